"""The questions a seed-replicated ladder answers before any law is fitted: how large is seed noise, and
is each precision's loss gap to the baseline larger than it?

A *cell* is one (model, token budget). Runs of a cell that share a seed share everything but the precision
(``run.seed`` and ``run.data_seed`` are config values the sweep never derives from the precision), so the
gap of precision p in replicate s is paired:

    g_p,s = L(p, s) − L(base, s)

*Seed noise* is measured where a cell was run with several seeds: per precision the sample standard deviation
of L over seeds, and per precision the standard deviation of the paired gap g_p,s over seeds (the noise of
the quantity the comparison is about). A cell's gap (the mean of its paired gaps) is judged against the
paired-gap noise measured at the same model size, at the replicated budget nearest to the cell's (in log
tokens; the larger noise on a tie) — noise shrinks as a run trains longer, so a short budget's noise would
flatter nothing at a long one and a long budget's would flatter a short one — and the largest of all sizes
if the size has no replicated cell: ``above noise`` when gap − noise > 0, with the margin and
the ratio gap / noise reported either way. One standard deviation is a low bar; the ratio says how far past
it a cell is.

Pure pandas: no torch, no fitting. :func:`write_report` writes the tables (CSV + Markdown) and figures.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.errors import AnalysisError

#: the loss table columns that ``quartet fit`` reads (plus the ladder's own)
LOSS_COLUMNS = ("n_params", "tokens", "forward", "backward", "loss", "seed", "model", "precision")


def loss_table(df: pd.DataFrame) -> pd.DataFrame:
    """The runs as a tidy loss table: ``LOSS_COLUMNS`` + run_id, steps, tokens_per_param; sorted."""
    missing = [c for c in LOSS_COLUMNS if c not in df.columns]
    if missing:
        raise AnalysisError(f"ladder: the runs lack column(s) {', '.join(missing)}")
    if df["seed"].isna().any():
        raise AnalysisError(f"ladder: {int(df['seed'].isna().sum())} of {len(df)} runs have no seed; the ladder compares "
                            f"seed replicates, so a loss table needs a seed column (runs directories record it)")
    out = df.copy()
    out["tokens_per_param"] = (out["tokens"] / out["n_params"]).round(2)
    cols = list(LOSS_COLUMNS) + [c for c in ("run_id", "steps", "tokens_per_param") if c in out.columns]
    out = out[cols].sort_values(["n_params", "tokens", "precision", "seed"]).reset_index(drop=True)
    out["seed"] = out["seed"].astype(int)
    return out


def _check_base(df: pd.DataFrame, base: str) -> None:
    if base not in set(df["precision"]):
        raise AnalysisError(f"ladder: no {base!r} runs to compare against; precisions: "
                            f"{', '.join(sorted(set(df['precision'])))}")


def paired_gaps(df: pd.DataFrame, base: str = "bf16") -> pd.DataFrame:
    """One row per (cell, precision ≠ base, seed) present with the base: the paired gap L(p, s) − L(base, s)."""
    _check_base(df, base)
    keys = ["model", "n_params", "tokens", "seed"]
    b = df[df["precision"] == base][keys + ["loss"]].rename(columns={"loss": "base_loss"})
    other = df[df["precision"] != base][keys + ["precision", "loss"]]
    pairs = other.merge(b, on=keys, how="inner")
    pairs["gap"] = pairs["loss"] - pairs["base_loss"]
    return pairs.sort_values(["n_params", "tokens", "precision", "seed"]).reset_index(drop=True)


def seed_noise(df: pd.DataFrame, base: str = "bf16") -> pd.DataFrame:
    """Noise measured at every replicated cell: per precision, seeds, mean and sd of L, sd of the paired gap."""
    _check_base(df, base)
    cells = df.groupby(["model", "n_params", "tokens"])["seed"].nunique()
    replicated = cells[cells >= 2].index
    if len(replicated) == 0:
        raise AnalysisError("ladder: no cell was run with 2 or more seeds, so seed noise cannot be measured; "
                            "add seed replicates (sweep include: run.seed / run.data_seed)")
    gaps = paired_gaps(df, base)
    rows = []
    for model, n, d in replicated:
        cell = df[(df["model"] == model) & (df["n_params"] == n) & (df["tokens"] == d)]
        for prec, grp in cell.groupby("precision"):
            g = gaps[(gaps["model"] == model) & (gaps["tokens"] == d) & (gaps["precision"] == prec)]["gap"]
            rows.append({"model": model, "n_params": n, "tokens": d, "precision": prec, "seeds": grp["seed"].nunique(),
                         "loss_mean": grp["loss"].mean(), "loss_sd": grp["loss"].std(ddof=1),
                         "gap_mean": g.mean() if len(g) else np.nan,
                         "gap_sd": g.std(ddof=1) if len(g) >= 2 else np.nan})
    return pd.DataFrame(rows).sort_values(["n_params", "tokens", "precision"]).reset_index(drop=True)


def cell_gaps(df: pd.DataFrame, base: str = "bf16", noise: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (cell, precision ≠ base): mean paired gap, the noise it is judged against, margin, ratio, verdict.

    The noise of a cell is the paired-gap sd of that precision measured at the same model size, at the
    replicated budget nearest in log tokens (the larger sd on a tie); with no replicated cell at that size,
    the largest sd over all sizes; with none of that precision (a sweep still running), NaN and the verdict "noise
    not measured". ``noise_from`` says which.
    """
    noise = seed_noise(df, base) if noise is None else noise
    gaps = paired_gaps(df, base)
    ref = noise.dropna(subset=["gap_sd"])
    rows = []
    for (model, n, d, prec), grp in gaps.groupby(["model", "n_params", "tokens", "precision"]):
        same = ref[(ref["model"] == model) & (ref["precision"] == prec)]
        if len(same):
            dist = (np.log(same["tokens"].astype(float)) - np.log(float(d))).abs().round(9)
            near = same[dist == dist.min()]
            sd = float(near["gap_sd"].max())
            d_ref = float(near.loc[near["gap_sd"].idxmax(), "tokens"])
            where = f"this size, D/N {d_ref / n:.3g}"
        else:
            pool = ref[ref["precision"] == prec]
            # a sweep still running may have no replicated cell of this precision yet: its gaps are listed, unjudged
            sd, where = ((float(pool["gap_sd"].max()), "largest of all sizes") if len(pool)
                         else (np.nan, "not measured"))
        gap = float(grp["gap"].mean())
        rows.append({"model": model, "n_params": n, "tokens": d, "tokens_per_param": round(d / n, 2), "precision": prec,
                     "seeds": int(grp["seed"].nunique()), "base_loss": float(grp["base_loss"].mean()),
                     "loss": float(grp["loss"].mean()), "gap": gap, "noise_sd": sd, "noise_from": where,
                     "margin": gap - sd, "ratio": np.nan if np.isnan(sd) else gap / sd if sd > 0 else np.inf,
                     "verdict": ("noise not measured" if np.isnan(sd) else "above noise" if gap > sd
                                 else "below noise" if gap < -sd else "within noise")})
    return pd.DataFrame(rows).sort_values(["precision", "n_params", "tokens"]).reset_index(drop=True)


