"""Test-wide guards and fixtures: no network, no caches outside the checkout, markers that skip cleanly, one torch
thread per test, the tiny CPU run.

- wandb is forced offline; its folders, matplotlib's, the compile and Hugging Face caches and pytest's
  tmp_path folders live under ``.cache/tests`` of the checkout (git-ignored), unless already set.
- ``gpu`` tests skip without CUDA; ``slurm`` tests skip unless the local Slurm is up
  (``cluster/slurm_local/up.sh``; CI starts it in ``.ci/run``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_CACHE = REPO / ".cache" / "tests"
_CACHE.mkdir(parents=True, exist_ok=True)

# Set before anything imports wandb / torch.compile / matplotlib.
os.environ["WANDB_MODE"] = "offline"
os.environ.pop("WANDB_API_KEY", None)
for var, sub in {
    "WANDB_DIR": "wandb",
    "WANDB_CACHE_DIR": "wandb-cache",
    "WANDB_CONFIG_DIR": "wandb-config",
    "WANDB_DATA_DIR": "wandb-data",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "MPLCONFIGDIR": "matplotlib",
    "HF_HOME": "huggingface",
    "TIKTOKEN_CACHE_DIR": "tiktoken",
}.items():
    os.environ.setdefault(var, str(_CACHE / sub))
os.environ.setdefault("QUARTET_CACHE", str(REPO / ".cache"))
# Without a GPU the Triton kernels run in Triton's interpreter. The choice is fixed when triton is first imported
# (its own @jit library functions, e.g. tl.sum, are made then), and importing quartet.config already imports
# triton through torch: so it is set here, before any test module is collected, not in tests/kernels/conftest.py
# alone (a tests/cluster module that imports quartet.config at the top broke every kernel test of its xdist worker).
if shutil.which("nvidia-smi") is None and not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# tmp_path folders under the checkout's (git-ignored) .cache, not /tmp/pytest-of-<user>: pytest keeps the
# last 3 sessions there (pyproject: only failed tests' folders). Read when the first tmp_path is made
# (xdist: by the controller, which hands the folder to its workers).
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(_CACHE / "tmp"))
Path(os.environ["PYTEST_DEBUG_TEMPROOT"]).mkdir(parents=True, exist_ok=True)
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing
        return False


def _slurm_up() -> bool:
    if not shutil.which("sinfo") or not os.environ.get("SLURM_CONF"):
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() != ""


def pytest_collection_modifyitems(config, items):
    cuda = _cuda_available()
    slurm = _slurm_up()
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "slurm" in item.keywords and not slurm:
            item.add_marker(pytest.mark.skip(reason="local Slurm is not running (see cluster/slurm_local/up.sh)"))


#: The tiny CPU run: a ~13k-parameter model, 12 steps of 8 x 64 tokens, no wandb, metrics every step.
TINY_RUN = ("model=llama_nano", "data=shakespeare_small", "logging=quiet", "logging.log_every=1", "run.threads=1",
            "budget=tokens", "budget.tokens=6144", "run.device=cpu")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """One torch thread per test: two xdist workers share two cores, and oversubscribing them is much slower. Only
    where torch is already imported (the analysis tests run without it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture
def tiny_overrides() -> list[str]:
    """The :data:`TINY_RUN` overrides (for tests that compose themselves or run the CLI)."""
    return list(TINY_RUN)


@pytest.fixture
def tiny_cfg(tmp_path):
    """``tiny_cfg(*overrides)``: compose(TINY_RUN + overrides) with run.out_dir under the test's tmp folder."""
    from quartet.config import compose

    def make(*overrides: str):
        return compose([*TINY_RUN, f"run.out_dir={tmp_path / 'runs'}", *overrides])

    return make
