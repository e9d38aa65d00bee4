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
