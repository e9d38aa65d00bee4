"""``quartet status NAME [--watch]``: one table for every run of a sweep, from its run directories.

Reads ``<runs>/<NAME>/*/`` (state.json, metrics.jsonl, summary.json, .claim, error.txt) and, when
the Slurm tools exist, cross-checks ``squeue`` (and ``sacct`` / ``scontrol show job`` for jobs that
left the queue; a missing ``sacct`` is tolerated). A run whose job vanished without an end marker
(``scancel``, node failure) is recorded as failed/cancelled so the next launch resumes it; so is a
standalone ``quartet train`` whose process is gone, and a Slurm run whose job was not requeued after
a preemption / time limit. When squeue cannot be asked, one warning line says so and Slurm-claimed
runs show ``unknown`` instead of a guessed state (see ``cluster/runstate.py``).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from cluster import runstate, slurm
from quartet import paths

ORDER = ("running", "pending", "waiting", "unknown", "stale", "preempted", "failed", "cancelled", "corrupt", "invalid",
         "new", "completed")
STYLE = {"completed": "green", "running": "cyan", "pending": "blue", "waiting": "blue", "preempted": "yellow",
         "failed": "red", "cancelled": "magenta", "corrupt": "bold red", "new": "white", "unknown": "bold yellow",
         "stale": "yellow", "invalid": "bold red"}
#: states after which ``--watch`` keeps refreshing
ACTIVE = {"running", "pending", "unknown"}


def collect(group_dir: Path) -> list[runstate.RunView]:
    """Views of every run directory under ``group_dir`` (sorted by run id)."""
    return collect_checked(group_dir)[0]


def collect_checked(group_dir: Path) -> tuple[list[runstate.RunView], str | None]:
    """:func:`collect` plus one warning line when Slurm-claimed runs could not be checked with squeue."""
    if slurm.available():
        queue, why = slurm.queue_or_error()
    else:
        queue, why = None, "squeue/sbatch are not on PATH"
    views = []
    for d in sorted(p for p in Path(group_dir).iterdir() if p.is_dir() and not p.name.startswith(".")):
        if d.name == "slurm" or not any((d / f).exists() for f in (paths.CONFIG, paths.STATE, paths.SUMMARY)):
            continue
        views.append(runstate.inspect(d, queue))
    unverified = [v for v in views if v.job_state == runstate.UNKNOWN_JOB]
    warning = None
    if unverified:
        warning = (f"quartet status: warning: could not query the Slurm scheduler ({why}); the job states of "
                   f"{len(unverified)} run(s) are unverified (shown as {runstate.UNKNOWN_JOB}: queued, running or over)")
    return views, warning


def summary_line(views: list[runstate.RunView]) -> str:
    """``27 runs: 20 completed, 3 running, ...`` in a fixed order."""
    counts: dict[str, int] = {}
    for v in views:
        counts[v.state] = counts.get(v.state, 0) + 1
    parts = [f"{counts[k]} {k}" for k in ORDER if counts.get(k)]
    parts += [f"{n} {k}" for k, n in counts.items() if k not in ORDER]
    return f"{len(views)} runs: " + (", ".join(parts) if parts else "none")


def render(name: str, views: list[runstate.RunView], max_error: int = 60):
    """A rich Table of the runs plus the summary line as its caption."""
    from rich.table import Table

    table = Table(title=f"sweep {name}", caption=summary_line(views))
    for col in ("run", "state", "step/total", "loss", "tok/s", "job", "last error"):
        table.add_column(col, justify="right" if col in ("step/total", "loss", "tok/s") else "left", overflow="fold")
    for v in views:
        step = f"{v.step if v.step is not None else '-'}/{v.total_steps if v.total_steps is not None else '-'}"
        loss = f"{v.loss:.4f}" if isinstance(v.loss, (int, float)) else "-"
        tps = f"{v.tokens_per_s:,.0f}" if isinstance(v.tokens_per_s, (int, float)) else "-"
        job = (v.job_id or "-") + (f" ({v.job_state})" if v.job_state else "")
        err = v.error or v.note or ""
        err = err if len(err) <= max_error else err[: max_error - 1] + "…"
        table.add_row(v.run_id, f"[{STYLE.get(v.state, 'white')}]{v.state}[/]", step, loss, tps, job, err)
    return table


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quartet status", description="State of every run of a sweep.")
    p.add_argument("name", help="sweep name (the group folder under the runs root)")
    p.add_argument("--runs-dir", help="runs root (default: $QUARTET_RUNS, else <checkout>/runs; a relative path is from the working directory)")
    p.add_argument("--watch", nargs="?", const=5.0, type=float, metavar="SECONDS",
                   help="refresh every SECONDS (default 5) until no run is pending/running; Ctrl-C stops")
    return p


def missing_sweep_message(arg: str, name: str, root: Path, runs_dir_given: bool) -> str:
    """One line for a sweep without a folder under ``root``, suggesting a command that works.

    A launchable sweep (``sweeps/NAME.yaml`` or a YAML path) gets ``quartet sweep ...``; any other name
    (a typo) gets the sweeps that have runs under ``root`` and the ones that can be launched.
    """
    from cluster.spec import available_sweeps
    from quartet.paths import SWEEPS_DIR

    runs_dir = f" --runs-dir {root}" if runs_dir_given else ""
    launchable = available_sweeps(SWEEPS_DIR)
    if (arg.endswith((".yaml", ".yml")) and Path(arg).is_file()) or name in launchable:
        return f"quartet status: no runs of sweep {name!r} under {root} yet (launch it with: quartet sweep {arg}{runs_dir})"
    with_runs = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")) if root.is_dir() else []
    shown = f"`quartet status NAME{runs_dir}` shows one of: {', '.join(with_runs)}" if with_runs else f"no sweep has runs under {root}"
    return (f"quartet status: no sweep {name!r} (no folder {root / name}, no {SWEEPS_DIR / (name + '.yaml')}); "
            f"{shown}; `quartet sweep NAME{runs_dir}` launches one of: {', '.join(launchable) or '(none)'}")


def not_a_name(name: str) -> str | None:
    """Why ``name`` is not a sweep name (a path, ``.``, ``..``), with the command meant; None for a name.

    A sweep is named by its folder under the runs root; ``quartet status /etc`` must not list ``/etc`` as a sweep."""
    from quartet.paths import is_folder_name

    if is_folder_name(name):
        return None
    path = Path(name)
    meant = (f"; for the runs under {path}: quartet status {path.resolve().name} --runs-dir {path.resolve().parent}"
             if path.is_dir() and path.resolve().name else "")
    return (f"{name!r} is a path, not a sweep name: give the sweep's name (its folder under the runs root, e.g. "
            f"smoke) and the runs root with --runs-dir{meant}")


def report_corrupt(views: list[runstate.RunView]) -> int:
    """Print one line (stderr) per run whose summary.json is corrupt or impossible (``invalid``: e.g. a negative
    val_loss); 1 when there is any, else 0."""
    bad = [v for v in views if v.state in {"corrupt", "invalid"}]
    for v in bad:
        why = (paths.corrupt_summary(v.run_dir) if v.state == "corrupt" else None) or v.error
        print(f"quartet status: error: run {v.run_id}: {why}", file=sys.stderr)
    return 1 if bad else 0


def cli_main(argv: list[str] | None = None) -> int:
    """Entry point of ``quartet status``; exit code 1 when the sweep folder does not exist or a run's
    summary.json is corrupt (named on stderr), 2 when NAME is a path rather than a sweep name."""
    from rich.console import Console
    from rich.live import Live

    from quartet.paths import runs_root

    args = _parser().parse_intermixed_args(argv)
    root = Path(args.runs_dir) if args.runs_dir else runs_root()
    name = Path(args.name).stem if args.name.endswith((".yaml", ".yml")) else args.name
    why = not_a_name(name)
    if why:
        print(f"quartet status: error: {why}", file=sys.stderr)
        return 2
    group = root / name
    console = Console(width=None if sys.stdout.isatty() else 200)
    if not group.is_dir():
        print(missing_sweep_message(args.name, name, root, bool(args.runs_dir)), file=sys.stderr)
        return 1
    try:
        views, warning = collect_checked(group)
    except PermissionError as exc:  # status only reads: a folder it may not list is named, not a traceback
        print(f"quartet status: error: {exc.strerror}: {exc.filename}; cannot list the sweep's runs", file=sys.stderr)
        return 1
    if warning:
        print(warning, file=sys.stderr)
    if not args.watch:
        console.print(render(name, views))
        return report_corrupt(views)
    try:
        with Live(render(name, views), console=console, refresh_per_second=1) as live:
            while True:
                views, again = collect_checked(group)
                if again and not warning:
                    warning = again
                    print(warning, file=sys.stderr)
                live.update(render(name, views))
                if not any(v.state in ACTIVE for v in views):
                    break
                time.sleep(max(0.5, args.watch))
    except KeyboardInterrupt:
        pass
    return report_corrupt(views)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cli_main())
