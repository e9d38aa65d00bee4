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
