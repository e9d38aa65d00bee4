"""The block-wise FP8 tensor-core layer of ``fp8_deepseek`` against the CPU oracle (quartet.quant).

On a GPU the GEMMs run on ``F.scaled_mm``'s BlockWise1x128 / BlockWise128x128 recipes (the lead runs this file on
an H100: ``.venv/bin/python -m pytest -q -n 0 tests/kernels/test_fp8_block_linear.py``). Without one, PyTorch's CPU
build has no block-wise ``scaled_mm``: the layer's calls go to an emulator that first hands the very same tensors
(shapes and strides) to PyTorch's own meta implementation of ``F.scaled_mm`` — which checks the scale layouts
cuBLAS needs — and then multiplies the dequantized operands in float32.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quartet.kernels import fp8_block_linear as B
from quartet.kernels.backends import make_backend
from quartet.kernels.linear import IMPL_FP8_BLOCK, fused_covers, fused_quant_linear
from quartet.quant import build_scheme
from quartet.quant.blockwise import fp8_blockwise_quantize
from quartet.quant.config import PrecisionConfig
from quartet.quant.quantizers import QuantizerSpec

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DS = build_scheme(PrecisionConfig(name="fp8_deepseek"))
_REAL_SCALED_MM = F.scaled_mm


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _emulated_scaled_mm(a, b, scale_a, recipe_a, scale_b, recipe_b, output_dtype=None, **kw):
    """``F.scaled_mm`` for the two block-wise recipe pairs: PyTorch's meta checks, then a float32 product."""
    out = _REAL_SCALED_MM(_meta(a), _meta(b), _meta(scale_a), recipe_a, _meta(scale_b), recipe_b,
                          output_dtype=output_dtype)
    M, K = a.shape
    N = b.shape[1]
    kb = -(-K // 128)
    sa = scale_a.repeat_interleave(128, 1)[:, :K]
    if recipe_b == F.ScalingType.BlockWise128x128:
        sb = scale_b[:kb].repeat_interleave(128, 0).repeat_interleave(128, 1)[:K, :N]
    else:  # BlockWise1x128: (N, K/128)
        sb = scale_b.t().repeat_interleave(128, 0)[:K]
    y = (a.float() * sa) @ (b.float() * sb)
    assert out.shape == y.shape
    return y.to(output_dtype or torch.float32)


@pytest.fixture(autouse=True)
def _scaled_mm_on_cpu(monkeypatch):
    if DEV == "cpu":
        monkeypatch.setattr(F, "scaled_mm", _emulated_scaled_mm)


def _cases():
    g = torch.Generator().manual_seed(1)
    edges = torch.tensor([448.0, -448.0, 0.0, -0.0, 2.0**-9, 3 * 2.0**-10, 1.0625, 17.0, 2.0**-20] * 32)
    return [torch.randn(256, 384, generator=g) * torch.exp(2 * torch.randn(256, 384, generator=g)),
            torch.randn(200, 300, generator=g) * 1e-3,
            torch.zeros(128, 256),
            edges.reshape(2, -1)]


@pytest.mark.parametrize("rows", [1, 128])
def test_codes_and_scales_equal_the_oracle_bitwise(rows):
    for x in _cases():
        codes, scale = B.quantize_fp8_blocks(x.to(DEV), rows)
        ref, ref_scale = fp8_blockwise_quantize(x, rows, 128)
        assert codes.dtype == torch.float8_e4m3fn
        assert torch.equal(scale.cpu(), ref_scale)
        assert torch.equal(B.dequantize_fp8_blocks(codes, scale, rows).cpu(), ref)


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("rows", [1, 128])
def test_nonfinite_zero_subnormal_and_huge_tiles_equal_the_oracle_bitwise(rows, dev, edge_tensors):
    """The unit is the tile: a tile holding NaN/±Inf gets a NaN scale and NaN values (its codes NaN too), every other
    tile as the oracle; all-zero tiles keep scale 1 and zeros, subnormal tiles stay finite, huge ones saturate.
    Dequantized values and scales bitwise the oracle's on ``dev``."""
    for name, x in edge_tensors((256, 384), 3).items():
        codes, scale = B.quantize_fp8_blocks(x.to(dev), rows)
        ref, ref_scale = fp8_blockwise_quantize(x, rows, 128)
        if name in ("nan", "inf", "-inf"):  # element (3, 5): the tile of rows 3 (or 0..127), columns 0..127
            tile = torch.zeros_like(ref, dtype=torch.bool)
            tile[(3 if rows == 1 else 0):(4 if rows == 1 else 128), :128] = True
            assert torch.equal(torch.isnan(ref), tile) and int(torch.isnan(ref_scale).sum()) == 1, name
        else:
            assert torch.isfinite(ref).all(), name
        torch.testing.assert_close(scale.cpu(), ref_scale, rtol=0, atol=0, equal_nan=True, msg=name)
        torch.testing.assert_close(B.dequantize_fp8_blocks(codes, scale, rows).cpu(), ref, rtol=0, atol=0,
                                   equal_nan=True, msg=name)


@pytest.mark.parametrize("T", [256, 200])  # 200: tokens zero-padded to a multiple of 128 inside
def test_layer_matches_the_oracle_layer(T, layer_checks):
    # the same FP8 operands on both sides (bitwise, test above); only the GEMM's float32 accumulation order
    # differs (on the GPU: block-wise scaled tensor-core GEMMs)
    layer_checks.assert_matches_oracle(DS, B.FP8BlockQuantLinear, T, 256, 384, seed=T,
                                       tol=2e-4 if DEV == "cuda" else 1e-6)


@pytest.mark.parametrize("variant", ["fp8_deepseek_fwd", "fp8_deepseek_bwd"])
def test_half_variants_match_the_oracle_layer(variant, layer_checks):
    """The forward-only / backward-only variant on the same layer: its quantized half as the recipe's (FP8 GEMMs),
    its unquantized half on BF16 operands -- the only difference from the oracle's float32 GEMMs is that rounding
    (and, where a block-scaled operand meets an unquantized one, that operand's rounding to BF16): ≤ 2^-9 per
    operand, a few 1e-3 of the products' norms."""
    scheme = build_scheme(PrecisionConfig(name=variant))
    assert B.part(scheme) == ("forward" if variant.endswith("_fwd") else "backward")
    layer_checks.assert_matches_oracle(scheme, B.FP8BlockQuantLinear, 192, 256, 384, seed=5, tol=4e-3)


def test_fused_hook_installs_the_block_layer_only_where_it_applies(monkeypatch):
    hopper = make_backend("hopper_fp8")
    w = torch.nn.Parameter(torch.randn(384, 256))
    assert fused_covers(DS, "hopper_fp8") and not fused_covers(DS, "triton")
    layer = fused_quant_linear(w, DS, hopper, name="l", layer_index=0, seed=0)
    assert isinstance(layer, B.FP8BlockQuantLinear) and layer.weight is w
    assert fused_quant_linear(torch.nn.Parameter(torch.randn(96, 64)), DS, hopper) is None  # not multiples of 128
    assert not B.covers(build_scheme(PrecisionConfig(name="fp8")))
    monkeypatch.setattr(hopper, "supports_device", lambda device: True)
    for spec in DS.specs():
        assert hopper.unsupported_reason(spec, torch.device("cuda")) is None
    e5 = QuantizerSpec("fp8", fmt="e5m2", scaling="block", group=128)
    assert "DeepSeek" in hopper.unsupported_reason(e5, torch.device("cuda"))


def test_statistics_steps_take_the_seam_path_with_the_same_quantizers(layer_checks):
    layer_checks.assert_stats_steps_take_the_seam_path(DS, B.FP8BlockQuantLinear, 128, 256, 64,
                                                       tol=2e-4 if DEV == "cuda" else 1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_apply_precision_runs_fp8_deepseek_on_tensor_cores_on_hopper(layer_checks):
    layer_checks.assert_model_trains_on_hopper("fp8_deepseek", IMPL_FP8_BLOCK)
