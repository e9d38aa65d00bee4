"""Figures of a fit (matplotlib, Agg): losses with fitted curves, efficiencies, residuals, break-even
speedups and the optimal-precision maps (paper Fig. 1(b)/(c)). Each is written as PNG and PDF.

Every figure function takes a :class:`~analysis.report.FitReport` (and the tidy frame where it
plots data) and returns the paths it wrote; :func:`make_all` writes them all.
"""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from analysis.laws import predict  # noqa: E402
from analysis.report import FitReport, base_rows, scheme_groups, PAPER_SELECTIONS  # noqa: E402
from analysis.speed import MODEL_POINTS, OPTIONS, breakeven_speedup, optimal_map  # noqa: E402

#: the ladder's precisions keep these colours in every figure
PRECISION_COLORS = {"bf16": "#1f77b4", "fp8": "#2ca02c", "quartet": "#d62728", "quartet_sr": "#ff7f0e"}
OPTION_COLORS = {"FP8:FP8": "#9ecae1", "FP4:FP8": "#fdae6b", "FP8:FP4": "#a1d99b", "FP4:FP4": "#e6550d"}
plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 150, "font.size": 10, "axes.grid": True,
                     "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False})


def _save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    fig.tight_layout()
    for p in paths:
        fig.savefig(p, bbox_inches="tight")
    plt.close(fig)
    return paths


