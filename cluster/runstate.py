"""Run state as seen from outside a run: markers in the run directory, claims, Slurm cross-checks.

The run directory is the source of truth (``docs/ARCHITECTURE.md``): ``summary.json`` means done,
``state.json`` holds the trainer's last word, ``metrics.jsonl`` the latest loss. Two extra files are
owned by ``cluster/``:

``.claim``
    Created with ``O_CREAT | O_EXCL`` by the launcher that is about to start the run, so two
    concurrent launches can never both start it. It records who holds it (launcher pid + host, and
    the Slurm job id once submitted). A claim is *stale* when its holder is gone: the pid is dead
    (same host) or the job left ``squeue``. A stale claim is broken atomically (renamed away; only
    one contender's rename succeeds) and then re-claimed with ``O_EXCL`` again.
``error.txt``
    Traceback of a failed run (also written by the trainer).

The claim says which *launcher* started a run; the process that trains it holds ``.train.lock``
(:mod:`quartet.runlock`: an flock the kernel drops when that process dies). A run whose train lock
is held is live whatever its claim says (a launcher killed while its worker checkpoints), and is
never claimed again until the lock is free: a relaunch cannot start a second trainer on it.

A run whose ``state.json`` says running/pending but whose claim is stale died without saying so
(``scancel``, node failure, OOM kill): :func:`reconcile` records it as failed, with the Slurm end
state (e.g. ``CANCELLED``) in the error, so the next launch resumes it from its checkpoint.
Likewise a standalone ``quartet train`` (no claim) whose process recorded in ``state.json`` (``pid``,
``pid_start``, ``host``) is gone from this host, and a Slurm run left ``preempted`` by a job that
ended without being requeued (submitit's "timed-out too many times"). A run on another host that
cannot be checked is shown ``stale`` once its files stopped changing for much longer than expected.
When ``squeue`` cannot be asked, Slurm-claimed runs are shown ``unknown`` (job state ``UNKNOWN``)
rather than guessed, and their claims are trusted (never broken, never relaunched).

Claims and train locks record the run directory they were made for (``dir``). A copy of a run directory made
while its run trains carries the original's records, whose holder is alive but works on the original: the copy
is ``stale`` (saying so), and its claim is not its own (a launch may take it). File times further in the future
than :data:`FUTURE_SKEW_S` are no sign of life: such a run is ``stale`` with a line, not trusted until then.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cluster import slurm
from quartet import paths, proc
# the run directory's names, its atomic write and its readers are quartet.paths'; these are the ones status, claims
# and the launcher use, under the names cluster/ has always used
from quartet.paths import (CLAIM, ERROR, METRICS, STATE, SUMMARY, atomic_write_text, corrupt_summary,  # noqa: F401
                           read_json)

#: a claim from another host that we cannot check is trusted for this long
FOREIGN_CLAIM_TTL_S = 3600.0
#: a run without a claim whose trainer cannot be checked (another host, no pid recorded) is ``stale``
#: when neither state.json nor metrics.jsonl changed for this long (or 20 metrics intervals, if longer)
STALE_AFTER_S = 3600.0
#: job state shown when squeue could not be asked about a Slurm-claimed run
UNKNOWN_JOB = "UNKNOWN"
#: file times further ahead of this host's clock than this are no sign of life (a clock ahead, files copied with
#: future times): such a run is judged ``stale`` rather than trusted until that time comes
FUTURE_SKEW_S = 300.0


def now_iso() -> str:
    """UTC time in ISO 8601 (what state.json uses)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def invalid_summary(summary: dict[str, Any]) -> str | None:
    """One line naming what makes a readable ``summary.json`` impossible (else None): a numeric ``val_loss`` that is
    not positive and finite — no cross-entropy loss is, and ``quartet fit`` drops such a run for the same reason."""
    value = summary.get("val_loss")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    if not (math.isfinite(value) and value > 0):
        return (f"summary.json's val_loss is {value:g} (not positive and finite: a cross-entropy loss cannot be; the "
                f"summary is corrupt); quartet fit drops the run; delete summary.json to train the run again")
    return None


