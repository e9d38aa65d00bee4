"""Which added cells would pin the recipes' effN and effD, and at what GPU cost? Simulate designs before running them.

The recipe table's fit (docs/recipes.md) leaves every recipe's effN interval at the bound 4: its cells (D/N 5-20)
grow N and D together. This script plants the committed fit (benchmarks/results/recipes/fit.json: the base law's
parameters and each recipe's point effN / effD) on the one-GPU ladder's 15 bf16 cells (the base law's cells, seeds
as run) and on a candidate design's recipe cells, draws every run's loss with noise, fits the simulated table with the
project's own `quartet fit` code (:func:`analysis.report.fit_all`: base law, one efficiency fit per recipe, the paired
cell bootstrap) and reports, per design, how often each recipe's effN / effD 95% interval stays off the efficiency
bounds (1e-5, 4) and is narrower than a stated width ("pinned": the rule of :mod:`analysis.verdict`, ``--width``), the
median interval widths,
how often the interval holds the planted value, and the GPU cost of the design's added runs. Every design sees the
same draws at the cells it shares with another (common random numbers), so designs differ only by what they add.

Two noise models, in nats. ``seed``: a bf16 run deviates by the bf16 seed sd of its size (the recipe table's
noise.csv, RMS over the size's replicated cells); a recipe run shares the deviation of the bf16 run of its seed (the
pairing) plus a gap deviation with the size's median paired-gap sd over the ten recipes (20.5M, where no recipe ran:
the median of fp8's and quartet's in the ladder's noise.csv); a cell's loss is the mean over its seeds. ``misfit``:
one deviation per cell (seeds do not average it away) with the committed fit's RMS residual of the size, bf16 and
recipe-minus-bf16 apart (20.5M's gap from the ladder's fit of fp8 and quartet): the law's lack of fit, which the
seed model leaves out. ``--noise-scale`` multiplies every sd. A third check uses no simulation
(:func:`real_check`): the committed table plus the ladder's own fp8 and quartet runs at the added cells, refitted.

Cost: added runs are every recipe but bf16, fp8 and quartet (the ladder ran those at all 15 cells) at each added
cell. GPU-hours twice: the planner's estimate (cluster.profiles.gpu_hours, conf/cluster/local_gpu.yaml) and from
the recipe sweep's own runs: each run's steps x the median seconds per step that its model and recipe took in the
sweep, 4 runs sharing an H100 (benchmarks/results/recipes/runs.tar.gz summaries; llama_20m scaled from llama_7m by
the ladder's measured bf16/fp8/quartet step ratio, a lower bound for the quantizer-bound recipes); GPU-hours =
summed run wall-clock / 4. The longest added run is what half an hour of a 4-GPU machine must fit.

    .venv/bin/python benchmarks/recipes_design.py              # -> benchmarks/results/recipes/design_sim.csv
    .venv/bin/python benchmarks/recipes_design.py --designs current "+3m dn40" --reps 2 --out /tmp/d.csv
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.verdict import PINNED_WIDTH, pinned  # noqa: E402
from analysis.laws import predict  # noqa: E402
from analysis.report import fit_all  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
OUT = RESULTS / "recipes" / "design_sim.csv"
#: recipes whose runs the ladder already has at every one of its 15 cells (sweeps/ladder_1gpu.yaml)
LADDER_PRECISIONS = ("bf16", "fp8", "quartet")
#: the recipe table's cells (sweeps/recipes.yaml): (model, budget, seeds)
CURRENT = [("llama_1m", "dn10", 3), ("llama_1m", "dn20", 1), ("llama_3m", "dn10", 3), ("llama_3m", "dn20", 1),
           ("llama_7m", "dn5", 3), ("llama_7m", "dn10", 1)]
#: candidates: cells added to the current design (one seed each unless stated); every one is a ladder cell
_1M = [("llama_1m", "dn40", 1), ("llama_1m", "dn80", 1)]
DESIGNS = {
    "current": [],
    "+1m dn40": [("llama_1m", "dn40", 1)],
    "+1m dn40,80": _1M,
    "+1m dn40,80 (3 seeds)": [(m, b, 3) for m, b, _ in _1M],
    "+3m dn40": [("llama_3m", "dn40", 1)],
    "+7m dn20": [("llama_7m", "dn20", 1)],
    "+1m dn40,80 +3m dn40": _1M + [("llama_3m", "dn40", 1)],
    "+1m dn40,80 +7m dn20": _1M + [("llama_7m", "dn20", 1)],
    "+1m dn40,80 +3m dn40 +7m dn20": _1M + [("llama_3m", "dn40", 1), ("llama_7m", "dn20", 1)],
    "+20m dn5": [("llama_20m", "dn5", 1)],
    "all 15 ladder cells": _1M + [("llama_1m", "dn160", 1), ("llama_3m", "dn40", 1), ("llama_3m", "dn80", 1),
                                  ("llama_7m", "dn20", 1), ("llama_20m", "dn5", 1), ("llama_20m", "dn10", 1),
                                  ("llama_20m", "dn20", 1)],
}
#: runs share a GPU this many at a time (conf/cluster/local_gpu.yaml workers_per_gpu; the sweep's s/step were so)
RUNS_PER_GPU = 4


def _budget(run_id: str) -> str:
    return run_id.split("-")[1]


def ladder_cells() -> pd.DataFrame:
    """The ladder's bf16 cells: model, budget, n_params, tokens, steps, seeds."""
    lad = pd.read_csv(RESULTS / "ladder" / "losses.csv")
    b = lad[lad["precision"] == "bf16"].assign(budget=lambda d: d["run_id"].map(_budget))
    return (b.groupby(["model", "budget"], sort=False)
            .agg(n_params=("n_params", "first"), tokens=("tokens", "first"), steps=("steps", "first"),
                 seeds=("loss", "size")).reset_index())


