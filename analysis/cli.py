"""``quartet fit`` and ``quartet figures``: command-line front ends of :mod:`analysis` (no torch)."""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

from analysis.errors import AnalysisError
from analysis.laws import LAWS
from analysis.load import BASE_LABEL

SOURCE_HELP = ("runs directory, .csv/.parquet table (columns n_params, tokens, forward, backward, loss), "
               "wandb:ENTITY/PROJECT, a folder of wandb offline runs, or --paper for the bundled paper grid")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="?", help=SOURCE_HELP)
    p.add_argument("--paper", action="store_true", help="use the Quartet paper's published loss grid")
    p.add_argument("--law", choices=sorted(LAWS), default="busbridge", help="law form (default: busbridge)")
    p.add_argument("--bootstrap", type=int, default=0, metavar="N", help="bootstrap resamples for 95%% intervals")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--resample", choices=("cells", "residuals"), default="cells",
                   help="what the bootstrap redraws: whole cells (default) or, the design held fixed, each point's "
                        "log-residual (the bootstrap of a designed grid; assumes the law's form)")
    p.add_argument("--selections", choices=("auto", "paper", "none"), default="auto",
                   help="row selections per precision: the paper notebook's (auto = only for --paper)")
    p.add_argument("--at-n", type=float, default=None, help="model size for the headline (default: largest base N)")
    p.add_argument("--at-ratio", type=float, default=None,
                   help="D/N for the headline (default: median D/N of the baseline runs; 100 for --paper)")
    p.add_argument("--replicates", choices=("mean", "all"), default="mean",
                   help="seed replicates of one (N, D, precision) cell: fit their mean as one point (default) or "
                        "every run as its own point")
    p.add_argument("--delta", type=float, default=None, metavar="D",
                   help="Huber threshold on log-loss residuals (default: the paper's 1e-4)")
    p.add_argument("--exclude", default=None, metavar="QUERY",
                   help="leave out runs matching a pandas query, e.g. \"steps < 500\" (listed as dropped, with the rule)")
    p.add_argument("--min-params", type=float, default=None, metavar="N",
                   help="the rung rule: leave out every run of a model size below N non-embedding parameters, where at "
                        "least 3 base sizes remain (default 2e6; 0 keeps every rung); the fit with them is printed too")
    p.add_argument("--pinned-width", type=float, default=None, metavar="W",
                   help="the widest 95%% efficiency interval the verdicts call pinned (default 0.3; analysis.verdict)")
    p.add_argument("--start-grid", choices=("paper", "wide"), default="paper",
                   help="multi-start grid: the paper's (486 starts) or a wider one (3,072) for data far from its scale")
    p.add_argument("-v", "--verbose", action="store_true", help="log dropped runs and fit details")


def _check_common(args) -> None:
    """The options every fit takes, checked before any data is read (one line each)."""
    if args.paper == bool(args.source):
        raise AnalysisError("give exactly one SOURCE or --paper")
    if args.bootstrap < 0:
        raise AnalysisError(f"--bootstrap must be >= 0 resamples (got {args.bootstrap})")
    if args.seed < 0:  # numpy's generators take none
        raise AnalysisError(f"--seed must be >= 0 (got {args.seed})")
    if args.delta is not None and not args.delta > 0:
        raise AnalysisError(f"--delta must be positive (got {args.delta})")
    if args.min_params is not None and not (math.isfinite(args.min_params) and args.min_params >= 0):
        raise AnalysisError(f"--min-params must be >= 0 parameters (got {args.min_params:g})")
    if args.pinned_width is not None and not args.pinned_width > 0:
        raise AnalysisError(f"--pinned-width must be positive (got {args.pinned_width:g})")
    for flag, value in (("--at-n", args.at_n), ("--at-ratio", args.at_ratio)):
        if value is not None and not value > 0:
            raise AnalysisError(f"{flag} must be positive (got {value:g})")


def check_writable(path: Path, flag: str, folder: bool = False) -> None:
    """AnalysisError (one line) unless ``path`` (a file, or a folder with ``folder``) can be written: checked before
    the work, so a read-only location does not cost a whole fit and end in a traceback."""
    from quartet.paths import not_writable

    why = not_writable(path, folder=folder)
    if why:
        raise AnalysisError(f"{flag} {path}: {why}; choose another location")


def _load_and_fit(args):
    from analysis.load import load
    from analysis.report import fit_all

    _check_common(args)
    df = load("paper" if args.paper else args.source)
    sel = None if args.selections == "none" else args.selections
    extra = {k: v for k, v in (("delta", args.delta), ("min_params", args.min_params),
                                ("pinned_width", args.pinned_width)) if v is not None}
    report = fit_all(df, args.law, bootstrap=args.bootstrap, seed=args.seed, selections=sel, at_n=args.at_n,
                     at_ratio=args.at_ratio, progress=args.bootstrap > 0, replicates=args.replicates,
                     exclude=args.exclude, start_grid=args.start_grid, resample=args.resample, **extra)
    return df, report


