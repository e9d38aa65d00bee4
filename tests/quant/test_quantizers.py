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


@pytest.mark.parametrize("kind", ["quest", "absmax", "ocp", "ms_fp4", "fp8", "nvfp4", "int4", "luq", "mxfp8"])
def test_every_quantizer_kind_runs_and_is_close(kind):
    x = torch.randn(32, 128, generator=_gen(13))
    q = reference_quantize(x, QuantizerSpec(kind, group=16 if kind == "nvfp4" else 32), seed=1)
    assert q.values.shape == x.shape and torch.isfinite(q.values).all()
    assert (q.dequantized() - x).norm() / x.norm() < (0.5 if kind == "luq" else 0.25)
    with pytest.raises(ValueError):
        QuantizerSpec("fp3")


# --- range edges (issue #15) -------------------------------------------------------------------------------------

def _decode_mx(codes, e8, factor=1.0):
    from quartet.quant.formats import e2m1_decode

    return (e2m1_decode(codes).reshape(*e8.shape, -1) * e8m0_decode(e8).unsqueeze(-1) * factor).reshape(codes.shape)


def test_absmax_scales_stay_in_e8m0_range_and_codes_decode_to_the_values():
    """amax < 2^-124: the exponent floor(log2 amax) − 2 is clamped to E8M0's -127 AFTER the −2 (it was clamped
    before, giving 2^-128 / 2^-129, which E8M0 stores as 2^-127: the stored form decoded to 2x / 4x x̂)."""
    amaxes = [1.5 * 2.0 ** -126, 2.0 ** -125, 1.5 * 2.0 ** -127, 2.0 ** -140, 1.5 * 2.0 ** -124, 2.0 ** -123]
    want_exp = [-127, -127, -127, -127, -126, -125]
    x = torch.zeros(len(amaxes), 32)
    for i, a in enumerate(amaxes):
        x[i, 0] = a
        x[i, 1] = -a / 3  # a second, smaller value of each group
    s = mx.absmax_scales(x)
    assert s.squeeze(-1).tolist() == [2.0 ** e for e in want_exp]
    for xq, factor in ((mx.absmax_mxfp4(x), 4 / 3), (mx.rtn_absmax_mxfp4(x), 1.0)):
        codes, e8 = mx.mx_codes(xq, s, factor=factor)
        assert e8.squeeze(-1).tolist() == [e + 127 for e in want_exp]
        assert torch.equal(_decode_mx(codes, e8, factor), xq)  # stored form == dequantized values
    # the OCP rule on 1.5·2^-126 / 2^-127 = 3: code 5 (value 3), the -a/3 element 1 -> code 10 (-1.0)
    codes, e8 = mx.mx_codes(mx.rtn_absmax_mxfp4(x), s)
    assert codes[0, :2].tolist() == [5, 10] and e8[0].item() == 0
    assert mx.rtn_absmax_mxfp4(x)[0, 0].item() == 1.5 * 2.0 ** -126
    # absmax x3/4 never clips, also at the clamped scale: |y| = 0.75·a/2^-127 < 6
    y = x / s.repeat_interleave(32, -1) * 0.75
    assert y.abs().max() < 6


def test_nvfp4_block_scale_underflow_keeps_the_block():
    """A 16-group ~2^19 below the tensor amax: its E4M3 block scale underflows (amax_g/6/S < 2^-10); it is raised
    to E4M3's smallest subnormal 2^-9, not to 1.0 (which rounded the whole group to 0)."""
    from quartet.quant.formats import e2m1_encode

    x = torch.zeros(48)
    x[0] = 1e6
    x[16:32] = 2.0
    x[20] = -2.0
    # x[32:48] stays zero: an all-zero group keeps block scale 1.0 and values 0
    xq, block, ts = mx.nvfp4_quantize(x)
    assert ts.item() == torch.tensor(1e6) * torch.tensor(1.0 / (6 * 448)).item()
    assert block.tolist() == [448.0, 2.0 ** -9, 1.0] and mx.E4M3_MIN_SUBNORMAL == 2.0 ** -9
    # E4M3 codes of the block scales: 448 = 0x7E, 2^-9 = 0x01 (smallest subnormal), 1.0 = 0x38
    assert block.to(torch.float8_e4m3fn).view(torch.uint8).tolist() == [0x7E, 0x01, 0x38]
    s1 = 2.0 ** -9 * ts.item()
    assert 2.5 < 2.0 / s1 < 3.5  # 2/s ≈ 2.75 rounds to 3
    assert torch.equal(xq[16:32], torch.where(x[16:32] > 0, 3.0, -3.0) * (block[1] * ts))
    assert xq[0] == 6.0 * (block[0] * ts) and (xq[32:] == 0).all()
    q = xq.reshape(3, 16) / (block * ts).unsqueeze(-1)
    assert e2m1_encode(q[1]).tolist() == [5, 5, 5, 5, 13] + [5] * 11
    # the edge: the smallest group that still gets a nonzero E4M3 scale on its own (amax_g/6/S just above 2^-10)
    # keeps the same block scale 2^-9; a group 2x smaller is raised to it too and still quantizes to nonzero
    for a in (2.0 ** -10 * 6 * ts.item() * 1.01, 2.0 ** -11 * 6 * ts.item()):
        z = x.clone()
        z[16:32] = a
        zq, zb, _ = mx.nvfp4_quantize(z)
        assert zb[1].item() == 2.0 ** -9 and (zq[16:32] != 0).all()


