"""``quartet sweep NAME [--cluster PROFILE] [--dry-run] [overrides...]``: plan, claim, submit.

1. Load ``sweeps/NAME.yaml`` and the cluster profile; compose + resolve EVERY run (one bad run ->
   nothing is submitted; the error names the run and the key).
2. Print the plan (per run N, D, steps, LR, FLOPs = 6·N·D, device-hours; new / done / running /
   failed counts; job arrays for Slurm).
3. For each run that is neither finished (``summary.json``) nor held by a live job: claim it
   atomically (``runstate.try_claim``), write its resolved ``config.yaml``, then submit.
   - ``slurm``: one submitit job array per resource shape (split above MaxArraySize, ``%N`` cap);
     returns at once. sbatch scripts and logs stay in ``<runs>/<sweep>/slurm/``.
   - ``local``: a pool of ``workers`` processes (``threads_per_worker`` torch threads each) on this
     machine; blocks with per-run and whole-sweep progress. Ctrl-C checkpoints the running runs.
     With ``gpus`` > 0 the pool has ``gpus * workers_per_gpu`` processes, each pinned to one GPU,
     and the runs' data is prepared here first, with its progress on this terminal.

Override routing: ``cluster.<key>=v`` edits the profile, ``sweep.<key>=v`` edits the sweep spec
(e.g. ``sweep.axes.precision=[bf16]``), anything else is a Hydra override applied to every run.

submitit directly, not Hydra's submitit launcher: the launcher runs *inside* ``@hydra.main
--multirun`` and owns job/run directories and requeue (it resubmits the Hydra job and has no notion
of "already done"), while we need a plan before submission, skip-if-done + atomic claims, run
directories named by the run id, per-size resource shapes (one array each) and a Checkpointable
that stops the trainer at a step boundary. Composition still uses Hydra's compose API.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from cluster import runstate
from cluster.plan import Plan, PlannedRun, build_plan, render_plan, write_run_config
from cluster.profiles import ClusterProfile, load_profile, local_gpus, local_pool_size
from cluster.spec import load_sweep, sweep_file
from quartet import paths
from quartet.errors import QuartetError


def split_overrides(items: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(sweep edits, cluster edits, run overrides) from the CLI's trailing ``key=value`` items."""
    sweep, cluster, run = [], [], []
    for item in items:
        if "=" not in item:
            raise QuartetError(f"override {item!r}: expected key=value (e.g. cluster.partition=gpu, run.seed=1)")
        if item.startswith("sweep."):
            sweep.append(item[len("sweep."):])
        elif item.startswith("cluster."):
            cluster.append(item[len("cluster."):])
        else:
            run.append(item)
    return sweep, cluster, run


def only_overrides(items: list[str]) -> list[str]:
    """``--only KEY=V1,V2`` items as sweep edits (``sweep.only.KEY=[V1,V2]``)."""
    out = []
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise QuartetError(f"--only {item!r}: expected KEY=V1,V2 (e.g. --only model=llama_3m,llama_7m)")
        out.append(f"sweep.only.{key}=[{values}]")
    return out


def default_runs_root() -> Path:
    """``$QUARTET_RUNS``, else the checkout's ``runs/`` (:func:`quartet.paths.runs_root`)."""
    from quartet.paths import runs_root

    return runs_root()


def placement(run_overrides: list[str], runs_dir: str | None) -> tuple[list[str], str | None, str | None]:
    """(the other run overrides, runs root, group name) of a sweep whose run overrides may say where runs land.

    ``run.out_dir=DIR`` is the runs root, as ``--runs-dir DIR`` (both, naming different folders: QuartetError), and
    ``run.name=NAME`` the group folder, as ``sweep.name=NAME``: where runs land is decided by the same keys as for
    ``quartet train``, and the plan, its claims, logs and ``quartet status`` all look there."""
    rest, out_dir, name = [], None, None
    for item in run_overrides:
        key, _, value = item.lstrip("+").partition("=")
        if key == "run.out_dir":
            out_dir = value
        elif key == "run.name":
            name = value
        else:
            rest.append(item)
    if out_dir and runs_dir and Path(out_dir).resolve() != Path(runs_dir).resolve():
        raise QuartetError(f"--runs-dir {runs_dir} and run.out_dir={out_dir} name two runs folders; give one")
    return rest, runs_dir or out_dir or None, name


