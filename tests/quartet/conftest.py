"""Helpers for the foundation tests: a tiny, fast run config on the small bundled corpus."""
from __future__ import annotations

import pytest
import torch

#: a ~13k-parameter model, 8 x 64-token steps, no wandb, metrics every step
TINY = ["model=llama_nano", "data=shakespeare_small", "logging=quiet", "logging.log_every=1", "run.threads=1",
        "budget=tokens", "budget.tokens=6144"]


@pytest.fixture(autouse=True)
def _one_thread():
    """Two xdist workers share two cores: one torch thread each is much faster than oversubscribing."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture
def tiny_cfg(tmp_path):
    """compose(TINY + overrides) with run.out_dir under the test's tmp folder."""
    from quartet.config import compose

    def make(*overrides: str):
        return compose([*TINY, f"run.out_dir={tmp_path / 'runs'}", *overrides])

    return make


@pytest.fixture
def tiny_overrides():
    """The TINY overrides (for tests that compose themselves or run the CLI)."""
    return list(TINY)


@pytest.fixture
def torchrun2():
    """``run(overrides, out_dir) -> run dir``: ``quartet train`` on 2 CPU processes under torchrun (gloo), asserting
    it exits 0 (its output tail in the message otherwise)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from quartet.config import compose
    from quartet.runs import run_dir

    repo = Path(__file__).resolve().parents[2]

    def run(overrides: list[str], out) -> Path:
        env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "quartet.cli", "train", *overrides, f"run.out_dir={out}"]
        res = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=240)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        return run_dir(compose([*overrides, f"run.out_dir={out}"]))

    return run
