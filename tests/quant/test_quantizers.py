"""Quantizers: scale formulas, SR unbiasedness and reproducibility, MS-FP4 DGE / OCC, LUQ, NVFP4."""
from __future__ import annotations

import math

import pytest
import torch

from quartet.quant import mx
from quartet.quant.formats import E2M1_GRID, e8m0_decode, pack_e2m1, round_to_e2m1, unpack_e2m1
from quartet.quant.quantizers import (
    QuantizerSpec,
    dge_derivative,
    luq_quantize,
    ms_fp4_quantize,
    occ_clamp,
    reference_quantize,
)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _on_grid(y):
    return torch.isin(y.abs(), E2M1_GRID).all()


def test_quest_scale_matches_formula_and_mask():
    x = torch.randn(16, 128, generator=_gen()) * torch.logspace(-3, 2, 16).unsqueeze(1)
    xq, mask = mx.quest_mxfp4(x)
    g = x.reshape(16, 4, 32)
    sigma = torch.sqrt((g**2).mean(-1) - g.mean(-1) ** 2)
    want = torch.exp2(torch.floor(torch.log2(0.48707976 * sigma + 1e-8)))
    s = mx.quest_scales(x)
    assert torch.allclose(s, want, rtol=1e-6)
    assert torch.equal(torch.log2(s), torch.log2(s).round())  # E8M0-representable
    y = g / s.unsqueeze(-1)
    assert _on_grid((xq.reshape(16, 4, 32) / s.unsqueeze(-1)))
    assert torch.equal(mask.reshape(16, 4, 32), y.abs() < 6)
    assert torch.equal(xq.reshape(16, 4, 32), round_to_e2m1(y) * s.unsqueeze(-1))
    assert 0 < (~mask).float().mean() < 0.2  # some clipping happens with the floored scale
    nf = mx.quest_scales(x, floor=False)
    assert torch.allclose(nf, 0.48707976 * sigma + 1e-8, rtol=1e-6)


def test_absmax_scales_match_formulas():
    x = torch.randn(8, 256, generator=_gen(1)) * 3
    g = x.reshape(8, 8, 32)
    amax = g.abs().amax(-1, keepdim=True)
    p2 = torch.exp2(torch.floor(torch.log2(amax)) - 2)
    xq = mx.absmax_mxfp4(x).reshape(8, 8, 32)
    q = xq / (p2 * 4 / 3)
    assert (q - q.round(decimals=0)).abs().max() < 1e-5 or _on_grid(q.round(decimals=4))
    assert _on_grid(torch.round(q * 2) / 2)
    # x3/4 rule: max |x/s| in [3, 6): never clipped, the largest element keeps its magnitude
    y = g / (p2 * 4 / 3)
    assert (y.abs().amax(-1) >= 3).all() and (y.abs().amax(-1) < 6).all()
    assert torch.equal(xq, round_to_e2m1(g / p2 * 0.75) * p2 * (4 / 3))
    # OCP rule: s = 2^(floor(log2 amax) - 2), max |x/s| in [4, 8) -> saturates at 6
    ocp = mx.rtn_absmax_mxfp4(x).reshape(8, 8, 32)
    assert torch.equal(ocp, round_to_e2m1(g / p2) * p2)
    assert torch.equal(mx.absmax_scales(x), p2.squeeze(-1))


def test_mx_codes_round_trip():
    x = torch.randn(4, 64, generator=_gen(2))
    xq = mx.absmax_mxfp4(x)
    codes, e8 = mx.mx_codes(xq, mx.absmax_scales(x), factor=4 / 3)
    from quartet.quant.formats import e2m1_decode

    back = e2m1_decode(unpack_e2m1(pack_e2m1(codes))).reshape(4, 2, 32) * e8m0_decode(e8).unsqueeze(-1) * (4 / 3)
    assert torch.allclose(back.reshape(4, 64), xq, rtol=1e-6)
    xq, _ = mx.quest_mxfp4(x)
    codes, e8 = mx.mx_codes(xq, mx.quest_scales(x))
    back = e2m1_decode(codes).reshape(4, 2, 32) * e8m0_decode(e8).unsqueeze(-1)
    assert torch.equal(back.reshape(4, 64), xq)