SWEEP_RECORD = paths.SWEEP_RECORD


def sweep_origin(name_or_path: str) -> str:
    """Which sweep file ``name_or_path`` is, as recorded in its group folder: ``sweeps/<file>`` for a shipped sweep
    (the same wherever the checkout is), else the file's absolute path."""
    from quartet.paths import SWEEPS_DIR

    path = sweep_file(name_or_path).resolve()
    try:
        return f"sweeps/{path.relative_to(Path(SWEEPS_DIR).resolve())}"
    except ValueError:
        return str(path)


def check_group_owner(group_dir: Path, name: str, origin: str) -> None:
    """QuartetError (one line) when sweep ``name``'s group folder holds the runs of another sweep file of that name:
    launching would merge this sweep's runs into that folder (and status and fits of it would mix two grids)."""
    other = (runstate.read_json(group_dir / SWEEP_RECORD) or {}).get("sweep_file")
    if other and other != origin:
        raise QuartetError(f"sweep {name}: {group_dir} holds the runs of sweep file {other}, not of {origin}; give "
                           f"this sweep its own name (name: in the file, or sweep.name=NEW) or another --runs-dir; if "
                           f"it is that file moved, delete {group_dir / SWEEP_RECORD}")


def record_group_owner(plan: Plan, origin: str) -> None:
    """Write :data:`SWEEP_RECORD` into the group folder (launches only; the first launch of a folder names it)."""
    path = plan.group_dir / SWEEP_RECORD
    if (runstate.read_json(path) or {}).get("sweep_file") != origin:
        paths.atomic_write_text(path, json.dumps({"sweep": plan.spec.name, "sweep_file": origin}) + "\n", parents=True)


def make_plan(name: str, cluster: str | None, overrides: list[str], runs_dir: str | None = None,
              with_state: bool = True, reconcile: bool = True) -> Plan:
    """Load sweep + profile and build the validated plan; QuartetError when its group folder belongs to another
    sweep file (:func:`check_group_owner`). Writes nothing, except that with ``reconcile`` runs found dead are
    recorded so (``runstate.inspect``)."""
    sweep_ov, cluster_ov, run_ov = split_overrides(overrides)
    run_ov, runs_dir, group = placement(run_ov, runs_dir)
    spec = load_sweep(name, sweep_ov + ([f"name={group}"] if group is not None else []))
    profile = load_profile(cluster or spec.cluster, cluster_ov)
    root = Path(runs_dir) if runs_dir else default_runs_root()
    origin = sweep_origin(name)
    check_group_owner(root.resolve() / spec.name, spec.name, origin)  # before the planning work
    plan = build_plan(spec, profile, root, run_ov, with_state=with_state, progress=True, reconcile=reconcile)
    plan.sweep_file = origin
    return plan


def check_corrupt(plan: Plan) -> None:
    """QuartetError (one line naming the file) when a run's summary.json is corrupt: such a run may have
    finished, so the launch neither retrains it nor starts the others until the file is dealt with."""
    bad = plan.corrupt()
    if bad:
        more = f" ({len(bad) - 1} more run(s) have a corrupt summary.json)" if len(bad) > 1 else ""
        first = runstate.corrupt_summary(bad[0].run_dir) or bad[0].view.error
        raise QuartetError(f"sweep {plan.spec.name}: {first}{more}; nothing was submitted")


def claim_and_prepare(plan: Plan, runs: list[PlannedRun]) -> tuple[list[PlannedRun], list[PlannedRun]]:
    """Claim each run and write its config.yaml; returns (claimed, taken by another launch)."""
    from cluster import slurm

    queue = slurm.queue() if slurm.available() else None
    claimed, taken = [], []
    if plan.sweep_file:
        record_group_owner(plan, plan.sweep_file)
    for r in runs:
        if runstate.try_claim(r.run_dir, {"scheduler": plan.profile.kind, "sweep": plan.spec.name}, queue):
            write_run_config(r, plan.profile)
            # drop a stale stop request left by an interrupted local launch
            (r.run_dir / paths.STOP).unlink(missing_ok=True)
            runstate.write_state(r.run_dir, state=(r.view.state if r.view and r.view.state in {"failed", "preempted"} else "pending"),
                                 total_steps=r.steps, job_id=None)
            claimed.append(r)
        else:
            taken.append(r)
    return claimed, taken