def _iv(iv, fmt="{:.4g}"):
    return "" if iv is None else f"[{fmt.format(iv[0])}, {fmt.format(iv[1])}]"


def _headline_reading(h: dict) -> str:
    """The headline's qualifiers in a few words: the fit's flag and which intervals include 1."""
    parts = [f"not a finding ({h['caveat'].split(':')[0]})"] if h.get("caveat") else []
    parts += [f"{e} interval includes 1" for e in h.get("includes_one", ())]
    return "; ".join(parts) or "finding"


def _signed_pct(v: float) -> str:
    return "0.0%" if round(v, 1) == 0 else f"{v:+.1f}%"


def _print_headline_table(console, headlines) -> None:
    """Many precisions' headlines as one table (a sentence each is unreadable beyond two or three)."""
    from rich.table import Table

    h0 = headlines[0]
    t = Table(title=f"What each precision costs at N = {h0['at_n']:.3g}, D/N = {h0['at_ratio']:g}, and the training "
                    f"speedup at which it pays off", title_justify="left")
    for col in ("precision", "effective N", "effective D", "break-even speedup", "reading"):
        t.add_column(col)
    for h in headlines:
        z = h["breakeven_speedup"]
        t.add_row(h["scheme"], _signed_pct(-h["lost_params_pct"]), _signed_pct(-h["lost_data_pct"]),
                  f"{z:.2f}x" if z == z and z != float("inf") else "none", _headline_reading(h))
    console.print(t)


def print_report(report, console=None) -> None:
    """Rich tables: base parameters with intervals, multi-start log, efficiencies, forecasts, headlines."""
    from rich.console import Console
    from rich.table import Table

    # Pipes/logs get a wide console so the tables do not wrap into unreadable columns.
    console = console or (Console() if sys.stdout.isatty() else Console(width=150))
    b = report.base
    boot = bool(report.base_intervals)
    opts = report.provenance.get("options", {})
    averaged = opts.get("runs", 0) > opts.get("points", 0)
    if averaged:
        console.print(f"seed replicates averaged: {opts['runs']} runs -> {opts['points']} (N, D, precision) cells, "
                      f"one point each (--replicates all: every run a point)")
    t = Table(title=f"Base law ({b.law}), {b.n_points} {'cells' if averaged else 'runs'}", title_justify="left")
    for col in ("parameter", "value", "95% interval", "note"):
        t.add_column(col)
    for name, val in b.params.items():
        raw = {"A": "a", "B": "b", "E": "e"}.get(name, name)
        t.add_row(name, f"{val:.6g}", _iv(report.base_intervals.get(name)) or "-", "" if raw in b.free else "fixed")
    console.print(t)
    console.print(f"base fit status: {b.status}" + ("" if boot else " (intervals: run with --bootstrap N)"))
    ms = b.multistart
    if ms:
        console.print(f"multi-start: {ms.n_converged}/{ms.n_starts} starts reached the best basin "
                      f"(cost within {ms.rel_tol:g}); best costs {', '.join(f'{c:.4e}' for c in ms.best_costs)}; "
                      f"{ms.seconds:.2f} s")
    if b.status != "converged":
        console.print(f"[yellow]base fit flagged: {b.status}: {b.message}[/yellow]")
    if report.efficiencies:
        _print_efficiencies(console, report, boot)
        for e in report.efficiencies:  # the reason beside every flag (an inherited one is the base's, printed above)
            if e.status != "converged" and not e.message.startswith("inherited"):
                console.print(f"[yellow]{e.scheme}: {e.status}: {e.message}[/yellow]")
    if report.bootstrap.get("requested"):
        console.print(f"bootstrap: {report.bootstrap['used']}/{report.bootstrap['requested']} resamples used")
    _print_consistency(console, report)
    _print_rung_rule(console, report)
    for f in report.forecasts:
        if f.mean_abs_rel_error == f.mean_abs_rel_error:  # not NaN
            console.print(f"forecast {f.name}: mean |rel. error| {f.mean_abs_rel_error:.2%}, max "
                          f"{f.max_abs_rel_error:.2%} on {len(f.held_out)} held-out run(s) (refit: {f.status})")
        else:
            console.print(f"forecast {f.name}: skipped ({f.status}: {f.message})")
    if len(report.headlines) > 2:
        _print_headline_table(console, report.headlines)
    else:
        for h in report.headlines:
            console.print(f"• {h['text']}")
    if report.dropped:
        # the rung rule's runs in one line (its reason is the same for all of them and printed above)
        by_rule = [d for d in report.dropped if d["reason"].startswith("rung rule:")]
        console.print(f"dropped {len(report.dropped)} run(s)" + (f", {len(by_rule)} of them by the rung rule" if by_rule
                                                                 else "") + ":")
        for d in report.dropped:
            if d not in by_rule:
                console.print(f"  - {d['run_id']}: {d['reason']}")


