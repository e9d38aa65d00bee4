"""Budget branches (docs/branches.md): a sweep's token budgets as decay branches of one WSD trunk.

A sweep with ``branches: true`` groups its runs by everything but the budget (size, precision, seeds, data,
optimizer). Per group, every run becomes a WSD run (``optim.schedule=wsd``) whose warm-up is the group's shortest
budget's (``optim.warmup_steps``: the warm-up rule applied to the shortest budget), so that all of them follow the
same LR up to their own decay start. Then:

* one **trunk** (``branch.save_steps``): warm-up, then the constant LR up to the largest budget's decay start
  (``optim.decay_fraction=0``), keeping ``ckpt/branch_<step>.pt`` at every budget's decay start;
* one **branch** per budget (``branch.trunk``, ``branch.step``): its own WSD run, started from the trunk's
  checkpoint at its decay start, which is bitwise where an independent run of that budget would be.

``branches: independent`` gives the same WSD runs (same warm-up) trained each from scratch: the reference the
branches are compared with. Both are part of the runs' identity only when set (``quartet.runs``).
"""
from __future__ import annotations

import json
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cluster.spec import MODES, RunPoint, branch_mode  # noqa: F401 - the sweep key's values, re-exported

def _set(cfg: DictConfig, key: str, value: Any) -> None:
    OmegaConf.set_readonly(cfg, False)
    OmegaConf.update(cfg, key, value, merge=False)


def _group_key(cfg: DictConfig) -> str:
    """What a run's group shares: its semantic config without the budget."""
    from quartet.runs import semantic_config

    sem = semantic_config(cfg)
    for key in ("budget_tokens", "steps"):
        sem.pop(key)
    return json.dumps(sem, sort_keys=True, default=str)


def expand_branches(items: list[tuple[RunPoint, DictConfig]], mode: str) -> list[tuple[RunPoint, DictConfig]]:
    """``(point, composed config)`` of a sweep's runs -> the runs of ``mode`` (module docstring); a trunk comes
    before its branches. Raises ConfigError (via resolve) when a budget's decay would start inside the warm-up."""
    from quartet.config import resolve
    from quartet.runs import run_id

    if mode == "off":
        return items
    groups: dict[str, list[tuple[RunPoint, DictConfig]]] = {}
    for point, cfg in items:
        _set(cfg, "optim.schedule", "wsd")
        _set(cfg, "optim.warmup_steps", None)
        groups.setdefault(_group_key(cfg), []).append((point, cfg))
    out: list[tuple[RunPoint, DictConfig]] = []
    for members in groups.values():
        warmup = min(resolve(cfg.copy()).warmup_steps for _, cfg in members)  # the shortest budget's warm-up
        for _, cfg in members:
            _set(cfg, "optim.warmup_steps", warmup)
        if mode == "independent":
            out += members
            continue
        resolved = [(point, cfg, resolve(cfg.copy())) for point, cfg in members]
        starts = sorted({res.decay_start for _, _, res in resolved})
        point0, cfg0, res0 = resolved[0]
        trunk = cfg0.copy()
        tokens = starts[-1] * res0.tokens_per_step
        for key, value in (("budget.name", "trunk"), ("budget.tokens_per_param", None),
                           ("budget.tokens", tokens), ("optim.decay_fraction", 0.0), ("branch.save_steps", starts)):
            _set(trunk, key, value)
        values = {k: v for k, v in point0.values.items() if k != "budget" and not k.startswith("budget.")}
        over = (f"budget.tokens={tokens}", "budget.tokens_per_param=null", "optim.decay_fraction=0",
                f"branch.save_steps=[{','.join(map(str, starts))}]")
        out.append((RunPoint(values={**values, "branch": "trunk"}, overrides=point0.overrides + over), trunk))
        tid = run_id(trunk)
        for point, cfg, res in resolved:
            _set(cfg, "branch.trunk", tid)
            _set(cfg, "branch.step", res.decay_start)
            out.append((point, cfg))
    return out
