"""Which new ladder cell would tell apart the laws the data cannot? Ask the fitted laws before spending GPU time.

When the irreducible loss E is not identified, every E on the profile grid whose base fit is within the seed noise
(:func:`analysis.report.e_profile`'s "admissible") is a law the data cannot reject. Those laws agree on the measured
cells and disagree elsewhere. For each candidate cell this script predicts the bf16 loss under every admissible
law and reports the spread (max − min over admissible E) against the seed noise of that size (the bf16 loss sd
at its replicated cell; for a size not yet run, the largest size's). The cell whose spread is many times the
noise is the one whose measurement rules laws out; GPU cost grows as N² · D/N, so it is listed too
(``gpu_cost`` = N · D relative to the largest measured cell).

    git show 5bc7341:benchmarks/results/ladder/round5/losses_round4.csv > /tmp/losses_before_retune.csv
    .venv/bin/python benchmarks/ladder_next_cell.py --losses /tmp/losses_before_retune.csv
                                                        # -> benchmarks/results/ladder/next_cell.csv
    .venv/bin/python benchmarks/ladder_next_cell.py --drop llama_20m:20 --out /tmp/before_20m_dn20.csv
                                                        # what the data said before the 20.5M D/N 20 cell ran

``--what-if`` then asks the question that matters for the fit: plant the candidate's bf16 loss at the lowest and
at the highest admissible prediction (fp8 and quartet at that size's mean measured gaps), refit with a 100-resample
cell bootstrap, and report E's interval — does measuring that cell identify E, whatever it turns out to be?

    .venv/bin/python benchmarks/ladder_next_cell.py --what-if           # ~2 min on 2 cores

``--design`` asks the same of a whole set of new cells at once (a new rung, or two): every cell of the design is
planted from one admissible law at a time — the lowest-E, a middle and the highest-E law, each a possible truth —
and the table is refitted with a 100-resample cell bootstrap. ``--only bf16`` plants the base runs alone (the base
law is fitted on bf16; the efficiencies keep the measured cells):

    .venv/bin/python benchmarks/ladder_next_cell.py --design llama_50m:5,llama_50m:10 --only bf16

``benchmarks/results/ladder/design_what_if.csv`` asks it of the table before the 1.0M rung's LR was retuned (the
file above, from git history; on today's table no E is admissible):

    .venv/bin/python benchmarks/ladder_next_cell.py --losses /tmp/losses_before_retune.csv \
        --design llama_50m:5,llama_50m:10 --design llama_50m:5,llama_50m:10,llama_100m:5 --only bf16 --out /tmp/a.csv
    .venv/bin/python benchmarks/ladder_next_cell.py --losses /tmp/losses_before_retune.csv --drop llama_1m:10 \
        --drop llama_1m:20 --drop llama_1m:40 --drop llama_1m:80 --drop llama_1m:160 \
        --design llama_50m:5,llama_50m:10 --design llama_50m:5,llama_50m:10,llama_50m:20 --out /tmp/b.csv
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.fit import fit_base
from analysis.laws import Law, get_law, predict
from analysis.load import frame_from_table
from analysis.report import average_replicates, base_rows, fit_all, seed_noise_log

HERE = Path(__file__).resolve().parent / "results" / "ladder"
SIZES = {"llama_1m": 1_049_728, "llama_3m": 3_410_176, "llama_7m": 7_081_344, "llama_20m": 20_453_888,
         "llama_30m": 30_482_560, "llama_50m": 49_556_736, "llama_100m": 102_823_936}
CANDIDATES = [("llama_7m", 40), ("llama_7m", 80), ("llama_20m", 20), ("llama_20m", 40), ("llama_50m", 5),
              ("llama_50m", 10)]


def main(argv=None) -> pd.DataFrame:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--losses", type=Path, default=HERE / "losses.csv")
    p.add_argument("--drop", action="append", default=[], metavar="MODEL:DN",
                   help="leave a measured cell out (e.g. to replay an earlier decision)")
    p.add_argument("--out", type=Path, default=HERE / "next_cell.csv")
    p.add_argument("--what-if", action="store_true", help="refit with each candidate planted at both ends")
    p.add_argument("--design", action="append", default=[], metavar="MODEL:DN[,MODEL:DN...]",
                   help="plant this set of cells from each of three admissible laws and refit (repeatable)")
    p.add_argument("--only", default=None, metavar="PRECISION", help="with --design: plant only this precision")
    args = p.parse_args(argv)
    raw = pd.read_csv(args.losses)
    for item in args.drop:
        model, dn = item.split(":")
        raw = raw[~((raw["model"] == model) & (raw["tokens_per_param"].round() == float(dn)))]
    noise_log = seed_noise_log(raw, "bf16")
    cells = average_replicates(raw.assign(precision=raw["precision"].fillna("")))
    base = base_rows(cells, "bf16")
    lw = get_law("busbridge")
    lmin = float(base["loss"].min())
    laws = []
    for e_val in np.concatenate([[1e-6 * lmin], np.linspace(0.0, 0.95 * lmin, 16)[1:]]):
        fixed = Law(f"{lw.name}@E", {**lw.fixed, "e": float(np.log(e_val))}, lw.description)
        fit = fit_base(base["n_params"], base["tokens"], base["loss"], fixed)
        pred = predict(fit.params, base["n_params"].to_numpy(), base["tokens"].to_numpy())
        rms = float(np.sqrt(np.mean(np.log(base["loss"].to_numpy() / pred) ** 2)))
        if rms <= noise_log:
            laws.append((float(e_val), fit.params))
    if not laws:
        raise SystemExit(f"ladder_next_cell: no E on the grid fits the base cells within the pooled seed noise "
                         f"({noise_log:.4f}): there are no admissible laws to ask (`quartet fit --profile-e` shows "
                         f"the residuals); replay an earlier table with --losses")
    if args.design:
        return _what_if_designs(raw, laws, args.design, args.only, args.out)
    # per-size bf16 seed sd (replicated cells); unseen sizes borrow the largest measured size's
    bf = raw[raw["precision"] == "bf16"]
    sd = bf.groupby(["model", "tokens"])["loss"].std().dropna().groupby(level=0).min()
    largest = max(sd.index, key=lambda m: SIZES.get(m, 0))
    big = raw[raw["model"] == largest]
    ref_cost = float((big["n_params"] * big["tokens"]).max())
    rows = []
    for model, dn in CANDIDATES:
        n = SIZES[model]
        if ((raw["model"] == model) & (raw["tokens_per_param"].round() == dn)).any():
            continue  # measured already
        preds = [float(predict(params, np.array([n]), np.array([n * dn]))[0]) for _, params in laws]
        noise = float(sd.get(model, sd[largest]))
        spread = max(preds) - min(preds)
        rows.append({"model": model, "D/N": dn, "pred_min": round(min(preds), 4), "pred_max": round(max(preds), 4),
                     "spread": round(spread, 4), "bf16_seed_sd": round(noise, 4),
                     "spread_over_noise": round(spread / noise, 1), "gpu_cost": round(n * n * dn / ref_cost, 2),
                     "admissible_E": f"{laws[0][0]:.2f}-{laws[-1][0]:.2f} ({len(laws)} laws)"})
        if args.what_if:
            for end, value in (("low", min(preds)), ("high", max(preds))):
                rows[-1][f"E_interval_if_{end}"] = _planted_e_interval(raw, model, n, dn, value)
    out = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out, index=False)
    print(out.to_string(index=False))
    return out


def _mean_gaps(raw: pd.DataFrame, model: str) -> dict:
    """Each precision's mean loss gap to bf16 at ``model`` (at the largest measured size for a size not yet run)."""
    size = raw[raw["model"] == model] if (raw["model"] == model).any() else raw[raw["n_params"] == raw["n_params"].max()]
    cells = size.groupby(["precision", "tokens"])["loss"].mean().unstack(0)
    return {p: float((cells[p] - cells["bf16"]).mean()) for p in cells.columns}