def _print_efficiencies(console, report, boot: bool) -> None:
    """The efficiency table: points, both interval kinds with their verdicts (analysis.verdict), status."""
    from rich.table import Table

    from analysis.verdict import INTERVAL_KINDS

    e_t = Table(title="Efficiencies (stage 2; forward-only runs fit effN alone, backward-only runs effD alone)",
                title_justify="left")
    cols = ["precision", "fitted", "effN", "effD"]
    if boot:
        cols += ["effN 95% full", "effN 95% base fixed", "effD 95% full", "effD 95% base fixed"]
    for col in cols + ["points", "status"]:
        e_t.add_column(col)

    def cell(iv, v) -> str:
        return "" if iv is None else f"{_iv(iv, '{:.3f}')} {v}"

    for e in report.efficiencies:
        row = [e.scheme, e.kind, f"{e.eff_n:.4f}" if e.fits_n else "1", f"{e.eff_d:.4f}" if e.fits_d else "1"]
        if boot:
            ints, verdicts = report.intervals(e.scheme), report.verdicts(e.scheme)
            for key in ("eff_n", "eff_d"):
                row += [cell(ints[kind][key], verdicts.get(key, {}).get(kind, "")) for kind in ("full", "base_fixed")]
        row += [str(e.n_points), e.status if e.status == "converged" else f"[yellow]{e.status}[/yellow]"]
        e_t.add_row(*row)
    console.print(e_t)
    if boot:
        console.print(f"intervals: full = {INTERVAL_KINDS['full']}; base fixed = {INTERVAL_KINDS['base_fixed']}. "
                      f"pinned = off the bounds and narrower than {report.pinned_width:g} (analysis.verdict)")


def _print_consistency(console, report) -> None:
    """Each combined recipe's gap against its halves' prediction (the Quartet paper's consistency check)."""
    if not report.consistency:
        return
    from rich.table import Table

    t = Table(title="Consistency: each recipe's gap to the base law against the gap its forward-only effN and "
                    "backward-only effD predict together (nats, mean over its cells)", title_justify="left")
    for col in ("recipe", "effN (fwd-only)", "effD (bwd-only)", "cells", "observed gap", "predicted gap",
                "discrepancy [95%]", "verdict"):
        t.add_column(col)
    for c in report.consistency:
        iv = _iv(c["interval"], "{:+.3f}")
        t.add_row(c["recipe"], f"{c['eff_n']:.3f} ({c['forward_only']})", f"{c['eff_d']:.3f} ({c['backward_only']})",
                  str(c["cells"]), f"{c['observed_gap']:+.4f}", f"{c['predicted_gap']:+.4f}",
                  f"{c['discrepancy']:+.4f} {iv}".strip(),
                  c["verdict"] if c["verdict"] != "inconsistent" else f"[yellow]{c['verdict']}[/yellow]")
    console.print(t)
    if any(c["interval"] is None for c in report.consistency):
        console.print("consistency verdicts need the bootstrap's intervals: run with --bootstrap N")


def _print_rung_rule(console, report) -> None:
    """What the rung rule did and, where it excluded rungs, the fit with them kept beside the reported one."""
    rule = report.rung_rule
    if not rule or rule.get("note") in ("off", None) or rule["note"].startswith("no base model size"):
        return
    console.print(f"rung rule (min_params {rule['min_params']:.3g}): {rule['note']}"
                  + (f"; {rule['excluded_runs']} run(s) left out" if rule["applied"] else ""))
    kept = rule.get("with_excluded")
    if not kept:
        return
    from rich.table import Table

    t = Table(title="The fit without and with the excluded rung(s) (points; the reported fit is the first)",
                title_justify="left")
    for col in ("", "fit", *report.base.params, "status"):
        t.add_column(col)
    t.add_row("base", "rule applied", *(f"{v:.4g}" for v in report.base.params.values()), report.base.status)
    t.add_row("", "every rung", *(f"{kept['base']['params'][k]:.4g}" for k in report.base.params),
              kept["base"]["status"])
    console.print(t)
    for e in report.efficiencies:
        k = kept["efficiencies"].get(e.scheme)
        if k is not None:
            console.print(f"  {e.scheme}: effN {e.eff_n:.3f} -> {k['eff_n']:.3f}, effD {e.eff_d:.3f} -> "
                          f"{k['eff_d']:.3f} with every rung ({k['status']})")


