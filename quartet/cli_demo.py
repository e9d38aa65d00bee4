"""``quartet demo`` — the README's main command: a real (tiny) low-precision scaling-law study.

On a laptop-sized CPU, with no network, it runs the same pipeline a user runs on a Slurm cluster:

1. prepare the bundled corpus (Shakespeare, BPE trained locally; cached after the first run);
2. launch the ``demo`` sweep through the sweep launcher with the ``local`` profile (tiny Llamas × token
   budgets × {bf16, fp8, quartet, luq_int4}, seed replicates at two cells); finished runs are reused, so a
   second call trains nothing;
3. measure what a study must measure before any law: seed noise, each precision's gap to bf16 per cell
   judged against it, a sign test; then fit the low-precision scaling law (base law on bf16; effN / effD per
   precision with bootstrap intervals and honest statuses), and the paper's published loss grid next to it;
4. write figures (PNG + PDF) and ``report.md`` into one results folder and print its path.

This module is part of the CLI dispatcher layer, which sits above the library, ``cluster/`` and ``analysis/``:
only :mod:`quartet.cli` imports it, and it drives the three packages (each imported lazily). Nothing in the
library imports it (``tests/test_layering.py`` holds this).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from quartet.errors import QuartetError
from quartet.paths import REPO_ROOT, runs_root

#: ``quartet demo --quick``: the demo's smaller grid (sweeps/demo_quick.yaml, every run one of the demo's)
QUICK_SWEEP = "demo_quick"
#: The committed results of the one-GPU ladder (docs/ladder.md); the report quotes its headline from them.
LADDER_RESULTS = REPO_ROOT / "benchmarks" / "results" / "ladder"

#: What the paper's notebook gives on the same grid (Table 6 / notebook 6ddd368), shown beside our fit.
PAPER_BASE = {"A": 1.52e5, "alpha": 0.589, "B": 5.25e5, "beta": 0.544, "E": 1.35, "gamma": 0.274}
PAPER_EFF = {  # scheme label in the bundled grid -> (effN, effD) published in the notebook
    "quest:bf16": (0.6478, None), "sr_absmax:bf16": (0.4353, None), "rtn_absmax:bf16": (0.6076, None),
    "bf16:sr_absmax": (None, 0.8549), "bf16:rtn_absmax": (None, 0.8315),
    "quest:sr_absmax": (0.6418, 0.9435), "luq-int4:luq-int4": (0.5032, 0.1538), "luq-fp4:luq-fp4": (0.0108, 0.0882),
}


# ----------------------------------------------------------------------------------------- steps
def prepare_corpus(data_override: str) -> dict:
    """Tokenize the sweep's corpus into shards once (reused later); returns its manifest (+ ``folder``)."""
    from quartet.config import compose
    from quartet.data import prepare, read_manifest

    cfg = compose([f"data={data_override}"])
    t0 = time.time()
    folder = prepare(cfg.data, progress=sys.stderr.isatty())
    man = read_manifest(folder)
    print(f"[1/4 data] {man['name']}: {man['splits']['train']['tokens']:,} train / "
          f"{man['splits']['val']['tokens']:,} val tokens, vocab {man['tokenizer']['vocab_size']} "
          f"({time.time() - t0:.1f} s) -> {folder}")
    return {**man, "folder": str(folder)}


def run_sweep(sweep: str, runs_dir: Path) -> tuple[Path, set[str]]:
    """Launch ``sweep`` with the local profile (only unfinished runs train); returns its group folder and the
    run ids of its plan (the folder may hold runs of an earlier version of the sweep)."""
    from rich.console import Console

    from cluster.launch import check_corrupt, claim_and_prepare, make_plan, run_local

    console = Console(width=None if sys.stdout.isatty() else 160)
    plan = make_plan(sweep, "local", [], str(runs_dir))
    check_corrupt(plan)
    todo = plan.pending()
    print(f"[2/4 sweep] {sweep}: {len(plan.runs)} runs ({len(plan.runs) - len(todo)} already finished, "
          f"{len(todo)} to train) in {plan.group_dir}")
    if todo:
        claimed, taken = claim_and_prepare(plan, todo)
        if taken:
            print(f"[2/4 sweep] {len(taken)} run(s) are being trained by another launch; not waiting for them")
        if claimed:
            _, failed, stopped = run_local(plan, claimed, console)
            if failed or stopped:
                raise QuartetError(f"{failed} run(s) failed and {stopped} stopped; see `quartet status {sweep} "
                                   f"--runs-dir {runs_dir}` (rerun `quartet demo` to resume)")
    return plan.group_dir, {r.run_id for r in plan.runs}