def _quest_scales_f64(x, group=32):
    g = x.double().reshape(*x.shape[:-1], -1, group)
    raw = mx.QUEST_SCALE_FACTOR * g.std(-1, unbiased=False) + 1e-8
    return torch.exp2(torch.floor(torch.log2(raw))).float()


def test_quest_large_finite_groups_do_not_overflow():
    """Squares above ~3e38 overflowed float32 (σ = inf → garbage scale, the group quantized to 0 or ±6·s). Groups
    up to the float32 limit now get the exact σ: equal to float64, and scaling the input by 2^66 scales x̂ by 2^66."""
    g = _gen(21)
    x = torch.randn(6, 64, generator=g)
    x[0] *= 1e20
    x[1] *= 3e37
    x[2, :32] = 2e38  # ±2e38 (near FLT_MAX; 3e38 would round to 4·2^126 = 2^128, past float32): σ = 2e38
    x[2, 1:32:2] = -2e38
    x[3] *= 2.0 ** 60
    s = mx.quest_scales(x)
    assert torch.isfinite(s).all()
    assert torch.equal(s, _quest_scales_f64(x))
    xq, mask = mx.quest_mxfp4(x)
    assert torch.isfinite(xq).all()
    y = x.reshape(6, 2, 32) / s.unsqueeze(-1)
    assert torch.equal(xq, (round_to_e2m1(y) * s.unsqueeze(-1)).reshape(6, 64))
    assert torch.equal(mask, (y.abs() < 6).reshape(6, 64)) and mask.float().mean() > 0.9
    base = torch.randn(4, 64, generator=g) * 1024  # σ ≫ 1e-8: the +1e-8 rounds away in both
    big = base * 2.0 ** 66
    assert torch.equal(mx.quest_mxfp4(big)[0], mx.quest_mxfp4(base)[0] * 2.0 ** 66)
    assert torch.equal(mx.quest_mxfp4(big)[1], mx.quest_mxfp4(base)[1])
    codes, e8 = mx.mx_codes(xq, s)
    assert torch.equal(_decode_mx(codes, e8), xq)


def test_quest_nonfinite_groups_propagate_as_nan():
    """A group holding Inf/NaN gets a NaN scale (E8M0 code 255): all its x̂ are NaN and its mask False, so the
    trainer's NaN check sees it; the other groups are quantized as if alone."""
    g = _gen(22)
    x = torch.randn(3, 96, generator=g)
    x[0, 5] = float("inf")
    x[1, 40] = float("nan")
    x[2, 70] = -float("inf")
    xq, mask = mx.quest_mxfp4(x)
    bad = torch.zeros(3, 3, dtype=torch.bool)
    bad[0, 0] = bad[1, 1] = bad[2, 2] = True
    badx = bad.repeat_interleave(32, -1)
    assert torch.equal(torch.isnan(xq), badx) and not mask[badx].any()
    s = mx.quest_scales(x)
    assert torch.equal(torch.isnan(s), bad)
    clean = torch.where(badx, 0.0, x)
    cq, cm = mx.quest_mxfp4(clean)
    assert torch.equal(xq[~badx], cq[~badx]) and torch.equal(mask[~badx], cm[~badx])
    codes, e8 = mx.mx_codes(xq, s)
    assert torch.equal(e8 == 255, bad) and (codes[badx] == 0).all()
    assert torch.equal(torch.isnan(_decode_mx(codes, e8)), badx)
    assert torch.isnan(mx.quest_scales(x, floor=False)[bad]).all()


def test_quest_normal_inputs_unchanged():
    """For finite groups whose squares fit float32 the scale is the one-pass formula, bit for bit."""
    x = torch.randn(64, 256, generator=_gen(23)) * torch.exp(torch.randn(64, 1, generator=_gen(24)) * 4)
    g = x.reshape(64, 8, 32)
    ones = torch.ones(32, 1)
    mean = (g @ ones).squeeze(-1) / 32
    msq = ((g * g) @ ones).squeeze(-1) / 32
    raw = mx.QUEST_SCALE_FACTOR * (msq - mean * mean).clamp_(min=0).sqrt_() + 1e-8
    assert torch.equal(mx.quest_scales(x, floor=False), raw)
    assert torch.equal(mx.quest_scales(x), torch.exp2(torch.frexp(raw).exponent.float() - 1))


# --- MXFP8 (OCP MX: E4M3 elements, E8M0 scale per 32) --------------------------------------------------------------

