"""The recipe law's table: per recipe effN from its forward-only runs, effD from its backward-only runs, the recipe's
own gap against what the two predict together, and the break-even speedup against the fast paths' measured speed.

Reads a fit JSON of the forward-only / backward-only runs (`quartet fit --bootstrap N --json`, default
benchmarks/results/halves/fit.json, else the forecast's fit), benchmarks/results/recipes/speed_200m.json (each
recipe's llama_200m step on one H200 on the path `auto` picks) and writes table.md beside the fit and between the
markers `<!-- halves_table.py: begin -->` / `<!-- halves_table.py: end -->` of docs/recipes.md, and halves.png (the
efficiencies beside the joint fit of each recipe's own runs, benchmarks/results/recipes/fit.json).

Per recipe: each efficiency with its `base fixed` 95% interval (the base law held at its fit, as the papers report
theirs) and the verdict (analysis.verdict: pinned = off the bounds and narrower than the stated width); the
consistency check (the recipe's mean gap to the base law over its cells against the gap effN × effD predict); the
break-even speedup s at which L(s·effN·N, effD·D) = L(N, D) at the fit's headline point, and the recipe's measured
step speed against bf16's (bf16 step time / recipe step time): it pays off at that size when the speed exceeds s.
A recipe whose halves were not run says so.

    python benchmarks/halves_table.py                      # table.md next to the fit, the block in docs/recipes.md
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.report import update_marked_block  # noqa: E402
from analysis.speed import breakeven_speedup  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "halves"
SPEED = REPO / "benchmarks" / "results" / "recipes" / "speed_200m.json"
JOINT_FIT = REPO / "benchmarks" / "results" / "recipes" / "fit.json"
DOCS = REPO / "docs" / "recipes.md"
PAGE_BLOCK = "halves_table.py"
BASE = "bf16"
KIND = "base_fixed"


def _eff(e: dict | None, key: str) -> tuple[float, list | None, str] | None:
    """(value, base-fixed interval, verdict) of ``key`` (eff_n / eff_d) in a fitted half ``e``; None if not fitted."""
    if e is None:
        return None
    return float(e[key]), e.get(f"{key}_interval_base_fixed"), (e.get("verdicts") or {}).get(key, {}).get(KIND, "—")


def _step_speed(speed: dict) -> dict:
    """recipe -> bf16 step time / its step time (> 1: faster than bf16), from a ladder_speed.py JSON."""
    ms = {r["config"].split(":")[0]: r["step_ms_median"] for r in speed["rows"] if r.get("step_ms_median")}
    return {k: ms[BASE] / v for k, v in ms.items() if k != BASE and BASE in ms}


def rows(fit: dict, speed: dict) -> list[dict]:
    """One row per recipe that appears in the fit (itself or through a half), in the fit's order."""
    effs = {e["scheme"]: e for e in fit["efficiencies"]}
    halves = {e["scheme"]: e for e in fit["efficiencies"] if e.get("kind") in ("forward", "backward")}
    recipes = [e["scheme"] for e in fit["efficiencies"] if e.get("kind") not in ("forward", "backward")]
    consistency = {c["recipe"]: c for c in fit.get("consistency", [])}
    head = (fit.get("headlines") or [{}])[0]
    at_n, ratio = head.get("at_n"), head.get("at_ratio")
    speeds = _step_speed(speed)
    out = []
    for r in recipes:
        fwd, bwd = _eff(halves.get(f"{r}_fwd"), "eff_n"), _eff(halves.get(f"{r}_bwd"), "eff_d")
        row = {"recipe": r, "eff_n": fwd, "eff_d": bwd, "consistency": consistency.get(r),
               "speed": speeds.get(r), "breakeven": None, "at_n": at_n, "at_ratio": ratio,
               "joint": (effs[r]["eff_n"], effs[r]["eff_d"])}
        if fwd and bwd and at_n:
            row["breakeven"] = float(breakeven_speedup(fit["base"]["params"], fwd[0], bwd[0], at_n, at_n * ratio))
        out.append(row)
    return out


def _fmt(e) -> str:
    if e is None:
        return "not run"
    value, iv, verdict = e
    return f"{value:.3f} [{iv[0]:.2f}, {iv[1]:.2f}] {verdict}" if iv else f"{value:.3f} {verdict}"


def markdown(table: list[dict], fit: dict, fit_name: str, speed: dict) -> str:
    out = ["<!-- written by benchmarks/halves_table.py; do not edit by hand -->", "",
           "| recipe | effN, forward-only [95%] | effD, backward-only [95%] | gap: observed / effN·effD predict | "
           "break-even speedup | step speed vs bf16 (200M) | pays off |", "|---|---|---|---|---|---|---|"]
    for r in sorted(table, key=lambda r: (r["eff_n"] is None and r["eff_d"] is None)):  # measured recipes first
        c = r["consistency"]
        gap = (f"{c['observed_gap']:+.3f} / {c['predicted_gap']:+.3f} ({c['verdict']})" if c else "—")
        be = "—" if r["breakeven"] is None else ("never" if not math.isfinite(r["breakeven"]) else f"{r['breakeven']:.2f}×")
        sp = "—" if r["speed"] is None else f"{r['speed']:.2f}×"
        pays = "—" if r["breakeven"] is None or r["speed"] is None else ("yes" if r["speed"] > r["breakeven"] else "no")
        if pays != "—" and not all(e[2] == "pinned" for e in (r["eff_n"], r["eff_d"])):
            pays += " (an efficiency not pinned)"
        out.append(f"| `{r['recipe']}` | {_fmt(r['eff_n'])} | {_fmt(r['eff_d'])} | {gap} | {be} | {sp} | {pays} |")
    head = table[0] if table else {}
    base = fit["base"]
    out += ["", f"Fit: `{fit_name}` ({fit['provenance']['options'].get('runs')} runs; base law {base['law']}, "
            f"{base['status']}). Intervals: bootstrap with the base law held at its fit ({KIND}); verdicts by "
            f"`analysis.verdict` (pinned: off the bounds and narrower than "
            f"{fit['provenance']['options'].get('pinned_width', 0.3)}). Break-even at N = {head.get('at_n', 0):.3g}, "
            f"D/N = {head.get('at_ratio', 0):g}, from the forward-only effN and the backward-only effD; step speed "
            f"from `speed_200m.json` ({speed.get('device', '?')}, the path `auto` picks)."]
    unrun = [r["recipe"] for r in table if r["eff_n"] is None and r["eff_d"] is None]
    if unrun:
        out.append(f"Not run: the halves of {', '.join(f'`{u}`' for u in unrun)} (beyond the budget: "
                   f"`benchmarks/results/design/plan.md`).")
    return "\n".join(out) + "\n"