def _fingerprint(group_dir: Path, run_ids: set[str]) -> str:
    """Hash of the plan's finished runs' summaries + this code version: unchanged inputs -> reuse the report."""
    h = hashlib.sha256()
    for p in sorted(group_dir.glob("*/summary.json")):
        if p.parent.name not in run_ids:
            continue
        h.update(p.parent.name.encode())
        h.update(p.read_bytes())
    for mod in ("analysis/report.py", "analysis/fit.py", "analysis/figures.py", "analysis/ladder.py", "quartet/cli_demo.py"):
        f = REPO_ROOT / mod
        if f.exists():
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def analyse(group_dir: Path, out: Path, bootstrap: int, run_ids: set[str] | None = None) -> dict:
    """Noise, gaps and the fit of the tiny study, and the paper grid's refit; figures and fit JSONs."""
    import analysis
    from analysis import figures
    from analysis.figures import make_all
    from analysis.ladder import cell_gaps, loss_table, orders, seed_noise, sign_test

    t0 = time.time()
    df = analysis.load(group_dir)
    if run_ids is not None:
        stale = sorted(set(df["run_id"]) - run_ids)
        if stale:  # runs of an earlier version of the sweep: not part of this study
            print(f"[3/4 fit] leaving out {len(stale)} run(s) in {group_dir} that the sweep no longer plans")
            attrs = dict(df.attrs)
            df = df[df["run_id"].isin(run_ids)].reset_index(drop=True)
            df.attrs = attrs
    study_dir = out / "study"
    ladder = None
    if df.groupby(["n_params", "tokens"])["seed"].nunique().max() >= 2:
        table = loss_table(df)
        noise = seed_noise(table)
        gaps = cell_gaps(table, noise=noise)
        ladder = {"table": table, "noise": noise, "gaps": gaps, "signs": sign_test(gaps), "orders": orders(table)}
        ladder_figs = (figures.plot_ladder_losses(table, study_dir) + figures.plot_ladder_gaps(gaps, study_dir)
                       + figures.plot_training_curves(df, study_dir) + figures.plot_seed_curves(df, study_dir))
    else:
        ladder_figs = figures.plot_training_curves(df, study_dir)
    # The paper's 6-parameter form first; a tiny grid (9 base cells) can leave it under-determined (a parameter on
    # its bound), and then the report says so and uses the γ = 1 (Hoffmann) special case.
    study = analysis.fit_all(df, law="busbridge", bootstrap=bootstrap)
    law_note = f"Busbridge form (the paper's): {study.base.status} ({study.base.message})."
    if study.base.status != "converged":
        study = analysis.fit_all(df, law="hoffmann", bootstrap=bootstrap)
        law_note += (f" With {study.base.n_points} base points that form is under-determined, so the tables use "
                     f"its γ = 1 special case (Hoffmann): {study.base.status} ({study.base.message}).")
    study.to_json(study_dir / "fit.json")
    # no break-even or optimal-precision panels for the study: they would extrapolate its ≤ 1e5-parameter law
    # to 1e7-1e11 (the paper refit draws them, from its own range)
    study_figs = (figures.plot_losses(study, df, study_dir) + figures.plot_efficiencies(study, study_dir)
                  + figures.plot_residuals(study, df, study_dir))
    paper_df = analysis.load("paper")
    paper = analysis.fit_all(paper_df, bootstrap=0)
    paper.to_json(out / "paper" / "fit.json")
    paper_figs = make_all(paper, paper_df, out / "paper")
    print(f"[3/4 fit] tiny study: {len(df)} runs, base law {study.base.status}; paper grid: {len(paper_df)} runs "
          f"({time.time() - t0:.1f} s incl. figures)")
    if ladder is not None:
        for prec, g in ladder["gaps"].groupby("precision"):
            above = int((g["verdict"] == "above noise").sum())
            print(f"          • {prec}: gap to bf16 above seed noise in {above} of {len(g)} cells "
                  f"(mean {g['gap'].mean():+.3f} nats)")
    for h in study.headlines:
        print(f"          • {h['text']}")
    return {"df": df, "ladder": ladder, "study": study, "law_note": law_note, "paper_df": paper_df, "paper": paper,
            "figs": [p for p in ladder_figs + study_figs + paper_figs if p.suffix == ".png"]}


