"""The reference library on a CUDA device gives the CPU results (skipped without a GPU).

Also runnable without pytest on a bare GPU box: ``python tests/quant/test_gpu.py``.
"""
from __future__ import annotations

import torch

try:
    import pytest

    pytestmark = pytest.mark.gpu
except ImportError:  # pragma: no cover - bare GPU box
    pytest = None


def _cpu_gpu(fn, *args):
    cpu = fn(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
    gpu = fn(*[a.cuda() if isinstance(a, torch.Tensor) else a for a in args])
    return cpu, gpu


def test_deterministic_quantizers_match_cpu():
    from quartet.quant import formats as F
    from quartet.quant import mx, quartet2
    from quartet.quant.hadamard import block_hadamard

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 512, generator=g) * 3
    quantizers = {
        "rtn_e2m1": lambda t: F.round_to_e2m1(t), "ocp": lambda t: mx.rtn_absmax_mxfp4(t),
        "absmax": lambda t: mx.absmax_mxfp4(t), "quest": lambda t: mx.quest_mxfp4(t)[0],
        "nvfp4": lambda t: mx.nvfp4_quantize(t)[0], "fp8": lambda t: F.fp8_quantize(t, "e4m3", "row")[0],
        "quest_e8m0": lambda t: F.e8m0_decode(F.e8m0_encode(mx.quest_scales(t))),
        "quest_after_hadamard": lambda t: mx.quest_mxfp4(block_hadamard(t, 32))[0],
        "nvfp4_4o6": lambda t: quartet2.nvfp4_four_over_six(t)[0], "mxfp8": lambda t: mx.mxfp8_quantize(t),
        "ms_eden_mean": lambda t: quartet2.ms_eden_quantize(t, stochastic=False)[0],
    }
    for name, fn in quantizers.items():
        c, d = _cpu_gpu(fn, x)
        assert d.is_cuda
        # sigma / Hadamard use matmuls whose float rounding may differ across devices; on the
        # quantization grid almost every output is then still identical
        frac = float((c != d.cpu()).float().mean())
        if "quest" in name or name == "ms_eden_mean":  # (the EDEN correction is a float64 sum: order may differ)
            assert frac < 1e-3, (name, frac)
        else:  # no matmul inside: bitwise the CPU result
            assert frac == 0.0, (name, frac)
    c, d = _cpu_gpu(lambda t: block_hadamard(t, 128), x)
    assert torch.allclose(c, d.cpu(), atol=1e-5)


def test_quant_linear_runs_on_cuda_with_seeded_sr():
    from torch import nn

    from quartet.model import BlockLinear
    from quartet.quant import apply_precision, collect_stats, set_step
    from quartet.quant.config import PrecisionConfig

    for name in ("quartet", "quartet_sr", "fp8", "ms_fp4", "nvfp4", "luq_int4", "quartet2", "mxfp8"):
        grads = []
        for _ in range(2):
            torch.manual_seed(0)
            m = nn.Sequential(BlockLinear(256, 512), BlockLinear(512, 256)).cuda()
            plan = apply_precision(m, PrecisionConfig(name=name, backend="reference", stats_every=1), seed=5)
            assert plan.backend == "reference"
            set_step(m, 1)
            x = torch.randn(4, 64, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = m(x)
            y.float().square().mean().backward()
            assert torch.isfinite(m[0].weight.grad).all()
            assert collect_stats(m)
            grads.append(m[0].weight.grad.clone())
        assert torch.equal(grads[0], grads[1]), name  # reproducible on the GPU too


def test_nonfinite_zero_subnormal_and_huge_units_match_cpu_for_every_kind():
    """Issue #30's edge cases (tests/quant/test_nonfinite.py) for every quantizer kind on the GPU, where the reference
    path is what runs nvfp4, ms_fp4, luq, int4, ... : the same NaN elements as on the CPU (whole scale units) and
    every other value bitwise the CPU's. QuEST's σ is a matmul (a few elements may differ, as above); the kinds that
    draw random numbers draw other ones from a CUDA generator, so only their NaN pattern and finiteness are compared."""
    from test_nonfinite import KINDS, edge_inputs

    from quartet.quant.quantizers import _RANDOM_KINDS, reference_quantize

    cases = edge_inputs()
    for kind, (spec, _) in KINDS.items():
        random = spec.stochastic or spec.kind in _RANDOM_KINDS
        for name, x in cases.items():
            c = reference_quantize(x, spec, seed=1).dequantized()
            d = reference_quantize(x.cuda(), spec, seed=1).dequantized()
            assert d.is_cuda
            d = d.cpu()
            assert torch.equal(torch.isnan(c), torch.isnan(d)), (kind, name)
            assert torch.equal(torch.isinf(c), torch.isinf(d)), (kind, name)
            if random:
                continue
            ok = ~torch.isnan(c)
            frac = float((c[ok] != d[ok]).float().mean()) if ok.any() else 0.0
            assert frac < 1e-3 if spec.kind == "quest" else frac == 0.0, (kind, name, frac)


if __name__ == "__main__":  # pragma: no cover - bare GPU box without pytest
    import sys

    sys.path.insert(0, ".")
    print(torch.__version__, torch.cuda.get_device_name(0))
    test_deterministic_quantizers_match_cpu()
    test_quant_linear_runs_on_cuda_with_seeded_sr()
    sys.path.insert(0, "tests/quant")
    test_nonfinite_zero_subnormal_and_huge_units_match_cpu_for_every_kind()
    print("gpu checks passed")