def _decode_mxfp8(codes, e8):
    vals = codes.view(torch.float8_e4m3fn).float().reshape(*e8.shape, -1)
    return (vals * e8m0_decode(e8).unsqueeze(-1)).reshape(codes.shape)


def test_mxfp8_scale_rule_values_and_codes():
    from quartet.quant.formats import round_to_fp8

    x = torch.randn(16, 128, generator=_gen(30)) * torch.logspace(-20, 20, 16).unsqueeze(1)
    s = mx.mxfp8_scales(x)
    amax = x.reshape(16, 4, 32).abs().amax(-1)
    assert torch.equal(s, torch.exp2(torch.floor(torch.log2(amax.double())) - 8).float())  # exact here
    xq = mx.mxfp8_quantize(x)
    y = x.reshape(16, 4, 32) / s.unsqueeze(-1)
    assert y.abs().max() < 512 and torch.equal(xq, (round_to_fp8(y, "e4m3") * s.unsqueeze(-1)).reshape(16, 128))
    # half a step: 2^-4 relative among normals (3 mantissa bits), 2^-10 among subnormals; (448, 512) saturates
    err = (xq.reshape(16, 4, 32) / s.unsqueeze(-1) - y).abs()
    sat = y.abs() > 448
    assert (err[~sat] <= torch.maximum(y.abs()[~sat] * 2.0 ** -4, torch.tensor(2.0 ** -10))).all()
    assert (err[sat] < 64).all() and (xq.reshape(16, 4, 32)[sat].abs() == 448 * s.unsqueeze(-1).expand_as(y)[sat]).all()
    codes, e8 = mx.mxfp8_codes(xq, s)
    assert torch.equal(_decode_mxfp8(codes, e8), xq) and torch.equal(e8m0_decode(e8), s)


def test_mxfp8_edges_zeros_subnormals_powers_of_two_overflow_nan():
    x = torch.zeros(8, 32)
    # 0: all zeros -> scale 2^-8 (E8M0 code 119), values 0
    # 1: just below a power of two: amax = 2^k(1-2^-24) has exponent k-1 (float32 log2 says k) -> scale 2^(k-9);
    #    amax/s = 512(1-2^-24) saturates to 448
    x[1, 0], x[1, 1] = 2.0 ** 10 * (1 - 2.0 ** -24), 3.0
    # 2: amax < 2^-119: the exponent clamps to E8M0's -127 after the -8; y = 2^-13 flushes to 0 through E4M3's
    #    subnormals (smallest 2^-9), y = 1.5·2^-9·... stays
    x[2, 0], x[2, 1] = 2.0 ** -140, 1.5 * 2.0 ** -135
    # 3: E4M3 subnormals inside a normal group: amax 1 -> s = 2^-8; 2^-17 -> y = 2^-9 (kept), 2^-19 -> 2^-11 (0)
    x[3, 0], x[3, 1], x[3, 2] = 1.0, 2.0 ** -17, 2.0 ** -19
    # 4: near float32's largest value: s = 2^119, values saturate at 448·2^119, finite
    x[4, 0], x[4, 1] = 3e38, -1e38
    # 5, 6: Inf / NaN -> NaN scale (code 255), the whole group NaN; 7: an ordinary group beside them
    x[5, 3], x[6, 4] = float("inf"), float("nan")
    x[7] = torch.linspace(-3, 3, 32)
    s = mx.mxfp8_scales(x)
    xq = mx.mxfp8_quantize(x)
    assert s[[0, 1, 2, 3, 4, 7], 0].tolist() == [2.0 ** -8, 2.0 ** 1, 2.0 ** -127, 2.0 ** -8, 2.0 ** 119, 2.0 ** -7]
    assert torch.isnan(s[5:7]).all() and torch.isnan(xq[5:7]).all() and torch.isfinite(xq[[0, 1, 2, 3, 4, 7]]).all()
    assert (xq[0] == 0).all()
    assert xq[1, 0].item() == 448 * 2.0 and xq[1, 1].item() == 3.0
    assert xq[2, 0].item() == 0.0 and xq[2, 1].item() == 1.5 * 2.0 ** -135  # y = 1.5·2^-8: E4M3 subnormal 3·2^-9
    assert xq[3, :3].tolist() == [1.0, 2.0 ** -17, 0.0]
    assert xq[4, 0].item() == 448 * 2.0 ** 119
    assert abs(xq[4, 1].item() + 1e38) / 1e38 < 2 ** -4
    codes, e8 = mx.mxfp8_codes(xq, s)
    assert e8[:, 0].tolist() == [119, 128, 0, 119, 246, 255, 255, 120]
    assert (codes[5:7] == 0).all() and codes[1, 0].item() == 0x7E  # 448 = E4M3 0x7E
    ok = [0, 1, 2, 3, 4, 7]
    assert torch.equal(_decode_mxfp8(codes, e8)[ok], xq[ok])
    assert torch.isnan(_decode_mxfp8(codes, e8)[5:7]).all()