def write_state(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Update ``state.json`` (merging with what is there) atomically; returns the new state."""
    state = paths.read_state(run_dir)
    state.update(fields)
    state["updated"] = now_iso()
    paths.write_json_atomic(Path(run_dir) / STATE, state, indent=1, parents=True)
    return state


def last_metrics(run_dir: Path, max_bytes: int = 65536) -> dict[str, Any] | None:
    """The last complete row of ``metrics.jsonl`` (reads only the file's tail)."""
    return next(paths.last_rows(run_dir, max_bytes), None)


# ------------------------------------------------------------------------------------------ claims


def _pid_alive(pid: int) -> bool:
    return proc.pid_alive(pid)


def read_claim(run_dir: Path) -> dict[str, Any] | None:
    """The claim record, or None."""
    return read_json(Path(run_dir) / CLAIM)


def claim_alive(claim: dict[str, Any] | None, queue: dict[str, str] | None, run_dir: Path | None = None) -> bool:
    """Whether the holder of ``claim`` may still be working on the run.

    ``queue`` is :func:`cluster.slurm.queue` (None = squeue unavailable: Slurm claims are then
    trusted, never broken blindly). A claim of a launcher on another host cannot be checked: it is trusted
    while the run's files (``.claim``, ``state.json``, ``metrics.jsonl`` of ``run_dir``) changed within
    :data:`FOREIGN_CLAIM_TTL_S`, judged by their modification times (stamped by the shared file system), not
    by the other host's clock in the claim.
    """
    if not claim:
        return False
    if run_dir is not None and elsewhere(claim, run_dir):  # a copy's claim: its holder works on the original
        return False
    job = claim.get("job_id")
    if claim.get("scheduler") == "slurm" and job:
        if queue is None:
            return True
        return queue.get(str(job)) in slurm.ALIVE
    if claim.get("host") == socket.gethostname():
        pid = claim.get("pid")
        return isinstance(pid, int) and _pid_alive(pid)
    beat = foreign_heartbeat(claim, run_dir)
    return not in_future(beat) and time.time() - beat < FOREIGN_CLAIM_TTL_S


def in_future(mtime: float) -> bool:
    """Whether a file time is further ahead of this host's clock than :data:`FUTURE_SKEW_S`: no sign of life."""
    return mtime - time.time() > FUTURE_SKEW_S


def elsewhere(record: dict[str, Any] | None, run_dir: Path) -> str | None:
    """The other run directory a claim or train-lock record of this host was made for, or None (made for
    ``run_dir``, or not checkable: no directory recorded, or made on another host, whose paths may differ).

    A run directory copied while its run trains carries the original's records: their holder is alive, but works on
    the original, never on the copy."""
    where = (record or {}).get("dir")
    if not where or record.get("host") != socket.gethostname():
        return None
    other, here = Path(where), Path(run_dir)
    with contextlib.suppress(OSError):
        if other.resolve() == here.resolve() or (other.exists() and os.path.samefile(other, here)):
            return None
    return str(other)


def foreign_heartbeat(claim: dict[str, Any], run_dir: Path | None) -> float:
    """The latest sign of life of a run claimed on another host: its files' modification times (or, without a
    run directory, the claim's own time)."""
    if run_dir is None:
        return float(claim.get("time", 0) or 0)
    return max(_mtime(Path(run_dir) / f) for f in (CLAIM, STATE, METRICS))


def foreign_claim(claim: dict[str, Any] | None) -> bool:
    """A claim of a local launcher on another host: nothing of it can be checked from here."""
    return bool(claim) and claim.get("scheduler") != "slurm" and claim.get("host") not in (None, socket.gethostname())


def _record(run_dir: Path, **fields: Any) -> None:
    """``write_state`` for what status found, where it can: a reader without write access (a second user of a
    shared runs directory) still gets its report, and the file stays as it was."""
    with contextlib.suppress(OSError):
        write_state(run_dir, **fields)


def try_claim(run_dir: Path, info: dict[str, Any], queue: dict[str, str] | None) -> bool:
    """Atomically claim ``run_dir`` for this launcher. False if someone alive holds it, or it has ended since
    this launcher planned it (a summary.json, even a corrupt one: the trainer would refuse it anyway, after this
    launch had rewritten its state and submitted a job that does nothing)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    # Deciding "stale" and breaking the claim must be one step: without the lock, a contender that
    # judged the old claim stale could rename away the fresh claim another contender just created.
    with _claim_lock(run_dir):
        if train_lock_holder(run_dir) is not None:  # a trainer is at work on it, whoever launched it
            return False
        if paths.outcome(run_dir) in ("finished", "corrupt"):
            return False
        return _try_claim_locked(run_dir, info, queue)


def train_lock_holder(run_dir: Path) -> dict[str, Any] | None:
    """The record (pid, host, job ids) of the process training ``run_dir`` now ({} if unwritten), or None."""
    from quartet.runlock import holder

    return holder(run_dir)


@contextlib.contextmanager
def _claim_lock(run_dir: Path):
    """Exclusive advisory lock (flock) serialising claim attempts on one run directory."""
    fd = os.open(run_dir / paths.CLAIM_LOCK, os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _try_claim_locked(run_dir: Path, info: dict[str, Any], queue: dict[str, str] | None) -> bool:
    path = run_dir / CLAIM
    record = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(), "job_id": None,
              "dir": str(run_dir.resolve()), **info}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            current = read_claim(run_dir)
            if current is None:
                # being written right now by another launcher (or garbage): give it a moment
                time.sleep(0.05)
                current = read_claim(run_dir)
                if current is None and time.time() - _mtime(path) < 5:
                    return False
            if current is not None and claim_alive(current, queue, run_dir):
                return False
            # stale: break it atomically; only one contender's rename can succeed
            try:
                os.rename(path, run_dir / f"{paths.STALE_CLAIM}{uuid.uuid4().hex[:8]}")
            except FileNotFoundError:
                pass
            _cleanup_stale(run_dir)
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh)
        return True
    return False


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _cleanup_stale(run_dir: Path) -> None:
    for p in run_dir.glob(f"{paths.STALE_CLAIM}*"):
        try:
            p.unlink()
        except OSError:
            pass


def update_claim(run_dir: Path, **fields: Any) -> None:
    """Add fields (e.g. the Slurm job id after submission) to our claim."""
    claim = read_claim(run_dir) or {}
    claim.update(fields)
    atomic_write_text(Path(run_dir) / CLAIM, json.dumps(claim), parents=True)


def release_claim(run_dir: Path) -> None:
    """Drop our claim (local runs, after the run returned, or a submission that failed)."""
    claim = read_claim(run_dir)
    if claim and claim.get("pid") == os.getpid() and claim.get("host") == socket.gethostname():
        try:
            (Path(run_dir) / CLAIM).unlink()
        except FileNotFoundError:
            pass


# ------------------------------------------------------------------------------------------ views


@dataclass
class RunView:
    """What ``quartet status`` and the launch plan know about one run."""

    run_id: str
    run_dir: Path
    # new | pending | running | completed | preempted | failed | cancelled | corrupt | invalid | stale | unknown | waiting
    state: str
    live: bool = False  # a live claim (job queued/running, or a local launcher working on it)
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    job_id: str | None = None
    job_state: str | None = None
    error: str | None = None
    note: str | None = None  # why the state is what it is, when that is not obvious (shown without an error)
    record: dict[str, Any] = field(default_factory=dict)  # state.json as read
    summary: dict[str, Any] | None = None  # summary.json as read (a finished run)


def inspect(run_dir: Path, queue: dict[str, str] | None = None, reconcile_dead: bool = True) -> RunView:
    """Read a run directory (and the queue) into a :class:`RunView`.

    With ``reconcile_dead`` a run that claims to be running but whose holder is gone is recorded
    as failed in ``state.json`` (see the module docstring).
    """
    run_dir = Path(run_dir)
    st = paths.read_state(run_dir)
    claim = read_claim(run_dir)
    row = last_metrics(run_dir) or {}
    job_id = (claim or {}).get("job_id") or st.get("job_id")
    view = RunView(
        run_id=run_dir.name,
        run_dir=run_dir,
        state=str(st.get("state") or "new"),
        step=st.get("step", row.get("step")),
        total_steps=st.get("total_steps"),
        loss=row.get("loss"),
        tokens_per_s=row.get("tokens_per_s"),
        job_id=str(job_id) if job_id else None,
        error=st.get("error"),
        note=st.get("note") if st.get("state") == "waiting" else None,
        record=st,
    )
    if row.get("step") is not None and (view.step is None or row["step"] > view.step):
        view.step = row["step"]
    if queue is not None and view.job_id:
        view.job_state = queue.get(view.job_id)
    summary = view.summary = paths.read_summary(run_dir)
    if summary is not None:
        view.state = "completed"
        view.error = None
        view.loss = summary.get("val_loss", view.loss)
        view.tokens_per_s = summary.get("tokens_per_s", view.tokens_per_s)
        view.step = summary.get("steps", view.step)
        view.total_steps = view.total_steps or summary.get("steps")
        invalid = invalid_summary(summary)
        if invalid is not None:  # finished, but with an impossible result: flagged, never retrained by a launch
            view.state, view.error = "invalid", invalid
        return view
    corrupt = corrupt_summary(run_dir)
    if corrupt is not None:  # maybe finished: never "new", never reconciled or relaunched
        view.state, view.live = "corrupt", claim_alive(claim, queue, run_dir) or train_lock_holder(run_dir) is not None
        view.error = corrupt.replace(str(run_dir / SUMMARY), SUMMARY, 1)  # the table's column: no long path
        return view
    if view.state == "completed":  # summary.json is the only completion marker (it was deleted)
        view.state = "new"
    # a held train lock means a trainer is at work, even when the launcher of its claim is gone
    locked = train_lock_holder(run_dir) is not None
    if not locked and _copied(run_dir, view, claim, queue):
        return view
    view.live = claim_alive(claim, queue, run_dir) or locked
    slurm_claim = bool((claim or {}).get("scheduler") == "slurm" and (claim or {}).get("job_id"))
    if view.live:
        if slurm_claim and queue is None:
            # squeue could not be asked: the claim is trusted (never relaunched), but nothing is asserted
            view.job_state = UNKNOWN_JOB
            if view.state in {"running", "pending", "new"}:
                view.note = (f"squeue could not be asked: job {view.job_id} may be queued, running or over "
                             f"(state.json says {st.get('state') or 'nothing yet'})")
                view.state = "unknown"
            else:
                view.note = f"unverified: squeue could not be asked (state.json says {view.state})"
            return view
        queued = view.job_state in slurm.WAITING
        if view.state == "preempted" and (queued or view.job_state is None):
            pass  # checkpointed and requeued: waits for the scheduler to start it again
        elif queued:  # requeued: whatever state.json says about the previous attempt, nothing runs now
            if view.state == "running":
                view.note = (f"requeued: job {view.job_id} waits in the queue; state.json still says running "
                             f"(previous attempt, step {view.step or 0})")
            view.state = "pending"
        elif view.state not in {"running", "waiting"}:  # waiting: a branch held by its launcher until its trunk
            view.state = "pending" if view.job_state is None else "running"
        return view
    # `pending` with its claim released and no trainer ever recorded (pid, host): an interrupted launch released it
    # before any worker started the run (Ctrl-C of a local sweep)
    released = view.state == "pending" and claim is None and not st.get("pid") and not st.get("host")
    if released or (view.state == "pending" and claim is not None and not slurm_claim and not foreign_claim(claim)):
        # claimed by a local launcher that stopped (killed) before any worker started the run: nothing ran, nothing
        # failed; it is what it was before the launch (new, or preempted with a checkpoint to resume from)
        ckpt = run_dir / paths.CKPT
        started = view.step or (ckpt.is_dir() and any(ckpt.iterdir()))
        view.state = "preempted" if started else "new"
        who = "its launch" if released else f"its launcher (pid {claim.get('pid')})"
        view.note = f"{who} stopped before the run started; a relaunch starts it"
        return view
    if view.state in {"running", "pending"} and foreign_claim(claim):
        # a launcher on another host whose files stopped changing: it may still be alive; nothing is written
        beat = foreign_heartbeat(claim, run_dir)
        age = time.time() - beat
        view.state = "stale"
        quiet = _future_note(-age) if in_future(beat) else f"no update of its files for {duration(age)}"
        view.error = (f"stale: claimed by pid {claim.get('pid')} on {claim.get('host')}, {quiet}; not checkable "
                      f"from here (nothing was written); if it died, relaunch resumes it")
        return view
    if view.state in {"running", "pending"} and claim is not None:
        # the process that owned the run is gone and never wrote an end state
        end = slurm.final_state(view.job_id) if (view.job_id and slurm_claim) else None
        view.job_state = end or view.job_state
        cancelled = end is not None and end.startswith("CANCELLED")
        view.state = "cancelled" if cancelled else "failed"
        what = f"job {view.job_id} ended {end}" if end else f"the process holding it ({view.job_id or 'local'}) is gone"
        view.error = (f"{'cancelled' if cancelled else 'lost'}: {what} at step {view.step or 0} without an end "
                      f"marker; relaunch resumes from the last checkpoint")
        if reconcile_dead and st:
            _record(run_dir, state="failed", error=view.error)
    elif view.state == "preempted" and slurm_claim and queue is not None:
        _not_requeued(run_dir, view, claim, st, reconcile_dead)
    elif view.state in {"running", "pending"}:  # no claim: a standalone `quartet train`
        _check_standalone(run_dir, view, st, reconcile_dead)
    elif view.state == "failed" and view.error and view.error.startswith("cancelled"):
        view.state = "cancelled"
    if view.state == "failed" and not view.error and (run_dir / ERROR).exists():
        lines = paths.tail(run_dir / ERROR, 8192).strip().splitlines()  # "" when unreadable (another user's 0600 file)
        view.error = lines[-1] if lines else None
    return view


def _copied(run_dir: Path, view: RunView, claim: dict[str, Any] | None, queue: dict[str, str] | None) -> bool:
    """A copy of a run directory made while its run trained (its train lock is not held here): the train lock or
    claim it carries names another folder, which exists, and a holder that is alive (a moved folder's records name
    a folder that is gone; a dead holder's run is lost, as anywhere). Running / pending in the copy: ``stale``, saying
    so (True: the view is done; nothing is written). Otherwise its state stands, with a note (False)."""
    from quartet.runlock import describe, last_record

    lock = last_record(run_dir)
    found = None
    for record, alive, who in ((lock, lambda r: isinstance(r.get("pid"), int) and _pid_alive(r["pid"]), describe),
                               (claim, lambda r: claim_alive(r, queue), _claimant)):
        other = elsewhere(record, run_dir)
        if other and Path(other).is_dir() and alive(record):
            found = (other, who(record))
            break
    if found is None:
        return False
    other, who = found
    if view.state not in {"running", "pending"}:
        view.note = f"a copy of {other}, which {who} works on"
        return False
    view.state = "stale"
    view.error = (f"stale: a copy of {other}: its state.json, claim and train lock are that folder's ({who} works "
                  f"there, not here); nothing trains this copy (nothing was written); a launch resumes it here")
    return True


def _claimant(claim: dict[str, Any]) -> str:
    """``the launcher pid 12 on h`` / ``Slurm job 34`` for a claim record."""
    if claim.get("scheduler") == "slurm" and claim.get("job_id"):
        return f"Slurm job {claim['job_id']}"
    return f"the launcher pid {claim.get('pid')} on {claim.get('host')}"


# ------------------------------------------------------------------------------ dead or lost runs

_NOT_REQUEUED = re.compile(r"Job not requeued because: (.+?)\.?\s*$", re.M)


def not_requeued_reason(claim: dict[str, Any] | None) -> str | None:
    """submitit's reason for not requeuing the claim's job (``timed-out too many times``, ...), from its logs.

    submitit logs ``Job not requeued because: <reason>.`` to the job's stdout and raises it (stderr)
    when a preempted / timed-out job cannot be requeued; the claim records the stdout log's path.
    """
    log = (claim or {}).get("log")
    if not log:
        return None
    log = Path(log)
    found = None
    for path in (log, log.with_name(log.name.replace("_log.out", "_log.err"))):
        hits = _NOT_REQUEUED.findall(paths.tail(path))
        found = hits[-1].strip() if hits else found
    return found


def _not_requeued(run_dir: Path, view: RunView, claim: dict[str, Any] | None, st: dict[str, Any],
                  reconcile_dead: bool) -> None:
    """A Slurm run left ``preempted`` whose job is gone from the queue: it was not requeued and never
    will be (a requeued job keeps its id in squeue). Failed with submitit's reason, or cancelled."""
    reason = not_requeued_reason(claim)
    end = slurm.final_state(view.job_id) if view.job_id else None
    view.job_state = end or view.job_state
    ended = f"job {view.job_id} ended {end}" if end else f"job {view.job_id} left the queue"
    if reason is None and end is not None and end.startswith("CANCELLED"):
        view.state = "cancelled"
        view.error = (f"cancelled: {ended} after being preempted, at step {view.step or 0}; "
                      f"relaunch resumes from the last checkpoint")
    else:
        why = reason or "the job was not requeued"
        if reason and "too many times" in reason:
            why += " (the cluster.max_num_timeout time-limit requeues are used up)"
        view.state = "failed"
        view.error = f"not requeued: {why}; {ended} at step {view.step or 0}; relaunch resumes from the last checkpoint"
    if reconcile_dead and st:
        _record(run_dir, state="failed", error=view.error)


def _future_note(ahead: float) -> str:
    """Why a run whose files are dated ``ahead`` seconds in the future cannot be judged alive."""
    return (f"but its files are dated {duration(ahead)} in the future (a clock ahead, or files copied with future times): "
            f"whether it is alive cannot be told from them")


def duration(seconds: float) -> str:
    """A span of time for a line: ``40 s``, ``12 min``, ``3.5 h`` (negative as 0)."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _metrics_interval(run_dir: Path) -> float | None:
    """Seconds between the last two rows of metrics.jsonl (their ``elapsed_s``), if known."""
    rows = []
    for row in paths.last_rows(run_dir):
        if isinstance(row.get("elapsed_s"), (int, float)):
            rows.append(float(row["elapsed_s"]))
            if len(rows) == 2:
                return rows[0] - rows[1] if rows[0] > rows[1] else None
    return None


def _check_standalone(run_dir: Path, view: RunView, st: dict[str, Any], reconcile_dead: bool) -> None:
    """state.json says running, nobody holds a claim: ask the trainer's recorded process.

    Same host: its pid (and start time) must still be alive, else the run is ``failed`` (lost; the
    trainer was killed or died before it could write its end state, e.g. of a full disk). Another host,
    or no pid recorded: ``stale`` when state.json / metrics.jsonl stopped changing for much longer than
    the trainer writes them, else running with a note that it cannot be checked from here.
    """
    pid, host, here = st.get("pid"), st.get("host"), socket.gethostname()
    if isinstance(pid, int) and host == here:
        if proc.same_process_alive(pid, st.get("pid_start")):
            return
        disk = ""
        with contextlib.suppress(OSError):
            free = shutil.disk_usage(run_dir).free
            if free < 256 * 2**20:
                disk = f"; its file system has only {free / 2**20:.0f} MiB free (a full disk?)"
        view.state = "failed"
        view.error = (f"lost: process {pid} on {host} is gone at step {view.step or 0} without an end marker "
                      f"(killed, or died before writing state.json){disk}; rerunning resumes from the last checkpoint")
        if reconcile_dead:
            now = paths.read_state(run_dir)
            if now.get("pid") == pid and now.get("state") == st.get("state"):  # not restarted meanwhile
                _record(run_dir, state="failed", error=view.error)
        return
    beat = max(_mtime(run_dir / STATE), _mtime(run_dir / METRICS))
    interval = _metrics_interval(run_dir)
    limit = max(STALE_AFTER_S, 20 * interval) if interval else STALE_AFTER_S
    age = time.time() - beat
    where = f"on {host}" if host else "on an unrecorded host"
    if in_future(beat):
        view.state = "stale"
        view.error = (f"stale: state.json says running {where}, {_future_note(-age)}; nothing was written; if it died, "
                      f"rerunning resumes from the last checkpoint")
    elif beat and age > limit:
        view.state = "stale"
        view.error = (f"stale: no update of state.json/metrics.jsonl for {duration(age)} (expected every "
                      f"{duration(interval) if interval else '?'}); {'pid ' + str(pid) + ' ' if pid else ''}{where} "
                      f"cannot be checked from here; if it died, rerunning resumes from the last checkpoint")
    elif host != here:
        view.note = f"running {where} (not checkable from here)"
