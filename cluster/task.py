"""What runs inside a job: train one run directory, checkpoint on preemption, record failures.

:class:`RunTask` is the callable submitit pickles for Slurm. It needs only the run directory: the
resolved ``config.yaml`` was written there before submission, and the trainer resumes from
``ckpt/last.pt`` (the folder ``ckpt/last`` under FSDP) by itself, so a requeued job (by submitit after a signal, or by ``scontrol
requeue``) simply calls it again.

Preemption / time limit: Slurm sends USR2 ``signal_delay_s`` before the end; submitit's handler
calls :meth:`RunTask.checkpoint` in the main thread. Python runs signal handlers only in the main
thread, between bytecodes, so the trainer runs in a worker thread: the handler asks it to stop
(``Trainer.request_stop()``: it finishes the current step, saves the checkpoint, marks the run
``preempted``), waits for that, and hands submitit a fresh ``RunTask`` to requeue.

Local pools (``--cluster local``): :func:`_init_local_worker` sets up each pool process once (torch
threads, and with GPUs its one GPU slot, taken from a queue the launcher filled -- see
:func:`gpu_slots`); :func:`local_worker` then trains one run per call. A pool process never outlives
its launcher (:func:`_watch_launcher`): when the launcher dies, however it dies (``kill -9`` included),
the process asks its run to checkpoint at the next step boundary and exits. And the trainer itself
holds the run's lock (:mod:`quartet.runlock`) while it trains, so a relaunch never starts a second
trainer on a run that is still being trained.

Multi-GPU: with several tasks per job (one per GPU), ``submitit.helpers.TorchDistributedEnvironment``
exports RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT from the Slurm environment (over all nodes
of the job), which the trainer reads for DDP and FSDP alike; the run's config.yaml says which (``run.parallel``,
chosen by the plan). On USR2 every rank stops at the same step boundary, so the sharded FSDP checkpoint, a
collective, is written by all of them.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, NamedTuple, Optional

import submitit

from cluster import runstate
from quartet import paths
from quartet.runlock import JOB_ENV, RunLockedError

#: how long a checkpoint request may take before we give up waiting (Slurm kills at the deadline anyway)
STOP_WAIT_S = 600.0


def _record_failure(run_dir: Path, exc: BaseException, job_id: str | None) -> None:
    """Write error.txt (traceback) and mark state failed unless the trainer already did."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    err = run_dir / paths.ERROR
    try:
        if not err.exists() or paths.read_state(run_dir).get("state") != "failed":
            paths.atomic_write_text(err, tb)
        msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        st = paths.read_state(run_dir)
        if st.get("state") != "failed" or not st.get("error"):
            runstate.write_state(run_dir, state="failed", error=msg, job_id=job_id, host=socket.gethostname())
    except OSError:
        pass


def execute_run(run_dir: str | Path, job_id: str | None, on_trainer=None, rank: int = 0) -> dict[str, Any]:
    """Train the run in ``run_dir`` (resume if it has a checkpoint; no-op if it has a summary).

    Returns the trainer's summary (or ``{"state": "preempted"}`` when stopped early). On any
    exception the traceback goes to ``error.txt``, ``state.json`` says failed, and it re-raises.
    ``on_trainer(trainer)`` is called once the trainer exists (the preemption hook uses it).
    """
    run_dir = Path(run_dir)
    summary = paths.read_summary(run_dir)
    if summary is not None:
        return summary
    corrupt = paths.corrupt_summary(run_dir)
    if corrupt is not None:  # maybe finished: neither retrain it nor touch its state.json
        from quartet.errors import QuartetError

        raise QuartetError(corrupt)
    try:
        from quartet.config import load_config_file
        from quartet.runs import run_dir as run_dir_of
        from quartet.train import BranchWaitingError, Trainer

        cfg = load_config_file(run_dir / paths.CONFIG)
        expected = Path(run_dir_of(cfg)).resolve()
        if expected != run_dir.resolve():
            raise RuntimeError(f"config.yaml in {run_dir} names run dir {expected}; the directory was moved or edited")
        try:
            trainer = Trainer(cfg)
        except BranchWaitingError as exc:  # a budget branch before its trunk checkpoint: nothing ran, nothing failed
            if rank == 0:
                mark_waiting(run_dir, str(exc))
            return {"state": "waiting", "note": str(exc)}
        if rank == 0:
            # recorded once the trainer holds the run lock: a duplicate that is refused writes nothing
            trainer.on_start.append(lambda _t: runstate.write_state(run_dir, state="running", job_id=job_id,
                                                                     host=socket.gethostname(), error=None))
        if on_trainer is not None:
            on_trainer(trainer)
        result = trainer.run()
    except RunLockedError:
        raise  # another process trains this run: its files are not ours to mark failed
    except BaseException as exc:
        if rank == 0:
            _record_failure(run_dir, exc, job_id)
        raise
    done = paths.read_summary(run_dir)
    if done is not None:
        return done
    return dict(result or {}, state=paths.read_state(run_dir).get("state", "preempted"))


