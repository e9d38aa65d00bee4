"""Where things live: the checkout's config folders, the default runs folder, the local cache, and the files of a
run directory.

Every location can be moved with an environment variable so that an installed copy, a test or a
cluster job can point elsewhere without code changes.

The run directory's contract (docs/ARCHITECTURE.md, "Files in a run directory") is this module's alone: the names
of its files, where a checkpoint or a branch point lies, the atomic write every JSON file goes through, the readers
of ``summary.json`` / ``state.json`` / ``metrics.jsonl``, and the rule that says whether a run is finished, failed or
unfinished. The trainer's recorder writes by it, ``cluster/`` reads and claims by it, ``analysis/`` loads by it;
it imports no torch, so all three may.
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Iterator, NamedTuple

#: The checkout (or install prefix) holding conf/, sweeps/ and the packages.
REPO_ROOT = Path(os.environ.get("QUARTET_ROOT", Path(__file__).resolve().parents[1]))
#: Hydra config groups (model/, precision/, budget/, data/, optim/, logging/, cluster/).
CONF_DIR = Path(os.environ.get("QUARTET_CONF", REPO_ROOT / "conf"))
#: Named experiment grids.
SWEEPS_DIR = Path(os.environ.get("QUARTET_SWEEPS", REPO_ROOT / "sweeps"))


def is_folder_name(value) -> bool:
    """Whether ``value`` names one folder (no ``/``, not ``.`` or ``..``), not a path."""
    name = str(value)
    return name not in ("", ".", "..") and not any(c in name for c in "/\\\0")


def check_folder_name(key: str, value) -> None:
    """ConfigError (one line) unless ``value`` names one folder: runs land in ``<runs root>/<run.name>/<run id>``,
    and a name with ``/`` or ``..`` would put them outside the runs root (or on top of another sweep's runs)."""
    from quartet.errors import ConfigError

    name = str(value)
    if not is_folder_name(name):
        raise ConfigError(f"{key}={name!r}: must be one folder name (no '/', not '.' or '..'), so that runs stay "
                          f"inside the runs root")


def runs_root() -> Path:
    """Default root of run directories (``runs/<group>/<run_id>/``); ``QUARTET_RUNS`` overrides."""
    return Path(os.environ.get("QUARTET_RUNS", REPO_ROOT / "runs"))


def cache_dir() -> Path:
    """Project cache (tokenizers, prepared shards, compile caches); ``QUARTET_CACHE`` overrides."""
    return Path(os.environ.get("QUARTET_CACHE", REPO_ROOT / ".cache"))


def own_corpus_overrides(vocab_size: int = 8192, val_fraction: float = 0.2) -> list[str]:
    """Hydra overrides for a corpus of this checkout's own docs and ``quartet`` sources (``data=files``): real text that
    needs no network and no corpus package — what the multi-GPU checks and the FSDP memory benchmark train on."""
    return ["data=files", f"data.paths=[{REPO_ROOT / 'docs'},{REPO_ROOT / 'quartet'}]", f"data.vocab_size={vocab_size}",
            f"data.val_fraction={val_fraction}"]


# ------------------------------------------------------------------------- shared runs directories


def _nearest_existing(path: str | Path) -> Path:
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _name(table, ident: int) -> str:
    try:
        return table(ident)[0]
    except (KeyError, OverflowError):
        return str(ident)


def apply_shared_umask(path: str | Path) -> bool:
    """Shared runs directories: when the nearest existing folder of ``path`` is group-writable with the setgid
    bit (``chmod g+ws``: what a lab's shared ``runs/`` is), create everything group-writable from now on (the
    group bits of the umask are cleared; setgid folders already give new files their group). Returns whether it
    did. A private folder leaves the umask as it is."""
    import stat

    try:
        st = _nearest_existing(path).stat()
    except OSError:
        return False
    if not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISGID and st.st_mode & stat.S_IWGRP):
        return False
    mask = os.umask(0)
    os.umask(mask & ~0o070)
    return True


