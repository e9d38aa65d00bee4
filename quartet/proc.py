"""Process identity on this host: whether a recorded pid still names the process that recorded it.

The trainer records ``pid`` and ``pid_start`` (:func:`process_start`) in ``state.json``; ``quartet
status`` (``cluster/runstate.py``) later asks :func:`same_process_alive` whether that process still
runs. The start time guards against pid reuse. Stdlib only: the status command must not import torch.
"""
from __future__ import annotations

import os


def _stat(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (after the command name), or None when unreadable."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            stat = fh.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    # the command name (field 2) is in parentheses and may contain spaces: split after its last ')'
    return stat[stat.rfind(")") + 2:].split()


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22); None when unknown."""
    fields = _stat(pid)
    try:
        return int(fields[19])  # field 22 overall: 3 is fields[0]
    except (TypeError, IndexError, ValueError):
        return None


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants on this host, parents first (from each process's parent pid, field 4 of
    ``/proc/<pid>/stat``): processes that left ``pid``'s process group or session (torchrun's ranks) included."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            fields = _stat(int(d))
            if fields and len(fields) > 1 and fields[1].isdigit():
                children.setdefault(int(fields[1]), []).append(int(d))
    out, todo = [], [int(pid)]
    while todo:
        out.append(todo.pop())
        todo += children.get(out[-1], [])
    return out


def _zombie(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] in ("Z", "X")


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists on this host (and is not a zombie)."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except (OverflowError, ValueError):
        return False
    return not _zombie(pid)


def same_process_alive(pid: int, start: int | None = None) -> bool:
    """True when ``pid`` is alive on this host and, when ``start`` is known, started at ``start``."""
    if not pid_alive(pid):
        return False
    if start is None:
        return True
    now = process_start(pid)
    return now is None or now == int(start)
