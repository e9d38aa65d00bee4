"""Checkpoint files: verified by a checksum, written atomically, the previous one kept as a fallback.

Why: one unverified file meant a truncated or bit-flipped ``last.pt`` either crashed the resume with a raw
traceback (and the run looked reset to step 0) or, worse, loaded silently. So:

* **Format.** A checkpoint file is one fixed-length ASCII header line followed by the ``torch.save`` bytes::

      quartet-checkpoint v1 sha256=<64 hex> bytes=<20 digits>\\n<torch.save payload>

  The header holds the sha256 and the length of the payload, so a load detects a truncated file (too few
  bytes) and any changed byte (checksum mismatch) before unpickling anything. The checksum lives inside
  the file, not in a sidecar, so a rename moves file and checksum together (no two-file atomicity to get
  wrong). Files from before this scheme (a bare ``torch.save`` zip) still load, with a one-line warning
  that they are unverified.
* **Atomic write, two generations.** :func:`save_atomic` writes ``<name>.tmp`` completely (hashing while it
  writes), fsyncs it, then ``os.replace``s the current ``last.pt`` to ``prev.pt`` and the tmp to
  ``last.pt``, and fsyncs the folder. A crash before the rotation leaves ``last.pt`` and ``prev.pt`` as
  they were (a stale ``.tmp`` is ignored and overwritten); a crash between the two renames leaves a
  complete ``prev.pt``. At every moment at least one complete, verifiable checkpoint exists.
* **Load with fallback.** :func:`load_latest` loads ``last.pt``; if it is missing, truncated, unreadable
  or fails its checksum, it warns in one line naming the file and why, moves the bad file aside to
  ``last.pt.bad`` (so the next save does not rotate it over the good ``prev.pt``) and loads ``prev.pt``.
  If neither is usable it raises :class:`CheckpointError` naming both files and what to do.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import warnings
from pathlib import Path
from typing import Callable

import torch

from quartet.errors import QuartetError
from quartet.paths import fsync_dir as _fsync_dir  # the renames themselves made durable

_HEADER = "quartet-checkpoint v1 sha256={sha} bytes={n:020d}\n"
HEADER_LEN = len(_HEADER.format(sha="0" * 64, n=0))
_HEADER_RE = re.compile(rb"quartet-checkpoint v1 sha256=([0-9a-f]{64}) bytes=(\d{20})\n")
_MAGIC = b"quartet-checkpoint "
_CHUNK = 1 << 24


class CheckpointError(QuartetError):
    """A checkpoint file is missing, truncated, unreadable or fails its checksum (one-line message)."""


class _HashingWriter:
    """File-like that forwards writes to ``fh`` and hashes / counts the bytes."""

    def __init__(self, fh):
        self.fh, self.sha, self.n = fh, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.n += len(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def _serialize(obj, fh) -> None:
    """Write ``obj`` into the open binary file (separate so tests can simulate a crash mid-write)."""
    torch.save(obj, fh)


def prev_path(path: str | Path) -> Path:
    """The previous generation kept beside ``path``: ``ckpt/last.pt`` -> ``ckpt/prev.pt``."""
    path = Path(path)
    return path.with_name("prev" + path.suffix)


def exists(path: str | Path) -> bool:
    """True when ``path`` or its previous generation exists (a run to resume, whether or not it verifies)."""
    return Path(path).is_file() or prev_path(path).is_file()


def root_os_error(exc: BaseException) -> OSError | None:
    """The innermost :class:`OSError` in ``exc``'s chain (``__cause__`` / ``__context__``), or None: the file
    system's own word (``[Errno 28] No space left on device: ...``) under whatever wrapped it."""
    found, seen = None, set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError):
            found = exc
        exc = exc.__cause__ or exc.__context__
    return found


def save_atomic(obj, path: str | Path, keep_prev: bool = True) -> Path:
    """Save ``obj`` to ``path`` with a checksum header; the old ``path`` becomes ``prev.pt`` (module docstring), or is
    replaced with ``keep_prev=False`` (a file that is never rotated, e.g. a trunk's ``branch_<step>.pt``)."""
    path = Path(path)
    # the checkpoint folder only, never its parents: a run directory moved away mid-write must not be recreated
    # empty at its old path (the trainer then stops with the move's one line instead)
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(b" " * HEADER_LEN)  # placeholder: the header is known only after the payload
            writer = _HashingWriter(fh)
            _serialize(obj, writer)
            fh.seek(0)
            fh.write(_HEADER.format(sha=writer.sha.hexdigest(), n=writer.n).encode())
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()  # a partial file only takes the space a full disk lacks
        cause = root_os_error(exc)
        if cause is not None and cause is not exc:
            # torch.save turns a failed write into a RuntimeError, and closing the file raises it again:
            # one error, the file system's, instead of a chain of three
            raise cause from None
        raise
    if keep_prev and path.is_file():
        os.replace(path, prev_path(path))
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return path