def permission_hint(path: str | Path | None) -> str:
    """What to do about a permission error on ``path``: who owns the nearest existing part of it, its mode, and the
    two ways out (share it with the group, or use a runs directory of one's own)."""
    import grp
    import pwd
    import stat

    if path is None:
        return "check the permissions of the runs directory, or use one of your own (--runs-dir / run.out_dir)"
    where = _nearest_existing(path)
    try:
        st = where.stat()
    except OSError:
        return f"{where} cannot be read; use a runs directory of your own (--runs-dir / run.out_dir)"
    owner, group = _name(pwd.getpwuid, st.st_uid), _name(grp.getgrgid, st.st_gid)
    me = _name(pwd.getpwuid, os.geteuid())
    return (f"{where} belongs to {owner} (group {group}, mode {stat.filemode(st.st_mode)}) and {me} may not write "
            f"there; ask {owner} to share the runs directory with the group (chmod -R g+w, and g+s on its folders: "
            f"docs/cluster.md, 'Shared runs directories'), or use a runs directory of your own (--runs-dir / "
            f"run.out_dir)")


def not_writable(path: str | Path, folder: bool = True) -> str | None:
    """Why ``path`` (a folder to create or fill, or with ``folder=False`` a file to write) cannot be written, or None.

    Checks the nearest existing ancestor (a folder not yet made is made there) and an existing target itself, so a
    command can refuse a read-only output location in one line before its work instead of after it."""
    path = Path(path)
    target = path if folder else path.parent
    existing = _nearest_existing(target)
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    if not folder and path.exists() and not os.access(path, os.W_OK):
        return f"{path} is not writable"
    return None


# ------------------------------------------------------------------------- the run directory

#: the resolved config (``quartet train --config-file DIR/config.yaml`` replays it)
CONFIG = "config.yaml"
#: the trainer's (or the launcher's) last word: pending | running | waiting | preempted | failed | completed
STATE = "state.json"
#: written atomically when, and only when, the run completed: the completion marker
SUMMARY = "summary.json"
#: one JSON object per logged step, then one final row
METRICS = "metrics.jsonl"
ERROR = "error.txt"
ENV = "env.json"
QUANT_MAP = "quant_map.json"
WANDB_ID = "wandb_id"
TRAIN_LOG = "train.log"
#: a run's stdout and stderr under a local pool
STDOUT_LOG = "stdout.log"
#: who starts or runs the run (a launcher, ``O_EXCL``), the lock serialising claim attempts, broken claims' prefix
CLAIM = ".claim"
CLAIM_LOCK = ".claim.lock"
STALE_CLAIM = ".claim.stale."
#: who trains the run now (an ``flock`` of the trainer's rank 0)
TRAIN_LOCK = ".train.lock"
#: a local launch's request to checkpoint and stop (Ctrl-C)
STOP = ".stop"
#: room set aside on the disk while the run trains (so that a full disk can still record the failure)
RESERVE = ".space-reserve"
#: the checkpoints' folder
CKPT = "ckpt"
#: in a sweep's group folder (beside its runs): the sweep file whose runs it holds (cluster.launch.check_group_owner)
SWEEP_RECORD = ".sweep.json"
#: files that make a folder a run directory (something trained, or trains, there)
RUN_MARKERS = (STATE, METRICS, SUMMARY, CKPT, TRAIN_LOCK)


def last_checkpoint(run_dir: str | Path, sharded: bool = False) -> Path:
    """``ckpt/last.pt``, or with ``sharded`` the folder ``ckpt/last`` of an FSDP checkpoint (the previous generation
    beside it: :func:`quartet.checkpoint.prev_path`)."""
    return Path(run_dir) / CKPT / ("last" if sharded else "last.pt")


def branch_point(trunk_dir: str | Path, step: int) -> Path:
    """``<trunk>/ckpt/branch_<step>.pt``: a budget-branch trunk's state after update ``step``, kept for its branch."""
    return Path(trunk_dir) / CKPT / f"branch_{int(step)}.pt"


def trunk_of(point: Path) -> Path:
    """The trunk run directory of a :func:`branch_point` path."""
    return Path(point).parent.parent