def fit_main(argv: list[str] | None = None) -> int:
    """``quartet fit SOURCE [--law ...] [--bootstrap N] [--json OUT]``."""
    p = argparse.ArgumentParser(prog="quartet fit", description="Fit the low-precision scaling law "
                                "L = (A/(N·effN)^α + B/(D·effD)^β)^γ + E to finished runs or a loss table.")
    _common(p)
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="write the report as JSON")
    p.add_argument("--profile-e", action="store_true",
                   help="also refit at E fixed on a grid: do the efficiencies depend on the irreducible loss?")
    p.add_argument("--profile-bootstrap", type=int, default=0, metavar="N",
                   help="with --profile-e: bootstrap N resamples at every admissible E, for each efficiency's 95%% "
                        "interval whatever E is (slow: one bootstrap per E)")
    p.add_argument("--profile-csv", type=Path, default=None, metavar="OUT", help="with --profile-e: write the table")
    p.add_argument("--optimal", default=None, metavar="C[,C...]",
                   help="training budgets in FLOPs (C = 6ND): the compute-optimal N, D and loss per precision "
                        "(intervals with --bootstrap)")
    p.add_argument("--speedup", action="append", default=[], metavar="PRECISION=S",
                   help="a precision's training speedup over the baseline for --optimal (repeatable; default 1)")
    p.add_argument("--isoflop", action="store_true",
                   help="also estimate N_opt(C) from IsoFLOP slices (Chinchilla Approach 2), where the runs form them")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(levelname)s %(message)s")
    try:
        _check_common(args)
        budgets, speedups = _optimal_args(args)
        for flag, path in (("--json", args.json), ("--profile-csv", args.profile_csv)):
            if path is not None:
                check_writable(path, flag)
        df, report = _load_and_fit(args)
        _check_speedup_names(speedups, report)
        print_report(report)
        if args.profile_e:
            _print_profile(df, args)
        if args.optimal:
            _print_optimal(report, budgets, speedups)
        if args.isoflop:
            _print_isoflop(df, report)
    except AnalysisError as exc:
        print(f"quartet fit: {exc}", file=sys.stderr)
        return 2
    if args.json:
        report.to_json(args.json)
        print(f"wrote {args.json}")
    return 0


def _optimal_args(args) -> tuple[list[float], dict[str, float]]:
    """--optimal's budgets and --speedup's PRECISION=S pairs, checked before the fit (one line each)."""
    budgets: list[float] = []
    if args.optimal:
        try:
            budgets = [float(c) for c in args.optimal.split(",")]
        except ValueError:
            raise AnalysisError(f"--optimal takes FLOPs separated by commas, like 1e19,1e20 (got {args.optimal!r})") from None
        if not all(math.isfinite(c) and c > 0 for c in budgets):
            raise AnalysisError(f"--optimal budgets must be positive (got {args.optimal!r})")
    speedups: dict[str, float] = {}
    for item in args.speedup:
        key, sep, value = item.partition("=")
        try:
            speed = float(value) if sep and key.strip() else float("nan")
        except ValueError:
            speed = float("nan")
        if not (math.isfinite(speed) and speed > 0):
            raise AnalysisError(f"--speedup takes PRECISION=S with S > 0, e.g. --speedup quartet=1.8 (got {item!r})")
        speedups[key.strip().lower()] = speed
    if speedups and not budgets:
        raise AnalysisError("--speedup applies to --optimal's compute-optimal table; give --optimal C[,C...] too")
    return budgets, speedups


def _check_speedup_names(speedups: dict, report) -> None:
    """A --speedup naming no fitted precision (a typo, or a label of another table) is an error, not ignored."""
    labels = [BASE_LABEL] + [e.scheme for e in report.efficiencies]
    unknown = [k for k in speedups if k not in {label.lower() for label in labels}]
    if unknown:
        raise AnalysisError(f"--speedup {unknown[0]}: no precision of that name in the fit; its precisions are "
                            f"{', '.join(labels)}")


def _print_optimal(report, budgets: list[float], speedups: dict[str, float]) -> None:
    from rich.console import Console
    from rich.table import Table

    speedups = {label: speedups[label.lower()] for label in
                [BASE_LABEL] + [e.scheme for e in report.efficiencies] if label.lower() in speedups}
    rows = report.compute_optimal(budgets, speedups)
    console = Console() if sys.stdout.isatty() else Console(width=150)
    t = Table(title="Compute-optimal allocation (C = 6ND; a speedup s buys C·s)", title_justify="left")
    for col in ("C (FLOPs)", "precision", "speedup", "N_opt", "D_opt", "D/N", "loss", "status"):
        t.add_column(col)
    for r in rows:
        iv = {k: r.get(f"{k}_interval") for k in ("n_opt", "d_opt", "loss")}
        cell = {k: f"{r[k]:.3g}" + (f" [{iv[k][0]:.3g}, {iv[k][1]:.3g}]" if iv[k] else "") for k in iv}
        t.add_row(f"{r['flops']:.3g}", r["precision"], f"{r['speedup']:g}", cell["n_opt"], cell["d_opt"],
                  f"{r['ratio']:.3g}", cell["loss"], r["status"])
    console.print(t)
    lo, hi = report.provenance["base_range"]["n_min"], report.provenance["base_range"]["n_max"]
    outside = sorted({f"{r['flops']:.3g}" for r in rows if not lo <= r["n_opt"] <= hi})
    if outside:
        console.print(f"[yellow]N_opt outside the fitted N range [{lo:.3g}, {hi:.3g}] at C = {', '.join(outside)}: "
                      f"an extrapolation[/yellow]")


