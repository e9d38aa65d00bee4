"""The recipe table (docs/recipes.md) from the committed results: one row per training recipe.

Reads what `quartet ladder` and `quartet fit` wrote into benchmarks/results/recipes/ — gaps.csv (the paired gap to
bf16 per cell and the seed noise it is judged against), losses.csv (for recipe-against-recipe gaps),
fit.json (effN / effD with 95% bootstrap intervals, break-even speedups) — plus recipe_speed.json (each recipe's
llama_7m step alone on one H100) and runs.tar.gz (the runs' wall-clock and any failed run's error). Writes
table.md (the tables the docs page shows; the block between the markers in docs/recipes.md is replaced by it) and
recipes.png (every recipe in one figure). The whole chain, from the repository root:

    mkdir -p /tmp/recipes_runs
    tar xzf benchmarks/results/recipes/runs.tar.gz -C /tmp/recipes_runs
    tar xzf benchmarks/results/ladder/runs.tar.gz -C /tmp/recipes_runs --wildcards './ladder_1gpu/*-bf16-*'
    quartet ladder /tmp/recipes_runs --out benchmarks/results/recipes
    quartet fit benchmarks/results/recipes/losses.csv --bootstrap 200 --min-params 0 --json benchmarks/results/recipes/fit.json
    python benchmarks/recipes_table.py

(The ladder's bf16 runs at every cell are the base law's points; its runs of the recipe cells are in both archives
and `quartet ladder` keeps one copy.)
"""
from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.ladder import cell_gaps, seed_noise, sign_test  # noqa: E402
from analysis.report import update_marked_block  # noqa: E402
from quartet.paths import STATE, SUMMARY  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "recipes"
DOCS = REPO / "docs" / "recipes.md"
#: the docs page's block this script writes: between <!-- recipes_table.py: begin --> and <!-- ...: end -->
PAGE_BLOCK = "recipes_table.py"
BASE = "bf16"
#: recipe pairs that published work orders (docs/recipes.md): the first's loss minus the second's, paired by seed
HEAD_TO_HEAD = (("quartet2", "nvfp4_recipe"), ("quartet", "quartet_sr"), ("quartet", "luq_int4"), ("mxfp8", "fp8"))
SIZE_LABEL = {"llama_1m": "1.0M", "llama_3m": "3.4M", "llama_7m": "7.1M", "llama_20m": "20.5M"}
VERDICT = {"above noise": "above", "within noise": "within", "below noise": "below", "noise not measured": "unjudged"}


def _fmt_eff(value: float, interval) -> str:
    if interval is None:
        return f"{value:.2f}"
    return f"{value:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def _fmt_int(x: float) -> str:
    return f"{int(round(x)):,}"


def seed_cells(gaps: pd.DataFrame) -> dict:
    """Per model size, the replicated cell (most seeds, then the shortest budget): the cell the table shows."""
    out = {}
    for model, g in gaps.groupby("model"):
        top = g[g["seeds"] == g["seeds"].max()]
        out[model] = float(top["tokens"].min())
    return out


def runs_from_archive(path: Path) -> tuple[pd.DataFrame, list[dict]]:
    """Every finished run's summary (run id, precision, model, wall-clock) and every failed run's state."""
    done, failed = [], []
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            name = m.name.rsplit("/", 1)[-1]
            if name not in (SUMMARY, STATE):
                continue
            data = json.load(tar.extractfile(m))
            if name == SUMMARY:
                done.append({"run_id": data["run_id"], "precision": data["precision"], "model": data["model"],
                             "wall_clock_s": float(data["wall_clock_s"])})
            elif data.get("state") == "failed":
                failed.append(data)
    summaries = pd.DataFrame(done)
    finished = set(summaries["run_id"]) if len(summaries) else set()
    return summaries, [f for f in failed if f["run_id"] not in finished]


