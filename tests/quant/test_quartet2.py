"""Quartet II quantizers: Four Over Six picks the better of two block scales, MS-EDEN is unbiased (its scale
rounding exactly, over the random Hadamard statistically) with the RTN error, the 16/17 NVFP4 SR never clips."""
from __future__ import annotations

import pytest
import torch

from quartet.quant import mx
from quartet.quant import quartet2 as q2
from quartet.quant.formats import E2M1_GRID, round_to_e2m1, round_to_fp8
from quartet.quant.hadamard import block_hadamard, random_signs
from quartet.quant.quantizers import QuantizerSpec, reference_quantize


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _is_e4m3(v):
    return torch.equal(v, round_to_fp8(v, "e4m3"))


def _on_e2m1_grid(y):
    return torch.isin(y.abs(), E2M1_GRID).all()


def test_four_over_six_keeps_the_candidate_with_less_error():
    x = torch.randn(64, 128, generator=_gen(1)) * torch.logspace(-2, 2, 64).unsqueeze(1)
    xq, block, ts = q2.nvfp4_four_over_six(x)
    assert ts == x.abs().max() * (1.0 / (6 * 256))
    g = x.reshape(64, 8, 16)
    amax_g = g.abs().amax(-1)
    cands = []
    for c in (6.0, 4.0):
        b = round_to_fp8(amax_g * (1.0 / c) / ts, "e4m3")
        s = (b * ts).unsqueeze(-1)
        xc = round_to_e2m1(g / s) * s
        cands.append((xc, b, ((xc.double() - g.double()) ** 2).sum(-1)))
    (x6, b6, e6), (x4, b4, e4) = cands
    four = e4 < e6
    assert 0.2 < float(four.float().mean()) < 0.8  # both branches occur on Gaussian data
    assert torch.equal(block, torch.where(four, b4, b6)) and _is_e4m3(block) and block.max() <= 384
    assert torch.equal(xq.reshape(64, 8, 16), torch.where(four.unsqueeze(-1), x4, x6))
    plain = mx.nvfp4_quantize(x)[0]
    assert (xq - x).norm() < (plain - x).norm()


def test_four_over_six_branches_on_constructed_groups():
    # one group each; the tensor amax is the group amax, so the block scales are exactly 256 (amax -> 6) and 384
    # (amax -> 4) and y = 1.5·x/amax·4 resp. x/amax·4
    four = torch.tensor([4.0, 3.0, -3.0, 1.0] + [0.0] * 12)  # exact on the 4-branch; 3 -> 4.5 -> 4 on the 6-branch
    xq, block, _ = q2.nvfp4_four_over_six(four)
    assert torch.equal(xq, four) and block.item() == 384.0
    assert not torch.equal(mx.nvfp4_quantize(four)[0], four)
    six = torch.tensor([6.0, 1.0] + [0.0] * 14)  # exact on the 6-branch; 1 -> 2/3 -> 0.5 on the 4-branch
    xq, block, _ = q2.nvfp4_four_over_six(six)
    assert torch.equal(xq, six) and block.item() == 256.0
    spike = torch.tensor([0.0] * 15 + [-2.0])  # exact on both: a tie keeps 6
    xq, block, _ = q2.nvfp4_four_over_six(spike)
    assert torch.equal(xq, spike) and block.item() == 256.0
    z = torch.zeros(2, 16)  # all-zero tensor: scales 1, values 0
    xq, block, ts = q2.nvfp4_four_over_six(z)
    assert torch.equal(xq, z) and block.flatten().tolist() == [1.0, 1.0] and ts.item() == 1.0


def test_ms_eden_matches_the_algorithm():
    x = torch.randn(32, 256, generator=_gen(2)) * torch.logspace(-1, 1, 32).unsqueeze(1)
    xm, target, ts = q2.ms_eden_quantize(x, stochastic=False)
    xs, scale, ts2 = q2.ms_eden_quantize(x, _gen(3))
    c = 6 * (16 / 17) / 0.93
    assert q2.MS_EDEN_CLIP == pytest.approx(c, rel=1e-12) and ts == ts2
    assert ts.item() == pytest.approx(float(x.abs().max()) / (c * 256), rel=1e-6)
    g = x.reshape(32, 16, 16).double()
    e = mx.e4m3_block_scale(x.reshape(32, 16, 16).abs().amax(-1), q2.MS_EDEN_CLIP, ts).double()
    y = g / (e * ts.double()).unsqueeze(-1)
    q = round_to_e2m1(y.float()).double()
    s_g = (y * y).sum(-1) / (y * q).sum(-1)
    assert s_g.min() > 0.85 and s_g.max() < 1.15  # the EDEN correction is a few percent
    assert torch.allclose(target.double(), e * s_g, rtol=1e-6)
    assert torch.allclose(xm.reshape(32, 16, 16).double(), q * (e * s_g * ts.double()).unsqueeze(-1), rtol=1e-6)
    # the stochastic scales are E4M3 values, one of the two neighbours of the corrected scale
    assert _is_e4m3(scale) and scale.max() < 448
    lo, hi = torch.minimum(scale, target), torch.maximum(scale, target)
    assert (hi / lo).max() < 1 + 2.0 ** -3 + 1e-6
    assert _on_e2m1_grid(torch.round(xs.reshape(32, 16, 16) / (scale * ts).unsqueeze(-1) * 2) / 2)
    assert torch.equal(xs, q2.ms_eden_quantize(x, _gen(3))[0])  # reproducible for a fixed seed
    assert not torch.equal(xs, q2.ms_eden_quantize(x, _gen(4))[0])


