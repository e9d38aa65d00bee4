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


def not_writable(path: str | Path, folder: bool = True) -> str | None:
    """Why ``path`` (a folder to create or fill, or with ``folder=False`` a file to write) cannot be written, or None.

    Checks the nearest existing ancestor (a folder not yet made is made there) and an existing target itself, so a
    command can refuse a read-only output location in one line before its work instead of after it."""
    path = Path(path)
    target = path if folder else path.parent
    existing = next((p for p in [target, *target.parents] if p.exists()), None)
    if existing is None or not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    if not folder and path.exists() and not os.access(path, os.W_OK):
        return f"{path} is not writable"
    return None
