"""The trainer's lock on its run directory: one process trains a run at a time, whoever started it.

``<run_dir>/.train.lock`` carries an exclusive ``flock`` taken by :meth:`quartet.train.Trainer.run`
(rank 0) before it writes anything, and held until the trainer returns. While held, the file names the
holder (pid, host, Slurm job id, the local launch's job id, start time). Every way of training a run
(``quartet train``, a local pool worker, a Slurm task) goes through ``Trainer.run``, so two of them can
never train one run together: the second refuses with one line naming the holder and changes nothing.

Why flock: the kernel drops it when the holding process dies, however it dies (``kill -9``, OOM), so a
killed run is resumable by the next command with no stale lock to clean up; and the holder need not
be the launcher, which may die while its workers still train. The file itself is never deleted:
deleting it would let a second process lock a fresh inode while the first still holds the old one.
On a shared filesystem flock must reach across hosts (NFSv4 emulates it with POSIX locks; Lustre needs
the ``flock`` mount option).

This module has no torch import: ``quartet status`` and the launcher read locks through it.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from quartet.errors import QuartetError
from quartet.paths import TRAIN_LOCK

#: environment variable a launcher sets so the lock names its job (e.g. ``local-<launcher pid>``)
JOB_ENV = "QUARTET_JOB_ID"
#: how long acquire() keeps retrying a held lock: a status probe holds a shared lock for microseconds,
#: and a trainer starting at that instant must not be refused because of it
ACQUIRE_RETRY_S = 0.5


class RunLockedError(QuartetError):
    """Another live process holds the run's lock; ``holder`` is its record (possibly empty)."""

    def __init__(self, message: str, holder: dict[str, Any] | None = None):
        super().__init__(message)
        self.holder = holder or {}


def _slurm_job() -> str | None:
    """This process's Slurm job id (array jobs as ``ARRAY_TASK``), or None outside Slurm."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


def describe(holder: dict[str, Any] | None) -> str:
    """``pid 123 on host h (Slurm job 45, since <time>)`` for a lock record; ``an unknown process`` if empty."""
    if not holder or holder.get("pid") is None:
        return "an unknown process (its lock record is not written yet)"
    extra = []
    if holder.get("slurm_job_id"):
        extra.append(f"Slurm job {holder['slurm_job_id']}")
    elif holder.get("job_id"):
        extra.append(f"job {holder['job_id']}")
    if holder.get("since"):
        extra.append(f"since {holder['since']}")
    return f"pid {holder['pid']} on host {holder.get('host', '?')}" + (f" ({', '.join(extra)})" if extra else "")


def _read(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 65536, 0).decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class RunLock:
    """A held run lock; :meth:`release` (or process death) frees it. Create with :func:`acquire`."""

    def __init__(self, path: Path, fd: int, record: dict[str, Any]):
        self.path = path
        self.record = record
        self._fd: int | None = fd

    def release(self) -> None:
        """Clear the record and drop the lock (idempotent). The file stays: see the module docstring."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # a free lock names nobody; a killed holder's record is ignored anyway
        except OSError:
            pass
        os.close(fd)  # closing the last descriptor of the open file releases the flock

    def current_dir(self) -> Path | None:
        """Where the locked run directory is now (Linux: the lock file's open descriptor follows a rename of its
        folder), or None when unknown or deleted."""
        if self._fd is None:
            return None
        try:
            where = os.readlink(f"/proc/self/fd/{self._fd}")
        except OSError:
            return None
        if where.endswith(" (deleted)") or not where.startswith("/"):
            return None
        return Path(where).parent

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def refusal(what: str, holder: dict[str, Any] | None, path: Path) -> RunLockedError:
    """The one-line error of a run whose lock ``path`` is held by ``holder``."""
    return RunLockedError(f"{what} is being trained by {describe(holder)}; lock {path}: nothing was changed; wait for "
                          f"it to finish (quartet status) or stop it, then run the same command again", holder)


def check_free(run_dir: Path | str, what: str = "run") -> None:
    """Raise :func:`refusal`'s error when another process holds ``run_dir``'s lock (read-only probe, see
    :func:`holder`): a command refuses at once instead of after building its model and data."""
    held = holder(run_dir)
    if held is not None:
        raise refusal(what, held, Path(run_dir) / TRAIN_LOCK)


def acquire(run_dir: Path | str, what: str = "run", retry_s: float = ACQUIRE_RETRY_S) -> RunLock:
    """Take the exclusive lock of ``run_dir`` (created if needed) and write this process into it.

    Raises :class:`RunLockedError` with one line naming the holder when another process holds it;
    nothing in the run directory is changed then (the lock file exists already: the holder made it).
    ``what`` names the run in that message.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / TRAIN_LOCK
    # O_CLOEXEC (Python's default): a child process (git, a data worker) must never inherit the lock
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # the umask decides (group-writable when shared)
    deadline = time.monotonic() + retry_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            if time.monotonic() >= deadline:
                holder = _read(fd)
                os.close(fd)
                raise refusal(what, holder, path) from None
            time.sleep(0.05)
    # dir: a copy of the folder made while this process trains carries this record; status tells it is not its own
    record = {"pid": os.getpid(), "host": socket.gethostname(), "slurm_job_id": _slurm_job(),
              "job_id": os.environ.get(JOB_ENV) or None,
              "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "dir": str(run_dir.resolve())}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    return RunLock(path, fd, record)


def last_record(run_dir: Path | str) -> dict[str, Any]:
    """What the lock file says, whether or not it is held ({} when absent, empty or unreadable): the holder's record
    while held, a killed holder's after, nothing after a clean release. Reads only (no lock probe)."""
    try:
        fd = os.open(Path(run_dir) / TRAIN_LOCK, os.O_RDONLY)
    except OSError:
        return {}
    try:
        return _read(fd)
    finally:
        os.close(fd)


def holder(run_dir: Path | str) -> dict[str, Any] | None:
    """The record of the process holding ``run_dir``'s lock ({} if not written yet), or None if free.

    Read-only: never creates the file. Probes with a shared non-blocking flock, released at once (a
    trainer acquiring at that instant retries, see ``ACQUIRE_RETRY_S``).
    """
    path = Path(run_dir) / TRAIN_LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                for _ in range(5):  # the holder writes its record right after locking
                    rec = _read(fd)
                    if rec:
                        return rec
                    time.sleep(0.02)
                return {}
            return None
        return None  # we got it: nobody holds it (closing drops our shared lock)
    finally:
        os.close(fd)