def _what_if_designs(raw: pd.DataFrame, laws: list, designs: list[str], only: str | None, out: Path) -> pd.DataFrame:
    """E's and the efficiencies' bootstrap intervals after adding each design, planted from three admissible laws."""
    picks = sorted({0, len(laws) // 2, len(laws) - 1})
    rows = []
    for design in designs:
        cells = [(m, float(dn)) for m, dn in (item.split(":") for item in design.split(","))]
        gaps = {model: _mean_gaps(raw, model) for model, _ in cells}  # measured once, not per planted law
        for i in picks:
            e_val, params = laws[i]
            new = []
            for model, dn in cells:
                n = SIZES[model]
                bf16 = float(predict(params, np.array([n]), np.array([n * dn]))[0])
                for p, gap in gaps[model].items():
                    if only is None or p == only:
                        new.append({"n_params": n, "tokens": n * dn, "forward": p, "backward": p, "loss": bf16 + gap,
                                    "seed": 0, "model": model, "precision": p,
                                    "run_id": f"planted-{model}-{dn:g}-{p}"})
            table = pd.concat([raw, pd.DataFrame(new)], ignore_index=True)
            rep = fit_all(frame_from_table(table, name="what-if"), "busbridge", bootstrap=100, seed=0)
            lo, hi = rep.base_intervals["E"]
            row = {"design": design, "only": only or "all", "planted_E": round(e_val, 3),
                   "fitted_E": round(float(rep.base.params["E"]), 3), "E_interval": f"[{lo:.2f}, {hi:.2f}]",
                   "status": rep.base.status}
            for eff in rep.efficiencies:
                ints = rep.eff_intervals.get(eff.scheme, {})
                for key in ("eff_n", "eff_d"):
                    if key in ints:
                        row[f"{eff.scheme}_{key}"] = f"[{ints[key][0]:.2f}, {ints[key][1]:.2f}]"
            rows.append(row)
            print(row, flush=True)
    frame = pd.DataFrame(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out, index=False)
    print(frame.to_string(index=False))
    return frame


def _planted_e_interval(raw: pd.DataFrame, model: str, n: float, dn: float, bf16_loss: float) -> str:
    """E's 95% cell-bootstrap interval after adding the cell (model, D/N) with the given bf16 loss."""
    gaps = _mean_gaps(raw, model)
    new = [{"n_params": n, "tokens": n * dn, "forward": p, "backward": p, "loss": bf16_loss + gaps[p], "seed": 0,
            "model": model, "precision": p, "run_id": f"planted-{model}-{p}"} for p in gaps]
    table = pd.concat([raw, pd.DataFrame(new)], ignore_index=True)
    rep = fit_all(frame_from_table(table, name="what-if"), "busbridge", bootstrap=100, seed=0)
    lo, hi = rep.base_intervals["E"]
    return f"[{lo:.2f}, {hi:.2f}] ({rep.base.status})"


if __name__ == "__main__":
    main()
