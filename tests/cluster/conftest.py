"""Shared fixtures of the cluster tests."""
from __future__ import annotations

from pathlib import Path

import pytest

# 2 budgets x 2 precisions of the nano model on the small bundled corpus: ~10-20 s on 2 cores
TINY_SWEEP = """
name: {name}
cluster: local
axes:
  budget.tokens: [2048, 4096]
  precision: [bf16, fp8]
fixed:
  model: llama_nano
  budget: tokens
  data: shakespeare_small
  logging: quiet
  run.device: cpu
"""


@pytest.fixture()
def tiny_sweep(tmp_path: Path):
    """``tiny_sweep(name)`` writes the 4-run CPU sweep as ``<tmp>/<name>.yaml`` (group folder ``name``); returns its path."""
    def write(name: str) -> str:
        path = tmp_path / f"{name}.yaml"
        path.write_text(TINY_SWEEP.format(name=name))
        return str(path)

    return write