def scheme_colors(report: FitReport) -> dict:
    """One colour per precision for every figure of a report (tab20, in the order of the report's efficiencies;
    the ladder's named precisions keep their colours)."""
    palette = plt.get_cmap("tab20").colors
    out = {}
    for k, e in enumerate(report.efficiencies):
        out[e.scheme] = PRECISION_COLORS.get(e.scheme, palette[(2 * k) % 20 + (k // 10) % 2])
    return out


def extrapolation_note(n_fit: float, n_top: float) -> str:
    """What a title says about the N range it draws: where the law was fitted and, beyond 10x that, how far
    the figure extrapolates."""
    note = f"; law fitted up to N = {_fmt_n(n_fit)}"
    return note + (f", extrapolated {n_top / n_fit:.3g}x beyond it" if n_top > 10 * n_fit else "")


def _fmt_n(n: float) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}K"


def pick_fp4_scheme(report: FitReport) -> tuple[str, float, float]:
    """The FP4 scheme whose (effN, effD) feed the optimal-precision map.

    Preference: a scheme labelled ``quartet``; else a joint QuEST-forward fit (the paper's Quartet);
    else the converged joint fit with the largest effN·effD; else the best forward-only effN combined
    with the best backward-only effD.
    """
    usable = [e for e in report.efficiencies if np.isfinite(e.eff_n) and np.isfinite(e.eff_d)
              and e.status in ("converged", "too_few_points")]
    for e in usable:
        if e.scheme.lower().startswith("quartet") and e.kind == "joint":
            return e.scheme, e.eff_n, e.eff_d
    for e in usable:
        if e.kind == "joint" and e.forward == "quest":
            return e.scheme, e.eff_n, e.eff_d
    joint = [e for e in usable if e.kind == "joint" and e.status == "converged"]
    if joint:
        e = max(joint, key=lambda e: e.eff_n * e.eff_d)
        return e.scheme, e.eff_n, e.eff_d
    fwd = [e for e in usable if e.kind == "forward"]
    bwd = [e for e in usable if e.kind == "backward"]
    en = max((e.eff_n for e in fwd), default=1.0)
    ed = max((e.eff_d for e in bwd), default=1.0)
    return "best forward + best backward", en, ed


def _schemes_to_plot(report: FitReport, limit: int) -> list:
    effs = [e for e in report.efficiencies if np.isfinite(e.eff_n) and e.n_points >= 2]
    # Informative fits first: degenerate ones (an efficiency near 0: the law cannot describe the
    # method, e.g. unstable baselines) go last; then by coverage.
    effs.sort(key=lambda e: (min(e.eff_n, e.eff_d) < 0.05, e.status != "converged", -e.n_points, e.scheme))
    return effs[:limit]


def plot_losses(report: FitReport, df: pd.DataFrame, out_dir: Path, max_panels: int = 6) -> list[Path]:
    """Loss vs tokens per model size, with the fitted curves: baseline + the best-covered precisions."""
    selections = PAPER_SELECTIONS if report.provenance.get("options", {}).get("selections") else None
    groups = {label: rows for label, _, _, _, rows in scheme_groups(df, report.provenance["options"]["base_label"],
                                                                     selections)}
    panels = [("baseline (bf16)", base_rows(df, report.provenance["options"]["base_label"]), 1.0, 1.0)]
    for e in _schemes_to_plot(report, max_panels - 1):
        panels.append((f"{e.scheme} (effN={e.eff_n:.3f}, effD={e.eff_d:.3f})", groups.get(e.scheme), e.eff_n, e.eff_d))
    ncol = min(3, len(panels))
    nrow = int(np.ceil(len(panels) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.0 * ncol, 3.9 * nrow), squeeze=False, sharey=False)
    sizes = sorted(df["n_params"].unique())
    cmap = plt.get_cmap("viridis")
    colors = {n: cmap(i / max(1, len(sizes) - 1)) for i, n in enumerate(sizes)}
    for ax, (title, rows, en, ed) in zip(axes.ravel(), panels):
        if rows is None or rows.empty:
            ax.set_visible(False)
            continue
        for n, g in rows.groupby("n_params"):
            g = g.sort_values("tokens")
            ax.scatter(g["tokens"], g["loss"], color=colors[n], s=22, zorder=3, label=_fmt_n(n))
            d = np.geomspace(g["tokens"].min() / 1.5, g["tokens"].max() * 1.5, 100)
            ax.plot(d, predict(report.base.params, np.full_like(d, n), d, en, ed), color=colors[n], lw=1.2)
        ax.set_xscale("log")
        ax.set_xlabel("tokens D")
        ax.set_ylabel("validation loss (nats/token)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, title="N", title_fontsize=7, loc="upper right")
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    p = report.base.params
    fig.suptitle(f"{report.base.law} fit: A={p['A']:.3g} α={p['alpha']:.3f} B={p['B']:.3g} β={p['beta']:.3f} "
                 f"E={p['E']:.3f} γ={p['gamma']:.3f}", fontsize=10)
    return _save(fig, out_dir, "losses")


def plot_efficiencies(report: FitReport, out_dir: Path) -> list[Path]:
    """effN vs effD per precision, with bootstrap 95 % intervals where available."""
    fig, ax = plt.subplots(figsize=(8.6, 5.2))
    colors = scheme_colors(report)
    ax.add_patch(plt.Rectangle((0, 0), 1, 1, fill=False, ls="--", lw=0.8, color="grey"))
    markers = {"forward": "s", "backward": "^", "joint": "o"}
    drawn: list[tuple[float, float]] = []
    for e in report.efficiencies:
        if not (np.isfinite(e.eff_n) and np.isfinite(e.eff_d)):
            continue
        # points that (nearly) coincide are drawn as concentric markers, each later one smaller, so none hides
        stack = sum(1 for x, y in drawn if abs(x - e.eff_d) < 0.015 and abs(y - e.eff_n) < 0.015)
        drawn.append((e.eff_d, e.eff_n))
        ints = report.eff_intervals.get(e.scheme, {})
        xerr = yerr = None
        if "eff_d" in ints and e.fits_d:
            lo, hi = ints["eff_d"]
            xerr = [[max(e.eff_d - lo, 0)], [max(hi - e.eff_d, 0)]]
        if "eff_n" in ints and e.fits_n:
            lo, hi = ints["eff_n"]
            yerr = [[max(e.eff_n - lo, 0)], [max(hi - e.eff_n, 0)]]
        hollow = e.status != "converged"
        ax.errorbar(e.eff_d, e.eff_n, xerr=xerr, yerr=yerr, fmt=markers[e.kind], ms=max(3.0, 9.0 - 2.5 * stack),
                    capsize=3, color=colors[e.scheme], mfc="none" if hollow else None, zorder=3 + stack,
                    label=f"{e.scheme} [{e.kind}] ({e.eff_n:.3f}, {e.eff_d:.3f})" + (f" {e.status}" if hollow else ""))
    # Room for efficiencies a little above 1 (noise on near-lossless formats) and their intervals.
    finite = [v for e in report.efficiencies for v in (e.eff_n, e.eff_d) if np.isfinite(v)]
    hi_ci = [iv[1] for ints in report.eff_intervals.values() for iv in ints.values()]
    top = min(2.0, max([1.12] + [v + 0.05 for v in finite + hi_ci if v < 2.0]))
    ax.set_xlim(-0.02, top)
    ax.set_ylim(-0.02, top)
    ax.set_xlabel("data efficiency effD (backward precision)")
    ax.set_ylabel("parameter efficiency effN (forward precision)")
    ax.set_title("Efficiencies (unfitted one = 1; hollow = flagged fit; coinciding fits drawn concentric)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), title="scheme [fitted] (effN, effD)",
              title_fontsize=7)
    return _save(fig, out_dir, "efficiencies")


def plot_residuals(report: FitReport, df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Log residuals ln L_obs − ln L_fit vs tokens: baseline (base fit) and each precision (its effs)."""
    base_label = report.provenance["options"]["base_label"]
    selections = PAPER_SELECTIONS if report.provenance.get("options", {}).get("selections") else None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    b = base_rows(df, base_label)
    res = np.log(b["loss"]) - np.log(predict(report.base.params, b["n_params"].to_numpy(), b["tokens"].to_numpy()))
    sc = axes[0].scatter(b["tokens"], res * 1e3, c=np.log10(b["n_params"]), cmap="viridis", s=25)
    fig.colorbar(sc, ax=axes[0], label="log10 N")
    axes[0].set_title(f"baseline: {len(b)} runs, RMS {np.sqrt(np.mean(res ** 2)) * 1e3:.2f}e-3", fontsize=10)
    effs = {e.scheme: e for e in report.efficiencies}
    colors = scheme_colors(report)
    plotted = 0
    for label, _, _, _, rows in scheme_groups(df, base_label, selections):
        e = effs.get(label)
        if e is None or not np.isfinite(e.eff_n) or rows.empty:
            continue
        r = np.log(rows["loss"]) - np.log(predict(report.base.params, rows["n_params"].to_numpy(),
                                                  rows["tokens"].to_numpy(), e.eff_n, e.eff_d))
        axes[1].scatter(rows["tokens"], r * 1e3, s=18, label=label, color=colors.get(label))
        plotted += 1
    axes[1].set_title("quantized precisions (with their effN / effD)", fontsize=10)
    if plotted:
        axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the data, never on it
    else:  # say so rather than leave an empty (and unscalable) log axis
        axes[1].text(0.5, 0.5, "no precision has fitted efficiencies", ha="center", va="center",
                     transform=axes[1].transAxes, fontsize=9, color="0.4")
    for ax in axes[: 2 if plotted else 1]:
        ax.set_xscale("log")
    for ax in axes:
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xlabel("tokens D")
        ax.set_ylabel("ln L_obs − ln L_fit  (×1e-3)")
    fig.set_size_inches(12.5, 4.2)
    return _save(fig, out_dir, "residuals")


def plot_breakeven(report: FitReport, out_dir: Path, ratio: float | None = None) -> list[Path]:
    """Break-even uniform speedup Z vs model size at D/N = ratio (default: the headline's), per precision."""
    at = report.provenance["options"]["headline_at"]
    ratio = ratio or at["ratio"]
    fig, ax = plt.subplots(figsize=(6.8, 4.6))
    n = np.geomspace(min(1e7, at["n"] / 10), 1e11, 200)
    colors = scheme_colors(report)
    never, above = [], []
    top = 4.0
    for e in report.efficiencies:
        if not (np.isfinite(e.eff_n) and np.isfinite(e.eff_d)):
            continue
        z = breakeven_speedup(report.base.params, e.eff_n, e.eff_d, n, n * ratio)
        z = np.where(np.isfinite(z), z, np.nan)
        if np.all(np.isnan(z)):
            never.append(e.scheme)  # no speedup compensates anywhere on the axis
            continue
        if np.nanmin(z) > top:
            above.append(f"{e.scheme} ({np.nanmin(z):.3g}x+)")
            continue
        ax.plot(n, z, color=colors[e.scheme], label=f"{e.scheme} (effN {e.eff_n:.2f}, effD {e.eff_d:.2f})")
    notes = []
    if never:
        notes.append("never pays off (Z = ∞):\n  " + "\n  ".join(never))
    if above:
        notes.append(f"above {top:g}x everywhere:\n  " + "\n  ".join(above))
    if notes:  # beside the axes, under the legend: named, not dropped, and off the curves
        ax.text(1.02, 0.0, "\n".join(notes), transform=ax.transAxes, fontsize=7, color="0.3", va="bottom")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(2.0, color="grey", lw=0.8, ls=":")
    ax.axvline(at["n"], color="grey", lw=0.8, ls="--")
    ax.text(at["n"] * 1.1, 3.85, "headline N", fontsize=7, color="grey")
    ax.text(n[0] * 1.2, 2.03, "FP4 vs FP8 BOPS (2×)", fontsize=7, color="grey")
    ax.set_xscale("log")
    ax.set_ylim(0.8, top)
    ax.set_xlabel("model size N (non-embedding parameters)")
    ax.set_ylabel("break-even speedup Z (× the baseline's throughput)")
    beyond = extrapolation_note(report.provenance["base_range"]["n_max"], float(n[-1]))
    ax.set_title(f"Speedup needed to match the baseline at equal compute (D/N = {ratio:g}{beyond})", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, out_dir, "breakeven")


def plot_optimal_precision(report: FitReport, out_dir: Path, fp4: tuple[str, float, float] | None = None,
                           resolution: int = 160) -> list[Path]:
    """The paper's Fig. 1(b)/(c): optimal forward:backward option over (N_max, D/N), BOPS and RTX 5090."""
    label, en, ed = fp4 or pick_fp4_scheme(report)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    cmap = ListedColormap([OPTION_COLORS[o] for o in OPTIONS])
    for ax, sp, title in zip(axes, ("bops", "rtx5090"), ("speedups by BOPS (Table 1)", "measured RTX 5090 speedups")):
        m = optimal_map(report.base.params, (en, ed), speedups=sp, resolution=resolution)
        ax.pcolormesh(m.n_max, m.ratio, m.best, cmap=cmap, vmin=-0.5, vmax=len(OPTIONS) - 0.5, shading="auto",
                      rasterized=True)  # a bitmap inside the PDF: small and fast to write
        for name, n, d in MODEL_POINTS:
            ax.scatter(n, d / n, color="k", s=18, zorder=3)
            ax.annotate(name, (n, d / n), textcoords="offset points", xytext=(4, 3), fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N_max (forward budget, parameters)")
        ax.set_title(title, fontsize=10)
        ax.grid(False)
    axes[0].set_ylabel("D_max / N_max (tokens per parameter)")
    handles = [Patch(color=OPTION_COLORS[o], label=o) for o in OPTIONS]
    axes[1].legend(handles=handles, fontsize=8, loc="lower right", title="fwd:bwd")
    extrap = extrapolation_note(report.provenance["base_range"]["n_max"], float(m.n_max.max()))
    fig.suptitle(f"Optimal precision (FP4 = {label}: effN {en:.3f}, effD {ed:.3f}; FP8 lossless{extrap})",
                 fontsize=10)
    return _save(fig, out_dir, "optimal_precision")


def make_all(report: FitReport, df: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write every figure (PNG + PDF) into ``out_dir``; returns the paths."""
    out_dir = Path(out_dir)
    paths: list[Path] = []
    paths += plot_losses(report, df, out_dir)
    paths += plot_efficiencies(report, out_dir)
    paths += plot_residuals(report, df, out_dir)
    paths += plot_breakeven(report, out_dir)
    paths += plot_optimal_precision(report, out_dir)
    return paths


# ---------------------------------------------------------------- seed-replicated ladders (analysis.ladder)


def _precision_color(prec: str, i: int) -> str:
    return PRECISION_COLORS.get(prec, plt.get_cmap("tab10")(i % 10))


def plot_ladder_losses(table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Final validation loss vs tokens, one panel per model size, one colour per precision; where a cell was
    run with several seeds the marker is their mean and the bar their full range (min to max)."""
    sizes = sorted(table["n_params"].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.3 * len(sizes), 3.7), squeeze=False)
    precs = sorted(table["precision"].unique(), key=lambda p: (p != "bf16", p))
    for ax, n in zip(axes.ravel(), sizes):
        rows = table[table["n_params"] == n]
        for i, prec in enumerate(precs):
            g = rows[rows["precision"] == prec].groupby("tokens")["loss"].agg(["mean", "min", "max"]).reset_index()
            shift = 1.0 + 0.03 * (i - (len(precs) - 1) / 2)  # side by side, same budget
            ax.errorbar(g["tokens"] * shift, g["mean"], yerr=[g["mean"] - g["min"], g["max"] - g["mean"]],
                        color=_precision_color(prec, i), marker="o", ms=4, lw=1.2, capsize=2, label=prec)
        ax.set_xscale("log")
        ax.set_xlabel("tokens D")
        ax.set_ylabel("final validation loss")
        model = rows["model"].iloc[0] if "model" in rows.columns else ""
        ax.set_title(f"{model} (N = {_fmt_n(n)})", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("ladder losses: mean over seeds, bars = seed range", fontsize=10)
    return _save(fig, out_dir, "ladder_losses")


def plot_ladder_gaps(gaps: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Each precision's gap to the baseline per cell (loss difference, nats) with the ±1 sd paired-gap seed
    noise it is judged against as a grey band; cells ordered by N, then D."""
    precs = sorted(gaps["precision"].unique())
    cells = gaps[["model", "n_params", "tokens_per_param"]].drop_duplicates().sort_values(["n_params", "tokens_per_param"])
    labels = [f"{m.replace('llama_', '')}\nD/N {r:.3g}" for m, r in zip(cells["model"], cells["tokens_per_param"])]
    x = np.arange(len(cells))
    width = 0.8 / max(1, len(precs))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * len(cells) + 2), 3.8))
    for i, prec in enumerate(precs):
        g = cells.merge(gaps[gaps["precision"] == prec], on=["model", "n_params", "tokens_per_param"], how="left")
        pos = x + (i - (len(precs) - 1) / 2) * width
        ax.bar(pos, g["gap"], width * 0.9, color=_precision_color(prec, i), label=f"{prec} − base")
        for p, sd in zip(pos, g["noise_sd"]):
            ax.fill_between([p - width / 2, p + width / 2], -sd, sd, color="0.5", alpha=0.25, lw=0)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("loss gap to baseline (nats)")
    ax.set_title("gap per cell (bars) vs ±1 sd paired-gap seed noise of that size at the nearest replicated budget "
                 "(grey)", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, out_dir, "ladder_gaps")


def plot_training_curves(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Training loss vs tokens per precision at each size's largest budget (lowest seed), one panel per size;
    runs need the ``path`` of their folder (``analysis.load.load_runs_dir``)."""
    from analysis.load import load_curve

    sizes = sorted(runs["n_params"].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.3 * len(sizes), 3.7), squeeze=False)
    precs = sorted(runs["precision"].unique(), key=lambda p: (p != "bf16", p))
    for ax, n in zip(axes.ravel(), sizes):
        rows = runs[runs["n_params"] == n]
        top = rows[(rows["tokens"] == rows["tokens"].max()) & (rows["seed"] == rows["seed"].min())]
        # the baseline drawn last, on top: the other precisions' curves often lie right on it
        for i, prec in sorted(enumerate(precs), key=lambda t: t[1] == "bf16"):
            sel = top[top["precision"] == prec]
            if sel.empty:
                continue
            curve = load_curve(sel.iloc[0])
            curve = curve[curve["loss"].notna()] if "loss" in curve.columns else curve.iloc[0:0]
            ax.plot(curve["tokens"], curve["loss"], color=_precision_color(prec, i), lw=1.0,
                    alpha=1.0 if prec == "bf16" else 0.8, label=prec)
            ax.scatter([sel.iloc[0]["tokens"]], [sel.iloc[0]["loss"]], color=_precision_color(prec, i), s=18,
                       zorder=3, marker="D")
        ax.set_xscale("log")
        ax.set_xlim(left=float(top["tokens"].max()) / 200)  # the first updates' losses are off the chart anyway
        ax.set_ylim(top=min(ax.get_ylim()[1], float(rows["loss"].max()) * 1.6))
        ax.set_xlabel("tokens")
        ax.set_ylabel("training loss (line), final val loss (◆)")
        ax.set_title(f"{rows['model'].iloc[0]} (N = {_fmt_n(n)}), D/N {top['tokens'].max() / n:.0f}", fontsize=9)
        ax.legend(fontsize=7)
    return _save(fig, out_dir, "ladder_curves")


def plot_e_profile(profile: pd.DataFrame, out_dir: Path) -> list[Path]:
    """The fit profiled over the irreducible loss (``analysis.report.e_profile``): left, each precision's effN
    (solid) and effD (dashed) refitted at every fixed E; right, the base fit's RMS log residual against the
    pooled seed noise. Shaded: the E the data cannot reject (residuals within the noise)."""
    noise = profile.attrs.get("seed_noise_log", float("nan"))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    schemes = [c[: -len("_effN")] for c in profile.columns if c.endswith("_effN")]
    for i, label in enumerate(schemes):
        color = _precision_color(label, i)
        ax.plot(profile["E"], profile[f"{label}_effN"], color=color, marker="o", ms=3, lw=1.2, label=f"{label} effN")
        ax.plot(profile["E"], profile[f"{label}_effD"], color=color, ls="--", lw=1.0, label=f"{label} effD")
    ax.axhline(1.0, color="k", lw=0.6)
    ax2.plot(profile["E"], profile["rms_log_residual"], color="k", marker="o", ms=3, lw=1.2, label="base fit")
    if np.isfinite(noise):
        ax2.axhline(noise, color="0.4", ls=":", label=f"seed noise {noise:.3f}")
    ok = profile[profile["admissible"] == True]  # noqa: E712
    if not ok.empty:
        for a in (ax, ax2):
            a.axvspan(ok["E"].min(), ok["E"].max(), color="tab:green", alpha=0.08, lw=0)
    ax.set_xlabel("irreducible loss E (fixed)")
    ax.set_ylabel("efficiency")
    if not ok.empty:
        note = "shaded: E the data admit"
    elif np.isfinite(noise):
        note = "no E fits within the seed noise"  # the law's form, not E, limits the fit
    else:
        note = "no replicates: no E judged"
    ax.set_title(f"efficiencies refitted at each E ({note})", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    ax2.set_xlabel("irreducible loss E (fixed)")
    ax2.set_ylabel("RMS log residual of the base fit")
    ax2.set_title("base fit quality vs E", fontsize=9)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, out_dir, "ladder_e_profile")


def plot_seed_curves(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Training loss vs tokens of every seed at each replicated cell (one panel per cell; colour = seed, line
    style = precision; a 5-row rolling mean): where seed noise comes from — e.g. a plateau whose end moves from
    seed to seed."""
    from matplotlib.ticker import NullFormatter

    from analysis.load import load_curve

    reps = runs.groupby(["model", "n_params", "tokens"])["seed"].nunique()
    cells = sorted(reps[reps >= 2].index, key=lambda c: (c[1], c[2]))
    if not cells:
        return []
    fig, axes = plt.subplots(1, len(cells), figsize=(4.0 * len(cells), 3.6), squeeze=False)
    precs = sorted(runs["precision"].unique(), key=lambda p: (p != "bf16", p))
    styles = ["-", "--", ":", "-."]
    for ax, (model, n, d) in zip(axes.ravel(), cells):
        rows = runs[(runs["n_params"] == n) & (runs["tokens"] == d)]
        seeds = sorted(rows["seed"].unique())
        for _, run in rows.iterrows():
            curve = load_curve(run)
            curve = curve[curve["loss"].notna()] if "loss" in curve.columns else curve.iloc[0:0]
            k, j = seeds.index(run["seed"]), precs.index(run["precision"])
            ax.plot(curve["tokens"], curve["loss"].rolling(5, min_periods=1).mean(), color=plt.get_cmap("tab10")(k),
                    lw=0.9, ls=styles[j % len(styles)], label=f"{run['precision']} seed {int(run['seed'])}")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(left=d / 30)
        ax.set_ylim(top=min(ax.get_ylim()[1], float(rows["loss"].max()) * 1.8))
        ax.set_xlabel("tokens")
        ax.set_ylabel("training loss (5-row rolling mean)")
        ax.set_title(f"{model}, D/N {d / n:.0f}: {len(seeds)} seeds (colour) x precision (line style)", fontsize=8)
        handles, labels = ax.get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda i: labels[i])
        ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=6, ncol=3)
    fig.tight_layout()
    return _save(fig, out_dir, "ladder_seed_curves")