def figure(table: list[dict], fit: dict, joint_fit: dict | None, out: Path) -> Path:
    """effN from the forward-only runs and effD from the backward-only runs per recipe (base-fixed interval thick,
    full interval thin), beside the joint fit of the recipe's own runs (open, grey: the recipe table's fit)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    halves = {e["scheme"]: e for e in fit["efficiencies"] if e.get("kind") in ("forward", "backward")}
    joint = {e["scheme"]: e for e in (joint_fit or {}).get("efficiencies", [])}
    recipes = [r["recipe"] for r in table if r["eff_n"] is not None or r["eff_d"] is not None]
    y = {p: len(recipes) - 1 - i for i, p in enumerate(recipes)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.6 * len(recipes) + 2.2), sharey=True)
    for ax, key, half, title, color in ((axes[0], "eff_n", "_fwd", "(a) effN from forward-only runs", "#1f77b4"),
                                        (axes[1], "eff_d", "_bwd", "(b) effD from backward-only runs", "#c44e52")):
        for p in recipes:
            e = halves.get(p + half)
            if e is not None:
                full, fixed = e.get(f"{key}_interval"), e.get(f"{key}_interval_{KIND}")
                if full:
                    ax.plot(full, [y[p] + 0.1] * 2, color=color, lw=1.0, zorder=2)
                if fixed:
                    ax.plot(fixed, [y[p] + 0.1] * 2, color=color, lw=4, alpha=0.45, solid_capstyle="butt", zorder=2)
                pinned = (e.get("verdicts") or {}).get(key, {}).get(KIND) == "pinned"
                ax.plot(e[key], y[p] + 0.1, "o", ms=7, color=color, mfc=color if pinned else "white", zorder=3)
            j = joint.get(p)
            if j is not None:
                lo, hi = j.get(f"{key}_interval") or (j[key], j[key])
                ax.plot([lo, hi], [y[p] - 0.15] * 2, color="0.6", lw=1.0, zorder=1)
                ax.plot(j[key], y[p] - 0.15, "s", ms=5, color="0.6", mfc="white", zorder=1)
        ax.axvline(1, color="0.3", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlim(0.03, 5)
        ax.set_title(title, fontsize=11)
        ax.grid(axis="x", alpha=0.3)
        for p in recipes:
            ax.axhline(y[p] - 0.5, color="0.9", lw=0.6, zorder=0)
    axes[0].set_yticks([y[p] for p in recipes], recipes)
    axes[0].set_ylim(-0.6, len(recipes) - 0.4)
    for ax in axes:
        ax.set_xlabel("efficiency (95% bootstrap interval)")
    handles = [Line2D([], [], color="0.3", lw=4, alpha=0.45, label="base fixed 95%"),
               Line2D([], [], color="0.3", lw=1, label="full 95% (base law refitted)"),
               Line2D([], [], color="0.3", marker="o", ls="", label="filled: pinned (off the bounds, < 0.3 wide)"),
               Line2D([], [], color="0.6", marker="s", mfc="white", ls="-", label="joint fit of the recipe's own runs (recipe table, every rung)")]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fit", type=Path, default=None,
                   help="fit JSON of the half runs (default: halves/fit.json, else halves/forecast_fit.json)")
    p.add_argument("--speed", type=Path, default=SPEED, help="ladder_speed.py JSON of every recipe's step")
    p.add_argument("--out", type=Path, default=None, help="where table.md goes (default: beside the fit)")
    p.add_argument("--docs", default=str(DOCS), help="page whose halves_table.py block becomes table.md ('' leaves it)")
    p.add_argument("--joint-fit", type=Path, default=JOINT_FIT,
                   help="the recipe table's fit, drawn beside the halves' efficiencies in halves.png")
    args = p.parse_args(argv)
    fit_path = args.fit or next(f for f in (RESULTS / "fit.json", RESULTS / "forecast_fit.json") if f.is_file())
    fit, speed = json.loads(fit_path.read_text()), json.loads(args.speed.read_text())
    name = str(fit_path.resolve().relative_to(REPO)) if REPO in fit_path.resolve().parents else str(fit_path)
    md = markdown(rows(fit, speed), fit, name, speed)
    out = args.out or fit_path.parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(md)
    joint = json.loads(args.joint_fit.read_text()) if args.joint_fit and args.joint_fit.is_file() else None
    figure(rows(fit, speed), fit, joint, out / "halves.png")
    if args.docs and update_marked_block(args.docs, PAGE_BLOCK, md):
        print(f"updated the table in {args.docs}")
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