def recipe_rows(gaps, fit, speed, order) -> list[dict]:
    effs = {e["scheme"]: e for e in fit["efficiencies"]}
    heads = {h["scheme"]: h for h in fit["headlines"]}
    tps = {r["config"].split(":")[0]: r["tokens_per_s"] for r in speed["rows"]}
    signs = sign_test(gaps).set_index("precision")
    cells = seed_cells(gaps)
    rows = [{"recipe": BASE, "effN": "1", "effD": "1", "gaps": {m: "—" for m in cells}, "sign": "—",
             "tps": tps.get(BASE), "x": 1.0, "breakeven": "—", "status": "base"}]
    for prec in order:
        e, h = effs.get(prec), heads.get(prec)
        row = {"recipe": prec, "tps": tps.get(prec), "x": tps[prec] / tps[BASE] if prec in tps else None}
        row["effN"] = _fmt_eff(e["eff_n"], e.get("eff_n_interval")) if e else "—"
        row["effD"] = _fmt_eff(e["eff_d"], e.get("eff_d_interval")) if e else "—"
        row["status"] = e["status"] if e else "not fitted"
        if h is None:
            row["breakeven"] = "—"
        else:
            z = h["breakeven_speedup"]
            row["breakeven"] = "never" if z is None else f"{z:.2f}×"
        row["gaps"] = {}
        for model, tokens in cells.items():
            g = gaps[(gaps["precision"] == prec) & (gaps["model"] == model) & (gaps["tokens"] == tokens)]
            if g.empty:
                row["gaps"][model] = "—"
                continue
            g = g.iloc[0]
            short = "" if g["seeds"] >= gaps["seeds"].max() else f" ({int(g['seeds'])} seeds)"
            row["gaps"][model] = f"{g['gap']:+.3f} ± {g['noise_sd']:.3f} {VERDICT[g['verdict']]}{short}"
        s = signs.loc[prec] if prec in signs.index else None
        row["sign"] = "—" if s is None else f"{int(s['worse_than_base'])}/{int(s['cells'])} (p {s['p_two_sided']:.2g})"
        rows.append(row)
    return rows


def head_to_head(losses: pd.DataFrame, pairs=HEAD_TO_HEAD) -> pd.DataFrame:
    """Recipe a against recipe b: the paired gap L(a, s) − L(b, s) per cell, judged against its own seed sd
    (analysis.ladder's rules with b as the baseline), and the sign test over cells."""
    rows = []
    for a, b in pairs:
        sub = losses[losses["precision"].isin([a, b])]
        if not {a, b} <= set(sub["precision"]):
            continue
        g = cell_gaps(sub, base=b, noise=seed_noise(sub, base=b))
        s = sign_test(g).iloc[0]
        judged = g["verdict"].value_counts().to_dict()
        rows.append({"a": a, "b": b, "cells": int(s["cells"]), "a_worse": int(s["worse_than_base"]),
                     "p": float(s["p_two_sided"]), "mean_gap": float(g["gap"].mean()),
                     "min_gap": float(g["gap"].min()), "max_gap": float(g["gap"].max()),
                     "above": judged.get("above noise", 0), "within": judged.get("within noise", 0),
                     "below": judged.get("below noise", 0)})
    return pd.DataFrame(rows)