def mark_waiting(run_dir: Path, why: str) -> None:
    """state.json: "waiting" (a budget branch whose trunk checkpoint is not there yet; a relaunch starts it)."""
    runstate.write_state(Path(run_dir), state="waiting", note=why, error=None)


class RunTask(submitit.helpers.Checkpointable):
    """submitit callable: ``RunTask(run_dir)()`` trains that run; requeue-safe (see module doc)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = str(run_dir)
        self._trainer = None
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:  # the trainer and thread never travel in the pickle
        return {"run_dir": self.run_dir}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.run_dir = state["run_dir"]
        self._trainer = None
        self._thread = None

    def __call__(self) -> dict[str, Any]:
        env = submitit.JobEnvironment()
        job_id = str(env.job_id)
        rank = env.global_rank
        if env.num_tasks > 1:
            # DDP: export RANK/LOCAL_RANK/WORLD_SIZE/MASTER_*; the trainer picks cuda:LOCAL_RANK itself
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
            self._chain_stop_on_usr2(rank)
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["result"] = execute_run(self.run_dir, job_id, on_trainer=self._set_trainer, rank=rank)
            except BaseException as exc:  # re-raised in the main thread
                box["error"] = exc

        self._thread = threading.Thread(target=work, name="quartet-train", daemon=True)
        self._thread.start()
        while self._thread.is_alive():
            self._thread.join(0.2)  # short joins keep the main thread responsive to signals
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _set_trainer(self, trainer) -> None:
        self._trainer = trainer

    def _stop_and_wait(self) -> None:
        if self._trainer is not None:
            self._trainer.request_stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(STOP_WAIT_S)

    def _chain_stop_on_usr2(self, rank: int) -> None:
        """Every rank stops at a step boundary on USR2 (submitit only checkpoints rank 0)."""
        if rank == 0:
            return
        previous = signal.getsignal(signal.SIGUSR2)

        def handler(signum, frame):
            self._stop_and_wait()
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGUSR2, handler)

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Called by submitit in the signal handler: stop at a step boundary, then requeue."""
        self._stop_and_wait()
        return submitit.helpers.DelayedSubmission(RunTask(self.run_dir))


# --------------------------------------------------------------------------- local pool workers

#: environment of a pinned pool worker: its slot in the pool's GPU list and the physical GPU
GPU_SLOT_ENV = "QUARTET_GPU_SLOT"
GPU_ENV = "QUARTET_GPU"
#: runs the local pool trains at once on one GPU (recorded in state.json as ``runs_per_gpu``)
RUNS_PER_GPU_ENV = "QUARTET_RUNS_PER_GPU"


class LocalResult(NamedTuple):
    """What :func:`local_worker` returns: the first three fields are the old 3-tuple."""

    run_dir: str
    state: str  # completed | failed | preempted (or whatever state.json says)
    error: Optional[str]  # one line, when failed
    gpu: Optional[str] = None  # physical GPU (CUDA_VISIBLE_DEVICES entry) the run trained on; None on CPU


def gpu_slots(gpus: int, per_gpu: int, visible: str | None = None) -> list[tuple[int, str]]:
    """The pool's GPU slots as ``(index in the pool's GPU list, physical id)``, ``per_gpu`` per GPU.

    Physical ids index into ``visible`` (the launcher's CUDA_VISIBLE_DEVICES, e.g. ``"2,3"``: slots of
    GPU 0 and 1 become ``"2"`` and ``"3"``); without it they are ``0..gpus-1``. The order is round
    robin over GPUs, so a pool smaller than the slot list (fewer runs than slots) still spreads out.
    """
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if gpus > len(ids):
            from quartet.errors import ConfigError

            raise ConfigError(f"cluster.gpus={gpus} but CUDA_VISIBLE_DEVICES={visible!r} lists {len(ids)} device(s); "
                              f"use a smaller cluster.gpus or widen CUDA_VISIBLE_DEVICES")
    else:
        ids = [str(i) for i in range(gpus)]
    return [(g, ids[g]) for _ in range(max(1, per_gpu)) for g in range(gpus)]


#: how long a starting pool process waits for its GPU slot (the queue is filled before the pool starts)
SLOT_WAIT_S = 120.0


