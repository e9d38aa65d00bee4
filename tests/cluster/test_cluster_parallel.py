"""The plan's parallelism choice and per-GPU memory check (run.parallel, quartet.memory): no trainer, no Slurm."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from cluster.plan import build_plan
from cluster.profiles import load_profile
from cluster.spec import load_sweep
from quartet.config import compose, resolve
from quartet.errors import ConfigError
from quartet.memory import GB, estimate, estimate_run

SIZES = """
name: sizes
cluster: slurm_hopper
axes:
  model: [llama_100m, llama_800m, llama_1600m, llama_3200m, llama_7b]
  precision: [quartet]
fixed:
  budget: tokens
  budget.tokens: 1000000000
  data: c4
  optim.micro_batch_size: 8   # the paper's 512 sequences over 64 GPUs; 1.6B's 64 per rank would not fit
"""


def _plan(tmp_path, body=SIZES, extra=(), profile="slurm_hopper", prof_over=()):
    path = tmp_path / "sizes.yaml"
    path.write_text(body)
    return build_plan(load_sweep(str(path)), load_profile(profile, list(prof_over)), tmp_path / "runs",
                      list(extra), with_state=False)


def test_paper_7b_on_hopper_is_fsdp_and_fits(tmp_path):
    """Every 3B / 7B run of the Hopper plan is FSDP over its 64 GPUs with an estimate under 80 GB; smaller sizes
    keep DDP (their DDP estimate fits); the run config records the choice."""
    plan = _plan(tmp_path)
    by = {str(r.cfg.model.name): r for r in plan.runs}
    for name in ("llama_3200m", "llama_7b"):
        r = by[name]
        assert r.cfg.run.parallel == "fsdp" and r.memory.shards == r.resources.gpus == 64
        assert r.memory.total < 80 * GB
    for name in ("llama_100m", "llama_800m"):
        assert by[name].cfg.run.parallel == "ddp" and by[name].memory.shards == 1
    # why 7B needs FSDP: DDP's replicated fp32 weights + grads + Adam alone are 16 bytes/param (~104 GB)
    res7 = resolve(by["llama_7b"].cfg.copy(), 64)
    ddp = estimate_run(res7, parallel="ddp", world_size=64)
    assert ddp.params + ddp.grads + ddp.optimizer == pytest.approx(16 * res7.n_params_total)
    assert ddp.total > 80 * GB


def test_plan_refuses_a_run_over_the_gpu_memory(tmp_path):
    """run.parallel=ddp for 7B on 80 GB GPUs: one line naming the run, the estimate and the GPU size."""
    body = SIZES.replace("[llama_100m, llama_800m, llama_1600m, llama_3200m, llama_7b]", "[llama_7b]")
    with pytest.raises(ConfigError) as err:
        _plan(tmp_path, body, extra=["run.parallel=ddp"])
    msg = str(err.value)
    assert "\n" not in msg and "model=llama_7b" in msg and "exceeds the 80 GB GPU of profile slurm_hopper" in msg
    weights = 4 * resolve(compose(["model=llama_7b", "data=c4"])).n_params_total / GB  # fp32, unsharded
    assert f"GB/GPU (weights {weights:.1f}, grads {weights:.1f}, Adam {2 * weights:.1f}" in msg
    # no micro-batch makes DDP fit: its model state alone is over 80 GB
    assert msg.endswith("try run.parallel=fsdp or run.activation_checkpointing=true or a rule with more GPUs; "
                        "nothing was submitted")
    # the rule may force a mode too: fsdp for everything fits
    plan = _plan(tmp_path, body, prof_over=["resources=[{max_params: .inf, gpus: 64, nodes: 8, parallel: fsdp}]"])
    assert plan.runs[0].cfg.run.parallel == "fsdp"
    with pytest.raises(ConfigError, match="parallel='zero3'; allowed: ddp, fsdp, null"):
        _plan(tmp_path, body, prof_over=["resources=[{max_params: .inf, gpus: 8, parallel: zero3}]"])


def test_refusal_names_a_micro_batch_that_fits(tmp_path):
    """1.6B on 8 GPUs with the full 64 sequences per rank: activations alone exceed 80 GB; the line says which
    micro-batch fits."""
    body = SIZES.replace("[llama_100m, llama_800m, llama_1600m, llama_3200m, llama_7b]", "[llama_1600m]")
    body = body.replace("  optim.micro_batch_size: 8", "")
    with pytest.raises(ConfigError, match=r"model=llama_1600m.*activations \d+.*try run.activation_checkpointing=true "
                       r"or optim.micro_batch_size=(32|16|8) or a rule with more GPUs"):
        _plan(tmp_path, body)


def test_estimate_terms_shard_and_checkpointing():
    """FSDP divides the model state by the world size; activation checkpointing keeps one layer's activations."""
    kw = dict(n_params_total=1_000_000_000, n_layer=10, d_model=1024, ffn_hidden=2816, vocab_size=32000,
              micro_tokens=4096, quantized=False)
    ddp = estimate(parallel="ddp", world_size=8, **kw)
    fsdp = estimate(parallel="fsdp", world_size=8, **kw)
    assert fsdp.params * 8 == ddp.params == 4e9 and fsdp.optimizer * 8 == ddp.optimizer == 8e9
    assert fsdp.activations == ddp.activations
    ac = estimate(parallel="fsdp", world_size=8, activation_checkpointing=True, **kw)
    logits = 10.0 * 4096 * 32000
    assert ac.activations - logits == pytest.approx(10 * 2 * 4096 * 1024 + 4096 * 1024 * 34)
    assert ac.total < fsdp.total
    # 64 shards of a 30B model train in little memory, but every rank first builds the whole fp32 model
    big = estimate(parallel="fsdp", world_size=64, activation_checkpointing=True,
                   **{**kw, "n_params_total": 30_000_000_000})
    assert big.training < 40 * GB and big.total == 120 * GB + big.overhead
    assert "peak at start-up: the whole fp32 model 120.0 before sharding" in big.describe()


