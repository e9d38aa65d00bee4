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


def _run(cmd: list[str], timeout: float = 20) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def queue() -> dict[str, str] | None:
    """Job id -> state for every job in ``squeue`` (array elements listed one per line).

    Keys hold both spellings of an array element (``<array>_<index>`` and its raw job id) so a
    lookup works with whichever id a run recorded. ``None`` when squeue cannot be asked.
    """
    out = _run(["squeue", "-h", "-r", "-o", "%A|%i|%T"])
    if out is None:
        return None
    jobs: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            raw, nice, state = parts
            jobs[raw] = state
            jobs[nice] = state
    return jobs


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
