"""A forecast written before a sweep stage trains, and its comparison with the runs once they have.

The forward-only / backward-only runs of sweeps/recipes_halves.yaml are trained in two stages: the 3.4M and 7.1M
cells first, then the 20.5M cells. Before the second stage trains, `forecast` fits the first stage's runs (the fit
JSON of `quartet fit --bootstrap N`) and writes what the law predicts for every run of the second: per cell and
precision the loss and the gap to the same cell's bf16 run, each with the 95% range over the bootstrap's refits
(`analysis.predict`), and the efficiencies they rest on, with both interval kinds. The file carries its date; git
history shows it predates the runs. `compare` reads the runs' losses once they exist and says, cell by cell, whether
the observed paired gap (mean over seeds of L(precision, s) − L(bf16, s)) and the observed loss fall inside the
forecast's ranges.

    python benchmarks/halves_forecast.py forecast --fit FIT.json --only model=llama_20m --out benchmarks/results/halves
    python benchmarks/halves_forecast.py compare --losses LOSSES.csv --out benchmarks/results/halves
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.load import BASE_LABEL, load_table  # noqa: E402
from analysis.predict import LawFit, Point, forecast, gap_forecast  # noqa: E402
from analysis.report import read_fit_json  # noqa: E402

SWEEP = "recipes_halves"


def stage_cells(sweep: str, only: list[str]) -> list[dict]:
    """The (model, N, tokens, D/N, precision, seeds, run ids) cells of one stage of ``sweep`` (``--only`` items), as
    `quartet sweep --only` plans them."""
    import tempfile

    from cluster.launch import make_plan, only_overrides

    with tempfile.TemporaryDirectory() as tmp:
        plan = make_plan(sweep, "local", only_overrides(only), tmp, with_state=False)
    cells: dict[tuple, dict] = {}
    for r in plan.runs:
        model = r.cfg.model.name
        key = (model, r.tokens, r.precision)
        c = cells.setdefault(key, {"model": model, "n_params": float(r.n_params), "tokens": float(r.tokens),
                                   "dn": round(r.tokens / r.n_params, 2), "precision": r.precision, "seeds": [],
                                   "run_ids": []})
        c["seeds"].append(int(r.cfg.run.seed))
        c["run_ids"].append(r.run_id)
    return sorted(cells.values(), key=lambda c: (c["n_params"], c["tokens"], c["precision"]))


def _iv(x) -> list | None:
    return None if x is None else [float(v) for v in x]


def make_forecast(fit_path: Path, only: list[str], sweep: str = SWEEP) -> dict:
    raw = read_fit_json(fit_path)  # the efficiencies and provenance as written, and the law they make
    fit = LawFit.from_dict(raw, fit_path)
    rows = []
    for c in stage_cells(sweep, only):
        if c["precision"] == BASE_LABEL:
            continue
        pt = Point(c["n_params"], c["tokens"], c["model"])
        loss = forecast(fit, [pt], [c["precision"]])[0]
        gap = gap_forecast(fit, pt, c["precision"])
        rows.append({**c, "loss": loss["loss"], "loss_interval": _iv(loss["interval"]), "gap": gap["gap"],
                     "gap_interval": _iv(gap["interval"]), "eff_n": loss["eff_n"], "eff_d": loss["eff_d"],
                     "extrapolation": loss["extrapolation"]})
    effs = [{k: e.get(k) for k in ("scheme", "kind", "eff_n", "eff_d", "eff_n_interval", "eff_n_interval_base_fixed",
                                   "eff_d_interval", "eff_d_interval_base_fixed", "verdicts", "n_points")}
            for e in raw["efficiencies"] if e.get("kind") in ("forward", "backward")]
    return {"what": f"forecast of the {sweep} stage --only {' '.join(only)} from the fit of the runs before it",
            "date": dt.date.today().isoformat(), "fit": str(fit_path.relative_to(REPO) if fit_path.is_absolute()
                                                              and REPO in fit_path.parents else fit_path),
            "fit_created": raw.get("provenance", {}).get("created"), "base": raw["base"]["params"],
            "base_status": raw["base"]["status"], "efficiencies": effs, "cells": rows}


def _fmt_iv(x, digits=3, sign="") -> str:
    return "—" if x is None else f"[{x[0]:{sign}.{digits}f}, {x[1]:{sign}.{digits}f}]"


def render_forecast(f: dict) -> str:
    lines = [f"# Forecast, {f['date']}: {f['what']}", "",
             f"Fit: `{f['fit']}` (base law {f['base_status']}; bootstrap refits give every range). Written by "
             "`python benchmarks/halves_forecast.py forecast` before the stage's runs trained.", "",
             "| precision | fitted | value | full 95% | base fixed 95% | verdicts (full / base fixed) | cells |",
             "|---|---|---|---|---|---|---|"]
    for e in f["efficiencies"]:
        which = "eff_n" if e["kind"] == "forward" else "eff_d"
        v = (e.get("verdicts") or {}).get(which, {})
        lines.append(f"| `{e['scheme']}` | {'effN' if which == 'eff_n' else 'effD'} | {e[which]:.3f} | "
                     f"{_fmt_iv(e[which + '_interval'])} | {_fmt_iv(e[which + '_interval_base_fixed'])} | "
                     f"{v.get('full', '—')} / {v.get('base_fixed', '—')} | {e['n_points']} |")
    lines += ["", "| model | D/N | precision | seeds | loss [95%] | gap to bf16 [95%] | effN, effD used |",
              "|---|---|---|---|---|---|---|"]
    for c in f["cells"]:
        li = c["loss_interval"]
        loss = f"{c['loss']:.4f}" + ("" if li is None else f" [{li[0]:.4f}, {li[1]:.4f}]")
        lines.append(f"| {c['model']} | {c['dn']:g} | `{c['precision']}` | {len(c['seeds'])} | {loss} | "
                     f"{c['gap']:+.4f} {_fmt_iv(c['gap_interval'], 4, '+')} | {c['eff_n']:.3f}, {c['eff_d']:.3f} |")
    return "\n".join(lines) + "\n"


def compare(f: dict, losses) -> dict:
    """Each forecast cell against its runs: observed mean loss, observed paired gap (seeds with a same-seed bf16 run
    in the same cell), and whether each falls inside the forecast's range."""
    rows = []
    for c in f["cells"]:
        cell = losses[(losses["n_params"] == c["n_params"]) & (losses["tokens"] == c["tokens"])]
        mine = cell[cell["run_id"].isin(c["run_ids"])]
        base = cell[cell["precision"] == BASE_LABEL].groupby("seed")["loss"].mean()
        pairs = [float(r.loss - base[r.seed]) for r in mine.itertuples() if r.seed in base.index]
        loss = float(mine["loss"].mean()) if len(mine) else math.nan
        gap = float(sum(pairs) / len(pairs)) if pairs else math.nan

        def inside(v, iv):
            return None if iv is None or not math.isfinite(v) else bool(iv[0] <= v <= iv[1])

        rows.append({"model": c["model"], "dn": c["dn"], "precision": c["precision"], "runs": int(len(mine)),
                     "pairs": len(pairs), "loss": loss, "loss_forecast": c["loss"], "loss_interval": c["loss_interval"],
                     "loss_inside": inside(loss, c["loss_interval"]), "gap": gap, "gap_forecast": c["gap"],
                     "gap_interval": c["gap_interval"], "gap_inside": inside(gap, c["gap_interval"])})
    judged = [r for r in rows if r["gap_inside"] is not None]
    return {"forecast_date": f["date"], "cells": rows, "gaps_inside": sum(r["gap_inside"] for r in judged),
            "gaps_judged": len(judged),
            "losses_inside": sum(bool(r["loss_inside"]) for r in rows if r["loss_inside"] is not None),
            "losses_judged": sum(r["loss_inside"] is not None for r in rows)}