def planted() -> tuple[dict, dict]:
    """The committed recipe fit: base law parameters and {recipe: (effN, effD)} point estimates."""
    fit = json.loads((RESULTS / "recipes" / "fit.json").read_text())
    return fit["base"]["params"], {e["scheme"]: (e["eff_n"], e["eff_d"]) for e in fit["efficiencies"]}


def noise_sds() -> tuple[dict, dict]:
    """Per model: the bf16 seed sd (RMS over the size's replicated cells) and the median paired-gap sd, in nats."""
    rec = pd.read_csv(RESULTS / "recipes" / "noise.csv")
    lad = pd.read_csv(RESULTS / "ladder" / "noise.csv")
    both = pd.concat([rec, lad[~lad["model"].isin(rec.loc[rec["gap_sd"].notna(), "model"])]])
    bf = both[both["precision"] == "bf16"].drop_duplicates(["model", "tokens"])
    sd_b = bf.groupby("model")["loss_sd"].apply(lambda s: float(np.sqrt(np.mean(s**2)))).to_dict()
    gaps = both[both["gap_sd"].notna()].drop_duplicates(["model", "tokens", "precision"])
    sd_g = gaps.groupby("model")["gap_sd"].median().to_dict()
    return sd_b, sd_g


def _cell_residuals(tag: str) -> pd.DataFrame:
    """The committed fit's residuals (nats) at every cell of ``tag`` (recipes | ladder): seed-mean loss − the law."""
    fit = json.loads((RESULTS / tag / "fit.json").read_text())
    effs = {e["scheme"]: (e["eff_n"], e["eff_d"]) for e in fit["efficiencies"]}
    d = pd.read_csv(RESULTS / tag / "losses.csv")
    m = d.groupby(["model", "n_params", "tokens", "precision"])["loss"].mean().reset_index()
    m["res"] = [r.loss - float(predict(fit["base"]["params"], r.n_params, r.tokens, *effs.get(r.precision, (1, 1))))
                for r in m.itertuples()]
    bf = m[m["precision"] == "bf16"].set_index(["model", "tokens"])["res"]
    m["gap_res"] = [r.res - bf[(r.model, r.tokens)] for r in m.itertuples()]
    return m


def misfit_sds() -> tuple[dict, dict]:
    """Per model: the RMS residual of the committed base fit over the size's bf16 cells, and the RMS over recipes and
    cells of a recipe's residual minus bf16's (the gap the law misses), in nats; the 20.5M gap from the ladder's fit
    (fp8 and quartet, the only recipes it ran there)."""
    rec, lad = _cell_residuals("recipes"), _cell_residuals("ladder")
    rms = lambda s: float(np.sqrt(np.mean(s**2)))  # noqa: E731
    sd_b = rec[rec["precision"] == "bf16"].groupby("model")["res"].apply(rms).to_dict()
    gaps = rec[rec["precision"] != "bf16"]
    extra = lad[(lad["precision"] != "bf16") & ~lad["model"].isin(gaps["model"])]
    sd_g = pd.concat([gaps, extra]).groupby("model")["gap_res"].apply(rms).to_dict()
    return sd_b, sd_g


#: the most seeds any cell gets (draws are made for this many whatever the design: common random numbers)
MAX_SEEDS = 3


