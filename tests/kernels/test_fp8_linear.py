"""The FP8 tensor-core layer of the ``fp8`` scheme against the CPU oracle (quartet.quant)."""
from __future__ import annotations

import pytest
import torch

from quartet.kernels import fp8_linear as F8
from quartet.kernels.backends import make_backend
from quartet.kernels.linear import IMPL_FP8, fused_covers, fused_quant_linear
from quartet.quant import build_scheme
from quartet.quant.config import PrecisionConfig
from quartet.quant.formats import fp8_quantize

DEV = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = build_scheme(PrecisionConfig(name="fp8", forward="fp8", backward="fp8"))


def _edges(fmax: float) -> torch.Tensor:
    """Values at the format's edges once scaled by amax/fmax = 1: just below powers of two, subnormals,
    ties between neighbours, zeros of both signs and the largest value itself."""
    below = [2.0**k * (1 - 2.0**-12) for k in range(-8, 9)]
    sub = [2.0**-7, 2.0**-9, 3 * 2.0**-10, 2.0**-12, 2.0**-20]  # e4m3 subnormals start below 2^-6
    ties = [1.0625, 1.1875, 3.25 + 0.125, 17.0, 2.0**-9 * 1.5]  # halfway between e4m3 neighbours
    vals = torch.tensor([fmax, -fmax, 0.0, -0.0, *below, *sub, *ties, *[-v for v in ties]], dtype=torch.float32)
    return vals


@pytest.mark.parametrize("fmt,dtype", [("e4m3", F8.E4M3), ("e5m2", F8.E5M2)])
def test_codes_equal_the_oracle_bitwise(fmt, dtype):
    g = torch.Generator().manual_seed(1)
    cases = [torch.randn(64, 96, generator=g) * 3.0,
             torch.randn(33, 16, generator=g) * 1e-3 + torch.randn(33, 16, generator=g).sign() * 1e-6,
             torch.zeros(16, 32),
             _edges(448.0 if fmt == "e4m3" else 57344.0).reshape(1, -1)]
    for x in cases:
        codes, scale = F8.fp8_tensor_quantize(x.to(DEV), dtype)
        ref, ref_scale = fp8_quantize(x, fmt, "tensor")
        assert torch.equal(scale.cpu(), ref_scale), fmt
        assert torch.equal((codes.float() * scale).cpu(), ref), fmt  # bitwise: same codes, same scale


def test_non_finite_input_propagates_instead_of_hiding():
    x = torch.randn(16, 32)
    x[3, 5] = float("inf")
    codes, scale = F8.fp8_tensor_quantize(x.to(DEV), F8.E4M3)
    assert not torch.isfinite(codes.float() * scale).all()


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("fmt,dtype", [("e4m3", F8.E4M3), ("e5m2", F8.E5M2)])
def test_nonfinite_zero_subnormal_and_huge_tensors_equal_the_oracle_bitwise(fmt, dtype, dev, edge_tensors):
    """The unit of a tensor scale is the tensor: one NaN/±Inf makes the scale and every value NaN, as the oracle; an
    all-zero tensor keeps scale 1 and zeros; subnormal tensors stay finite (a scale that underflows to 0 flushes to
    ±0); huge values saturate at ±fmax·s. Codes × scale and the scale bitwise the oracle's on ``dev``."""
    for name, x in edge_tensors((64, 96), 2).items():
        codes, scale = F8.fp8_tensor_quantize(x.to(dev), dtype)
        ref, ref_scale = fp8_quantize(x, fmt, "tensor")
        assert torch.isnan(ref).all() if name in ("nan", "inf", "-inf") else torch.isfinite(ref).all(), name
        torch.testing.assert_close(scale.cpu(), ref_scale, rtol=0, atol=0, equal_nan=True, msg=name)
        torch.testing.assert_close((codes.float() * scale).cpu(), ref, rtol=0, atol=0, equal_nan=True, msg=name)


@pytest.mark.parametrize("T", [64, 50])  # 50: tokens padded to a multiple of 16 inside
def test_layer_matches_the_oracle_layer(T, layer_checks):
    # same FP8 operands on both sides; only the GEMM's accumulation differs (Hopper's FP8 tensor cores
    # accumulate with fewer bits than float32: ~8e-5 measured on an H100; float32 on the CPU)
    layer_checks.assert_matches_oracle(FP8, F8.FP8QuantLinear, T, 64, 96, seed=T, tol=2e-4 if DEV == "cuda" else 1e-5)


def test_fused_hook_installs_the_fp8_layer_only_where_it_applies():
    hopper = make_backend("hopper_fp8")
    w = torch.nn.Parameter(torch.randn(64, 32))
    assert fused_covers(FP8, "hopper_fp8") and not fused_covers(FP8, "triton")
    layer = fused_quant_linear(w, FP8, hopper, name="l", layer_index=0, seed=0)
    assert isinstance(layer, F8.FP8QuantLinear) and layer.weight is w
    assert fused_quant_linear(torch.nn.Parameter(torch.randn(40, 24)), FP8, hopper) is None  # not multiples of 16
    rows = build_scheme(PrecisionConfig(name="fp8", forward="fp8", backward="fp8", fp8_scaling="row"))
    assert not fused_covers(rows, "hopper_fp8")
    assert hopper.unsupported_reason(rows.fwd.a, torch.device("cpu")) is not None
    assert IMPL_FP8.startswith("FP8QuantLinear")


def test_statistics_steps_take_the_seam_path_with_the_same_quantizers(layer_checks):
    layer_checks.assert_stats_steps_take_the_seam_path(FP8, F8.FP8QuantLinear, 32, 64, 48, tol=1e-5 if DEV == "cpu" else 2e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_apply_precision_runs_fp8_on_tensor_cores_on_hopper(layer_checks):
    layer_checks.assert_model_trains_on_hopper("fp8", IMPL_FP8)