def render_compare(c: dict) -> str:
    lines = [f"# The forecast of {c['forecast_date']} against the runs", "",
             f"Paired gaps inside the forecast's 95% range: {c['gaps_inside']} of {c['gaps_judged']} cells; mean "
             f"losses inside: {c['losses_inside']} of {c['losses_judged']}.", "",
             "| model | D/N | precision | runs | gap observed | gap forecast [95%] | inside | loss observed | "
             "loss forecast | inside |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in c["cells"]:
        lines.append(f"| {r['model']} | {r['dn']:g} | `{r['precision']}` | {r['runs']} | {r['gap']:+.4f} | "
                     f"{r['gap_forecast']:+.4f} {_fmt_iv(r['gap_interval'], 4, '+')} | {r['gap_inside']} | "
                     f"{r['loss']:.4f} | {r['loss_forecast']:.4f} | {r['loss_inside']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    fp = sub.add_parser("forecast", help="write forecast.md / forecast.json for a stage of the sweep")
    fp.add_argument("--fit", type=Path, required=True, help="fit JSON of the runs before the stage")
    fp.add_argument("--only", action="append", required=True, metavar="KEY=V1,V2", help="the stage, as quartet sweep --only")
    fp.add_argument("--sweep", default=SWEEP)
    fp.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "halves")
    cp = sub.add_parser("compare", help="compare.md / compare.json: the forecast against the stage's runs")
    cp.add_argument("--losses", type=Path, required=True, help="losses.csv (quartet ladder) holding the stage's runs")
    cp.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "halves")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cmd == "forecast":
        f = make_forecast(args.fit.resolve(), args.only, args.sweep)
        (args.out / "forecast.json").write_text(json.dumps(f, indent=1) + "\n")
        md = render_forecast(f)
        (args.out / "forecast.md").write_text(md)
    else:
        f = json.loads((args.out / "forecast.json").read_text())
        c = compare(f, load_table(args.losses))
        (args.out / "compare.json").write_text(json.dumps(c, indent=1) + "\n")
        md = render_compare(c)
        (args.out / "compare.md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