def markdown(rows, cells, gaps, fit, speed, h2h, summaries, failed) -> str:
    sizes = [f"gap {SIZE_LABEL.get(m, m)} (D/N {t / gaps[gaps['model'] == m]['n_params'].iloc[0]:.0f})"
             for m, t in cells.items()]
    heads = fit["headlines"]
    at = f"N = {heads[0]['at_n']:.3g}, D/N = {heads[0]['at_ratio']:g}" if heads else "—"
    out = ["<!-- written by benchmarks/recipes_table.py; do not edit by hand -->", "",
           "| recipe | effN [95%] | effD [95%] | " + " | ".join(sizes)
           + " | worse than bf16 (sign test) | tokens/s | × bf16 | break-even speedup |",
           "|---" * (7 + len(sizes)) + "|"]
    for r in rows:
        tps = "—" if r["tps"] is None else _fmt_int(r["tps"])
        x = "—" if r["x"] is None else f"{r['x']:.2f}"
        out.append(f"| `{r['recipe']}` | {r['effN']} | {r['effD']} | " + " | ".join(r["gaps"][m] for m in cells)
                   + f" | {r['sign']} | {tps} | {x} | {r['breakeven']} |")
    base = fit["base"]
    by_status: dict = {}
    for e in fit["efficiencies"]:
        by_status.setdefault((e["status"], e["message"]), []).append(e["scheme"])
    out += ["", f"Break-even speedups at {at}. Base law ({base['law']}, {base['n_points']} bf16 cells): "
            f"{base['status']} ({base['message']}).",
            "Efficiency fits: " + "; ".join(f"{', '.join(v)}: {k[0]}" + (f" ({k[1]})" if k[0] != "converged" else "")
                                            for k, v in by_status.items()) + "."]
    if any(r["status"] != "converged" for r in rows[1:]):
        out.append("A flagged fit's effN, effD and break-even are not findings: read the gaps and the sign test.")
    out += ["", f"Speed: {speed['device']}, torch {speed['torch']}, llama_7m, 65,536 tokens per step, CUDA graphs "
            "(recipe_speed.json).", ""]
    if len(h2h):
        out += ["| recipe a − recipe b | cells a worse (sign test) | mean paired gap (range) | cells above / within / "
                "below the pair's seed sd |", "|---|---|---|---|"]
        for _, h in h2h.iterrows():
            out.append(f"| `{h['a']}` − `{h['b']}` | {h['a_worse']}/{h['cells']} (p {h['p']:.2g}) | "
                       f"{h['mean_gap']:+.3f} ({h['min_gap']:+.3f} to {h['max_gap']:+.3f}) | "
                       f"{h['above']} / {h['within']} / {h['below']} |")
        out.append("")
    reused = summaries["precision"].isin(["bf16", "fp8", "quartet"])
    out.append(f"Runs: {len(summaries)} finished ({int((~reused).sum())} trained by this sweep, {int(reused.sum())} "
               f"the ladder's own bf16 / fp8 / quartet runs); summed run wall-clock {summaries.loc[~reused, 'wall_clock_s'].sum():,.0f} s "
               f"for the sweep's runs, {summaries.loc[reused, 'wall_clock_s'].sum():,.0f} s for the ladder's.")
    if failed:
        out.append(f"Failed ({len(failed)}): " + "; ".join(
            f"`{f['run_id']}` ({': '.join(str(f.get('error', '')).split(': ')[:2])})" for f in failed)
            + ".")
    else:
        out.append("Failed: none.")
    return "\n".join(out) + "\n"


