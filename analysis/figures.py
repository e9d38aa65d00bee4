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


def precision_colors(labels) -> dict:
    """One colour per precision label, the same in every figure drawn from the same precisions: the ladder's named
    precisions keep :data:`PRECISION_COLORS`; the others take tab20 colours (dark ones first) in sorted label order,
    skipping the colours of the named precisions present and the baseline's, so that no two precisions share one."""
    from matplotlib.colors import to_hex

    labels = set(labels)
    named = {label: c for label, c in PRECISION_COLORS.items() if label in labels}
    taken = set(named.values()) | {PRECISION_COLORS["bf16"]}  # the baseline is in every figure, drawn or not
    tab20 = [to_hex(c) for c in plt.get_cmap("tab20").colors]
    palette = [c for c in tab20[0::2] + tab20[1::2] if c not in taken]
    return {**{label: palette[k % len(palette)] for k, label in enumerate(sorted(labels - set(named)))}, **named}


def scheme_colors(report: FitReport) -> dict:
    """:func:`precision_colors` of a report's precisions (its efficiencies' schemes)."""
    return precision_colors(e.scheme for e in report.efficiencies)


def log_axis(ax, axis: str = "x", unit: str = "") -> None:
    """Readable log-axis tick labels: ticks at 10^k on a wide axis (over 2.5 decades), else at 1, 2 and 5 x 10^k
    (more multiples until three ticks show), written as plain numbers with K/M/B/T (``unit`` appended), minor ticks
    unlabelled — a narrow range's default labels (3x10^7, 4x10^7, ...) overlap."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    lo, hi = (ax.get_xlim() if axis == "x" else ax.get_ylim())
    ticks = []
    wide = hi / lo > 10**2.5
    for subs in (((1,),) if wide else ()) + ((1, 2, 5), (1, 2, 3, 4, 5, 7), tuple(range(1, 10))):
        ticks = [m * 10.0**k for k in range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
                 for m in subs if lo <= m * 10.0**k <= hi]
        if len(ticks) >= 3:
            break
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(FixedLocator(ticks))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: _fmt_count(v) + unit))
    target.set_minor_formatter(NullFormatter())


def _fmt_count(v: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if v >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


def extrapolation_note(n_fit: float, n_top: float) -> str:
    """What a title says about the N range it draws: where the law was fitted and, beyond 10x that, how far
    the figure extrapolates."""
    note = f"; law fitted up to N = {_fmt_n(n_fit)}"
    factor = n_top / n_fit
    if factor <= 10:
        return note
    return note + f", extrapolated {f'{factor:.3g}' if factor < 1000 else f'{factor:,.0f}'}x beyond it"


def _fmt_n(n: float) -> str:
    return _fmt_count(n) if n >= 1e3 else f"{n / 1e3:.3g}K"


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


def panel_grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    """(rows, columns) for ``n`` panels, at most ``max_cols`` wide, with as few empty cells as that allows
    (4 panels: 2 × 2, not 2 × 3 with two empty)."""
    nrow = max(1, int(np.ceil(n / max_cols)))
    return nrow, max(1, int(np.ceil(n / nrow)))


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
    shown = _schemes_to_plot(report, max_panels - 1)
    for e in shown:
        flag = "" if e.status == "converged" else f", {e.status}"
        panels.append((f"{e.scheme} (effN={e.eff_n:.3f}, effD={e.eff_d:.3f}{flag})", groups.get(e.scheme), e.eff_n,
                       e.eff_d))
    left_out = [e.scheme for e in report.efficiencies if e not in shown]
    left_out += [title.split(" (")[0] for title, rows, _, _ in panels if rows is None or rows.empty]
    panels = [p for p in panels if p[1] is not None and not p[1].empty]
    nrow, ncol = panel_grid(len(panels))
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.0 * ncol, 3.9 * nrow), squeeze=False, sharey=False)
    sizes = sorted(df["n_params"].unique())
    cmap = plt.get_cmap("viridis")
    colors = {n: cmap(i / max(1, len(sizes) - 1)) for i, n in enumerate(sizes)}
    for ax, (title, rows, en, ed) in zip(axes.ravel(), panels):
        for n, g in rows.groupby("n_params"):
            g = g.sort_values("tokens")
            ax.scatter(g["tokens"], g["loss"], color=colors[n], s=22, zorder=3, label=_fmt_n(n))
            d = np.geomspace(g["tokens"].min() / 1.5, g["tokens"].max() * 1.5, 100)
            ax.plot(d, predict(report.base.params, np.full_like(d, n), d, en, ed), color=colors[n], lw=1.2)
        ax.set_xscale("log")
        log_axis(ax)
        ax.set_xlabel("tokens D")
        ax.set_ylabel("validation loss (nats/token)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, title="N", title_fontsize=7, loc="best")
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    p = report.base.params
    flag = "" if report.base.status == "converged" else f" ({report.base.status}: not a finding)"
    fig.suptitle(f"{report.base.law} fit{flag}: A={p['A']:.3g} α={p['alpha']:.3f} B={p['B']:.3g} β={p['beta']:.3f} "
                 f"E={p['E']:.3f} γ={p['gamma']:.3f}", fontsize=10)
    if left_out:  # named, not silently dropped (1-point fits, degenerate or surplus precisions)
        fig.text(0.01, -0.01, "not shown (one point, a degenerate fit or beyond the panels): " + ", ".join(left_out),
                 fontsize=7, color="0.3", va="top", wrap=True)
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
        # points whose markers would overlap (closer than a marker's width, ~0.03 on these axes) are drawn as
        # concentric markers, each later one smaller and on top, so none hides another
        stack = sum(1 for x, y in drawn if abs(x - e.eff_d) < 0.03 and abs(y - e.eff_n) < 0.03)
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
    ax.set_title("Efficiencies (unfitted one = 1; hollow = flagged fit; overlapping fits drawn concentric)", fontsize=9)
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
    # runs of several sizes share a budget and a fit puts many residuals near 0: each size (and, right, each
    # precision) is drawn slightly apart along D so that no marker hides another
    sizes = sorted(b["n_params"].unique())
    dodge = 1 + 0.04 * (np.searchsorted(sizes, b["n_params"]) - (len(sizes) - 1) / 2)
    sc = axes[0].scatter(b["tokens"] * dodge, res * 1e3, c=np.log10(b["n_params"]), cmap="viridis", s=25,
                         edgecolors="k", linewidths=0.3)
    fig.colorbar(sc, ax=axes[0], label="log10 N")
    axes[0].set_title(f"baseline: {len(b)} runs, RMS {np.sqrt(np.mean(res ** 2)) * 1e3:.2f}e-3 (sizes side by side along D)", fontsize=10)
    effs = {e.scheme: e for e in report.efficiencies}
    colors = scheme_colors(report)
    shown = [(label, rows) for label, _, _, _, rows in scheme_groups(df, base_label, selections)
             if label in effs and np.isfinite(effs[label].eff_n) and not rows.empty]
    resid = {label: 1e3 * (np.log(rows["loss"].to_numpy()) - np.log(predict(
        report.base.params, rows["n_params"].to_numpy(), rows["tokens"].to_numpy(), effs[label].eff_n,
        effs[label].eff_d))) for label, rows in shown}
    # the axis is scaled to the unflagged fits (a degenerate fit's residuals, 100x larger, would flatten them all);
    # flagged points beyond it sit on its edge as hollow triangles, and a note says so
    good = np.concatenate([resid[label] for label, _ in shown if effs[label].status == "converged"] or [np.zeros(0)])
    lim = 1.15 * max(np.abs(good).max(), 1e-3) if good.size else None
    beyond = []
    for k, (label, rows) in enumerate(shown):
        e, r = effs[label], resid[label]
        x = rows["tokens"].to_numpy() * (1 + 0.03 * (k - (len(shown) - 1) / 2))
        flagged = e.status != "converged"
        out = np.abs(r) > lim if lim is not None else np.zeros(r.size, bool)
        axes[1].scatter(x[~out], r[~out], s=18, facecolors="none" if flagged else colors.get(label),
                        edgecolors=colors.get(label) if flagged else "k", linewidths=0.9 if flagged else 0.3,
                        label=label + (f" ({e.status})" if flagged else ""))
        for sign, marker in ((1, "^"), (-1, "v")):
            edge = out & (np.sign(r) == sign)
            if edge.any():
                axes[1].scatter(x[edge], np.full(edge.sum(), sign * lim), s=30, marker=marker, facecolors="none",
                                edgecolors=colors.get(label), zorder=4)
        if out.any():
            beyond.append(f"{label} ({out.sum()}, to {np.abs(r).max():.3g})")
    if lim is not None:
        axes[1].set_ylim(-lim * 1.05, lim * 1.05)
    if beyond:
        axes[1].text(1.02, 0.0, "beyond the axis (hollow ▲/▼ on its edge):\n  " + "\n  ".join(beyond),
                     transform=axes[1].transAxes, fontsize=7, color="0.3", va="bottom")
    plotted = len(shown)
    axes[1].set_title("quantized precisions (with their effN / effD; side by side along D; hollow = flagged fit)",
                      fontsize=10)
    if plotted:
        axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the data, never on it
    else:  # say so rather than leave an empty (and unscalable) log axis
        axes[1].text(0.5, 0.5, "no precision has fitted efficiencies", ha="center", va="center",
                     transform=axes[1].transAxes, fontsize=9, color="0.4")
    for ax in axes[: 2 if plotted else 1]:
        ax.set_xscale("log")
        log_axis(ax)
    for ax in axes:
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xlabel("tokens D")
        ax.set_ylabel("ln L_obs − ln L_fit  (×1e-3)")
    fig.set_size_inches(12.5, 4.2)
    return _save(fig, out_dir, "residuals")


def breakeven_curves(report: FitReport, n: np.ndarray, ratio: float, top: float = 4.0, bottom: float = 0.8):
    """The break-even curves Z(N) at D/N = ``ratio`` that fit on a [bottom, top] axis, and the notes that name every
    precision the axis does not show whole: never paying off (Z = ∞ everywhere), above ``top`` everywhere, or
    clipped (leaving the axis, or infinite, over part of it). Flagged fits carry their status. Returns
    ``([(EffFit, z), ...], [note, ...])``."""
    never, above, clipped, curves = [], [], [], []
    for e in report.efficiencies:
        if not (np.isfinite(e.eff_n) and np.isfinite(e.eff_d)):
            continue
        z = breakeven_speedup(report.base.params, e.eff_n, e.eff_d, n, n * ratio)
        z = np.where(np.isfinite(z), z, np.nan)
        name = e.scheme + ("" if e.status == "converged" else f" ({e.status})")
        if np.all(np.isnan(z)):
            never.append(name)  # no speedup compensates anywhere on the axis
        elif np.nanmin(z) > top:
            above.append(f"{name} ({np.nanmin(z):.3g}x+)")
        else:
            curves.append((e, z))
            out = [f"{np.nanmax(z):.3g}x" if np.nanmax(z) > top else "",
                   f"{np.nanmin(z):.3g}x" if np.nanmin(z) < bottom else "", "∞" if np.isnan(z).any() else ""]
            if any(out):
                clipped.append(f"{name} (reaches {' / '.join(o for o in out if o)})")
    notes = []
    if never:
        notes.append("never pays off (Z = ∞):\n  " + "\n  ".join(never))
    if above:
        notes.append(f"above {top:g}x everywhere:\n  " + "\n  ".join(above))
    if clipped:
        notes.append(f"clipped at the axes ({bottom:g}-{top:g}x):\n  " + "\n  ".join(clipped))
    return curves, notes


def _within(a: np.ndarray, b: np.ndarray, rel: float) -> bool:
    """Whether two curves agree within ``rel`` wherever both are finite (and are finite somewhere)."""
    both = np.isfinite(a) & np.isfinite(b)
    return bool(both.any() and np.all(np.abs(a[both] / b[both] - 1) < rel))


def plot_breakeven(report: FitReport, out_dir: Path, ratio: float | None = None) -> list[Path]:
    """Break-even uniform speedup Z vs model size at D/N = ratio (default: the headline's), per precision."""
    at = report.provenance["options"]["headline_at"]
    ratio = ratio or at["ratio"]
    # the legend and the notes get a panel of their own beside the plot, so they never squeeze or cover it
    fig, (ax, side) = plt.subplots(1, 2, figsize=(10.0, 5.0), gridspec_kw={"width_ratios": [2.0, 1.0]})
    side.axis("off")
    n = np.geomspace(min(1e7, at["n"] / 10), 1e11, 200)
    colors = scheme_colors(report)
    top, bottom = 4.0, 0.8
    curves, notes = breakeven_curves(report, n, ratio, top, bottom)
    for k, (e, z) in enumerate(curves):
        # a curve within 2% of a later one everywhere would hide under it: draw it wider, the later one on top
        under = sum(1 for _, z2 in curves[k + 1:] if _within(z2, z, 0.02))
        flag = "" if e.status == "converged" else f" {e.status}"
        ax.plot(n, z, color=colors[e.scheme], ls="-" if not flag else "--", lw=1.5 + 2.0 * under, zorder=2 + k,
                label=f"{e.scheme} (effN {e.eff_n:.2f}, effD {e.eff_d:.2f}){flag}")
    if notes:  # in the side panel, under the legend: named, not dropped, and off the curves
        side.text(0.0, 0.0, "\n".join(notes), transform=side.transAxes, fontsize=7, color="0.3", va="bottom")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(2.0, color="grey", lw=0.8, ls=":")
    ax.axvline(at["n"], color="grey", lw=0.8, ls="--")
    ax.text(at["n"] * 1.1, 3.85, "headline N", fontsize=7, color="grey")
    ax.text(n[0] * 1.2, 2.03, "FP4 vs FP8 BOPS (2×)", fontsize=7, color="grey")
    ax.set_xscale("log")
    ax.set_ylim(bottom, top)
    log_axis(ax)
    ax.set_xlabel("model size N (non-embedding parameters)")
    ax.set_ylabel("break-even speedup Z (× the baseline's throughput)")
    beyond = extrapolation_note(report.provenance["base_range"]["n_max"], float(n[-1]))
    ax.set_title(f"Speedup needed to match the baseline at equal compute (D/N = {ratio:g}{beyond})", fontsize=9)
    side.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="upper left", bbox_to_anchor=(0.0, 1.0),
                title="dashed: flagged fit", title_fontsize=7, borderaxespad=0.0)
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
        placed: list[tuple[float, float]] = []
        for name, n, d in sorted(MODEL_POINTS, key=lambda m: -m[2] / m[1]):  # top to bottom
            ax.scatter(n, d / n, color="k", s=18, zorder=3)
            # inside the axes (points near the right edge are labelled on their left, near the top below), and not
            # on top of the label of a point just above (Llama 3 70B under Qwen 2.5 72B): that one goes below too
            left = n > 0.3 * m.n_max.max()
            below = d / n > 0.8 * m.ratio.max() or any(abs(np.log10(n / x)) < 0.3 and abs(np.log10(d / n / y)) < 0.1
                                                        for x, y in placed)
            placed.append((n, d / n))
            ax.annotate(name, (n, d / n), textcoords="offset points", xytext=(-4 if left else 4, -4 if below else 3),
                        ha="right" if left else "left", va="top" if below else "bottom", fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        log_axis(ax, "x")
        log_axis(ax, "y")
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


def plot_ladder_losses(table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Final validation loss vs tokens, one panel per model size, one colour per precision; where a cell was
    run with several seeds the marker is their mean and the bar their full range (min to max)."""
    sizes = sorted(table["n_params"].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.3 * len(sizes), 3.7), squeeze=False)
    precs = sorted(table["precision"].unique(), key=lambda p: (p != "bf16", p))
    colors = precision_colors(precs)
    for ax, n in zip(axes.ravel(), sizes):
        rows = table[table["n_params"] == n]
        for i, prec in enumerate(precs):
            g = rows[rows["precision"] == prec].groupby("tokens")["loss"].agg(["mean", "min", "max"]).reset_index()
            shift = 1.0 + 0.03 * (i - (len(precs) - 1) / 2)  # side by side, same budget
            ax.errorbar(g["tokens"] * shift, g["mean"], yerr=[g["mean"] - g["min"], g["max"] - g["mean"]],
                        color=colors[prec], marker="o", ms=4, lw=1.2, capsize=2, label=prec)
        ax.set_xscale("log")
        log_axis(ax)
        ax.set_xlabel("tokens D")
        ax.set_ylabel("final validation loss (nats/token)")
        model = rows["model"].iloc[0] if "model" in rows.columns else ""
        ax.set_title(f"{model} (N = {_fmt_n(n)})", fontsize=9)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("ladder losses: mean over seeds, bars = seed range", fontsize=10)
    return _save(fig, out_dir, "ladder_losses")


def plot_ladder_gaps(gaps: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Each precision's gap to the baseline per cell (loss difference, nats) with the ±1 sd paired-gap seed
    noise it is judged against as a grey band; cells ordered by N, then D."""
    precs = sorted(gaps["precision"].unique())
    colors = precision_colors(precs)
    cells = gaps[["model", "n_params", "tokens_per_param"]].drop_duplicates().sort_values(["n_params", "tokens_per_param"])
    labels = [f"{m.replace('llama_', '')}\nD/N {r:.3g}" for m, r in zip(cells["model"], cells["tokens_per_param"])]
    x = np.arange(len(cells))
    width = 0.8 / max(1, len(precs))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * len(cells) + 2), 3.8))
    for i, prec in enumerate(precs):
        g = cells.merge(gaps[gaps["precision"] == prec], on=["model", "n_params", "tokens_per_param"], how="left")
        pos = x + (i - (len(precs) - 1) / 2) * width
        ax.bar(pos, g["gap"], width * 0.9, color=colors[prec], label=f"{prec} − base")
        for p, sd in zip(pos, g["noise_sd"]):
            ax.fill_between([p - width / 2, p + width / 2], -sd, sd, color="0.5", alpha=0.25, lw=0)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("loss gap to baseline (nats)")
    ax.set_title("gap per cell (bars) vs ±1 sd paired-gap seed noise of that size at the nearest replicated budget "
                 "(grey)", fontsize=9)
    # beside the axes, not on them: with a dozen precisions a legend inside covers the largest sizes' bars
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0)
    return _save(fig, out_dir, "ladder_gaps")