def sign_test(gaps: pd.DataFrame) -> pd.DataFrame:
    """Per precision: in how many cells its mean gap to the baseline is positive, and the two-sided sign-test
    p-value of that count under "no effect" (each cell's sign a fair coin; cells treated as independent).
    Needs no noise estimate, so it complements the per-cell verdicts where seed noise is large."""
    from math import comb

    rows = []
    for prec, g in gaps.groupby("precision"):
        n, k = int(len(g)), int((g["gap"] > 0).sum())
        tail = sum(comb(n, i) for i in range(max(k, n - k), n + 1)) / 2 ** n
        rows.append({"precision": prec, "cells": n, "worse_than_base": k, "p_two_sided": min(1.0, 2 * tail)})
    return pd.DataFrame(rows)


def orders(df: pd.DataFrame, base: str = "bf16") -> dict:
    """Whether the baseline's losses fall with N at every budget and with D at every size (seed-0 runs)."""
    b = df[(df["precision"] == base) & (df["seed"] == df["seed"].min())]
    by_n = all(np.all(np.diff(g.sort_values("n_params")["loss"].to_numpy()) < 0)
               for _, g in b.groupby((b["tokens"] / b["n_params"]).round(2)))
    by_d = all(np.all(np.diff(g.sort_values("tokens")["loss"].to_numpy()) < 0) for _, g in b.groupby("n_params"))
    return {"falls_with_n": bool(by_n), "falls_with_d": bool(by_d)}


def markdown_table(frame: pd.DataFrame, floats: str = "{:.4f}") -> str:
    """A GitHub Markdown table of ``frame`` (floats formatted, no index)."""
    def fmt(v):
        if isinstance(v, (float, np.floating)):
            if not np.isfinite(v):
                return "-"
            if float(v).is_integer():
                return f"{int(v):,}"
            # a small figure (a fit's cost, 1e-5) keeps its digits instead of printing as 0.0000
            return f"{v:.3e}" if 0 < abs(v) < 1e-3 else floats.format(v)
        return f"{v:,}" if isinstance(v, (int, np.integer)) and abs(v) >= 1000 else str(v)

    head = "| " + " | ".join(frame.columns) + " |"
    sep = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, sep, *body])