#: how long a pool process whose launcher died lets its run checkpoint before it exits anyway
ORPHAN_GRACE_S = 120.0
#: how often a pool process checks that its launcher is alive
WATCH_EVERY_S = 0.5
#: an orphaned worker still alive this long after its grace (its interpreter wedged) is ended by a C-level timer
EXIT_TIMER_SLACK_S = 10.0

# State of this pool process, shared by local_worker (main thread) and the launcher watchdog thread.
_current_trainer = None  # the trainer of the run being trained now (None between runs)
_run_finished = threading.Event()  # set while no run is in progress
_run_finished.set()
_orphaned = threading.Event()  # set once the launcher is gone (or SIGTERM arrived)


def _set_parent_death_signal(sig: int) -> None:
    """Linux: have the kernel send ``sig`` to this process when its parent dies (prctl PR_SET_PDEATHSIG).

    No-op elsewhere; the watchdog's polling of the parent pid covers that case, and the race where
    the parent died before the prctl call.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _watch_launcher(launcher_pid: int) -> None:
    """Watchdog thread of a pool process: exit once the launcher is gone.

    The pool's queues cannot tell a worker that its launcher died (each worker holds both ends of the
    call queue, so it would wait for work forever), and the run it trains would go on with no one
    to report to while a relaunch may start it again. So: the parent pid changed (the launcher died,
    the worker was re-parented) or SIGTERM arrived (the launcher's PDEATHSIG, or a user) -> ask the
    current run to checkpoint and stop at the next step boundary, give it ``ORPHAN_GRACE_S``, then
    ``os._exit``. The kernel then drops the run's lock; state.json says ``preempted`` and the next
    launch resumes from the checkpoint. A run that did not stop in its grace leaves every thread's stack in
    its stdout.log; one whose interpreter is wedged is ended by :func:`_arm_exit_timer`.
    """
    while not _orphaned.wait(WATCH_EVERY_S):
        if os.getppid() != launcher_pid:
            _orphaned.set()
    trainer = _current_trainer
    if trainer is not None:
        _arm_exit_timer(ORPHAN_GRACE_S + EXIT_TIMER_SLACK_S)
        trainer.request_stop()
        if not _run_finished.wait(ORPHAN_GRACE_S):  # it did not stop in time: leave where it was in the log
            import faulthandler

            with contextlib.suppress(ValueError, OSError, AttributeError, RuntimeError):
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    # no run in progress (or preparing data, with nothing of the run written yet): nothing to save
    os._exit(1)


def _arm_exit_timer(seconds: float) -> None:
    """The last resort of an orphaned worker: after ``seconds``, write every thread's Python stack to stderr (the
    run's stdout.log while a run is in progress) and ``_exit(1)``.

    The watchdog's own ``os._exit`` needs the interpreter: a main thread wedged while holding the GIL (a C call
    that blocks without releasing it) would keep a dead launcher's worker -- and its GPU -- forever. faulthandler's
    timer is a C thread that needs no GIL, and the stacks it leaves say where the run was stuck."""
    import faulthandler

    for stream in (sys.stderr, sys.__stderr__):
        try:
            faulthandler.dump_traceback_later(seconds, exit=True, file=stream)
            return
        except (ValueError, OSError, AttributeError, TypeError, RuntimeError):  # closed, None, or no file descriptor
            continue


def _on_sigterm(signum, frame) -> None:
    # only sets an event (a signal handler runs between bytecodes of the main thread, which may be
    # inside the training step); the watchdog does the rest
    _orphaned.set()


def _init_local_worker(threads: int, slots=None, launcher_pid: int | None = None,
                       runs_per_gpu: int | None = None) -> None:
    """Pool initializer: its GPU slot (if any), a fixed number of torch threads, SIGINT to the parent,
    and a watchdog that makes it exit with its launcher ``launcher_pid`` (see :func:`_watch_launcher`).

    ``slots`` is a multiprocessing queue of :func:`gpu_slots` entries holding exactly one per pool
    process, so no GPU ever gets more than ``workers_per_gpu`` workers. The slot is taken and
    CUDA_VISIBLE_DEVICES set before torch is imported here: CUDA reads the variable when it
    initialises, so the trainer's ``cuda:0`` is this worker's GPU. ``runs_per_gpu`` (how many runs share a GPU
    in this pool) is recorded in each run's state.json, for the plan's measured device-hours.
    """
    if slots is not None:
        import queue

        try:
            slot, gpu = slots.get(timeout=SLOT_WAIT_S)
        except queue.Empty:  # cannot happen with one slot per process; fail loudly rather than share a GPU
            raise RuntimeError("local pool worker: no GPU slot left in the queue") from None
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
        os.environ[GPU_SLOT_ENV] = str(slot)
        os.environ[GPU_ENV] = str(gpu)
        if runs_per_gpu:
            os.environ[RUNS_PER_GPU_ENV] = str(runs_per_gpu)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["MKL_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass
    # Ctrl-C reaches the whole process group; the parent decides (it asks runs to stop via a file).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if launcher_pid is not None:
        # Die with the launcher: SIGTERM from the kernel the moment it dies (Linux), and a watchdog that
        # polls the parent pid (any OS; also covers a launcher that died before the prctl call).
        signal.signal(signal.SIGTERM, _on_sigterm)
        _set_parent_death_signal(signal.SIGTERM)
        threading.Thread(target=_watch_launcher, args=(launcher_pid,), name="quartet-launcher-watch",
                         daemon=True).start()


def _gpu_record(gpu: str) -> int | str:
    """A physical GPU id as recorded in claim/state: an int when numeric, else the id (UUID, MIG)."""
    return int(gpu) if gpu.isdigit() else gpu


def local_worker(run_dir: str, job_id: str) -> LocalResult:
    """Run one local job in a pool worker; returns a :class:`LocalResult`. Never raises.

    A ``.stop`` file in the run directory (written by the launcher on Ctrl-C) makes the trainer
    stop at the next step boundary with a checkpoint. On a GPU pool the run's GPU is recorded in
    its claim while it runs and in ``state.json`` (``gpu``, ``worker_pid``) once it ends: the
    trainer rewrites state.json while it trains, so only the final write is merged into.
    """
    global _current_trainer
    run_path = Path(run_dir)
    stop_file = run_path / paths.STOP
    watcher_done = threading.Event()

    def watch(trainer) -> None:
        global _current_trainer
        _current_trainer = trainer
        if _orphaned.is_set():  # the launcher died while this run was starting
            trainer.request_stop()

        def loop() -> None:
            while not watcher_done.wait(0.5):
                if stop_file.exists():
                    trainer.request_stop()
                    return

        threading.Thread(target=loop, daemon=True).start()

    # The run's own output goes to <run_dir>/stdout.log (the trainer also writes train.log), so the
    # launcher's progress display is not interleaved with several runs' logs.
    sys.stdout.flush()
    sys.stderr.flush()
    gpu = os.environ.get(GPU_ENV)
    if gpu is not None and runstate.read_claim(run_path) is not None:  # never create a claim the launcher lacks
        try:
            runstate.update_claim(run_path, gpu=_gpu_record(gpu), worker_pid=os.getpid())
        except OSError:
            pass
    saved = os.dup(1), os.dup(2)
    log_existed = (run_path / paths.STDOUT_LOG).exists()
    log = open(run_path / paths.STDOUT_LOG, "a")
    _run_finished.clear()
    # the trainer writes it into the run lock, so the lock names the launch that started the run
    os.environ[JOB_ENV] = job_id
    skipped = False
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    try:
        if gpu is not None:
            print(f"quartet local pool: pid {os.getpid()} on GPU {gpu} (slot {os.environ.get(GPU_SLOT_ENV)})", flush=True)
        result = execute_run(run_path, job_id, on_trainer=watch)
        state = "completed" if (run_path / paths.SUMMARY).exists() else str(result.get("state", "preempted"))
        return LocalResult(run_dir, state, None, gpu)
    except RunLockedError as exc:  # another process trains it: leave its files alone
        skipped = True
        return LocalResult(run_dir, "skipped", str(exc), gpu)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, traceback in error.txt
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return LocalResult(run_dir, "failed", f"{type(exc).__name__}: {first}", gpu)
    finally:
        _current_trainer = None
        watcher_done.set()
        if gpu is not None and not skipped:
            try:
                per_gpu = os.environ.get(RUNS_PER_GPU_ENV)
                runstate.write_state(run_path, gpu=_gpu_record(gpu), worker_pid=os.getpid(),
                                     **({"runs_per_gpu": int(per_gpu)} if per_gpu else {}))
            except OSError:
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        log.close()
        if skipped and not log_existed:
            # refused by the run lock: the stdout.log this call created holds nothing of the run's (its trainer
            # is a `quartet train` or a worker that opened the log before us), so leave the folder as it was
            (run_path / paths.STDOUT_LOG).unlink(missing_ok=True)
        if not skipped:
            try:
                stop_file.unlink()
            except FileNotFoundError:
                pass
        _run_finished.set()
