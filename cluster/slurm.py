"""Thin, failure-tolerant queries of the Slurm CLI (squeue / sacct / scontrol).

Every function returns something usable when the command is missing, slow or refuses (``sacct``
without slurmdbd exits 1): the run directories are the source of truth, Slurm is a cross-check.
"""
from __future__ import annotations

import functools
import shutil
import subprocess

#: squeue/sacct states in which the job still holds (or will hold) its claim on the run
ALIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
         "RESIZING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "STOPPED", "PREEMPTED"}


def available() -> bool:
    """True when the Slurm client tools are on PATH."""
    return shutil.which("squeue") is not None and shutil.which("sbatch") is not None


#: how long ``squeue`` may take before status gives up on it (the job states are then unverified)
SQUEUE_TIMEOUT_S = 20.0
#: squeue states of a job waiting to (re)start: whatever state.json says, nothing of it runs now
WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}


def _run_why(cmd: list[str], timeout: float = 20) -> tuple[str | None, str | None]:
    """``(stdout, None)`` when ``cmd`` succeeded, else ``(None, one line saying why)``."""
    if shutil.which(cmd[0]) is None:
        return None, f"{cmd[0]} not found"
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"{cmd[0]} timed out after {timeout:g} s"
    except OSError as exc:
        return None, f"{cmd[0]}: {exc}"
    if out.returncode != 0:
        err = (out.stderr or out.stdout or "").strip().splitlines()
        return None, f"{cmd[0]} exited {out.returncode}" + (f": {err[-1].strip()}" if err else "")
    return out.stdout, None


def _run(cmd: list[str], timeout: float = 20) -> str | None:
    return _run_why(cmd, timeout)[0]


def queue() -> dict[str, str] | None:
    """Job id -> state for every job in ``squeue`` (array elements listed one per line).

    Keys hold both spellings of an array element (``<array>_<index>`` and its raw job id) so a
    lookup works with whichever id a run recorded. ``None`` when squeue cannot be asked.
    """
    return queue_or_error()[0]


def queue_or_error() -> tuple[dict[str, str] | None, str | None]:
    """:func:`queue` and, when squeue could not be asked (failed, timed out), one line saying why."""
    out, why = _run_why(["squeue", "-h", "-r", "-o", "%A|%i|%T"], timeout=SQUEUE_TIMEOUT_S)
    if out is None:
        return None, why
    jobs: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            raw, nice, state = parts
            jobs[raw] = state
            jobs[nice] = state
    return jobs, None


def final_state(job_id: str) -> str | None:
    """The end state of a job that left the queue (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...).

    Tries ``sacct`` (needs slurmdbd) and then ``scontrol show job`` (works for MinJobAge seconds
    after the end, no accounting needed). ``None`` when neither knows.
    """
    out = _run(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", job_id])
    if out:
        for line in out.splitlines():
            jid, _, state = line.partition("|")
            if jid.strip() == job_id and state:
                return state.split()[0]  # "CANCELLED by 0" -> CANCELLED
    out = _run(["scontrol", "show", "job", "-o", job_id])
    if out:
        for tok in out.split():
            if tok.startswith("JobState="):
                return tok.split("=", 1)[1]
    return None


@functools.lru_cache(maxsize=1)
def max_array_size(default: int = 1001) -> int:
    """The cluster's ``MaxArraySize`` (array indices must be below it), or ``default``."""
    out = _run(["scontrol", "show", "config"])
    if out:
        for line in out.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "MaxArraySize":
                try:
                    return int(value.strip())
                except ValueError:
                    break
    return default