def loss_grid(df: pd.DataFrame) -> pd.DataFrame:
    """Mean loss per cell (rows: model, D/N; columns: precision), with the number of seeds behind each."""
    t = df.assign(dn=(df["tokens"] / df["n_params"]).round(1))
    mean = t.pivot_table(index=["model", "n_params", "dn"], columns="precision", values="loss", aggfunc="mean")
    seeds = t.groupby(["model", "n_params", "dn"])["seed"].nunique().rename("seeds")
    out = mean.join(seeds).reset_index().sort_values(["n_params", "dn"])
    return out.drop(columns="n_params")


def write_report(df: pd.DataFrame, out_dir: str | Path, base: str = "bf16", curves: bool = True) -> list[Path]:
    """losses.csv, noise.csv, gaps.csv, e_profile.csv, ladder.md and the figures (PNG + PDF) into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = loss_table(df)
    noise = seed_noise(table, base)
    gaps = cell_gaps(table, base, noise)
    paths = []
    for name, frame in (("losses.csv", table), ("noise.csv", noise), ("gaps.csv", gaps)):
        frame.to_csv(out / name, index=False)
        paths.append(out / name)
    o = orders(table, base)
    lines = ["# Ladder: losses, seed noise and gaps to " + base, "",
             f"{len(table)} runs; {base} losses fall with N at every budget: {o['falls_with_n']}; "
             f"with D at every size: {o['falls_with_d']}.", "", "## Loss per cell (mean over seeds)", "",
             markdown_table(loss_grid(table)), "", "## Seed noise (replicated cells)", "",
             markdown_table(noise), "", f"## Gap to {base} per cell, judged against the paired-gap noise", "",
             markdown_table(gaps[["model", "tokens_per_param", "precision", "seeds", "gap", "noise_sd", "margin",
                                  "ratio", "verdict"]]), "", f"## Sign of the gap to {base} over cells", "",
             markdown_table(sign_test(gaps), floats="{:.3g}"), ""]
    profile = None
    try:
        from analysis.load import frame_from_table
        from analysis.report import e_profile, profile_ranges

        profile = e_profile(frame_from_table(table, name="ladder"))
    except AnalysisError as exc:
        lines += ["## The fit profiled over E", "", f"not computed: {exc}", ""]
    if profile is not None:
        profile.to_csv(out / "e_profile.csv", index=False)
        paths.append(out / "e_profile.csv")
        ranges = profile_ranges(profile)
        noise = profile.attrs.get("seed_noise_log")
        lines += ["## The fit profiled over the irreducible loss E", "",
                  "E fixed on a grid, the rest of the base law and every efficiency refitted (Busbridge form, one "
                  f"point per cell). Admissible: the base fit's RMS log residual is within the pooled seed noise "
                  f"({noise:.4f}).", "", markdown_table(profile), ""]
        if ranges:
            lo, hi = ranges["E"]
            lines.append(f"Over the admissible E in [{lo:.3g}, {hi:.3g}]:")
            for label, r in ranges.items():
                if label != "E":
                    lines.append(f"- {label}: effN {r['eff_n'][0]:.3f} to {r['eff_n'][1]:.3f}, effD {r['eff_d'][0]:.3f} "
                                 f"to {r['eff_d'][1]:.3f}")
            lines.append("")
    (out / "ladder.md").write_text("\n".join(lines))
    paths.append(out / "ladder.md")
    from analysis import figures  # matplotlib only when figures are written

    paths += figures.plot_ladder_losses(table, out)
    paths += figures.plot_ladder_gaps(gaps, out)
    if profile is not None:
        paths += figures.plot_e_profile(profile, out)
    if curves and "path" in df.columns:
        paths += figures.plot_training_curves(df, out)
        paths += figures.plot_seed_curves(df, out)
    return paths


def cli_main(argv: list[str] | None = None) -> int:
    """``quartet ladder SOURCE [--out DIR] [--base bf16]``: seed noise, gaps vs noise, loss table, figures."""
    import argparse
    import sys

    from analysis.load import load

    p = argparse.ArgumentParser(prog="quartet ladder", description="Seed noise and each precision's gap to the "
                                "baseline per cell of a seed-replicated sweep; writes losses.csv (the table "
                                "`quartet fit` reads), noise.csv, gaps.csv, ladder.md and figures.")
    p.add_argument("source", help="runs directory (or a loss table with a seed column)")
    p.add_argument("--out", type=Path, default=Path("ladder_report"), help="output folder (default ./ladder_report)")
    p.add_argument("--base", default="bf16", help="baseline precision (default bf16)")
    args = p.parse_args(argv)
    try:
        from analysis.cli import check_writable

        check_writable(args.out, "--out", folder=True)
        df = load(args.source)
        paths = write_report(df, args.out, args.base)
    except AnalysisError as exc:
        print(f"quartet ladder: {exc}", file=sys.stderr)
        return 2
    print((args.out / "ladder.md").read_text())
    print(f"wrote {len(paths)} files to {args.out}/")
    return 0