def load(path: str | Path, map_location="cpu", warn: Callable[[str], object] | None = None) -> dict:
    """Load and verify one checkpoint written by :func:`save_atomic` (our own file: full unpickling).

    Raises :class:`CheckpointError` (one line: the file and why) if it is missing, truncated, unreadable
    or fails its checksum. A file without a header (written before checksums) loads unverified after a
    one-line ``warn`` (default: :func:`warnings.warn`).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEADER_LEN)
            if not head:
                raise CheckpointError(f"{path}: empty (0 bytes)")
            if not head.startswith(_MAGIC[:len(head)]):
                (warn or warnings.warn)(f"{path}: no checksum (written before checksums were added); loaded unverified")
                fh.seek(0)
                return torch.load(fh, map_location=map_location, weights_only=False)
            m = _HEADER_RE.fullmatch(head)
            if m is None:
                raise CheckpointError(f"{path}: truncated or damaged header ({path.stat().st_size} bytes)")
            want_sha, want_n = m.group(1).decode(), int(m.group(2))
            sha, n = hashlib.sha256(), 0
            while chunk := fh.read(_CHUNK):
                sha.update(chunk)
                n += len(chunk)
            if n != want_n:
                raise CheckpointError(f"{path}: truncated ({n} of {want_n} payload bytes)")
            if sha.hexdigest() != want_sha:
                raise CheckpointError(f"{path}: checksum mismatch (sha256 {sha.hexdigest()[:12]}... != "
                                      f"{want_sha[:12]}... recorded): the file changed after it was written")
            fh.seek(HEADER_LEN)
            return torch.load(fh, map_location=map_location, weights_only=False)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unpickling / zip / IO failure: name the file, one line
        first = (str(exc).splitlines() or [""])[0][:200]
        raise CheckpointError(f"{path}: unreadable ({type(exc).__name__}: {first})") from exc


def load_latest(path: str | Path, map_location="cpu", warn: Callable[[str], object] | None = None,
                move_bad: bool = True) -> tuple[dict, Path]:
    """Load ``path`` (``ckpt/last.pt``), falling back to ``prev.pt`` if it is unusable; returns (state, file).

    A fallback is announced by one ``warn`` line naming the bad file and why; with ``move_bad`` the bad
    file is renamed to ``<name>.bad`` so the next save keeps ``prev.pt``. Raises :class:`CheckpointError`
    naming both files and the remedy when neither loads.
    """
    warn = warn or warnings.warn
    path = Path(path)
    prev = prev_path(path)
    try:
        return load(path, map_location, warn), path
    except CheckpointError as exc:
        last_err = exc
    try:
        state = load(prev, map_location, warn)
    except CheckpointError as exc:
        raise CheckpointError(f"no usable checkpoint: {last_err}; {exc}; delete {path.parent} to restart the run "
                              f"from step 0") from exc
    moved = ""
    if move_bad and path.is_file():
        os.replace(path, path.with_name(path.name + ".bad"))
        moved = f" (kept as {path.name}.bad)"
    warn(f"checkpoint {last_err}{moved}; resuming from {prev.name} at step {state.get('step')}")
    return state, prev


# ----------------------------------------------------------------------------------------------
# Sharded checkpoints (run.parallel=fsdp): a torch.distributed.checkpoint (DCP) folder per generation
# ----------------------------------------------------------------------------------------------
#
# ``ckpt/last/`` holds DCP's files (``.metadata`` and one ``__<rank>_<i>.distcp`` per writer) for the model
# and optimizer, sharded as they were trained, plus ``meta.pt``: the rest of the state (step, scheduler,
# sampler, RNG, ...) and the sha256 and size of every DCP file, written last by :func:`save_atomic`, so it
# is itself checksummed. The same guarantees as one file:
#
# * **atomic, two generations**: every rank writes into ``last.tmp/``; once all have written and the files
#   are hashed, rank 0 writes ``meta.pt``, drops ``prev/``, renames ``last/`` to ``prev/`` and ``last.tmp/`` to
#   ``last/``. A crash at any moment leaves a complete ``last/`` or ``prev/`` (a folder without ``meta.pt`` is
#   never trusted).
# * **verified load with fallback**: a folder loads only if ``meta.pt`` passes its checksum and every DCP file
#   has its recorded size and sha256 (the ranks hash the files between them); otherwise one warning names
#   the folder and why, it is moved aside to ``last.bad/`` and ``prev/`` loads.
# * **any world size**: DCP re-slices the saved tensors to the loading ranks' shards (save on 2, resume on 1).

META = "meta.pt"


def sharded_prev(folder: str | Path) -> Path:
    """``ckpt/last`` -> ``ckpt/prev``."""
    return Path(folder).with_name("prev")


def _hash_file(path: Path) -> tuple[str, int]:
    sha, n = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            sha.update(chunk)
            n += len(chunk)
    return sha.hexdigest(), n


def _hash_shared(folder: Path, names: list[str]) -> dict[str, tuple[str, int]]:
    """sha256 and size of ``names`` in ``folder``, each rank hashing every world-th file; all ranks get all."""
    import torch.distributed as dist

    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = {n: _hash_file(folder / n) if (folder / n).is_file() else ("missing", -1) for n in names[rank::world]}
    if world == 1:
        return mine
    parts: list = [None] * world
    dist.all_gather_object(parts, mine)
    return {k: v for part in parts for k, v in part.items()}


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _rmtree(path: Path) -> None:
    import shutil

    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def save_sharded(model, optimizer, meta: dict, folder: str | Path) -> Path:
    """Collective: save ``model`` / ``optimizer`` (sharded or not) with DCP and ``meta`` into ``folder``
    (``ckpt/last``), the previous generation kept as ``ckpt/prev`` (see the section comment above)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    if _rank() == 0:
        _rmtree(tmp)  # a stale half-written attempt
        tmp.mkdir(parents=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    _barrier()
    names = sorted(p.name for p in tmp.iterdir())
    files = _hash_shared(tmp, names)
    if _rank() == 0:
        save_atomic({**meta, "files": files}, tmp / META)
        _fsync_dir(tmp)
        prev = sharded_prev(folder)
        if folder.is_dir():
            _rmtree(prev)
            os.replace(folder, prev)
        os.replace(tmp, folder)
        _fsync_dir(folder.parent)
    _barrier()
    return folder


def sharded_exists(folder: str | Path) -> bool:
    """True when ``ckpt/last`` or ``ckpt/prev`` is there (a run to resume, whether or not it verifies)."""
    return Path(folder).is_dir() or sharded_prev(folder).is_dir()


def _verify_sharded(folder: Path) -> dict:
    """Collective: ``meta.pt`` of ``folder`` after checking it and every DCP file; CheckpointError otherwise."""
    import torch.distributed as dist

    try:
        meta = load(folder / META)
        err = None
    except CheckpointError as exc:
        meta, err = None, str(exc)
    if meta is not None:
        want = meta.get("files", {})
        got = _hash_shared(folder, sorted(want))
        bad = [n for n in sorted(want) if tuple(got[n]) != tuple(want[n])]
        if bad:
            sizes = ", ".join(f"{n} ({'missing' if got[n][1] < 0 else f'{got[n][1]} of {want[n][1]} bytes'})"
                              for n in bad[:3])
            err = f"{folder}: {len(bad)} shard file(s) changed, truncated or missing since the save: {sizes}"
    if dist.is_initialized():  # all ranks take the same branch
        flags: list = [None] * dist.get_world_size()
        dist.all_gather_object(flags, err)
        err = next((f for f in flags if f), None)
    if err:
        raise CheckpointError(err)
    return meta


def load_sharded_latest(model, optimizer, folder: str | Path,
                        warn: Callable[[str], object] | None = None) -> tuple[dict, Path]:
    """Collective: restore ``model`` / ``optimizer`` in place from ``ckpt/last`` (else ``ckpt/prev``) at this
    world size; returns ``(meta, folder used)``. Raises :class:`CheckpointError` when neither verifies."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    warn = warn or warnings.warn
    folder = Path(folder)
    prev = sharded_prev(folder)
    errors = []
    for i, candidate in enumerate((folder, prev)):
        try:
            meta = _verify_sharded(candidate) if candidate.is_dir() else None
            if meta is None:
                raise CheckpointError(f"{candidate}: missing")
        except CheckpointError as exc:
            errors.append(str(exc))
            continue
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(candidate))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if i == 1:
            moved = ""
            if folder.is_dir():
                _barrier()
                if _rank() == 0:
                    bad = folder.with_name(folder.name + ".bad")
                    _rmtree(bad)
                    os.replace(folder, bad)
                moved = f" (kept as {folder.name}.bad)"
                _barrier()
            warn(f"checkpoint {errors[0]}{moved}; resuming from {prev.name} at step {meta.get('step')}")
        return meta, candidate
    raise CheckpointError(f"no usable checkpoint: {'; '.join(errors)}; delete {folder.parent} to restart the run "
                          f"from step 0")