# ----------------------------------------------------------------------------------- Slurm


def slurm_parameters(profile: ClusterProfile, res, sweep: str) -> dict:
    """submitit SlurmExecutor parameters for one resource shape."""
    params = {
        "job_name": f"quartet-{sweep}",
        "time": int(res.time_min),
        "nodes": int(res.nodes),
        "ntasks_per_node": int(res.tasks_per_node),
        "cpus_per_task": int(res.cpus_per_task),
        "mem": f"{int(res.mem_gb)}GB" if float(res.mem_gb).is_integer() else f"{int(res.mem_gb * 1024)}MB",
        "signal_delay_s": int(profile.signal_delay_s),
        "array_parallelism": int(profile.array_parallelism),
        "stderr_to_stdout": True,
    }
    if res.gpus_per_node:
        if profile.gpu_type:
            params["gres"] = f"gpu:{profile.gpu_type}:{res.gpus_per_node}"
        else:
            params["gpus_per_node"] = int(res.gpus_per_node)
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(profile, key)
        if value:
            params[key] = str(value)
    if profile.exclusive:
        params["exclusive"] = True
    if profile.setup:
        params["setup"] = list(profile.setup)
    if profile.srun_args:
        params["srun_args"] = list(profile.srun_args)
    if profile.additional:
        params["additional_parameters"] = dict(profile.additional)
    return params


def waits_for_trunk(run: PlannedRun) -> bool:
    """A budget branch that cannot start yet: no checkpoint of its own, and its trunk's is not there yet (a finished
    trunk will never write it: such a branch is started, and fails saying so)."""
    from quartet import checkpoint as ckpt_io

    src = paths.branch_source(run.cfg, run.run_dir)
    return (src is not None and not src.is_file() and not (paths.trunk_of(src) / paths.SUMMARY).is_file()
            and not ckpt_io.exists(paths.last_checkpoint(run.run_dir)))


def _hold(run: PlannedRun, why: str) -> None:
    from cluster.task import mark_waiting

    mark_waiting(run.run_dir, why)


def submit_slurm(plan: Plan, runs: list[PlannedRun]) -> list[tuple[str, int]]:
    """Submit ``runs`` as job arrays (one per resource shape, chunked); returns [(array id, size)].

    A budget branch whose trunk checkpoint is not there yet goes into an array of its own that depends on its
    trunk's job (``--dependency=afterany:<trunk job>``): it starts once the trunk's job ended, and exits "waiting"
    if the trunk did not get to its branch step (a relaunch submits it again). With no trunk job to wait for it
    is not submitted: state "waiting"."""
    held = [r for r in runs if waits_for_trunk(r)]
    out = _submit_arrays(plan, [r for r in runs if r not in held])
    by_trunk: dict[str, list[PlannedRun]] = {}
    for r in held:
        by_trunk.setdefault(str(r.cfg.branch.trunk), []).append(r)
    for trunk, members in by_trunk.items():
        job = (runstate.read_claim(members[0].run_dir.parent / trunk) or {}).get("job_id")
        if not job:
            for r in members:
                runstate.release_claim(r.run_dir)
                _hold(r, f"waits for its trunk {trunk}, which is not submitted; launch the sweep again")
            continue
        out += _submit_arrays(plan, members, dependency=f"afterany:{job}")
    return out


