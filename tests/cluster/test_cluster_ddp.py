"""Multi-task plumbing on CPU: RunTask under submitit with 2 tasks -> torch.distributed (gloo) DDP or FSDP2.

The same run trained by 1 task and by 2 tasks must give the same loss curve up to reduction order.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import submitit

from cluster.plan import build_plan, write_run_config
from cluster.profiles import load_profile
from cluster.spec import load_sweep
from cluster.task import RunTask

SWEEP = """
name: ddp
axes:
  precision: [bf16]
fixed:
  model: llama_nano
  budget: tokens
  budget.tokens: 10240
  data: shakespeare_small
  logging: quiet
  logging.log_every: 1
  run.device: cpu
"""


def losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def train_with_tasks(tmp_path: Path, tasks: int, profile_overrides: tuple[str, ...] = (), name: str = "") -> Path:
    (tmp_path / "ddp.yaml").write_text(SWEEP)
    spec = load_sweep(str(tmp_path / "ddp.yaml"))
    plan = build_plan(spec, load_profile("local", list(profile_overrides)), tmp_path / f"runs{tasks}{name}",
                      with_state=False)
    (run,) = plan.runs
    write_run_config(run, plan.profile)
    ex = submitit.LocalExecutor(folder=tmp_path / f"submitit{tasks}{name}")
    ex.update_parameters(tasks_per_node=tasks, timeout_min=30)
    job = ex.submit(RunTask(run.run_dir))
    results = job.results()  # one per task
    assert len(results) == tasks, job.stderr()
    return run.run_dir


def test_two_gloo_tasks_match_one_process(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # 2 tasks x 1 thread on 2 cores (oversubscribed gloo is ~20x slower)
    one = train_with_tasks(tmp_path, 1)
    two = train_with_tasks(tmp_path, 2)
    assert one.name == two.name  # same run id
    a, b = losses(one), losses(two)
    assert len(a) == len(b) == 20
    diff = max(abs(x - y) for x, y in zip(a, b))
    assert diff < 1e-4, diff
    assert "x2" in (two / "train.log").read_text()  # the trainer saw WORLD_SIZE=2
    sa = json.loads((one / "summary.json").read_text())
    sb = json.loads((two / "summary.json").read_text())
    assert abs(sa["val_loss"] - sb["val_loss"]) < 1e-4


def test_two_gloo_tasks_run_fsdp_when_the_profile_rule_says_so(tmp_path, monkeypatch):
    """A rule with ``parallel: fsdp`` puts run.parallel=fsdp into the run's config.yaml; RunTask's 2 submitit tasks
    then train it sharded (a DCP folder per generation) and match a 1-task DDP run."""
    from omegaconf import OmegaConf

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one = train_with_tasks(tmp_path, 1)
    two = train_with_tasks(tmp_path, 2, ("resources=[{max_params: .inf, gpus: 0, parallel: fsdp}]",), "fsdp")
    assert OmegaConf.load(two / "config.yaml").run.parallel == "fsdp"
    assert (two / "ckpt" / "last" / "__1_0.distcp").is_file() and not (two / "ckpt" / "last.pt").exists()
    a, b = losses(one), losses(two)
    assert len(a) == len(b) == 20
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4


def test_ddp_check_bundle_gives_both_runs_the_same_micro_batches(tmp_path):
    """The GPU DDP check compares 1 GPU x 2 micro-batches with 2 GPUs x 1: quantized schemes draw their random
    Hadamard signs per micro-batch, so a 1-GPU run of one whole-batch micro-batch would not be comparable."""
    import os
    import subprocess
    import sys

    from quartet.config import load_config_file, resolve

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DDP_CHECK_BUNDLE": str(tmp_path / "bundle")}
    subprocess.run([sys.executable, str(repo / "cluster/scripts/ddp_check.py"), "prepare", "--model", "llama_nano",
                    "--tokens", "4096", "--batch", "8", "--precision", "quartet"], check=True, env=env, cwd=repo,
                   capture_output=True)
    cfg = load_config_file(tmp_path / "bundle" / "config.yaml", ["run.device=cpu"])
    assert cfg.precision.name == "quartet" and cfg.optim.micro_batch_size == 4
    assert resolve(cfg, world_size=1).accum_steps(1) == 2
    assert resolve(cfg, world_size=2).accum_steps(2) == 1
