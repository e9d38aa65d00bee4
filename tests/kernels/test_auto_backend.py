"""What ``auto`` installs for each scheme on a GPU, resolved on the CPU: the device checks are simulated (an FP8 GPU
such as Hopper, and a GPU without FP8 tensor cores) and the selection runs as the trainer runs it
(:func:`quartet.quant.backend.get_backend` given the scheme, then the backend's fused layer).

A forward-only / backward-only variant (``<recipe>_fwd`` / ``_bwd``) must train on a fused layer as its recipe does,
never operand by operand when a fused layer covers it: that is what the effN / effD runs are timed and trained on."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from quartet.kernels import gemm as G  # noqa: E402
from quartet.kernels.linear import IMPL_FP8, IMPL_FP8_BLOCK, IMPL_FUSED, IMPL_SEAM  # noqa: E402
from quartet.kernels.recipe_linear import IMPL_RECIPE  # noqa: E402
from quartet.quant.backend import get_backend  # noqa: E402
from quartet.quant.config import PrecisionConfig  # noqa: E402
from quartet.quant.schemes import HALF_VARIANTS, build_scheme  # noqa: E402

#: the recipes the fused recipe layer runs on any GPU (fp8 where no FP8 layer takes it)
RECIPE_LAYER = ("mxfp8", "nvfp4", "nvfp4_recipe", "quartet2", "ms_fp4", "luq_int4")
#: Quartet's halves are these schemes operand for operand (tests/quant/test_schemes.py)
QUARTET_HALVES = {"quartet_fwd": "quest_fwd", "quartet_sr_fwd": "quest_fwd", "quartet_bwd": "rtn_bwd",
                  "quartet_sr_bwd": "sr_bwd"}


@pytest.fixture
def gpu(monkeypatch):
    """``gpu(fp8)``: make the backends' device checks see a CUDA GPU, with FP8 tensor cores or without."""
    def simulate(fp8: bool):
        monkeypatch.setattr(G, "hopper_available", lambda: fp8)
        monkeypatch.setattr(G, "blackwell_available", lambda: False)

    return simulate


def auto(name: str) -> tuple[str, str]:
    """(backend, layer) ``auto`` installs for scheme ``name`` on ``cuda``."""
    scheme = build_scheme(PrecisionConfig(name=name))
    backend = get_backend("auto", "cuda", scheme.specs(), scheme=scheme)
    layer = backend.fused_layer(scheme)
    return backend.name, layer[1] if layer else IMPL_SEAM


def test_on_an_fp8_gpu_every_half_variant_runs_on_its_recipes_fast_layers(gpu):
    gpu(fp8=True)
    assert auto("fp8") == ("hopper_fp8", IMPL_FP8) and auto("fp8_deepseek") == ("hopper_fp8", IMPL_FP8_BLOCK)
    assert auto("quartet") == auto("quartet_sr") == ("hopper_fp8", IMPL_FUSED)
    for recipe in RECIPE_LAYER:
        assert auto(recipe) == ("fused", IMPL_RECIPE), recipe
    for variant, (recipe, _half) in HALF_VARIANTS.items():
        got = auto(variant)
        if recipe in RECIPE_LAYER or recipe == "fp8":  # fp8's FP8 layer runs all six operands only: the recipe layer
            assert got == ("fused", IMPL_RECIPE), (variant, got)
        elif recipe == "fp8_deepseek":
            assert got == ("hopper_fp8", IMPL_FP8_BLOCK), (variant, got)
        else:
            assert got == auto(QUARTET_HALVES[variant]), (variant, got)
    # (the Quartet paper's forward-only / backward-only rows: the Triton MXFP4 quantizers on FP8 GEMMs, per operand)
    assert auto("quest_fwd") == auto("rtn_bwd") == auto("sr_bwd") == ("hopper_fp8", IMPL_SEAM)


def test_on_a_gpu_without_fp8_the_fp8_variants_take_the_recipe_layer_and_fp8_deepseek_compiled(gpu):
    gpu(fp8=False)
    for name in ("fp8", "fp8_fwd", "fp8_bwd", "mxfp8_fwd", "luq_int4_bwd"):
        assert auto(name) == ("fused", IMPL_RECIPE), name
    for name in ("fp8_deepseek", "fp8_deepseek_fwd", "fp8_deepseek_bwd"):
        assert auto(name) == ("compiled", IMPL_SEAM), name
    assert auto("quartet_fwd") == auto("quest_fwd") == ("triton", IMPL_SEAM)