def test_sr_is_unbiased_within_tight_bound():
    # values spread over every grid interval; 4000 draws each
    y = torch.linspace(-5.9, 5.9, 97)
    n = 4000
    draws = round_to_e2m1(y.expand(n, -1), stochastic=True, generator=_gen(5))
    mean = draws.mean(0)
    # std of one draw <= half the local grid step (<= 1); 6-sigma bound on the mean
    lo = E2M1_GRID[(torch.bucketize(y.abs(), E2M1_GRID, right=True) - 1).clamp(0, 6)]
    hi = E2M1_GRID[torch.bucketize(y.abs(), E2M1_GRID, right=True).clamp(1, 7)]
    sd = torch.sqrt((y.abs() - lo) * (hi - y.abs()))
    assert ((mean - y).abs() <= 6 * sd / math.sqrt(n) + 1e-6).all()
    assert _on_grid(draws)
    # the absmax SR quantizer as a whole is unbiased too
    x = torch.randn(2, 64, generator=_gen(6))
    acc = torch.zeros_like(x)
    for i in range(2000):
        acc += mx.absmax_mxfp4(x, stochastic=True, generator=_gen(100 + i))
    step = mx.absmax_scales(x).repeat_interleave(32, -1) * (4 / 3) * 2  # coarsest grid step
    assert ((acc / 2000 - x).abs() <= 6 * step / 2 / math.sqrt(2000)).all()


def test_sr_reproducible_for_fixed_seed():
    x = torch.randn(8, 64, generator=_gen(7))
    a = mx.absmax_mxfp4(x, stochastic=True, generator=_gen(11))
    b = mx.absmax_mxfp4(x, stochastic=True, generator=_gen(11))
    c = mx.absmax_mxfp4(x, stochastic=True, generator=_gen(12))
    assert torch.equal(a, b) and not torch.equal(a, c)
    spec = QuantizerSpec("absmax", stochastic=True)
    assert torch.equal(reference_quantize(x, spec, seed=3).values, reference_quantize(x, spec, seed=3).values)
    assert not torch.equal(reference_quantize(x, spec, seed=3).values, reference_quantize(x, spec, seed=4).values)


def test_dge_derivative_formula_and_cap():
    k, cap = 5.0, 3.0
    # points inside each of the three interval widths, away from the midpoints
    x = torch.tensor([0.1, 0.3, -0.4, 1.1, 2.2, 3.9, -2.6, 4.5, 5.5, -5.0])
    delta = torch.tensor([0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0])
    left = torch.floor(x / delta) * delta
    want = (1 / k) * torch.abs(2 * (x - left) / delta - 1) ** (1 / k - 1)
    got = dge_derivative(x, k, cap)
    assert torch.allclose(got, want.clamp(max=cap), rtol=1e-5)
    # interval edges: exactly 1/k; interval midpoints: capped
    assert torch.allclose(dge_derivative(torch.tensor([0.0, 0.5, 2.0, 4.0]), k, cap), torch.full((4,), 0.2))
    assert torch.equal(dge_derivative(torch.tensor([0.25, 2.5, 5.0, -0.75]), k, cap), torch.full((4,), cap))
    assert float(dge_derivative(torch.linspace(-6, 6, 10001), k, cap).max()) == cap
    # near the midpoint the uncapped value exceeds the cap
    assert (1 / k) * (2 * 0.001 / 0.5) ** (1 / k - 1) > cap