def _print_isoflop(df, report) -> None:
    from analysis.isoflop import MIN_SIZES, SLICE_TOLERANCE, isoflop_exponent, isoflop_slices

    p = report.base.params
    law = p["beta"] / (p["alpha"] + p["beta"])
    print(f"\nIsoFLOP slices (runs within {SLICE_TOLERANCE:g}x of one C = 6ND, >= {MIN_SIZES} sizes; parabola in ln N):")
    found = False
    for prec, rows in df.groupby("precision"):
        slices = isoflop_slices(rows)
        if slices.empty:
            continue
        found = True
        print(f"{prec}:")
        print(slices.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        exp = isoflop_exponent(slices)
        if exp:
            print(f"• {prec}: N_opt ∝ C^{exp['a_n']:.3f}, D_opt ∝ C^{exp['a_d']:.3f} from {exp['slices']} slices "
                  f"(the fitted law ({report.base.status}): N_opt ∝ C^{law:.3f})")
    if not found:
        print("• no IsoFLOP slices: the runs have no budget C shared by 3+ model sizes (a grid over N and D/N rarely does)")


def _print_profile(df, args) -> None:
    from analysis.report import e_profile, profile_ranges

    if args.profile_bootstrap < 0:
        raise AnalysisError(f"--profile-bootstrap must be >= 0 (got {args.profile_bootstrap})")
    prof = e_profile(df, args.law, replicates=args.replicates, bootstrap=args.profile_bootstrap, seed=args.seed,
                     resample=args.resample)
    if args.profile_csv:
        args.profile_csv.parent.mkdir(parents=True, exist_ok=True)
        prof.to_csv(args.profile_csv, index=False, float_format="%.6g")
    cols = [c for c in prof.columns if c not in ("cost",) and not c.endswith(("_lo", "_hi"))]
    print(f"\nprofile over E ({args.law}; admissible = base fit's RMS log residual within the pooled seed noise "
          f"{prof.attrs.get('seed_noise_log', float('nan')):.4f}):")
    print(prof[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    ranges = profile_ranges(prof)
    noise = prof.attrs.get("seed_noise_log", float("nan"))
    if not ranges and prof["admissible"].notna().any():
        best = prof.loc[prof["rms_log_residual"].idxmin()]
        effs = [c[: -len("_effN")] for c in prof.columns if c.endswith("_effN")]
        spans = "; ".join(f"{label} effN {prof[f'{label}_effN'].min():.3f}-{prof[f'{label}_effN'].max():.3f}, "
                          f"effD {prof[f'{label}_effD'].min():.3f}-{prof[f'{label}_effD'].max():.3f}" for label in effs)
        print(f"• no E fits the base cells within the pooled seed noise {noise:.4f}: the smallest RMS log residual is "
              f"{best['rms_log_residual']:.4f} (at E = {best['E']:.3g}), so the law's form, not E, limits the fit — "
              f"unless that noise, pooled from the few replicated cells, is underestimated; look at the cells with the "
              f"largest residuals. Over the whole grid of E (none admissible, so no fit the data accept): {spans}")
    elif not ranges:
        print("• no seed replicates to measure noise with: which E the data admit is not judged; read the table")
    if ranges:
        lo, hi = ranges["E"]
        schemes = {label: r for label, r in ranges.items() if label != "E"}
        for label, r in schemes.items():
            print(f"• over E in [{lo:.3g}, {hi:.3g}]: {label} effN {r['eff_n'][0]:.3f}-{r['eff_n'][1]:.3f}, "
                  f"effD {r['eff_d'][0]:.3f}-{r['eff_d'][1]:.3f} (point estimates)")
        for label, r in schemes.items():  # with --profile-bootstrap: the per-E intervals' envelope
            for key, name in (("eff_n", "effN"), ("eff_d", "effD")):
                if f"{key}_interval" not in r:
                    continue
                a, b = r[f"{key}_interval"]
                at = r[f"{key}_includes_1_at_E"]
                verdict = ("excludes 1 at every admissible E: a cost whatever E is" if not at else
                           f"includes 1 at E = {', '.join(f'{e:.3g}' for e in at)}: not a cost at every admissible E")
                print(f"• {label} {name}: 95% intervals with E held fixed span [{a:.3f}, {b:.3f}] over the admissible "
                      f"E; {verdict}")


def figures_main(argv: list[str] | None = None) -> int:
    """``quartet figures (--paper | SOURCE) [--out DIR]``: fit, then write every figure (PNG + PDF)."""
    p = argparse.ArgumentParser(prog="quartet figures", description="Fit and plot: losses with fitted curves, "
                                "efficiencies, residuals, break-even speedups, optimal-precision maps.")
    _common(p)
    p.add_argument("--out", type=Path, default=Path("figures"), help="output folder (default: ./figures)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(levelname)s %(message)s")
    try:
        _check_common(args)
        check_writable(args.out, "--out", folder=True)
        df, report = _load_and_fit(args)
    except AnalysisError as exc:
        print(f"quartet figures: {exc}", file=sys.stderr)
        return 2
    from analysis.figures import make_all

    paths = make_all(report, df, args.out)
    report.to_json(args.out / "fit.json")
    for h in report.headlines:
        print(f"• {h['text']}")
    print(f"wrote {len(paths)} figure files and fit.json to {args.out}/")
    return 0


def _floats(text: str, flag: str) -> list[float]:
    """``1e7,2e7`` -> [1e7, 2e7]; a bad number is one line naming the flag."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise AnalysisError(f"{flag} takes numbers separated by commas, e.g. 5,10 (got {text!r})") from None


def predict_main(argv: list[str] | None = None, model_point=None) -> int:
    """``quartet predict SOURCE (--model NAME | --n N) (--dn R | --tokens D) [--precision P] [--json [OUT]]``.
    ``model_point`` resolves ``--model`` names (see :func:`analysis.predict.points`)."""
    from analysis.predict import LawFit, forecast, is_fit_json, points

    p = argparse.ArgumentParser(
        prog="quartet predict",
        description="The loss the fitted law forecasts at (N, D) for each precision, with a 95%% interval from the "
                    "bootstrap's refits. SOURCE: a fit JSON (quartet fit --bootstrap N --json OUT) or anything "
                    "quartet fit reads (fitted here; --bootstrap N for intervals).",
        epilog="examples: quartet predict benchmarks/results/ladder/fit.json --model llama_50m --dn 5; "
               "quartet predict runs/my_sweep --bootstrap 100 --n 5e7 --tokens 2.5e8 --precision bf16,quartet")
    _common(p)
    p.add_argument("--model", action="append", default=[], metavar="NAME",
                   help="a model of conf/model (its exact non-embedding N); repeatable or comma-separated")
    p.add_argument("--n", default="", metavar="N[,N...]", help="non-embedding parameter counts, e.g. 5e7")
    p.add_argument("--dn", default="", metavar="R[,R...]",
                   help="tokens per parameter; with --model, the tokens a run of that budget trains (whole steps)")
    p.add_argument("--tokens", default="", metavar="D[,D...]", help="training tokens, e.g. 2.5e8")
    p.add_argument("--precision", action="append", default=[], metavar="P",
                   help="precisions to forecast (default: the base and every fitted one); repeatable or comma-separated")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="OUT",
                   help="write the rows as JSON to OUT (or stdout without OUT) instead of the table")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(levelname)s %(message)s")
    try:
        _check_common(args)
        models = [m for item in args.model for m in item.split(",") if m]
        pts = points(models=models, ns=_floats(args.n, "--n"), dns=_floats(args.dn, "--dn"),
                     tokens=_floats(args.tokens, "--tokens"), model_point=model_point)
        precisions = [x for item in args.precision for x in item.split(",") if x] or None
        if args.json not in (None, "-"):
            check_writable(Path(args.json), "--json")
        if args.source and not args.paper and is_fit_json(args.source):
            if args.bootstrap:
                raise AnalysisError(f"{args.source} is a fit JSON: its own bootstrap refits give the intervals "
                                    f"(--bootstrap applies when SOURCE is fitted here)")
            fit = LawFit.from_json(args.source)
        else:
            _, report = _load_and_fit(args)
            fit = LawFit.from_report(report, source="paper" if args.paper else args.source)
        rows = forecast(fit, pts, precisions)
    except AnalysisError as exc:
        print(f"quartet predict: {exc}", file=sys.stderr)
        return 2
    if args.json is not None:
        text = json.dumps({"source": fit.source, "bootstrap_draws": len(fit.draws), "rows": rows}, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
            print(f"wrote {args.json}")
        return 0
    print_forecast(fit, rows)
    return 0


def print_forecast(fit, rows: list[dict], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or (Console() if sys.stdout.isatty() else Console(width=150))
    t = Table(title=f"Forecast from {fit.source or 'the fit'} ({len(fit.draws)} bootstrap refits)", title_justify="left")
    for col in ("model", "N", "D", "D/N", "precision", "loss", "95% interval", "gap to base [95%]", "fit status"):
        t.add_column(col, justify="left" if col in ("model", "precision", "fit status") else "right")
    for r in rows:
        iv, giv = r["interval"], r["gap_interval"]
        gap = f"{r['gap']:+.4f}" + (f" [{giv[0]:+.4f}, {giv[1]:+.4f}]" if giv else "")
        t.add_row(r["model"] or "-", f"{r['n_params']:.4g}", f"{r['tokens']:.4g}", f"{r['ratio']:.3g}", r["precision"],
                  f"{r['loss']:.4f}", f"[{iv[0]:.4f}, {iv[1]:.4f}]" if iv else "-", gap, r["status"])
    console.print(t)
    if any(r["interval"] is None for r in rows):
        console.print("no interval where the fit has fewer than 10 bootstrap refits: fit with --bootstrap N "
                      "(quartet fit SOURCE --bootstrap 200 --json fit.json keeps them)")
    for note in sorted({r["extrapolation"] for r in rows if r["extrapolation"]}):
        console.print(f"[yellow]extrapolation: {note} (base runs: N {fit.base_range.get('n_min', 0):.3g}-"
                      f"{fit.base_range.get('n_max', 0):.3g}, D/N {fit.base_range.get('ratio_min', 0):.3g}-"
                      f"{fit.base_range.get('ratio_max', 0):.3g})[/yellow]")
    flagged = {r["precision"]: r for r in rows if r["status"] != "converged" and not r["message"].startswith("inherited")}
    for prec, r in flagged.items():
        console.print(f"[yellow]{prec}: fit {r['status']}: {r['message']}[/yellow]")


def _names(text: str, flag: str) -> list[str]:
    items = [x.strip() for x in (text or "").split(",") if x.strip()]
    if not items:
        raise AnalysisError(f"{flag} is empty: give at least one, separated by commas")
    return items


def design_main(argv: list[str] | None = None, cell_of=None, labels_of=None) -> int:
    """``quartet design SOURCE... --precisions P,... --models M,... --dn R,... --gpu-hours H``: the cheapest runs that
    pin the asked efficiencies in a simulation of ``quartet fit`` (:mod:`analysis.design`). ``cell_of(model, dn)``
    and ``labels_of(precision)`` resolve names from the training configs (the dispatcher passes them)."""
    from analysis import design as dz
    from analysis.verdict import INTERVAL_KINDS, PINNED_WIDTH
    from quartet.paths import REPO_ROOT

    speeds_default = ",".join(str(REPO_ROOT / "benchmarks" / "results" / "recipes" / f)
                              for f in ("recipe_speed.json", "speed_200m.json"))
    p = argparse.ArgumentParser(
        prog="quartet design",
        description="Choose the runs that pin efficiencies before running them: simulate the fit quartet fit will "
                    "run (existing runs + candidate runs drawn from the planted law with seed noise and the law's "
                    "misfit per size) and search for the cheapest cells that pin what is asked within a GPU budget.",
        epilog="example: quartet design benchmarks/results/recipes/losses.csv --fit benchmarks/results/recipes/fit.json "
               "--precisions quartet_fwd,quartet_bwd --models llama_3m,llama_7m,llama_20m --dn 5,10,20,40,80 "
               "--gpu-hours 1")
    p.add_argument("source", nargs="+", help="existing runs: loss tables or runs directories (merged by run id)")
    p.add_argument("--precisions", required=True, metavar="P,...", help="precisions to measure, e.g. quartet_fwd")
    p.add_argument("--models", required=True, metavar="M,...", help="candidate model sizes (conf/model names)")
    p.add_argument("--dn", required=True, metavar="R,...", help="candidate budgets, tokens per parameter")
    p.add_argument("--gpu-hours", type=float, required=True, metavar="H", help="the budget for the added runs")
    p.add_argument("--fit", default=None, metavar="FIT.json",
                   help="planted efficiencies: a fit JSON's point estimates (a half variant takes its recipe's)")
    p.add_argument("--plant", action="append", default=[], metavar="P=EFFN,EFFD", help="a precision's planted values")
    p.add_argument("--width", type=float, default=PINNED_WIDTH, help=f"pinned width (default {PINNED_WIDTH})")
    p.add_argument("--kind", choices=list(INTERVAL_KINDS), default="base_fixed",
                   help="the interval kind that must be pinned (default base_fixed)")
    p.add_argument("--max-seeds", type=int, default=3, help="most seeds per cell (default 3)")
    p.add_argument("--min-cells", type=int, default=dz.MIN_CELLS, help=f"fewest cells per precision ({dz.MIN_CELLS})")
    p.add_argument("--min-steps", type=int, default=dz.MIN_STEPS, help=f"fewest updates of a run ({dz.MIN_STEPS})")
    p.add_argument("--min-params", type=float, default=None, metavar="N", help="the rung rule (default as quartet fit)")
    p.add_argument("--confidence", type=float, default=dz.CONFIDENCE,
                   help=f"share of simulated fits that must pin (default {dz.CONFIDENCE})")
    p.add_argument("--reps", type=int, default=8, help="simulated fits per design (default 8)")
    p.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples per simulated fit (default 100)")
    p.add_argument("--rounds", type=int, default=3, help="search rounds (default 3)")
    p.add_argument("--seed", type=int, default=0, help="simulation seed")
    p.add_argument("--speeds", default=speeds_default, metavar="JSON,...", help="measured step times (ladder_speed.py)")
    p.add_argument("--no-pair", action="store_true", help="do not add bf16 runs at cells without them")
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="write plan.md and plan.csv there")
    p.add_argument("--sweep", type=Path, default=None, metavar="FILE", help="write the plan's runs as a sweep file")
    args = p.parse_args(argv)
    args.command = "quartet design " + " ".join(_quote(a) for a in (sys.argv[2:] if argv is None else argv))
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(message)s")
    logging.getLogger("analysis").setLevel(logging.ERROR)
    try:
        plan = _design(args, dz, cell_of, labels_of)
    except AnalysisError as exc:
        print(f"quartet design: {exc}", file=sys.stderr)
        return 2
    print(plan)
    return 0


def _design(args, dz, cell_of, labels_of) -> str:
    """Check the options (one line each), search, write the outputs; returns the plan as text."""
    import pandas as pd

    from analysis.load import load
    from analysis.report import MIN_PARAMS

    if not (math.isfinite(args.gpu_hours) and args.gpu_hours > 0):
        raise AnalysisError(f"--gpu-hours must be positive (got {args.gpu_hours:g})")
    if not 0 < args.width:
        raise AnalysisError(f"--width must be positive (got {args.width:g})")
    for flag, v, lo in (("--reps", args.reps, 1), ("--bootstrap", args.bootstrap, 10), ("--max-seeds", args.max_seeds, 1),
                        ("--min-cells", args.min_cells, 1), ("--rounds", args.rounds, 1), ("--seed", args.seed, 0),
                        ("--min-steps", args.min_steps, 0)):
        if v < lo:
            raise AnalysisError(f"{flag} must be >= {lo} (got {v})")
    if not 0 < args.confidence <= 1:
        raise AnalysisError(f"--confidence must be in (0, 1] (got {args.confidence:g})")
    dns = _floats(args.dn, "--dn")
    if not dns or any(not (math.isfinite(r) and r > 0) for r in dns):
        raise AnalysisError(f"--dn takes positive tokens-per-parameter ratios, e.g. 5,10,20 (got {args.dn!r})")
    models, precisions = _names(args.models, "--models"), _names(args.precisions, "--precisions")
    for path in (args.out, args.sweep):
        if path is not None:
            check_writable(path if path == args.sweep else path / "plan.md", "--out" if path == args.out else "--sweep")
    planted = dz.planted_from_fit(args.fit) if args.fit else {}
    for item in args.plant:
        key, sep, vals = item.partition("=")
        try:
            en, ed = (float(x) for x in vals.split(","))
        except ValueError:
            raise AnalysisError(f"--plant takes PRECISION=EFFN,EFFD, e.g. quartet_fwd=0.6,1 (got {item!r})") from None
        planted[key.strip()] = (en, ed)
    targets = {}
    for prec in precisions:
        fw, bw = labels_of(prec)
        if fw == bw == "bf16":
            raise AnalysisError(f"--precisions {prec}: the baseline has no efficiency to measure")
        targets[prec] = dz.make_target(prec, fw, bw, planted)
    cells = [cell_of(m, r) for m in models for r in dns]
    frames = [load(s) for s in args.source]
    existing = pd.concat(frames, ignore_index=True)
    if "run_id" in existing:
        existing = existing.drop_duplicates("run_id")
    min_params = MIN_PARAMS if args.min_params is None else args.min_params
    candidates, notes = dz.eligible(cells, min_params, args.min_steps)
    if not candidates:
        raise AnalysisError("no candidate cells left: " + "; ".join(notes))
    speeds = dz.StepSpeeds.from_json(_names(args.speeds, "--speeds"))
    for t in targets.values():
        speeds.step_ms(t.recipe, candidates[0].n_params, candidates[0].tokens_per_step)  # a recipe never measured: now
    options = dz.FitOptions(bootstrap=args.bootstrap, min_params=min_params, width=args.width)
    kept, report = dz.plant(existing, options)
    noise = dz.noise_model(kept, report)
    # other precisions' runs are fitted apart and change no target's interval: the simulated fits leave them out
    base_rows_ = (kept["forward"] == BASE_LABEL) & (kept["backward"] == BASE_LABEL)
    kept = kept[base_rows_ | kept["precision"].isin(list(targets))]
    pair = not args.no_pair
    result = dz.search(kept, targets, candidates, report.base.params, noise, speeds, budget_h=args.gpu_hours,
                       options=options, kind=args.kind, reps=args.reps, seed=args.seed, max_seeds=args.max_seeds,
                       min_cells=args.min_cells, confidence=args.confidence, rounds=args.rounds, pair=pair,
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
    beyond, beyond_h, more = dz.what_it_takes(result, kept, targets, candidates, report.base.params, noise, speeds,
                                              options=options, kind=args.kind, reps=max(args.reps // 2, 2),
                                              seed=args.seed, max_seeds=args.max_seeds, min_cells=args.min_cells,
                                              confidence=args.confidence, pair=pair)
    runs = dz.plan_rows(result.design, kept, targets, speeds, pair)
    text = dz.plan_markdown(args=args, result=result, runs=runs, noise=noise, report=report, speeds=speeds,
                            notes=notes, beyond=beyond, beyond_h=beyond_h, more=more, existing=kept,
                            targets=targets, pair=pair)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plan.md").write_text(text)
        runs.to_csv(args.out / "plan.csv", index=False, float_format="%.6g")
        result.summary.to_csv(args.out / "plan_widths.csv", index=False, float_format="%.4g")
        text += f"\nwrote {args.out / 'plan.md'}, plan.csv, plan_widths.csv"
    if args.sweep:
        name = args.sweep.stem
        args.sweep.write_text(dz.sweep_yaml(runs, name, f"runs chosen by quartet design ({len(runs)} runs, "
                                                         f"{result.hours:.2f} GPU-hours predicted)",
                                            [args.command,
                                             "The runs quartet design chose (docs/analysis.md, 'Designing runs').",
                                             f"  quartet sweep {name} --cluster local_gpu --dry-run"]))
        text += f"\nwrote {args.sweep}"
    return text


def _quote(a: str) -> str:
    return a if all(ch.isalnum() or ch in "-_=.,/:" for ch in a) else repr(a)
