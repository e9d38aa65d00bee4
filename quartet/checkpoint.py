"""Atomic checkpoint files: write to ``<name>.tmp``, fsync, then ``os.replace`` over the old one.

A crash or kill at any moment leaves either the previous complete checkpoint or the new complete one
under the final name (``os.replace`` is atomic on POSIX); a stale ``.tmp`` is ignored and overwritten.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch


def _serialize(obj, fh) -> None:
    """Write ``obj`` into the open binary file (separate so tests can simulate a crash mid-write)."""
    torch.save(obj, fh)


def save_atomic(obj, path: str | Path) -> Path:
    """Save ``obj`` with torch.save to ``path`` atomically (tmp file + fsync + os.replace + dir fsync)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        _serialize(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    try:  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # pragma: no cover - some filesystems refuse directory fsync
        pass
    return path


def load(path: str | Path, map_location="cpu") -> dict:
    """Load a checkpoint written by :func:`save_atomic` (our own file: full unpickling is allowed)."""
    return torch.load(Path(path), map_location=map_location, weights_only=False)
