"""Budget branches against independent WSD runs and against the cosine ladder (docs/branches.md).

Three loss tables (the ``losses.csv`` that ``quartet ladder`` writes; columns model, precision, tokens, seed, loss,
...) in ``benchmarks/results/branches/``: ``losses_branches.csv`` (the branches of ``sweeps/branches_ladder.yaml``;
the loader drops the trunks, which never decay), ``losses_independent.csv`` (the same WSD runs each from scratch,
``sweeps/branches_ladder_independent.yaml``) and ``losses_cosine.csv`` (the cosine ladder's runs,
``sweeps/ladder_1gpu.yaml``, restricted to the same model, precision, tokens and seed). Commands, from the
repository root (the run folders: ``tar xzf benchmarks/results/branches/runs.tar.gz -C /tmp`` and
``tar xzf benchmarks/results/ladder/runs.tar.gz -C /tmp``)::

    quartet ladder /tmp/branches_ladder --out /tmp/branches_report        # -> losses_branches.csv
    quartet ladder /tmp/branches_ladder_independent --out /tmp/independent_report   # -> losses_independent.csv
    python benchmarks/branches_compare.py cosine benchmarks/results/ladder/losses.csv \
        --like benchmarks/results/branches/losses_branches.csv --out benchmarks/results/branches/losses_cosine.csv
    python benchmarks/branches_compare.py compare --csv benchmarks/results/branches/comparison.csv \
        --figure benchmarks/results/branches/branches_losses.png
    python benchmarks/branches_compare.py fit-fixed --json-prefix fit_shape_     # -> fit_shape_<set>.json
    python benchmarks/branches_compare.py gpu-time /tmp/branches_ladder /tmp/branches_ladder_independent
    python benchmarks/branches_compare.py gpu-time /tmp/ladder_1gpu --like benchmarks/results/branches/losses_cosine.csv
    python benchmarks/branches_compare.py rerun /tmp/branches_ladder /tmp/branches_ladder_independent \
        --steps 20,40,100,300,500,600,1000 [--per-run]

``compare``: for every run (model, budget, precision, seed) in all three tables, ``comparison.csv`` has the three
losses (quantity ``loss``) and, per (model, budget, seed), quartet's paired gap to bf16 (quantity ``gap``,
precision ``quartet-bf16``), with each difference (branch − independent ``_bi``, branch − cosine ``_bc``,
independent − cosine ``_ic``) against the seed noise of a difference of two single runs, sqrt(sd_a² + sd_b²):
sd_x is set x's sd over the seeds of its replicated cell of the same size and precision (of the paired gap, for a
gap), the replicated cell nearest in log D if there are several (``noise_from``). ``z`` = difference / noise;
the verdict is ``within noise`` when |z| ≤ 1. The printed summary gives, per comparison and quantity, the mean
difference, mean and max |z| and how many rows lie within 1 and 2 noise units. The figure: one column per (size,
precision); top, final validation loss against D for the three sets (replicated cells: the seeds' mean and
range); bottom, each set minus the WSD run from scratch, with the ±1 noise band of a branch − independent
difference.

``fit-fixed``: two model sizes do not identify the law (``quartet fit`` flags each set ``hit_bound``), so this refits
each set with the law's shape (``--fix``, default alpha, beta, gamma and E) held at another fit's values
(``--shape``, default the four-size cosine ladder's ``fit.json``), and A, B and quartet's effN / effD free, with a
200-resample cell bootstrap (``--exclude`` as ``quartet fit``'s). A sensitivity check under a borrowed shape.

``gpu-time``: per run folder, the runs' summed ``wall_clock_s`` (a branch's covers its decay only; each run's own
wall time, also while it shared the GPU with others) and the tokens trained (a branch: its decay's).

``rerun``: the logged training loss, at each step, of the runs of one model and seed that share one configuration up
to that step (the trunk, and each budget's run before its decay starts: the same initialisation, data order and
LR), and its spread (``--per-run``: each run's): how far a GPU run drifts from an identical one.
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

SETS = ("branches", "independent", "cosine")
LABELS = {"branches": "WSD branch (trunk + decay)", "independent": "WSD from scratch", "cosine": "cosine ladder"}
STYLE = {"branches": dict(color="#7b3294", marker="o", ls="-"),
         "independent": dict(color="#e08214", marker="s", ls="--"),
         "cosine": dict(color="#4d4d4d", marker="^", ls=":")}
KEY = ["model", "precision", "tokens", "seed"]
PAIRS = (("branches", "independent"), ("branches", "cosine"), ("independent", "cosine"))
SHORT = {"branches": "b", "independent": "i", "cosine": "c"}
BASE, PREC = "bf16", "quartet"


def read_table(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path)
    missing = [c for c in KEY + ["loss", "n_params"] if c not in df.columns]
    if missing:
        raise SystemExit(f"branches_compare: {path} lacks column(s) {', '.join(missing)}")
    df["dn"] = (df["tokens"] / df["n_params"]).round().astype(int)
    return df


def cut_cosine(ladder: Path, like: Path, out: Path) -> pd.DataFrame:
    """The ladder's rows whose (model, precision, tokens, seed) are in ``like``; refuses when one is missing."""
    full, ref = pd.read_csv(ladder), pd.read_csv(like)
    keys = ref[KEY].drop_duplicates()
    cut = full.merge(keys, on=KEY, how="inner")
    if len(cut) != len(keys):
        got = cut[KEY].apply(tuple, axis=1).tolist()
        lost = [tuple(k) for k in keys.itertuples(index=False) if tuple(k) not in got]
        raise SystemExit(f"branches_compare: {len(lost)} run(s) of {like} have no row in {ladder}: {lost[:3]}")
    cut = cut[full.columns].sort_values(["model", "tokens", "precision", "seed"]).reset_index(drop=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    cut.to_csv(out, index=False)
    return cut


def gaps(df: pd.DataFrame) -> pd.DataFrame:
    """quartet − bf16 per (model, tokens, seed), paired by seed (:func:`analysis.ladder.paired_gaps`), as rows of
    precision ``quartet-bf16``."""
    from analysis.ladder import paired_gaps

    g = paired_gaps(df, BASE)
    g = g[g["precision"] == PREC]
    return g.assign(dn=(g["tokens"] / g["n_params"]).round().astype(int), loss=g["gap"], precision=f"{PREC}-{BASE}")[
        ["model", "n_params", "tokens", "dn", "seed", "precision", "loss"]]


def seed_noise(df: pd.DataFrame) -> pd.DataFrame:
    """sd over seeds per replicated (model, precision, tokens) of one set's losses, and of quartet's paired gap as
    precision ``quartet-bf16`` (:func:`analysis.ladder.seed_noise`)."""
    from analysis.ladder import seed_noise as ladder_seed_noise

    n = ladder_seed_noise(df, BASE)
    cols = ["model", "precision", "tokens", "sd", "seeds"]
    loss = n.rename(columns={"loss_sd": "sd"})[cols]
    gap = n[n["precision"] == PREC].assign(precision=f"{PREC}-{BASE}").rename(columns={"gap_sd": "sd"})[cols]
    out = pd.concat([loss, gap], ignore_index=True)
    return out[(out["seeds"] >= 2) & out["sd"].notna()].reset_index(drop=True)


def noise_for(noise: pd.DataFrame, model: str, precision: str, tokens: float) -> tuple[float, str]:
    rep = noise[(noise["model"] == model) & (noise["precision"] == precision)]
    if rep.empty:
        return math.nan, "none"
    k = (np.log(rep["tokens"]) - math.log(tokens)).abs().idxmin()
    row = rep.loc[k]
    return float(row["sd"]), f"{model} {row['tokens']:.0f} tokens ({int(row['seeds'])} seeds)"


def compare(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    long = {}
    for name, df in tables.items():
        long[name] = pd.concat([df.assign(quantity="loss")[["model", "n_params", "tokens", "dn", "seed", "precision",
                                                            "loss", "quantity"]],
                                gaps(df).assign(quantity="gap")], ignore_index=True)
    noise = {name: seed_noise(t) for name, t in long.items()}
    idx = ["quantity", "model", "n_params", "tokens", "dn", "precision", "seed"]
    merged = None
    for name, t in long.items():
        t = t.set_index(idx)["loss"].rename(name)
        merged = t.to_frame() if merged is None else merged.join(t, how="inner")
    merged = merged.reset_index()
    rows = []
    for r in merged.itertuples(index=False):
        row = r._asdict()
        sds = {}
        for name in tables:
            sds[name], src = noise_for(noise[name], r.model, r.precision, r.tokens)
            row[f"sd_{SHORT[name]}"] = sds[name]
        row["noise_from"] = src  # the three sets replicate the same cells
        for a, b in PAIRS:
            tag = SHORT[a] + SHORT[b]
            d = row[a] - row[b]
            n = math.sqrt(sds[a] ** 2 + sds[b] ** 2)
            z = d / n if n > 0 else math.nan
            row[f"diff_{tag}"], row[f"noise_{tag}"], row[f"z_{tag}"] = d, n, z
            row[f"verdict_{tag}"] = ("noise not measured" if math.isnan(z)
                                     else "within noise" if abs(z) <= 1 else "outside noise")
        rows.append(row)
    out = pd.DataFrame(rows).sort_values(["quantity", "model", "tokens", "precision", "seed"],
                                         ascending=[False, True, True, True, True])
    return out.reset_index(drop=True)


def summary(cmp: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (a, b), quantity in itertools.product(PAIRS, ("loss", "gap")):
        tag = SHORT[a] + SHORT[b]
        q = cmp[cmp["quantity"] == quantity]
        by_prec = list(q.groupby("precision")) if q["precision"].nunique() > 1 else []
        for prec, part in [("all", q)] + by_prec:
            z = part[f"z_{tag}"].abs()
            worst = part.loc[z.idxmax()]
            rows.append({"comparison": f"{a} - {b}", "quantity": quantity, "precision": prec, "rows": len(part),
                         "mean_diff": part[f"diff_{tag}"].mean(), "mean_abs_diff": part[f"diff_{tag}"].abs().mean(),
                         "mean_abs_z": z.mean(), "max_abs_z": z.max(),
                         "max_at": f"{worst['model']} D/N {worst['dn']} {worst['precision']} s{worst['seed']}",
                         "within_1": int((z <= 1).sum()), "within_2": int((z <= 2).sum())})
    return pd.DataFrame(rows)


def figure(tables: dict[str, pd.DataFrame], cmp: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.figures import log_axis

    sizes = tables["branches"].groupby("model")["n_params"].first().sort_values().index
    cols = [(m, p) for m in sizes for p in (BASE, PREC)]
    fig, axes = plt.subplots(2, len(cols), figsize=(3.6 * len(cols), 6.4), sharex="col",
                             gridspec_kw={"height_ratios": [1.6, 1]})
    for j, (model, prec) in enumerate(cols):
        top, bot = axes[0, j], axes[1, j]
        per_set = {}
        for name in SETS:
            d = tables[name]
            d = d[(d["model"] == model) & (d["precision"] == prec)]
            per_set[name] = d.groupby("tokens")["loss"].agg(["mean", "min", "max"])
        ref = per_set["independent"]["mean"]
        for k, name in enumerate(SETS):
            g, st = per_set[name], STYLE[name]
            x = g.index.to_numpy() * (1.0 + 0.03 * (k - 1))  # dodged along D so equal budgets stay visible
            kw = dict(color=st["color"], marker=st["marker"], ls=st["ls"], ms=5, lw=1.3)
            top.plot(x, g["mean"], label=LABELS[name], **kw)
            rep = (g["max"] > g["min"]).to_numpy()
            top.vlines(x[rep], g["min"][rep], g["max"][rep], color=st["color"], lw=2.2, alpha=0.6)
            bot.plot(x, (g["mean"] - ref.reindex(g.index)).to_numpy(), **kw)
            bot.vlines(x[rep], (g["min"] - ref)[rep], (g["max"] - ref)[rep], color=st["color"], lw=2.2, alpha=0.6)
        band = cmp[(cmp["quantity"] == "loss") & (cmp["model"] == model) & (cmp["precision"] == prec)]
        nb = band.groupby("tokens")["noise_bi"].first()
        bot.fill_between(nb.index, -nb.to_numpy(), nb.to_numpy(), color=STYLE["branches"]["color"], alpha=0.13,
                         lw=0, label="±1 noise of a branch − independent difference")
        bot.axhline(0, color="k", lw=0.6)
        top.set_xscale("log")
        top.set_title(f"{model}, {prec}")
        bot.set_xlabel("tokens D")
        if j == 0:
            top.set_ylabel("final validation loss (nats/token)")
            bot.set_ylabel("loss − WSD from scratch")
        log_axis(bot, "x")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    h2, l2 = axes[1, 0].get_legend_handles_labels()
    fig.suptitle("Budget branches vs WSD from scratch vs the cosine ladder (H100; a point is one run, or three "
                 "seeds' mean with their range as a bar)", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    fig.legend(handles + h2, labels + l2, loc="lower center", ncol=4, frameon=False, bbox_to_anchor=(0.5, 0.0))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=150, bbox_inches="tight")
    plt.close(fig)


def fit_fixed(dir_: Path, shape: Path, fix: list[str], bootstrap: int, seed: int, exclude: str | None,
              prefix: str | None) -> pd.DataFrame:
    """Each set's fit with the law's shape held at another fit's values (``fix``: raw names among alpha, beta,
    gamma, e), the rest (A, B, and E unless fixed) and quartet's effN / effD refitted, with a cell bootstrap."""
    import json

    import analysis
    from analysis.laws import RAW_NAMES, Law

    raw = dict(zip(RAW_NAMES, json.loads(shape.read_text())["base"]["raw"]))
    bad = [f for f in fix if f not in ("alpha", "beta", "gamma", "e")]
    if bad:
        raise SystemExit(f"branches_compare: --fix takes alpha, beta, gamma, e (got {', '.join(bad)})")
    law = Law("busbridge@" + "+".join(fix), {f: float(raw[f]) for f in fix},
              f"Busbridge with {', '.join(fix)} held at {shape}")
    rows = []
    for name in SETS:
        df = pd.read_csv(dir_ / f"losses_{name}.csv")
        rep = analysis.fit_all(df, law, bootstrap=bootstrap, seed=seed, exclude=exclude)
        e, iv = rep.eff(PREC), rep.eff_intervals.get(PREC, {})
        lo_n, hi_n = iv.get("eff_n") or (math.nan, math.nan)
        lo_d, hi_d = iv.get("eff_d") or (math.nan, math.nan)
        rows.append({"set": name, "base_status": rep.base.status, "E": rep.base.params["E"],
                     "effN": e.eff_n, "effN_lo": lo_n, "effN_hi": hi_n, "effD": e.eff_d, "effD_lo": lo_d,
                     "effD_hi": hi_d, "eff_status": e.status, "bootstrap_used": rep.bootstrap.get("used"),
                     "message": rep.base.message})
        if prefix:
            rep.to_json(dir_ / f"{prefix}{name}.json")
    return pd.DataFrame(rows)


def _read_runs(folder: Path) -> list[dict]:
    import yaml

    from quartet import paths

    runs = []
    for run in sorted(p for p in folder.iterdir() if p.is_dir()):
        s = paths.read_summary(run)
        if s is None:
            continue
        cfg = yaml.safe_load((run / paths.CONFIG).read_text()) if (run / paths.CONFIG).is_file() else {}
        s["_derived"] = (cfg or {}).get("derived", {})
        s["_metrics"] = run / paths.METRICS
        runs.append(s)
    return runs


def _role(run: dict) -> str | None:
    return (run.get("branch") or {}).get("role")


def gpu_time(folders: list[Path], like: Path | None) -> pd.DataFrame:
    """Per folder: runs, trunks, branches, the summed ``wall_clock_s`` (a branch's covers its decay only) and the
    tokens trained (a branch: its decay's). ``like``: keep only the run ids of that loss table (the cosine cells)."""
    keep = set(pd.read_csv(like)["run_id"]) if like else None
    rows = []
    for folder in folders:
        runs = [r for r in _read_runs(folder) if keep is None or r["run_id"] in keep]
        trunks = [r for r in runs if _role(r) == "trunk"]
        branches = [r for r in runs if _role(r) == "branch"]
        trained = sum(r["tokens"] * (1 - r["branch"]["step"] / r["steps"]) if _role(r) == "branch" else r["tokens"]
                      for r in runs)
        wall = sum(float(r["wall_clock_s"]) for r in runs)
        rows.append({"folder": folder.name, "runs": len(runs), "trunks": len(trunks), "branches": len(branches),
                     "wall_clock_s": wall, "wall_clock_h": wall / 3600,
                     "trunk_wall_clock_s": sum(float(r["wall_clock_s"]) for r in trunks),
                     "branch_wall_clock_s": sum(float(r["wall_clock_s"]) for r in branches),
                     "tokens_trained": trained, "devices": ", ".join(sorted({str(r.get("device_name")) for r in runs}))})
    return pd.DataFrame(rows)


def rerun(folders: list[Path], model: str, seed: int, steps: list[int], per_run: bool = False) -> pd.DataFrame:
    """The logged training loss at ``steps`` of every run of ``model`` and ``seed`` in the folders whose LR has not
    started to decay there (a trunk, and each budget's run before its decay start): runs with one configuration up
    to that step, so their spread is the GPU's run-to-run spread (the same data order, initialisation and LR)."""
    import json

    rows = []
    for folder in folders:
        for r in _read_runs(folder):
            if r["model"] != model or int(r["seed"]) != seed or _role(r) == "branch":
                continue
            start = int(r["_derived"].get("decay_start") or r["steps"])
            logged = {m["step"]: m["loss"] for m in map(json.loads, r["_metrics"].read_text().splitlines())
                      if "loss" in m}
            for step in steps:
                if step <= start and step in logged:
                    rows.append({"precision": r["precision"], "step": step, "run_id": r["run_id"],
                                 "loss": logged[step]})
    df = pd.DataFrame(rows)
    if per_run:
        return df.pivot_table(index=["precision", "run_id"], columns="step", values="loss").reset_index()
    return df.groupby(["precision", "step"])["loss"].agg(["count", "min", "max", "std"]).reset_index()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cosine", help="cut the ladder's losses to the runs of another table")
    c.add_argument("ladder", type=Path)
    c.add_argument("--like", type=Path, required=True)
    c.add_argument("--out", type=Path, required=True)
    m = sub.add_parser("compare", help="comparison.csv and the figure")
    m.add_argument("--dir", type=Path, default=Path("benchmarks/results/branches"))
    m.add_argument("--csv", type=Path)
    m.add_argument("--figure", type=Path)
    f = sub.add_parser("fit-fixed", help="each set's fit with the law's shape held at another fit's values")
    f.add_argument("--dir", type=Path, default=Path("benchmarks/results/branches"))
    f.add_argument("--shape", type=Path, default=Path("benchmarks/results/ladder/fit.json"))
    f.add_argument("--fix", default="alpha,beta,gamma,e")
    f.add_argument("--bootstrap", type=int, default=200)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--exclude")
    f.add_argument("--json-prefix", help="write <dir>/<prefix><set>.json")
    g = sub.add_parser("gpu-time", help="summed wall_clock_s and tokens trained per run folder")
    g.add_argument("folders", type=Path, nargs="+")
    g.add_argument("--like", type=Path, help="keep only this loss table's run ids")
    g.add_argument("--csv", type=Path)
    r = sub.add_parser("rerun", help="training loss spread of runs sharing one configuration up to a step")
    r.add_argument("folders", type=Path, nargs="+")
    r.add_argument("--model", default="llama_1m")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--steps", default="20,40,100,300,500")
    r.add_argument("--per-run", action="store_true", help="every run's loss at each step, not the spread")
    args = ap.parse_args(argv)
    fmt = {"display.width": 200, "display.max_columns": 20, "display.max_colwidth": 90,
           "display.float_format": "{:.4g}".format}
    if args.cmd == "fit-fixed":
        out = fit_fixed(args.dir, args.shape, [x for x in args.fix.split(",") if x], args.bootstrap, args.seed,
                        args.exclude, args.json_prefix)
        with pd.option_context(*itertools.chain.from_iterable(fmt.items())):
            print(out.to_string(index=False))
        return 0
    if args.cmd == "gpu-time":
        out = gpu_time(args.folders, args.like)
        if args.csv:
            out.to_csv(args.csv, index=False, float_format="%.6g")
        with pd.option_context(*itertools.chain.from_iterable(fmt.items())):
            print(out.to_string(index=False))
        return 0
    if args.cmd == "rerun":
        out = rerun(args.folders, args.model, args.seed, [int(x) for x in args.steps.split(",")], args.per_run)
        with pd.option_context(*itertools.chain.from_iterable(fmt.items())):
            print(out.to_string(index=False))
        return 0
    if args.cmd == "cosine":
        cut = cut_cosine(args.ladder, args.like, args.out)
        print(f"wrote {args.out}: {len(cut)} rows")
        return 0
    tables = {name: read_table(args.dir / f"losses_{name}.csv") for name in SETS}
    cmp = compare(tables)
    if args.csv:
        cmp.to_csv(args.csv, index=False, float_format="%.6g")
        print(f"wrote {args.csv}: {len(cmp)} rows")
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4f}".format):
        print(summary(cmp).to_string(index=False))
    if args.figure:
        figure(tables, cmp, args.figure)
        print(f"wrote {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
