"""The planner's fast path (one cached compose per group choice, one resolve per run) plans exactly what the full
path planned: Hydra's whole compose of every run, ``resolve`` called once per use, the run id from its own resolve."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from cluster.plan import build_plan, compose_run
from cluster.profiles import gpu_hours, load_profile, resources_for, rule_for
from cluster.spec import expand, load_sweep
from quartet.config import CONF_DIR, _hydra_compose, compose, resolve
from quartet.memory import choose_parallel
from quartet.runs import run_dir


def _node_signature(node, path: str = "") -> list:
    """Every node's path, type, flags and metadata: equal signatures + equal YAML = the same config object."""
    meta = node._metadata
    flags = (OmegaConf.is_struct(node), OmegaConf.is_readonly(node)) if isinstance(node, (DictConfig, ListConfig)) else ()
    out = [(path, type(node).__name__, flags, str(getattr(meta, "object_type", None)), str(meta.ref_type), meta.optional)]
    if isinstance(node, DictConfig) and not (node._is_none() or node._is_missing()):
        for key in node.keys():
            out += _node_signature(node._get_node(key), f"{path}.{key}")
    return out


def _full_path(point, spec, profile, root: Path) -> dict:
    """The plan of one run as the planner made it before the fast path (Hydra's compose, a resolve per use)."""
    cfg = _hydra_compose([*point.overrides, f"run.name={spec.name}", f"run.out_dir={root}"], CONF_DIR.resolve(), "train")
    res = resolve(cfg)
    resources = resources_for(profile, res.n_params)
    world = max(1, resources.gpus)
    if resources.gpus > 1:
        resolve(cfg.copy(), world_size=resources.gpus)
    requested = str(cfg.run.parallel)
    if requested == "auto":
        requested = rule_for(profile, res.n_params).parallel or "auto"
    mode, est = choose_parallel(resolve(cfg.copy(), world), world_size=world, gpu_memory_gb=profile.gpu_memory_gb,
                                requested=requested, activation_checkpointing=bool(cfg.run.activation_checkpointing))
    OmegaConf.set_readonly(cfg.run, False)
    cfg.run.parallel = mode
    return {"run_id": run_dir(cfg).name, "yaml": OmegaConf.to_yaml(cfg, resolve=True), "sig": _node_signature(cfg),
            "numbers": (res.n_params, res.tokens, res.steps, res.lr, gpu_hours(profile, res.n_params, res.tokens,
                                                                              str(cfg.precision.name))),
            "memory": est, "resources": resources}


@pytest.mark.parametrize("sweep,cluster,every", [("paper_grid", "slurm_blackwell", 9), ("ladder_1gpu", "local_gpu", 7),
                                                 ("paper_7b", "slurm_blackwell", 1), ("demo", "local", 3),
                                                 ("smoke", "local", 1)])
def test_fast_plan_equals_the_full_resolve(sweep, cluster, every, tmp_path):
    """Run ids, resolved configs (YAML and node types/flags), numbers, memory and resources agree on a sample."""
    spec = load_sweep(sweep)
    profile = load_profile(cluster)
    plan = build_plan(spec, profile, tmp_path, with_state=False)
    assert len(plan.runs) == len(expand(spec))
    sample = plan.runs[::every]
    assert sample
    for run in sample:
        old = _full_path(run.point, spec, profile, tmp_path.resolve())
        assert run.run_id == old["run_id"], run.point.label
        assert OmegaConf.to_yaml(run.cfg, resolve=True) == old["yaml"], run.point.label
        assert _node_signature(run.cfg) == old["sig"], run.point.label
        assert (run.n_params, run.tokens, run.steps, run.lr, run.hours) == old["numbers"]
        assert (run.memory, run.resources) == (old["memory"], old["resources"])


@pytest.mark.parametrize("overrides", [
    [],
    ["model=llama_1m", "precision=fp8", "budget=dn10", "data=pycode", "logging=ladder", "cluster=local_gpu",
     "run.seed=2", "run.data_seed=1338", "run.compile=true"],
    ["model=llama_7m", "model.lr=2e-3", "budget=tokens", "budget.tokens=123456", "optim.micro_batch_size=8",
     "data.paths=[a,b]", "precision=quartet", "precision.keep_bf16=[blocks.0.*]"],
    ["+model=llama_3m", "budget.tokens_per_param=7.5"],  # '+group=' is 'group='
    ["+run.extra=1"], ["~logging"],  # not modelled by the fast path: the full compose answers (here with errors)
])
def test_cached_compose_equals_hydra(overrides):
    """compose() (per-group cache + Hydra's own override step) returns Hydra's full compose, or its error."""
    try:
        full = _hydra_compose([o[1:] if o.startswith("+model=") else o for o in overrides], CONF_DIR.resolve(), "train")
    except Exception as exc:  # noqa: BLE001
        with pytest.raises(type(exc)) as caught:
            compose(overrides)
        assert str(caught.value) == str(exc)
        return
    for _ in range(2):  # cold and cached
        cfg = compose(overrides)
        assert OmegaConf.to_yaml(cfg) == OmegaConf.to_yaml(full) and _node_signature(cfg) == _node_signature(full)
        cfg.run.seed = 99  # a caller's edit never reaches the cache
    assert compose(overrides).run.seed == full.run.seed


def test_bad_override_reads_as_before():
    """Errors from the fast path are the full compose's one-line errors (it falls back to it)."""
    from quartet.errors import ConfigError

    for bad in (["run.sed=1"], ["optim.lr=abc"], ["model=llama_nope"]):
        with pytest.raises(ConfigError) as fast:
            compose(bad)
        with pytest.raises(ConfigError) as full:
            _hydra_compose(bad, CONF_DIR.resolve(), "train") if bad[0].startswith(("run", "optim")) else compose(bad)
        assert str(fast.value) == str(full.value)


def test_compose_run_is_the_plans_compose(tmp_path):
    spec = load_sweep("smoke")
    point = expand(spec)[0]
    assert OmegaConf.to_yaml(compose_run(point, spec, tmp_path, [])) == OmegaConf.to_yaml(
        _hydra_compose([*point.overrides, f"run.name={spec.name}", f"run.out_dir={tmp_path}"], CONF_DIR.resolve(), "train"))