def plot_training_curves(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Training loss (5-row rolling mean) vs tokens per precision at each size's largest budget (lowest seed), one
    panel per size; runs need the ``path`` of their folder (``analysis.load.load_runs_dir``). The precisions'
    curves often lie on each other: each has its own colour and line style (:func:`curve_styles`), the baseline is
    drawn first and widest, under the others, and one legend sits beside the panels, off the curves."""
    from matplotlib.lines import Line2D

    from analysis.load import load_curve

    sizes = sorted(runs["n_params"].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.3 * len(sizes), 3.7), squeeze=False)
    precs = sorted(runs["precision"].unique(), key=lambda p: (p != "bf16", p))
    colors = precision_colors(precs)
    styles = curve_styles(precs)
    for ax, n in zip(axes.ravel(), sizes):
        rows = runs[runs["n_params"] == n]
        top = rows[(rows["tokens"] == rows["tokens"].max()) & (rows["seed"] == rows["seed"].min())]
        for z, prec in enumerate(precs):  # the baseline first, at the bottom
            sel = top[top["precision"] == prec]
            if sel.empty:
                continue
            curve = load_curve(sel.iloc[0])
            curve = curve[curve["loss"].notna()] if "loss" in curve.columns else curve.iloc[0:0]
            ax.plot(curve["tokens"], curve["loss"].rolling(5, min_periods=1).mean(), color=colors[prec],
                    zorder=2 + z, **styles[prec])
            ax.scatter([sel.iloc[0]["tokens"]], [sel.iloc[0]["loss"]], color=colors[prec], s=18,
                       zorder=10 + z, marker="D")
        ax.set_xscale("log")
        ax.set_xlim(left=float(top["tokens"].max()) / 200)  # the first updates' losses are off the chart anyway
        ax.set_ylim(top=min(ax.get_ylim()[1], float(rows["loss"].max()) * 1.6))
        log_axis(ax)
        ax.set_xlabel("tokens")
        ax.set_ylabel("training loss (line), final val loss (◆)")
        ax.set_title(f"{rows['model'].iloc[0]} (N = {_fmt_n(n)}), D/N {top['tokens'].max() / n:.0f}", fontsize=9)
    fig.legend([Line2D([], [], color=colors[p], **styles[p]) for p in precs], precs, fontsize=8,
               loc="center left", bbox_to_anchor=(1.0, 0.5), title="precision", title_fontsize=8)
    fig.suptitle("training curves (5-row rolling mean) from D/200 on, clipped at 1.6x the size's highest final loss "
                 "(early losses lie above)", fontsize=9)
    fig.tight_layout()
    return _save(fig, out_dir, "ladder_curves")


def curve_styles(precs) -> dict:
    """Line keywords per precision for curves that overlap: the baseline (``bf16``, else the first) solid and
    widest, drawn under the others; every other precision its own dash pattern, thinner."""
    precs = list(precs)
    base = "bf16" if "bf16" in precs else (precs[0] if precs else None)
    dashes = ["--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2)), (0, (1, 1))]
    styles, k = {}, 0
    for p in precs:
        if p == base:
            styles[p] = {"ls": "-", "lw": 2.2, "alpha": 0.55}
        else:
            styles[p] = {"ls": dashes[k % len(dashes)], "lw": 1.2, "alpha": 0.95}
            k += 1
    return styles


def plot_e_profile(profile: pd.DataFrame, out_dir: Path) -> list[Path]:
    """The fit profiled over the irreducible loss (``analysis.report.e_profile``): left, each precision's effN
    (solid) and effD (dashed) refitted at every fixed E; right, the base fit's RMS log residual against the
    pooled seed noise. Shaded: the E the data cannot reject (residuals within the noise)."""
    noise = profile.attrs.get("seed_noise_log", float("nan"))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    schemes = [c[: -len("_effN")] for c in profile.columns if c.endswith("_effN")]
    colors = precision_colors(schemes)
    for label in schemes:
        color = colors[label]
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
    ax.set_xlabel("irreducible loss E (fixed; nats/token)")
    ax.set_ylabel("efficiency")
    if not ok.empty:
        note = "shaded: E the data admit"
    elif np.isfinite(noise):
        note = "no E fits within the seed noise"  # the law's form, not E, limits the fit
    else:
        note = "no replicates: no E judged"
    ax.set_title(f"efficiencies refitted at each E ({note})", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    ax2.set_xlabel("irreducible loss E (fixed; nats/token)")
    ax2.set_ylabel("RMS log residual of the base fit")
    ax2.set_title("base fit quality vs E", fontsize=9)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, out_dir, "ladder_e_profile")


def plot_seed_curves(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Training loss vs tokens of every seed at each replicated cell (one panel per cell; colour = seed, line
    style = precision; a 5-row rolling mean): where seed noise comes from — e.g. a plateau whose end moves from
    seed to seed."""
    from matplotlib.lines import Line2D

    from analysis.load import load_curve

    reps = runs.groupby(["model", "n_params", "tokens"])["seed"].nunique()
    cells = sorted(reps[reps >= 2].index, key=lambda c: (c[1], c[2]))
    if not cells:
        return []
    fig, axes = plt.subplots(1, len(cells), figsize=(4.0 * len(cells), 3.6), squeeze=False)
    precs = sorted(runs["precision"].unique(), key=lambda p: (p != "bf16", p))
    styles = ["-", "--", ":", "-."]
    seeds = sorted(runs["seed"].unique())  # one colour per seed in every panel
    for ax, (model, n, d) in zip(axes.ravel(), cells):
        rows = runs[(runs["n_params"] == n) & (runs["tokens"] == d)]
        for _, run in rows.iterrows():
            curve = load_curve(run)
            curve = curve[curve["loss"].notna()] if "loss" in curve.columns else curve.iloc[0:0]
            k, j = seeds.index(run["seed"]), precs.index(run["precision"])
            ax.plot(curve["tokens"], curve["loss"].rolling(5, min_periods=1).mean(), color=plt.get_cmap("tab10")(k),
                    lw=0.9, ls=styles[j % len(styles)], label=f"{run['precision']} seed {int(run['seed'])}")
        ax.set_xscale("log")
        ax.set_xlim(left=d / 30)
        ax.set_ylim(top=min(ax.get_ylim()[1], float(rows["loss"].max()) * 1.8))
        log_axis(ax)
        ax.set_xlabel("tokens")
        ax.set_ylabel("training loss (5-row rolling mean)")
        ax.set_title(f"{model}, D/N {d / n:.0f}: {rows['seed'].nunique()} seeds", fontsize=8)
    # one legend for every panel, beside them (per-panel legends covered the curves): colour = seed, style = precision
    handles = [Line2D([], [], color=plt.get_cmap("tab10")(k), lw=1.2) for k in range(len(seeds))]
    handles += [Line2D([], [], color="0.3", lw=1.2, ls=styles[j % len(styles)]) for j in range(len(precs))]
    labels = [f"seed {int(s)}" for s in seeds] + list(precs)
    fig.legend(handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5),
               title="colour: seed\nline: precision", title_fontsize=7)
    fig.suptitle("every seed's curve at the replicated cells, from D/30 on, clipped at 1.8x the cell's highest final "
                 "loss (early losses lie above)", fontsize=9)
    fig.tight_layout()
    return _save(fig, out_dir, "ladder_seed_curves")
