"""Run identity: a readable, stable id per semantic config, and the run directory it names.

``run_id(cfg)`` = ``<model>-<budget>-<precision>-s<seed>-<hash8>``. The hash covers only what
changes the numbers a run produces: model, budget, precision scheme, data identity, optimizer recipe
(with the *effective* LR and batch after resolve) and the seeds. It ignores run.name, out_dir,
logging, cluster, device, compile, micro-batching and the precision backend / stats schedule, so
relaunching the same experiment anywhere finds the same directory.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from quartet.data import FORMAT1_IDENTITY_KEYS, IDENTITY_KEYS
from quartet.paths import runs_root

#: precision keys that select an implementation or a logging schedule, not the maths
_PRECISION_NON_SEMANTIC = ("backend", "stats_every")


@functools.cache
def _data_defaults() -> dict:
    from dataclasses import fields

    from quartet.config import DataConfig

    return {f.name: (f.default_factory() if callable(f.default_factory) else f.default) for f in fields(DataConfig)}


def _newer_data_identity(data: dict) -> dict:
    """Data keys that change the token stream but are newer than the run-id scheme (``IDENTITY_KEYS`` beyond
    format 1): part of the identity only when set away from their default, so the ids of runs made before a
    key existed do not change (their config means the default)."""
    defaults = _data_defaults()
    return {k: data.get(k) for k in IDENTITY_KEYS
            if k not in FORMAT1_IDENTITY_KEYS and k in data and data.get(k) != defaults.get(k)}


def semantic_config(cfg: DictConfig, res=None) -> dict:
    """The part of the config that defines the experiment (the input of the run hash).

    ``res``: ``cfg``'s :class:`~quartet.config.ResolvedRun` when the caller has it (a planner resolves each run
    once); else a copy of ``cfg`` is resolved here."""
    from quartet.config import resolve

    res = res if res is not None else resolve(cfg.copy())
    c = OmegaConf.to_container(cfg, resolve=True)
    model = {k: v for k, v in c["model"].items() if k not in ("lr", "batch_size")}
    precision = {k: v for k, v in c["precision"].items() if k not in _PRECISION_NON_SEMANTIC}
    if not precision.get("keep_bf16"):  # newer than the run-id scheme: part of the identity only when set
        precision.pop("keep_bf16", None)
    optim = {k: v for k, v in c["optim"].items() if k not in ("name", "lr", "batch_size", "micro_batch_size")}
    optim.update(lr=res.lr, batch_size=res.batch_size)
    # newer than the run-id scheme: part of the identity only when set away from the paper's cosine
    if optim.get("schedule", "cosine") == "cosine":
        optim.pop("schedule", None)
        optim.pop("decay_fraction", None)
    if optim.get("warmup_steps") is None:
        optim.pop("warmup_steps", None)
    data = {k: c["data"].get(k) for k in FORMAT1_IDENTITY_KEYS}
    data.update(_newer_data_identity(c["data"]))
    out = {"model": model, "budget_tokens": res.budget_tokens, "steps": res.steps, "precision": precision,
           "data": data, "optim": optim, "seed": c["run"]["seed"], "data_seed": c["run"]["data_seed"]}
    branch = {k: v for k, v in (c.get("branch") or {}).items() if v not in (None, [])}
    if branch:  # a budget-branch trunk (its save steps) or branch (its trunk and branch step)
        out["branch"] = branch
    return out


def config_hash(cfg: DictConfig, res=None) -> str:
    """sha256 (hex) of the semantic config, canonical JSON (``res``: as for :func:`semantic_config`)."""
    blob = json.dumps(semantic_config(cfg, res), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _human(n: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.4g}{unit}"
    return f"{n:g}"


def budget_label(cfg: DictConfig) -> str:
    """``dn25`` for a tokens-per-parameter budget, ``t10M`` for an absolute one, ``trunk10M`` for a trunk."""
    b = cfg.budget
    if (cfg.get("branch") or {}).get("save_steps"):  # a budget-branch trunk: trained to its last branch point
        return f"trunk{_human(float(b.tokens))}"
    if b.tokens_per_param is not None:
        return f"dn{float(b.tokens_per_param):g}"
    return f"t{_human(float(b.tokens))}"


def run_id(cfg: DictConfig, res=None) -> str:
    """``<model>-<budget>-<precision>-s<seed>-<hash8>``: same semantic config, same id (``res``: as for
    :func:`semantic_config`)."""
    return f"{cfg.model.name}-{budget_label(cfg)}-{cfg.precision.name}-s{cfg.run.seed}-{config_hash(cfg, res)[:8]}"


def runs_base(cfg: DictConfig) -> Path:
    """The runs root of this config (``run.out_dir`` or ``quartet.paths.runs_root()``)."""
    return Path(cfg.run.out_dir) if cfg.run.out_dir else runs_root()


def run_dir(cfg: DictConfig, res=None) -> Path:
    """``<run.out_dir>/<run.name>/<run_id>/`` (``res``: as for :func:`semantic_config`)."""
    return runs_base(cfg) / str(cfg.run.name) / run_id(cfg, res)