def _submit_arrays(plan: Plan, runs: list[PlannedRun], dependency: str | None = None) -> list[tuple[str, int]]:
    import submitit

    from cluster.task import RunTask

    folder = plan.group_dir / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for res, chunk in plan.arrays(runs) if runs else []:
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=plan.profile.max_num_timeout,
                                    python=plan.profile.python)
        ex.update_parameters(**slurm_parameters(plan.profile, res, plan.spec.name))
        if dependency:
            ex.update_parameters(dependency=dependency)
        try:
            with ex.batch():
                jobs = [ex.submit(RunTask(r.run_dir)) for r in chunk]
        except Exception as exc:
            for r in chunk:
                runstate.release_claim(r.run_dir)
            raise QuartetError(f"sbatch failed for {len(chunk)} run(s) ({res.describe(plan.profile)}): "
                               f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from exc
        for r, job in zip(chunk, jobs):
            runstate.update_claim(r.run_dir, job_id=str(job.job_id), scheduler="slurm", log=str(job.paths.stdout))
            runstate.write_state(r.run_dir, job_id=str(job.job_id))
        array_id = str(jobs[0].job_id).split("_")[0]
        out.append((array_id, len(chunk)))
    return out


# ----------------------------------------------------------------------------------- local


def prepare_data(runs: list[PlannedRun], console=None) -> list[Path]:
    """Prepare every distinct data set of ``runs`` once, in this process, with visible progress.

    Otherwise the first worker to need a data set prepares it inside its own stdout.log while the
    others wait on its lock, and the launcher's terminal shows nothing. Returns the data folders;
    raises a one-line QuartetError naming the data set.
    """
    from quartet.data import data_dir, data_key, prepare

    groups: dict[tuple[str, str], list[PlannedRun]] = {}
    for r in runs:
        try:
            key = (str(data_dir(r.cfg.data)), data_key(r.cfg.data))
        except Exception as exc:
            raise QuartetError(f"data of run {r.run_id}: {_error_line(exc)}") from exc
        groups.setdefault(key, []).append(r)
    folders = []
    for (folder, _), members in groups.items():
        dcfg = members[0].cfg.data
        name = dcfg.get("name", "?")
        if console is not None and not (Path(folder) / "manifest.json").is_file():
            console.print(f"preparing data {name} in {folder} (used by {len(members)} run(s)) ...")
        try:
            folders.append(prepare(dcfg, progress=True))
        except Exception as exc:
            raise QuartetError(f"preparing data {name} ({folder}) failed, nothing was started: {_error_line(exc)}") from exc
    return folders


def _error_line(exc: BaseException) -> str:
    """First line of an error; non-project errors keep their type name (e.g. NotADirectoryError: ...)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return first if isinstance(exc, QuartetError) and first else f"{type(exc).__name__}: {first}".rstrip(": ")


def local_pool(profile: ClusterProfile, n_runs: int, gpus: int | None = None):
    """The process pool of a local launch for ``n_runs`` runs (a ProcessPoolExecutor, spawn context).

    ``gpus`` = 0: ``workers`` processes. ``gpus`` > 0: ``gpus * workers_per_gpu`` processes, each
    taking one GPU slot from a queue in its initializer (:func:`cluster.task._init_local_worker`).
    The queue holds exactly ``workers_per_gpu`` slots per GPU and a process takes one for its whole
    life, so no GPU ever has more than ``workers_per_gpu`` runs at once. Never more processes than runs.
    ``gpus``: the pool's GPU count when the caller resolved it already (else ``local_gpus(profile)``).
    """
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from cluster.task import _init_local_worker, gpu_slots

    gpus = local_gpus(profile) if gpus is None else gpus
    size = min(local_pool_size(profile, gpus), max(1, n_runs))
    threads = max(1, profile.threads_per_worker)
    # Children start with this many BLAS/OpenMP threads (set before spawn so the import sees it).
    os.environ["OMP_NUM_THREADS"] = str(threads)
    # spawn, never fork: a forked child inherits the parent's CUDA state (torch may have counted GPUs
    # here), and each worker must choose its GPU itself before CUDA starts in it.
    ctx = mp.get_context("spawn")
    slots = None
    if gpus:
        slots = ctx.Queue()
        for slot in gpu_slots(gpus, profile.workers_per_gpu, os.environ.get("CUDA_VISIBLE_DEVICES")):
            slots.put(slot)
    # os.getpid(): each worker watches this launcher and exits when it dies (cluster.task._watch_launcher)
    # runs trained at once on one GPU (slots go round robin over GPUs): recorded in each run's state.json, so the
    # device-hours it took can be measured later (cluster.plan.calibrate)
    per_gpu = min(max(1, profile.workers_per_gpu), -(-size // gpus)) if gpus else None
    return ProcessPoolExecutor(max_workers=size, mp_context=ctx, initializer=_init_local_worker,
                               initargs=(threads, slots, os.getpid(), per_gpu))


@contextlib.contextmanager
def _sigterm_as_ctrl_c():
    """SIGTERM (``kill PID``) of the launcher takes the Ctrl-C path while inside: running runs checkpoint
    and stop, claims are released. (SIGKILL cannot be caught: then the workers see the launcher die
    and stop by themselves, see ``cluster.task._watch_launcher``.) A launcher started with ``&`` from a
    non-interactive script inherits SIGINT ignored (bash does that for background jobs): the Ctrl-C handler is put
    back, so ``kill -INT`` stops it the same way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_local(plan: Plan, runs: list[PlannedRun], console=None) -> tuple[int, int, int]:
    """Run ``runs`` in a process pool on this machine with progress; returns (completed, failed, stopped).

    Ctrl-C or SIGTERM: running runs checkpoint and stop. Workers never outlive this process.
    """
    with _sigterm_as_ctrl_c():
        return _run_pool(plan, runs, console)


def _run_pool(plan: Plan, runs: list[PlannedRun], console=None) -> tuple[int, int, int]:
    from concurrent.futures import FIRST_COMPLETED, wait

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from cluster.task import local_worker

    console = console or Console()
    prof = plan.profile
    gpus = local_gpus(prof)
    size = min(local_pool_size(prof, gpus), len(runs))
    # Longest first: better packing of the pool, and the shortest runs fill the tail.
    runs = sorted(runs, key=lambda r: -r.hours)
    job_id = f"local-{os.getpid()}"
    completed = failed = stopped = 0
    t0 = time.time()
    where = f", {gpus} GPU{'s' if gpus != 1 else ''} x {max(1, prof.workers_per_gpu)}" if gpus else ""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        overall = progress.add_task(f"sweep {plan.spec.name} ({len(runs)} runs, {size} workers{where})", total=len(runs))
        bars: dict[str, int] = {}
        # budget branches whose trunk checkpoint is not there yet are held back until it is (docs/branches.md)
        held = [r for r in runs if waits_for_trunk(r)]
        for r in held:
            _hold(r, f"held by this launch until its trunk {r.cfg.branch.trunk} saves step {r.cfg.branch.step}")
        with local_pool(prof, len(runs), gpus) as pool:
            futures = {pool.submit(local_worker, str(r.run_dir), job_id): r for r in runs if r not in held}
            pending = set(futures)
            try:
                while pending or held:
                    for r in [r for r in held if not waits_for_trunk(r)]:
                        held.remove(r)
                        fut = pool.submit(local_worker, str(r.run_dir), job_id)
                        futures[fut] = r
                        pending.add(fut)
                    if not pending:  # nothing left that could write the checkpoints they wait for
                        for r in held:
                            runstate.release_claim(r.run_dir)
                            _hold(r, f"waits for its trunk {r.cfg.branch.trunk} to save step {r.cfg.branch.step}; "
                                     f"launch the sweep again once it has")
                            progress.advance(overall)
                            stopped += 1
                            progress.console.print(f"[yellow]waiting[/] {r.run_id}: its trunk has not saved step "
                                                   f"{r.cfg.branch.step}")
                        held = []
                        break
                    done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                    for fut in done:
                        r = futures[fut]
                        res = fut.result()
                        state, err = res.state, res.error
                        on = f"  gpu {res.gpu}" if res.gpu is not None else ""
                        runstate.release_claim(r.run_dir)
                        if r.run_id in bars:
                            progress.remove_task(bars.pop(r.run_id))
                        progress.advance(overall)
                        if state == "completed":
                            completed += 1
                            summ = runstate.read_json(r.run_dir / runstate.SUMMARY) or {}
                            loss = summ.get("val_loss")
                            progress.console.print(f"[green]done[/] {r.run_id}  val_loss={loss:.4f}{on}" if isinstance(loss, (int, float)) else f"[green]done[/] {r.run_id}{on}")
                        elif state == "skipped":  # another process holds the run's lock (it trains it)
                            stopped += 1
                            progress.console.print(f"[yellow]skipped[/] {r.run_id}: {err}")
                        elif state == "failed":
                            failed += 1
                            progress.console.print(f"[red]failed[/] {r.run_id}{on}: {err} (traceback in {r.run_dir / runstate.ERROR})")
                        else:
                            stopped += 1
                            progress.console.print(f"[yellow]{state}[/] {r.run_id}{on}")
                    for fut in pending:
                        r = futures[fut]
                        if not fut.running():
                            continue
                        view = runstate.inspect(r.run_dir, None, reconcile_dead=False)
                        if r.run_id not in bars:
                            bars[r.run_id] = progress.add_task(f"  {r.run_id}", total=r.steps)
                        progress.update(bars[r.run_id], completed=min(view.step or 0, r.steps))
            except KeyboardInterrupt:
                progress.console.print("[yellow]interrupted: asking running runs to checkpoint and stop...[/]")
                for r in held:
                    runstate.release_claim(r.run_dir)
                for fut, r in futures.items():
                    if fut.cancel():
                        runstate.release_claim(r.run_dir)
                    elif not fut.done():
                        (r.run_dir / paths.STOP).touch()
                for fut, r in futures.items():
                    if not fut.cancelled():
                        fut.result()
                        runstate.release_claim(r.run_dir)
                        stopped += 1
                raise
    console.print(f"local sweep {plan.spec.name}: {completed} completed, {failed} failed, {stopped} stopped "
                  f"in {time.time() - t0:.1f} s")
    return completed, failed, stopped


# ----------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="quartet sweep",
        description="Expand a sweep (sweeps/NAME.yaml), print the plan and submit what is not finished.",
        epilog="overrides: cluster.KEY=V edits the profile, sweep.KEY=V the sweep, others go to every run "
               "(Hydra syntax, e.g. optim.lr=1e-3).",
    )
    p.add_argument("name", help="sweep name (sweeps/<name>.yaml) or a path to a sweep YAML")
    p.add_argument("--cluster", help="cluster profile (conf/cluster/<name>.yaml or a path); default: the sweep's")
    p.add_argument("--dry-run", action="store_true", help="print the plan, write and submit nothing")
    p.add_argument("--runs-dir", help="runs root, as run.out_dir=DIR (default: $QUARTET_RUNS, else <checkout>/runs; a relative path is from the working directory)")
    p.add_argument("--max-rows", type=int, default=None, help="print at most this many runs in the plan table")
    p.add_argument("--only", action="append", default=[], metavar="KEY=V1,V2",
                   help="a stage of the sweep: only its runs whose KEY is one of the values (e.g. model=llama_3m,llama_7m; "
                        "repeat for several keys); run ids stay the full sweep's")
    p.add_argument("overrides", nargs="*", help="key=value overrides")
    return p