def simulate_table(seed, cells: pd.DataFrame, design: list, base: dict, effs: dict, sd_b: dict, sd_g: dict,
                   noise_scale: float = 1.0, per_cell: bool = False) -> pd.DataFrame:
    """One simulated loss table: the bf16 runs at every ladder cell, each recipe at the design's cells (seed means).

    A cell's draws depend only on ``seed`` and the cell (common random numbers), so two designs of one ``seed`` share
    their common cells' losses and differ only by the cells one of them adds. ``per_cell``: one deviation per cell
    whatever its seeds (a misfit of the law, which seeds do not average away)."""
    rows = []
    at = {(r.model, r.budget): r for r in cells.itertuples()}
    missing = [(m, b) for m, b, _ in design if (m, b) not in at]
    if missing:
        raise ValueError(f"design cells not among the ladder's bf16 cells: {missing}")
    recipe_seeds = {(m, b): k for m, b, k in design}
    if max(recipe_seeds.values(), default=0) > MAX_SEEDS:
        raise ValueError(f"at most {MAX_SEEDS} seeds per cell")
    for i, c in enumerate(cells.itertuples()):
        rng = np.random.default_rng([seed, i])
        dev = rng.normal(0.0, noise_scale * sd_b[c.model], MAX_SEEDS)  # per seed, shared by that seed's recipe runs
        gaps = rng.normal(0.0, noise_scale * sd_g[c.model], (len(effs), MAX_SEEDS))
        if per_cell:
            dev[:] = dev[0]
            gaps[:] = gaps[:, :1]
        true = float(predict(base, c.n_params, c.tokens))
        rows.append(dict(n_params=c.n_params, tokens=c.tokens, forward="bf16", backward="bf16", precision="bf16",
                         loss=true + dev[: int(c.seeds)].mean(), run_id=f"{c.model}-{c.budget}-bf16"))
        kr = recipe_seeds.get((c.model, c.budget), 0)
        if not kr:
            continue
        for (name, (en, ed)), gap in zip(effs.items(), gaps):
            rt = float(predict(base, c.n_params, c.tokens, en, ed))
            rows.append(dict(n_params=c.n_params, tokens=c.tokens, forward=name, backward=name, precision=name,
                             loss=rt + (dev[:kr] + gap[:kr]).mean(), run_id=f"{c.model}-{c.budget}-{name}"))
    return pd.DataFrame(rows)


NOISE_MODELS = {"seed": noise_sds, "misfit": misfit_sds}


def simulate(design: list, *, reps: int, bootstrap: int, seed: int = 0, noise: str = "seed", noise_scale: float = 1.0,
             effs: dict | None = None, cells: pd.DataFrame | None = None, width: float = PINNED_WIDTH) -> pd.DataFrame:
    """Fit ``reps`` simulated tables of ``CURRENT + design``; one row per (rep, recipe) with intervals and flags.
    ``noise``: ``seed`` (the measured seed sds, per run) or ``misfit`` (the committed fit's residuals, per cell);
    ``width``: the pinned rule's widest interval (:mod:`analysis.verdict`)."""
    base, fitted = planted()
    effs = effs or fitted
    cells = ladder_cells() if cells is None else cells
    sd_b, sd_g = NOISE_MODELS[noise]()
    merged = {(m, b): k for m, b, k in CURRENT}
    for m, b, k in design:
        merged[(m, b)] = max(merged.get((m, b), 0), k)
    full = [(m, b, k) for (m, b), k in merged.items()]
    out = []
    for rep in range(reps):
        table = simulate_table(seed * 1000 + rep, cells, full, base, effs, sd_b, sd_g, noise_scale, per_cell=noise == "misfit")
        fit = fit_all(table, "busbridge", bootstrap=bootstrap, seed=seed * 1000 + rep, selections=None,
                      forecasts=False)
        e_lo = fit.base_intervals.get("E", (np.nan, np.nan))[0]
        for name, (en, ed) in effs.items():
            e = fit.eff(name)
            iv = fit.eff_intervals.get(name, {"eff_n": (np.nan, np.nan), "eff_d": (np.nan, np.nan)})
            pin_n = pinned(iv["eff_n"], width, e.eff_n)
            out.append(dict(rep=rep, recipe=name, true_effN=en, true_effD=ed, effN=e.eff_n, effD=e.eff_d,
                            effN_lo=iv["eff_n"][0], effN_hi=iv["eff_n"][1], effD_lo=iv["eff_d"][0],
                            effD_hi=iv["eff_d"][1], pinned_N=pin_n,
                            pinned_ND=pin_n and pinned(iv["eff_d"], width, e.eff_d),
                            covers_N=bool(iv["eff_n"][0] <= en <= iv["eff_n"][1]),
                            base_E_at_0=bool(e_lo < 1e-3), boot_used=fit.bootstrap["used"]))
    return pd.DataFrame(out)