def test_occ_clamps_stated_fraction_and_compensation_is_exact():
    g = _gen(8)
    x = torch.randn(64, 1024, generator=g)
    x[:, :8] *= 30  # outlier channels
    xc, res = occ_clamp(x, 0.99)
    frac = float((res != 0).float().mean())
    assert 0.015 <= frac <= 0.025  # both tails at the 0.99 quantile: ~2% of entries
    assert torch.allclose(xc + res, x, atol=1e-5)
    w = torch.randn(256, 1024, generator=g) * 0.05
    q = ms_fp4_quantize(x, clip_quantile=0.99)
    wq = ms_fp4_quantize(w)
    assert torch.equal(q.residual, res)
    exact = x @ wq.values.t()
    compensated = q.values @ wq.values.t() + q.residual @ wq.values.t()
    uncompensated = q.values @ wq.values.t()
    fp4_only = ms_fp4_quantize(xc).values @ wq.values.t()
    # compensated = clamped FP4 product + exact outlier part: its error is the FP4 error of the bulk
    assert torch.allclose(compensated - q.residual @ wq.values.t(), fp4_only, atol=1e-4)
    err = (compensated - exact).norm() / exact.norm()
    assert err < 0.12
    assert err < 0.5 * (uncompensated - exact).norm() / exact.norm()
    # without clamping, outliers blow up the per-token scale: much larger error
    plain = ms_fp4_quantize(x).values @ wq.values.t()
    assert err < (plain - exact).norm() / exact.norm()


def test_ms_fp4_scales_per_row():
    w = torch.randn(16, 64, generator=_gen(9)) * torch.arange(1, 17).unsqueeze(1)
    q = ms_fp4_quantize(w, dge_k=5.0)
    s = w.abs().amax(1, keepdim=True) * (1.0 / 6)
    assert torch.allclose(q.data["scale"], s)
    assert torch.equal(q.values, round_to_e2m1(w / s) * s)
    assert torch.allclose(q.grad_factor, dge_derivative(w / s))


def test_luq_unbiased_and_on_log_grid():
    x = torch.randn(4096, generator=_gen(10)) * torch.logspace(-4, 0, 4096)
    n = 400
    acc = torch.zeros_like(x)
    for i in range(n):
        q = luq_quantize(x, _gen(1000 + i))
        acc += q
    amax = x.abs().max()
    levels = amax * torch.exp2(-torch.arange(7.0))
    nz = q[q != 0].abs()
    assert torch.isclose(nz.unsqueeze(1), levels.unsqueeze(0), rtol=1e-5).any(1).all()
    # relative bias small against the per-draw spread (alpha for underflow, lo for log SR)
    err = (acc / n - x).abs()
    bound = 6 * torch.maximum(x.abs(), levels[-1]) / math.sqrt(n)
    assert (err <= bound).all()


def test_nvfp4_groups_and_scales():
    x = torch.randn(8, 64, generator=_gen(12))
    xq, block, ts = mx.nvfp4_quantize(x)
    assert block.shape == (8, 4)
    assert torch.allclose(ts, x.abs().max() / (6 * 448))  # up to the 1/c rounding
    from quartet.quant.formats import round_to_fp8

    assert torch.equal(block, round_to_fp8(block, "e4m3"))  # block scales are E4M3 values
    y = xq.reshape(8, 4, 16) / (block * ts).unsqueeze(-1)
    assert _on_grid(torch.round(y * 2) / 2) and (y - torch.round(y * 2) / 2).abs().max() < 1e-4
    assert (xq - x).norm() / x.norm() < 0.15


@pytest.mark.parametrize("kind", ["quest", "absmax", "ocp", "ms_fp4", "fp8", "nvfp4", "int4", "luq"])
def test_every_quantizer_kind_runs_and_is_close(kind):
    x = torch.randn(32, 128, generator=_gen(13))
    q = reference_quantize(x, QuantizerSpec(kind, group=16 if kind == "nvfp4" else 32), seed=1)
    assert q.values.shape == x.shape and torch.isfinite(q.values).all()
    assert (q.dequantized() - x).norm() / x.norm() < (0.5 if kind == "luq" else 0.25)
    with pytest.raises(ValueError):
        QuantizerSpec("fp3")