def _say_busy(plan: Plan, console) -> None:
    """One line per run skipped because a process is training it now (it holds the run's train lock)."""
    from quartet.runlock import describe

    for r in plan.runs:
        if r.state == "running":
            holder = runstate.train_lock_holder(r.run_dir)
            if holder is not None:
                console.print(f"skipped {r.run_id}: being trained by {describe(holder)}")


def cli_main(argv: list[str] | None = None) -> int:
    """Entry point of ``quartet sweep``."""
    from rich.console import Console

    args = _parser().parse_intermixed_args(argv)
    # wide enough for run ids when the output is a file or a pipe (rich defaults to 80 columns there)
    console = Console(width=None if sys.stdout.isatty() else 200)
    try:
        # a dry run writes nothing: a run found dead is shown so, and recorded by the launch that resumes it
        plan = make_plan(args.name, args.cluster, only_overrides(args.only) + args.overrides, args.runs_dir,
                         reconcile=not args.dry_run)
    except QuartetError as exc:
        print(f"quartet sweep: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # planning a large grid takes minutes: Ctrl-C stops it in one line
        print("quartet sweep: interrupted while planning; nothing was written or submitted", file=sys.stderr)
        return 130
    if not plan.runs:
        print(f"quartet sweep: error: sweep {plan.spec.name} has 0 runs (its exclude drops every point of the grid); "
              f"nothing to do", file=sys.stderr)
        return 2
    render_plan(plan, console, max_rows=args.max_rows)
    if plan.duplicates:
        more = f" (and {len(plan.duplicates) - 1} more)" if len(plan.duplicates) > 1 else ""
        console.print(f"note: {len(plan.duplicates)} duplicate grid point(s) dropped, each the same run as an earlier "
                      f"one: {plan.duplicates[0]}{more}", markup=False)  # its [labels] are not rich markup
    try:
        check_corrupt(plan)
    except QuartetError as exc:
        print(f"quartet sweep: error: {exc}", file=sys.stderr)
        return 2
    _say_busy(plan, console)
    from quartet.paths import not_writable

    # before the dry run's exit: a dry run says what the launch would say (and exits as it would)
    why = not_writable(plan.runs_root)
    if why:
        print(f"quartet sweep: error: runs folder {plan.runs_root}: {why}; nothing was submitted (choose another with "
              f"--runs-dir or QUARTET_RUNS)", file=sys.stderr)
        return 2
    if args.dry_run:
        console.print("dry run: nothing written, nothing submitted")
        return 0
    todo = plan.pending()
    if todo and plan.profile.kind == "slurm":
        from cluster import slurm

        if not slurm.available():
            print(f"quartet sweep: error: profile {plan.profile.name} needs Slurm (sbatch/squeue not found on PATH); "
                  f"run this on a login node, or use --dry-run / --cluster local", file=sys.stderr)
            return 2
    if not todo:
        console.print(f"nothing to submit: all {len(plan.runs)} runs are done or running (quartet status {plan.spec.name})")
        return 0
    if plan.profile.kind == "local":
        try:
            gpus = local_gpus(plan.profile)  # gpus=auto without a GPU: one line, nothing claimed
            if gpus:
                from cluster.task import gpu_slots

                gpu_slots(gpus, plan.profile.workers_per_gpu, os.environ.get("CUDA_VISIBLE_DEVICES"))
                # CPU pools (gpus=0) keep preparing in the workers: there a run with bad data fails
                # alone and the others still train, as before.
                prepare_data(todo, console)
        except QuartetError as exc:
            print(f"quartet sweep: error: {exc}", file=sys.stderr)
            return 2
    from quartet.paths import apply_shared_umask, permission_hint

    apply_shared_umask(plan.group_dir)  # a group-shared runs directory: claims, configs and runs group-writable
    try:
        claimed, taken = claim_and_prepare(plan, todo)
    except PermissionError as exc:
        print(f"quartet sweep: error: {exc.strerror}: {exc.filename}; {permission_hint(exc.filename)}; "
              f"nothing was submitted", file=sys.stderr)
        return 2
    if taken:
        console.print(f"{len(taken)} run(s) were claimed by another launch in the meantime; skipped")
    if not claimed:
        console.print("nothing to submit")
        return 0
    try:
        if plan.profile.kind == "slurm":
            arrays = submit_slurm(plan, claimed)
            desc = ", ".join(f"{a} ({n} task{'s' if n > 1 else ''})" for a, n in arrays)
            console.print(f"submitted {len(claimed)} run(s) as {len(arrays)} job array(s): {desc}; "
                          f"sbatch scripts + logs in {plan.group_dir / 'slurm'}")
            elsewhere = plan.runs_root != default_runs_root().resolve()
            console.print(f"follow with: quartet status {plan.spec.name}" + (f" --runs-dir {plan.runs_root}" if elsewhere else ""))
            return 0
        completed, failed, stopped = run_local(plan, claimed, console)
        return 1 if failed else 0
    except KeyboardInterrupt:
        console.print("interrupted; relaunch the same command to resume")
        return 130
    except QuartetError as exc:
        print(f"quartet sweep: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cli_main())