# ----------------------------------------------------------------------------------------- report
def _fmt_interval(iv) -> str:
    return "" if not iv or any(v is None for v in iv) else f" [{iv[0]:.3g}, {iv[1]:.3g}]"


def _base_md(report, paper_ref: dict | None) -> list[str]:
    d = report.to_dict()["base"]
    ivs = d.get("intervals", {})
    cols = ["parameter", "fit", "95% bootstrap interval"] + (["paper (Table 6)"] if paper_ref else [])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for k in ("A", "alpha", "B", "beta", "E", "gamma"):
        row = [k, f"{d['params'][k]:.4g}", _fmt_interval(ivs.get(k)).strip() or "–"]
        if paper_ref:
            row.append(f"{paper_ref[k]:.4g}")
        lines.append("| " + " | ".join(row) + " |")
    lines.append(f"\nstatus: **{d['status']}** ({d['message']}), {d['n_points']} points, Huber cost {d['cost']:.3g}")
    return lines


def _eff_md(report, paper_ref: dict | None) -> list[str]:
    cols = ["precision (fwd:bwd)", "effN", "effD", "status", "points"] + (["paper effN / effD"] if paper_ref else [])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for e in report.to_dict()["efficiencies"]:
        label = f"{e['forward']}:{e['backward']}"
        en = "–" if e["eff_n"] is None or e.get("kind") == "backward" else f"{e['eff_n']:.3f}{_fmt_interval(e.get('eff_n_interval'))}"
        ed = "–" if e["eff_d"] is None or e.get("kind") == "forward" else f"{e['eff_d']:.3f}{_fmt_interval(e.get('eff_d_interval'))}"
        row = [f"{e['scheme']} ({label})", en, ed, e["status"], str(e["n_points"])]
        if paper_ref is not None:
            ref = paper_ref.get(label)
            row.append("–" if ref is None else " / ".join("–" if v is None else f"{v:.4g}" for v in ref))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _design_md(df, data: dict | None, sweep: str, runs_dir: Path) -> list[str]:
    """What ran: the corpus as its manifest states it, the grid, the seeds, and per-precision time."""
    lines = []
    if data:
        tok = data.get("tokenizer", {})
        src = data.get("source", {})
        kind = src.get("source", "?") if isinstance(src, dict) else str(src)
        what = {"shakespeare": "Shakespeare's plays (the bundled corpus package)",
                "code": "this interpreter's Python source", "files": "your text files"}.get(kind, kind)
        lines.append(f"- **Data**: `{data.get('name')}`: {what}; a {str(tok.get('kind', 'bpe')).upper()} tokenizer "
                     f"trained locally on {tok.get('train_chars', 0):,} characters, vocabulary {tok.get('vocab_size')}; "
                     f"{data['splits']['train']['tokens']:,} train / {data['splits']['val']['tokens']:,} validation "
                     f"tokens; tokenizer sha256 `{str(tok.get('sha256', ''))[:12]}…` (`{data.get('folder')}`).")
    sizes = ", ".join(f"{m} (N = {int(n):,})" for m, n in
                      df[["model", "n_params"]].drop_duplicates().sort_values("n_params").itertuples(index=False))
    budgets = ", ".join(f"{int(d):,}" for d in sorted(df["tokens"].unique()))
    reps = df.groupby(["model", "tokens"])["seed"].nunique()
    rep_cells = ", ".join(f"{m} @ {int(d):,} tokens" for (m, d), k in reps.items() if k >= 2) or "none"
    lines += [f"- **Grid**: {sizes} × budgets of {budgets} tokens × precisions "
              f"{', '.join(sorted(df['precision'].unique(), key=lambda p: (p != 'bf16', p)))}; "
              f"{len(df)} runs. Seeds 0, 1, 2 (each with its own data order, shared by every precision of a "
              f"replicate) at: {rep_cells}.",
              f"- **Runs**: `{runs_dir / sweep}` (sweep `{sweep}`, launched with `--cluster local`); re-running "
              "the demo reuses finished runs."]
    if "wall_clock_s" in df.columns and df["wall_clock_s"].notna().any():
        lines += ["", "| precision | runs | wall time of the runs, summed (s) | median tokens/s |", "|---|---|---|---|"]
        for prec, g in sorted(df.groupby("precision"), key=lambda t: (t[0] != "bf16", t[0])):
            lines.append(f"| {prec} | {len(g)} | {g['wall_clock_s'].sum():.0f} | {g['tokens_per_s'].median():,.0f} |")
    return lines


