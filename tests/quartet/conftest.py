"""Fixtures of the foundation tests (the tiny run and one torch thread: tests/conftest.py)."""
from __future__ import annotations

import pytest


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
        res = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        return run_dir(compose([*overrides, f"run.out_dir={out}"]))

    return run