def branch_source(cfg, own_dir: str | Path) -> Path | None:
    """The branch point a budget branch starts from (its trunk is a folder beside ``own_dir``); None when ``cfg`` (a
    run's config) is not a branch."""
    b = cfg.get("branch")
    if b is None or b.get("trunk") is None:
        return None
    return branch_point(Path(own_dir).parent / str(b.trunk), int(b.step))


def atomic_write_text(path: str | Path, text: str, parents: bool = False, durable: bool = False) -> None:
    """Write ``text`` to a temporary file beside ``path`` and ``os.replace`` it: readers never see a partial file,
    and two writers never share a temporary file. ``parents`` makes the missing folders first (never for a run
    directory that is being trained: one moved away must not be made again empty at its old path). ``durable``
    also fsyncs the file before the rename and the folder after it: after a power loss the path holds the old text
    or the new, never an empty file (for a marker others act on, as summary.json)."""
    path = Path(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}.tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def write_json_atomic(path: str | Path, obj, indent: int = 2, parents: bool = False, durable: bool = False) -> None:
    """``obj`` as JSON through :func:`atomic_write_text`."""
    atomic_write_text(path, json.dumps(obj, indent=indent, default=str), parents=parents, durable=durable)


def fsync_dir(folder: str | Path) -> None:
    """fsync a folder (a rename in it survives a power loss); best effort where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_json(path: str | Path) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when it is missing, unreadable, not UTF-8, half-written or not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: JSONDecodeError and UnicodeDecodeError
        return None
    return data if isinstance(data, dict) else None


def read_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's ``summary.json`` when it is a JSON object (the run completed), else None."""
    return read_json(Path(run_dir) / SUMMARY)


def read_state(run_dir: str | Path) -> dict[str, Any]:
    """The run's ``state.json`` ({} when missing or unreadable)."""
    return read_json(Path(run_dir) / STATE) or {}


def corrupt_summary(run_dir: str | Path) -> str | None:
    """One line naming a ``summary.json`` that exists but is not a JSON object (else None).

    Such a run may well have finished: it is neither shown as new nor launched again (a relaunch would
    train it a second time and append a duplicate final row to its metrics).
    """
    path = Path(run_dir) / SUMMARY
    if not path.exists() or read_json(path) is not None:
        return None
    return f"{path} is corrupt (not a JSON object); restore it, or delete it to train the run again"


def outcome(run_dir: str | Path) -> str:
    """The run's end as its files say it: ``finished`` (``summary.json`` is a JSON object: the only completion
    marker), ``corrupt`` (``summary.json`` exists but is not one: maybe finished, never retrained blindly),
    ``failed`` (``state.json`` says so) or ``unfinished`` (anything else: new, pending, running, waiting, preempted,
    or killed without an end marker)."""
    if read_summary(run_dir) is not None:
        return "finished"
    if (Path(run_dir) / SUMMARY).exists():
        return "corrupt"
    return "failed" if read_state(run_dir).get("state") == "failed" else "unfinished"


class MetricsLine(NamedTuple):
    """One line of ``metrics.jsonl``: its number (1-based), text, and row (None when the line is not JSON: torn)."""

    number: int
    line: str
    row: Any


def metrics_lines(run_dir: str | Path) -> Iterator[MetricsLine]:
    """The lines of the run's ``metrics.jsonl`` as they are read (nothing when it is missing); blank lines skipped."""
    path = Path(run_dir) / METRICS
    try:
        fh = open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    with fh:
        for number, line in enumerate(fh, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            yield MetricsLine(number, line, row)


def is_metrics_row(row: Any) -> bool:
    """A metrics row: a JSON object whose ``step`` (when present) is a number."""
    return isinstance(row, dict) and isinstance(row.get("step", 0), (int, float))


def tail(path: str | Path, max_bytes: int = 262144) -> str:
    """The last ``max_bytes`` of a file (a log, ``metrics.jsonl``) as text ("" when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max_bytes))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def last_rows(run_dir: str | Path, max_bytes: int = 65536) -> Iterator[dict[str, Any]]:
    """The complete rows of the tail of ``metrics.jsonl``, newest first (reads only the file's last ``max_bytes``)."""
    for line in reversed(tail(Path(run_dir) / METRICS, max_bytes).splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            yield row