def real_check(design: list, bootstrap: int, seed: int = 0, width: float = PINNED_WIDTH) -> pd.DataFrame:
    """The committed data, no simulation: the recipe table's losses plus the ladder's own fp8 and quartet runs at the
    design's added cells (the ladder ran those two recipes at all 15 cells), fitted as ``quartet fit`` does; one row
    per recipe of the two with its effN / effD intervals. What the added cells do to two recipes' real intervals."""
    rec = pd.read_csv(RESULTS / "recipes" / "losses.csv")
    lad = pd.read_csv(RESULTS / "ladder" / "losses.csv").assign(budget=lambda d: d["run_id"].map(_budget))
    # the design's added cells, with as many seeds as it gives them (the ladder has 3 at its seed cells)
    keep = {(m, b): k for m, b, k in design}
    pick = np.array([p in ("fp8", "quartet") and s_ < keep.get((m, b), 0)
                     for p, s_, m, b in zip(lad["precision"], lad["seed"], lad["model"], lad["budget"])], bool)
    extra = lad[pick]
    table = pd.concat([rec[rec["precision"].isin(LADDER_PRECISIONS)], extra.drop(columns="budget")], ignore_index=True)
    fit = fit_all(table, "busbridge", bootstrap=bootstrap, seed=seed, selections=None, forecasts=False)
    rows = []
    for name in ("fp8", "quartet"):
        e, iv = fit.eff(name), fit.eff_intervals[name]
        rows.append(dict(recipe=name, effN=e.eff_n, effD=e.eff_d, effN_lo=iv["eff_n"][0], effN_hi=iv["eff_n"][1],
                         effD_lo=iv["eff_d"][0], effD_hi=iv["eff_d"][1],
                         pinned_N=pinned(iv["eff_n"], width, e.eff_n),
                         pinned_ND=pinned(iv["eff_n"], width, e.eff_n) and pinned(iv["eff_d"], width, e.eff_d)))
    return pd.DataFrame(rows)


def step_seconds() -> dict:
    """{(model, precision): median seconds per update} of the recipe sweep's runs (4 per H100), llama_20m scaled."""
    rows = []
    for arch in (RESULTS / "recipes" / "runs.tar.gz", RESULTS / "ladder" / "runs.tar.gz"):
        with tarfile.open(arch) as tar:
            for m in tar.getmembers():
                if m.name.endswith("/summary.json"):
                    s = json.load(tar.extractfile(m))
                    rows.append(dict(sweep=s["name"], model=s["model"], precision=s["precision"],
                                     sps=s["wall_clock_s"] / s["steps"]))
    df = pd.DataFrame(rows)
    rec = df[df["sweep"] == "recipes"].groupby(["model", "precision"])["sps"].median().to_dict()
    lad = df[df["sweep"] == "ladder_1gpu"].groupby(["model", "precision"])["sps"].median()
    out = dict(rec)
    for (model, prec), v in lad.items():
        out.setdefault((model, prec), float(v))
    for (model, prec), v in list(rec.items()):
        if model == "llama_7m" and ("llama_20m", prec) not in out:
            ratio = lad.get(("llama_20m", prec), np.nan) / lad.get(("llama_7m", prec), np.nan)
            if not np.isfinite(ratio):
                ratio = lad[("llama_20m", "bf16")] / lad[("llama_7m", "bf16")]
            out[("llama_20m", prec)] = float(v * ratio)
    return out


def design_cost(design: list, cells: pd.DataFrame, recipes, sps: dict) -> dict:
    """GPU cost of a design's added runs (recipes the ladder already ran at the cell are free)."""
    from cluster.profiles import gpu_hours, load_profile

    prof = load_profile("local_gpu")
    at = {(r.model, r.budget): r for r in cells.itertuples()}
    runs, plan_h, wall, longest, longest_id = 0, 0.0, 0.0, 0.0, "-"
    for m, b, k in design:
        c = at[(m, b)]
        for name in recipes:
            if name in LADDER_PRECISIONS:
                continue
            for _ in range(k):
                runs += 1
                plan_h += gpu_hours(prof, c.n_params, c.tokens, name)
                w = c.steps * sps[(m, name)]
                wall += w
                if w > longest:
                    longest, longest_id = w, f"{m} {b} {name}"
    return dict(added_runs=runs, gpu_h_planner=plan_h, gpu_h_measured=wall / RUNS_PER_GPU / 3600,
                longest_run_min=longest / 60, longest_run=longest_id)