def figure(gaps, fit, order, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    cells = seed_cells(gaps)
    models = list(cells)
    colors = dict(zip(models, ["#1b9e77", "#d95f02", "#7570b3", "#e7298a"]))
    effs = {e["scheme"]: e for e in fit["efficiencies"]}
    recipes = list(order)
    y = {p: len(recipes) - 1 - i for i, p in enumerate(recipes)}  # the table's first row on top
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12.5, 0.55 * len(recipes) + 2.4), sharey=True,
                                 gridspec_kw={"width_ratios": [1.25, 1]})
    offsets = np.linspace(-0.27, 0.27, len(models))
    for m, dy in zip(models, offsets):
        for p in recipes:
            g = gaps[(gaps["precision"] == p) & (gaps["model"] == m)]
            for _, r in g.iterrows():
                seeded = r["tokens"] == cells[m]
                ax.errorbar(r["gap"], y[p] + dy + (0 if seeded else 0.09), xerr=r["noise_sd"] if seeded else None,
                            fmt="o" if seeded else "D", ms=6 if seeded else 4.5, color=colors[m],
                            mfc=colors[m] if seeded else "white", capsize=2.5, lw=1.2, zorder=3)
    ax.axvline(0, color="0.3", lw=0.8)
    ax.set_xlabel("loss gap to bf16 (nats; paired by seed and data order)")
    ax.set_title("(a) gap to bf16 at every cell", fontsize=11)
    ax.set_yticks([y[p] for p in recipes], recipes)
    ax.grid(axis="x", alpha=0.3)
    for p in recipes:
        ax.axhline(y[p] - 0.5, color="0.9", lw=0.6, zorder=0)
    for key, dy, marker in (("eff_n", 0.13, "o"), ("eff_d", -0.13, "s")):
        for p in recipes:
            e = effs.get(p)
            if e is None:
                continue
            lo, hi = e.get(f"{key}_interval") or (e[key], e[key])
            flagged = e["status"] != "converged"
            bx.plot([lo, hi], [y[p] + dy] * 2, color="0.35" if key == "eff_n" else "#c44e52", lw=1.4, zorder=2)
            bx.plot(e[key], y[p] + dy, marker=marker, ms=6, color="0.35" if key == "eff_n" else "#c44e52",
                    mfc="white" if flagged else None, zorder=3)
    bx.axvline(1, color="0.3", lw=0.8)
    bx.set_xscale("log")
    bx.set_xlim(0.02, 6)
    bx.axvline(4, color="0.6", lw=0.8, ls=":")
    bx.text(4, len(recipes) - 0.45, "bound 4", fontsize=8, ha="center", va="bottom", color="0.4")
    bx.set_xlabel("fitted efficiency (95% bootstrap interval)")
    bx.set_title("(b) effN and effD under the fitted law", fontsize=11)
    bx.grid(axis="x", alpha=0.3)
    for p in recipes:
        bx.axhline(y[p] - 0.5, color="0.9", lw=0.6, zorder=0)
    ax.set_ylim(-0.6, len(recipes) - 0.2)
    handles = [Line2D([], [], color=colors[m], marker="o", ls="", label=f"N = {SIZE_LABEL.get(m, m)}") for m in models]
    handles += [Line2D([], [], color="0.3", marker="o", ls="-", label=f"{int(gaps['seeds'].max())}-seed cell: mean ± paired-gap sd"),
                Line2D([], [], color="0.3", marker="D", mfc="white", ms=4.5, ls="",
                       label="other budget, 1 seed (judged by that sd)"),
                Line2D([], [], color="0.35", marker="o", ls="-", label="effN"),
                Line2D([], [], color="#c44e52", marker="s", ls="-", label="effD"),
                Line2D([], [], color="0.35", marker="o", mfc="white", ls="", label="open: fit flagged (not converged)")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.075, 1, 1))
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS, help="folder with the ladder report, fit.json, "
                   "recipe_speed.json and runs.tar.gz (default benchmarks/results/recipes)")
    p.add_argument("--out", type=Path, default=None, help="where table.md and recipes.png go (default: --results)")
    p.add_argument("--docs", default=str(DOCS.relative_to(REPO)), help="a page whose block between the markers "
                   f"'<!-- {PAGE_BLOCK}: begin -->' and '<!-- {PAGE_BLOCK}: end -->' becomes table.md (default docs/recipes.md; '' leaves pages alone)")
    args = p.parse_args(argv)
    res, out = args.results, args.out or args.results
    gaps = pd.read_csv(res / "gaps.csv")
    losses = pd.read_csv(res / "losses.csv")
    fit = json.loads((res / "fit.json").read_text())
    speed = json.loads((res / "recipe_speed.json").read_text())
    summaries, failed = runs_from_archive(res / "runs.tar.gz")
    cells = seed_cells(gaps)
    # rows in the order of the largest size's replicated gap: the scale the table is closest to answering for
    largest = gaps[gaps["n_params"] == gaps["n_params"].max()]["model"].iloc[0]
    seeded = gaps[(gaps["model"] == largest) & (gaps["tokens"] == cells[largest])]
    order = list(seeded.sort_values("gap")["precision"])
    order += sorted(set(gaps["precision"]) - set(order))
    rows = recipe_rows(gaps, fit, speed, order)
    h2h = head_to_head(losses)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(markdown(rows, cells, gaps, fit, speed, h2h, summaries, failed))
    fig = figure(gaps, fit, order, out / "recipes.png")
    print((out / "table.md").read_text())
    print(f"wrote {out / 'table.md'} and {fig}")
    if args.docs:
        page = Path(args.docs) if Path(args.docs).is_absolute() else REPO / args.docs
        if update_marked_block(page, PAGE_BLOCK, (out / "table.md").read_text()):
            print(f"updated the table in {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