def test_print_config_states_parallelism(tmp_path, capsys, monkeypatch):
    from quartet.train import cli_main

    monkeypatch.setenv("WORLD_SIZE", "64")
    assert cli_main(["model=llama_7b", "data=c4", "budget=tokens", "budget.tokens=1000000000", "run.parallel=fsdp",
                     "run.device=cpu", f"run.out_dir={tmp_path}", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "# parallel: fsdp (run.parallel=fsdp) over 64 rank(s), model state in 64 shard(s)" in out
    assert "# memory estimate: " in out and "state sharded 64 ways" in out
    cfg = OmegaConf.create(out.split("# run_id")[0])
    assert cfg.run.parallel == "fsdp"


def test_bad_parallel_value_is_one_line():
    with pytest.raises(ConfigError, match=r"run.parallel='zero3': allowed: auto, ddp, fsdp"):
        resolve(compose(["run.parallel=zero3"]))


def test_planned_run_config_replays_with_its_parallelism(tmp_path, capsys, monkeypatch):
    """The config.yaml the planner writes says fsdp; --print-config of it states the plan's 64-GPU estimate."""
    from cluster.plan import write_run_config
    from quartet.train import cli_main

    body = SIZES.replace("[llama_100m, llama_800m, llama_1600m, llama_3200m, llama_7b]", "[llama_7b]")
    run = _plan(tmp_path, body).runs[0]
    path = write_run_config(run, load_profile("slurm_hopper"))
    assert OmegaConf.load(path).run.parallel == "fsdp"
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli_main(["--config-file", str(path), "run.device=cpu", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert f"# memory estimate: {run.memory.describe()}" in out
    assert "over 64 rank(s), model state in 64 shard(s)" in out