def _verdict_md(ladder: dict | None, study, scale: str = "") -> list[str]:
    """The paragraph a reader wants first: what this tiny study can and cannot tell, from its own numbers."""
    if ladder is None:
        return ["No cell was run with several seeds, so no gap can be judged against noise."]
    gaps, signs = ladder["gaps"], ladder["signs"].set_index("precision")
    out = []
    for prec, g in sorted(gaps.groupby("precision"), key=lambda t: -t[1]["gap"].mean()):
        above = int((g["verdict"] == "above noise").sum())
        below = int((g["verdict"] == "below noise").sum())
        sign = signs.loc[prec]
        what = (f"**{prec}** is worse than bf16 in {int(sign['worse_than_base'])} of {int(sign['cells'])} cells "
                f"(mean gap {g['gap'].mean():+.3f} nats; sign test p = {sign['p_two_sided']:.2g}); its gap exceeds "
                f"one sd of the paired seed noise in {above} cell(s)")
        what += f", is below minus one sd in {below}" if below else ""
        within = len(g) - above - below
        what += f" and is within noise in {within}." if within else "."
        consistent = sign["p_two_sided"] < 0.05
        if consistent and g["gap"].mean() > 0 and above >= (len(g) + 1) // 2:
            what += " A cost this study measures."
        elif consistent and g["gap"].mean() < 0:
            what += (" Consistently *better* than bf16 here — at this tiny scale, not a claim about real "
                     "training (see below).")
        elif not consistent:
            what += (" No consistent effect: its gaps change sign from cell to cell (sign test), so whatever it "
                     "costs at this scale is smaller than the noise.")
        else:
            what += " Indicative only: the sign is consistent, but most cells do not clear the noise."
        out.append(f"- {what}")
    effs = {e.scheme: e for e in study.efficiencies}
    found = [s for s, e in effs.items() if e.status == "converged"]
    out += ["", f"The scaling-law fit is **{study.base.status}**"
            + (f" ({study.base.message})" if study.base.status != "converged" else "")
            + (f"; efficiencies reported as findings: {', '.join(found)}." if found else
               "; no efficiency is a finding here (each inherits or carries its own flag)."),
            "",
            "**What it can tell you**: that the pipeline measures noise before it claims an effect, and that a "
            "format as lossy as LUQ-INT4 costs loss visibly even at 10⁴–10⁵ parameters. **What it cannot**: "
            f"quartet's or fp8's cost at real scale — {scale}, and a law fitted on {study.base.n_points} tiny cells says nothing "
            "about 10⁸ parameters." + _gpu_ladder_sentence()]
    return out


def _gpu_ladder() -> dict | None:
    """The committed one-GPU ladder's headline numbers, read from its result files (None where they are absent)."""
    import pandas as pd

    try:
        gaps = pd.read_csv(LADDER_RESULTS / "gaps.csv")
        losses = pd.read_csv(LADDER_RESULTS / "losses.csv")
    except (OSError, ValueError):
        return None
    q = gaps[gaps["precision"] == "quartet"]
    if q.empty or losses.empty:
        return None
    return {"worse": int((q["gap"] > 0).sum()), "above": int((q["verdict"] == "above noise").sum()), "cells": len(q),
            "n_min": float(losses["n_params"].min()), "n_max": float(losses["n_params"].max()), "runs": len(losses)}


def _millions(n: float) -> str:
    return f"{n / 1e6:.0f}M"


def _gpu_ladder_sentence() -> str:
    lad = _gpu_ladder()
    if lad is None:
        return ""
    return (f" The one-GPU ladder ([docs/ladder.md](../../docs/ladder.md), committed results in "
            f"`benchmarks/results/ladder/`) measured quartet worse than bf16 in {lad['worse']} of {lad['cells']} cells "
            f"({lad['above']} above seed noise) at {_millions(lad['n_min'])}–{_millions(lad['n_max'])} parameters, "
            f"{lad['runs']} runs.")


