"""Where things live: the checkout's config folders, the default runs folder and the local cache.

Every location can be moved with an environment variable so that an installed copy, a test or a
cluster job can point elsewhere without code changes.
"""
from __future__ import annotations

import os
from pathlib import Path

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