def test_ms_eden_scale_rounding_is_exactly_unbiased():
    """Given the rotation, E over the scale draws of x̂ is the deterministic EDEN estimate (stochastic=False)."""
    n = 4000
    x = torch.randn(4, 64, generator=_gen(5))
    want = q2.ms_eden_quantize(x, stochastic=False)[0]
    xs = q2.ms_eden_quantize(x.repeat(n, 1), _gen(6))[0].reshape(n, 4, 64)  # same amax: same tensor scale
    mean, se = xs.mean(0), xs.std(0) / n ** 0.5
    moving = se > 0
    z = (mean - want)[moving] / se[moving]
    assert moving.float().mean() > 0.5 and z.abs().max() < 5 and z.pow(2).mean() < 1.5
    assert torch.equal(mean[~moving], want[~moving])  # groups whose corrected scale is already an E4M3 value


def _rotated_estimates(x, fn, draws, seed):
    """``draws`` independent estimates H⁻¹(Q(x·diag(ξ)·H)) of ``x``, one random sign vector ξ each, in one batch."""
    g = _gen(seed)
    signs = torch.stack([random_signs(128, g) for _ in range(draws)])  # (draws, 128)
    rows = x.shape[0]
    xs = (x.reshape(1, rows, -1, 128) * signs[:, None, None, :]).reshape(draws * rows, -1)
    est = block_hadamard(fn(block_hadamard(xs, 128), g), 128, inverse=True)
    return (est.reshape(draws, rows, -1, 128) * signs[:, None, None, :]).reshape(draws, rows, -1)


def test_ms_eden_is_unbiased_over_the_random_hadamard_and_rtn_is_not():
    x = torch.randn(8, 256, generator=_gen(7)) ** 3  # heavy-tailed, not Gaussian
    x[0, 3] = 40.0
    draws = 1000
    res = {}
    for name, fn in (("eden", lambda t, g: q2.ms_eden_quantize(t, g)[0]),
                     ("rtn", lambda t, g: mx.nvfp4_quantize(t)[0]),
                     ("4o6", lambda t, g: q2.nvfp4_four_over_six(t)[0])):
        est = _rotated_estimates(x, fn, draws, seed=8)
        align = (est * x).sum((1, 2)) / (x * x).sum()  # E[<x, x̂>]/<x, x> = 1 for an unbiased estimator
        res[name] = (float(align.mean()) - 1.0, float(align.std()) / draws ** 0.5)
    bias, se = res["eden"]
    assert abs(bias) < 4 * se, res
    for name in ("rtn", "4o6"):  # round-to-nearest shrinks: biased by tens of standard errors
        assert res[name][0] < -20 * res[name][1], res


def test_sr_with_headroom_never_clips_and_is_unbiased():
    # (within E4M3's normal range: a subnormal block scale can round down by more than 16/17)
    x = torch.randn(16, 64, generator=_gen(9)) * torch.logspace(-1, 1, 16).unsqueeze(1)
    xq, block, ts = q2.nvfp4_sr_headroom(x, _gen(10))
    y = x.reshape(16, 4, 16) / (block * ts).unsqueeze(-1)
    assert y.abs().max() <= 6.0 and _is_e4m3(block)
    n = 3000
    xs = q2.nvfp4_sr_headroom(x.repeat(n, 1), _gen(11))[0].reshape(n, 16, 64)
    se = xs.std(0) / n ** 0.5
    moving = se > 0
    z = (xs.mean(0) - x)[moving] / se[moving]
    assert z.abs().max() < 5 and z.pow(2).mean() < 1.5


def test_nonfinite_inputs_propagate_and_zeros_stay_zero():
    x = torch.randn(4, 32, generator=_gen(12))
    for bad in (float("inf"), float("nan")):
        xb = x.clone()
        xb[1, 5] = bad
        for fn in (lambda t: q2.nvfp4_four_over_six(t)[0], lambda t: q2.ms_eden_quantize(t, _gen(0))[0],
                   lambda t: q2.nvfp4_sr_headroom(t, _gen(0))[0]):
            assert torch.isnan(fn(xb)).any()  # a diverging run is not hidden as finite numbers
    z = torch.zeros(3, 32)
    assert torch.equal(q2.ms_eden_quantize(z, _gen(0))[0], z) and torch.equal(q2.nvfp4_sr_headroom(z, _gen(0))[0], z)


@pytest.mark.parametrize("kind", ["nvfp4_4o6", "nvfp4_sr1617", "ms_eden", "mxfp8"])
def test_new_kinds_run_through_the_spec(kind):
    x = torch.randn(32, 128, generator=_gen(13))
    spec = QuantizerSpec(kind, group=32 if kind == "mxfp8" else 16)
    a, b = reference_quantize(x, spec, seed=1), reference_quantize(x, spec, seed=1)
    assert torch.equal(a.values, b.values) and torch.isfinite(a.values).all()
    assert (a.values - x).norm() / x.norm() < (0.05 if kind == "mxfp8" else 0.2)
    assert a.data["scale"].shape == (32, 128 // spec.group) and spec.label() == f"{kind}/g{spec.group}"