def _summary(g: pd.DataFrame) -> dict:
    return dict(sims=len(g), pinned_N=g["pinned_N"].mean(), pinned_ND=g["pinned_ND"].mean(),
                effN_width_med=(g["effN_hi"] - g["effN_lo"]).median(),
                effD_width_med=(g["effD_hi"] - g["effD_lo"]).median(), effN_hi_med=g["effN_hi"].median(),
                covers_N=g["covers_N"].mean() if "covers_N" in g else np.nan,
                base_E_at_0=g["base_E_at_0"].mean() if "base_E_at_0" in g else np.nan)


def main(argv=None) -> pd.DataFrame:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=6, help="noise draws per design (the same draws for every design)")
    p.add_argument("--bootstrap", type=int, default=50, help="bootstrap refits per simulated fit")
    p.add_argument("--noise", nargs="*", default=list(NOISE_MODELS), choices=list(NOISE_MODELS))
    p.add_argument("--noise-scale", type=float, default=1.0)
    p.add_argument("--real-bootstrap", type=int, default=200,
                   help="bootstrap refits of the committed data's check (fp8, quartet); 0 skips it")
    p.add_argument("--designs", nargs="*", default=None, help="a subset of the candidates by name")
    p.add_argument("--width", type=float, default=PINNED_WIDTH,
                   help="the widest 95%% interval that counts as pinned (analysis.verdict)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    logging.getLogger("analysis").setLevel(logging.WARNING)
    designs = {k: v for k, v in DESIGNS.items() if not args.designs or k in args.designs}
    cells = ladder_cells()
    _, effs = planted()
    sps = step_seconds()
    for noise in args.noise:
        sd_b, sd_g = NOISE_MODELS[noise]()
        print(f"noise {noise} (nats): bf16 " + ", ".join(f"{m} {v:.4f}" for m, v in sd_b.items())
              + "; gap " + ", ".join(f"{m} {v:.4f}" for m, v in sd_g.items()), flush=True)
    rows = []
    for name, design in designs.items():
        cost = design_cost(design, cells, ["bf16", *effs], sps)
        for noise in args.noise:
            t0 = time.perf_counter()
            sims = simulate(design, reps=args.reps, bootstrap=args.bootstrap, noise=noise,
                            noise_scale=args.noise_scale, effs=effs, cells=cells, width=args.width)
            common = dict(noise=noise, design=name, recipe_cells=len(CURRENT) + len(design), reps=args.reps,
                          bootstrap=args.bootstrap, noise_scale=args.noise_scale, **cost)
            for recipe, g in [("all", sims), *sims.groupby("recipe", sort=False)]:
                rows.append(dict(common, recipe=recipe, **_summary(g), seconds=time.perf_counter() - t0))
        if args.real_bootstrap:
            t0 = time.perf_counter()
            real = real_check(design, args.real_bootstrap, width=args.width)
            common = dict(noise="real fp8+quartet", design=name, recipe_cells=len(CURRENT) + len(design), reps=1,
                          bootstrap=args.real_bootstrap, noise_scale=np.nan, **cost)
            for recipe, g in [("all", real), *real.groupby("recipe", sort=False)]:
                rows.append(dict(common, recipe=recipe, **_summary(g), seconds=time.perf_counter() - t0))
        print(f"{name}: done", flush=True)
    out = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out, index=False, float_format="%.4g")
    print_table(out)
    return out


def print_table(out: pd.DataFrame) -> None:
    """One line per design: pinned fraction and median effN / effD widths per noise model, the real check, the cost."""
    a = out[out["recipe"] == "all"]
    print("\npinned N / ND: share of fits whose effN / effN and effD 95% intervals are pinned (off the bounds (1e-5, 4) "
          "and narrower than --width, analysis.verdict); "
          "wN / wD: median interval widths; real: the committed fp8 and quartet runs")
    head = f"{'design':31s}"
    for noise in a["noise"].unique():
        head += f" | {noise.split()[0]:6s} N    ND    wN   wD "
    print(head + "| runs GPU-h plan/meas longest run")
    for name, g in a.groupby("design", sort=False):
        line = f"{name:31s}"
        for _, r in g.iterrows():
            line += f" |        {r['pinned_N']:.2f} {r['pinned_ND']:.2f} {r['effN_width_med']:4.2f} {r['effD_width_med']:4.2f} "
        r = g.iloc[0]
        print(line + f"| {int(r['added_runs']):4d} {r['gpu_h_planner']:4.2f} / {r['gpu_h_measured']:4.2f}  "
              f"{r['longest_run_min']:3.0f} min {r['longest_run']}")


if __name__ == "__main__":
    main()