def _runs_md(df) -> list[str]:
    """Appendix: every run with its loss, wall time and throughput (what a reader checks when a cell looks odd)."""
    if "wall_clock_s" not in df.columns:
        return []
    cols = ["run_id", "precision", "seed", "loss", "steps", "wall_clock_s", "tokens_per_s"]
    t = df.sort_values(["n_params", "tokens", "precision", "seed"])[[c for c in cols if c in df.columns]]
    lines = ["## Appendix: every run", "", "| " + " | ".join(t.columns) + " |", "|" + "---|" * len(t.columns)]
    for r in t.itertuples(index=False):
        d = r._asdict()
        lines.append(f"| {d['run_id']} | {d['precision']} | {d['seed']} | {d['loss']:.4f} | {d.get('steps', '')} | "
                     f"{d['wall_clock_s']:.1f} | {d['tokens_per_s']:,.0f} |")
    return lines


def _scale_note(df) -> str:
    return (f"at ≤ {df['tokens'].max() / 1e6:.2g}M tokens and ≤ {df['n_params'].max():,.0f} parameters their effects "
            f"are of the order of the seed noise")


def write_report(out: Path, res: dict, sweep: str, runs_dir: Path, seconds: float, data: dict | None = None) -> Path:
    """Write ``report.md`` (design, noise and gaps, curves, fit, verdict, paper refit) into ``out``."""
    from analysis.ladder import loss_grid, markdown_table

    df, study, paper, ladder = res["df"], res["study"], res["paper"], res["ladder"]
    rel = lambda p: p.relative_to(out).as_posix()  # noqa: E731 - tiny local helper
    figs = {p.stem: p for p in res["figs"] if p.parent.name == "study"}

    def fig(*stems):
        return [f"![{st}]({rel(figs[st])})" for st in stems if st in figs]

    lines = [
        "# quartet demo — a tiny low-precision scaling-law study",
        "",
        f"Generated {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} by `quartet demo` on "
        f"{platform.node()} ({os.cpu_count()} CPU cores, {platform.python_implementation()} "
        f"{platform.python_version()}); pipeline time {seconds:.0f} s.",
        "",
        "## What this tiny study can and cannot tell you",
        "",
        *_verdict_md(ladder, study, _scale_note(df)),
        "",
        "## 1. What ran",
        "",
        *_design_md(df, data, sweep, runs_dir),
        "",
        "## 2. Final validation loss per cell (nats/token, mean over seeds)",
        "",
        *(markdown_table(loss_grid(ladder["table"] if ladder else df)).splitlines()),
        "",
    ]
    if ladder is not None:
        o = ladder["orders"]
        g = ladder["gaps"]
        lines += [
            f"bf16 losses fall with N at every budget: {o['falls_with_n']}; with D at every size: {o['falls_with_d']}.",
            "",
            "## 3. Seed noise, and each precision's gap to bf16",
            "",
            "Runs of one cell and seed share initialisation and data order across precisions, so a gap is paired: "
            "L(precision, seed) − L(bf16, seed). The noise of a gap is its standard deviation over seeds, measured at "
            "the replicated cells; every cell is judged against the noise of its size at the nearest replicated budget "
            "(the largest of all sizes where its size has none). One sd is a low bar; the ratio says how far past it.",
            "",
            *markdown_table(ladder["noise"]).splitlines(),
            "",
            *markdown_table(g[["model", "tokens_per_param", "precision", "seeds", "gap", "noise_sd", "ratio", "verdict"]]
                            ).splitlines(),
            "",
            *markdown_table(ladder["signs"], floats="{:.3g}").splitlines(),
            "",
            *fig("ladder_losses", "ladder_gaps"),
            "",
            "## 4. Training curves",
            "",
            *fig("ladder_curves", "ladder_seed_curves"),
            "",
        ]
    lines += [
        "## 5. Scaling-law fit of the tiny study",
        "",
        "L(N, D) = (A / (N·effN)^α + B / (D·effD)^β)^γ + E — base on bf16 runs (one point per cell, seeds averaged), "
        "then effN/effD per precision with the base frozen (log-space Huber loss, multi-start; intervals from "
        "bootstrap over cells). A status other than `converged` means the number is not a finding.",
        "",
        res["law_note"],
        "",
        *_base_md(study, None),
        "",
        *_eff_md(study, None),
        "",
        *[f"- {h['text']}" for h in study.headlines],
        "",
        *fig("losses", "efficiencies", "residuals"),
        "",
        "## 6. The paper's published grid, refitted (reproduction)",
        "",
        "Same code on the Quartet paper's loss grid (`analysis/data/quartet_paper_losses.csv`, from the authors' "
        "notebook), next to the published numbers:",
        "",
        *_base_md(paper, PAPER_BASE),
        "",
        *_eff_md(paper, PAPER_EFF),
        "",
        *[f"- {h['text']}" for h in paper.headlines],
        "",
        *[f"![{p.stem}]({rel(p)})" for p in res["figs"] if p.parent.name == "paper"],
        "",
        "## 7. From this demo to real scale",
        "",
        "One GPU: the ladder of [docs/ladder.md](../../docs/ladder.md) (`quartet sweep ladder_1gpu`, Python-code "
        "corpus). A cluster: the paper grid.",
        "",
        "```bash",
        "quartet data prepare data=c4                                  # C4 + Llama-2 tokenizer (needs the hub)",
        "quartet sweep paper_grid --cluster slurm_blackwell --dry-run  # the plan: runs, arrays, GPU-hours",
        "quartet sweep paper_grid --cluster slurm_blackwell            # submit (re-run to resume; done runs are skipped)",
        "quartet status paper_grid --watch",
        "quartet fit runs/paper_grid --bootstrap 200 --json fit.json",
        "quartet figures runs/paper_grid --out figures/paper_grid",
        "```",
        "",
        "Fit JSON: `study/fit.json`, `paper/fit.json` (schema in `docs/analysis.md`).",
        "",
        *_runs_md(df),
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


# ----------------------------------------------------------------------------------------- CLI
def cli_main(argv: list[str] | None = None) -> int:
    """``quartet demo``: data → smoke sweep (local) → fit → figures + report; prints the report's path."""
    p = argparse.ArgumentParser(prog="quartet demo", description=__doc__.splitlines()[0])
    p.add_argument("--sweep", default=None, help="sweep to run locally (default: demo; any smaller grid of yours)")
    p.add_argument("--quick", action="store_true",
                   help=f"the smaller demo ({QUICK_SWEEP}: about 30%% of the compute, for a slow or busy machine)")
    p.add_argument("--runs-dir", type=Path, default=None, help="runs root (default: $QUARTET_RUNS, else <checkout>/runs)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default: results/<sweep name>)")
    p.add_argument("--bootstrap", type=int, default=50, help="bootstrap resamples for the intervals (default 50)")
    args = p.parse_args(argv)
    if args.quick and args.sweep:
        p.error(f"--quick is the sweep {QUICK_SWEEP}; give --quick or --sweep, not both")
    args.sweep = QUICK_SWEEP if args.quick else args.sweep or "demo"
    args.out = args.out or REPO_ROOT / "results" / Path(args.sweep).stem
    runs_dir = args.runs_dir or runs_root()
    t0 = time.time()
    try:
        from cluster.spec import load_sweep

        data = prepare_corpus(str(load_sweep(args.sweep, []).fixed.get("data", "shakespeare")))
        group_dir, run_ids = run_sweep(args.sweep, runs_dir)
        out = args.out
        stamp = out / ".fingerprint"
        fp = _fingerprint(group_dir, run_ids)
        if stamp.exists() and stamp.read_text().strip() == fp and (out / "report.md").exists():
            print("[3/4 fit] runs unchanged since the last report: reusing it")
        else:
            out.mkdir(parents=True, exist_ok=True)
            res = analyse(group_dir, out, args.bootstrap, run_ids)
            report = write_report(out, res, args.sweep, runs_dir, time.time() - t0, data)
            stamp.write_text(fp + "\n")
            print(f"[4/4 report] {len(res['figs'])} figures + {report.name}")
    except QuartetError as exc:
        print(f"quartet: error: {exc}", file=sys.stderr)
        return 2
    print(f"\nreport: {out / 'report.md'}   ({time.time() - t0:.0f} s)")
    return 0
