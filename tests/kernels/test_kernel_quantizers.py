"""Fused Triton quantizers against the pure-PyTorch oracle (quartet.quant).

On a CPU box the kernels run in Triton's interpreter on small shapes; on a GPU the same tests run on
the device (and the ``gpu``-marked ones add large shapes and the FP8 fold).
"""
from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton")

from quartet.kernels import triton_quant as tq  # noqa: E402
from quartet.quant import formats, hadamard, mx  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [(32, 64), (64, 96), (96, 256)] if DEV == "cpu" else [(128, 256), (992, 544), (4096, 1024)]


def _logical(x, axis):
    return x if axis in (-1, 1) else x.t()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("axis", [-1, 0])
def test_quest_bitwise_without_rotation(shape, axis):
    g = torch.Generator().manual_seed(hash((shape, axis)) % 2**31)
    x = (torch.randn(*shape, generator=g) * torch.rand(shape[0], 1, generator=g) * 3).to(torch.bfloat16)
    out = tq.mx_quantize(x.to(DEV), axis=axis, rule="quest", hadamard=False, mask=True, out_dtype=torch.float32)
    ref, ref_mask = mx.quest_mxfp4(_logical(x, axis).float())
    assert torch.equal(out.deq.cpu(), ref)
    assert torch.equal(out.mask.cpu(), ref_mask)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("with_signs", [False, True])
def test_quest_bitwise_with_fused_rotation(shape, axis, with_signs):
    g = torch.Generator().manual_seed(7 + hash((shape, axis, with_signs)) % 2**31)
    x = torch.randn(*shape, generator=g).to(torch.bfloat16)
    signs = hadamard.random_signs(32, g) if with_signs else None
    out = tq.mx_quantize(x.to(DEV), axis=axis, rule="quest", signs=signs, mask=True, out_dtype=torch.float32)
    xl = _logical(x, axis)
    # the oracle's rotation rounds exactly like the kernel (±1 sums, one scale): bitwise, no shim
    ref, ref_mask = mx.quest_mxfp4(hadamard.block_hadamard(xl, 32, signs))
    assert torch.equal(out.deq.cpu(), ref)
    assert torch.equal(out.mask.cpu(), ref_mask)
    if with_signs:  # the same signs passed by value as a 32-bit mask
        bits = tq.mx_quantize(x.to(DEV), axis=axis, rule="quest", signs=tq.signs_to_bits(signs), mask=True,
                              out_dtype=torch.float32)
        assert torch.equal(bits.deq.cpu(), ref)


@pytest.mark.parametrize("rule", ["absmax", "rtn_absmax"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_absmax_rtn_bitwise(rule, axis):
    g = torch.Generator().manual_seed(11 if axis else 12)
    x = (torch.randn(64, 128, generator=g) * torch.exp(torch.randn(64, 1, generator=g) * 2)).to(torch.bfloat16)
    x[3, :32] = 0  # an all-zero group
    out = tq.mx_quantize(x.to(DEV), axis=axis, rule=rule, hadamard=False, out_dtype=torch.float32)
    xl = _logical(x, axis).float()
    ref = mx.absmax_mxfp4(xl) if rule == "absmax" else mx.rtn_absmax_mxfp4(xl)
    assert torch.equal(out.deq.cpu(), ref)


@pytest.mark.parametrize("rule", ["quest", "absmax"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_mx_codes_and_scales_match_oracle(rule, axis):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(32, 128, generator=g).to(torch.bfloat16)
    out = tq.mx_quantize(x.to(DEV), axis=axis, rule=rule, hadamard=False, mx=True, out_dtype=torch.float32)
    xl = _logical(x, axis).float()
    if rule == "quest":
        xq, _ = mx.quest_mxfp4(xl)
        codes, e8 = mx.mx_codes(xq, mx.quest_scales(xl))
    else:
        xq = mx.absmax_mxfp4(xl)
        codes, e8 = mx.mx_codes(xq, mx.absmax_scales(xl), factor=4.0 / 3.0)
    assert torch.equal(out.codes.cpu(), formats.pack_e2m1(codes))
    assert torch.equal(out.e8m0.cpu(), e8)
    # the packed form decodes back to the dequantized values
    dec = formats.e2m1_decode(formats.unpack_e2m1(out.codes.cpu())).reshape(-1, 32)
    dec = dec * formats.e8m0_decode(out.e8m0.cpu()).reshape(-1, 1) * out.factor
    assert torch.equal(dec.reshape(xq.shape), out.deq.cpu())


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("row_exp", ["exact", "bound", "fused"])
def test_fp8_fold_is_exact_and_counts_flushes(fmt, axis, row_exp):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 128, generator=g).to(torch.bfloat16)
    out = tq.mx_quantize(x.to(DEV), axis=axis, rule="quest", hadamard=True, fp8=fmt, out_dtype=torch.float32,
                         row_exp="exact")
    folded = out.fp8.cpu().float() * out.row_scale.cpu()
    assert out.flushed.item() == 0
    assert torch.equal(folded, out.deq.cpu())
    ob = tq.mx_quantize(x.to(DEV), axis=axis, rule="absmax", stochastic=True, seed=1, fp8=fmt,
                        out_dtype=torch.float32, row_exp=row_exp)
    assert ob.flushed.item() == 0
    assert torch.equal(ob.fp8.cpu().float() * ob.row_scale.cpu(), ob.deq.cpu())
    # a row whose groups span ~40 binades: the small groups cannot all be exact in FP8 -> counted
    y = torch.randn(64, 128, generator=g)
    scale = torch.ones(64, 128)
    scale[:, :32] = 2.0 ** 20
    scale[:, 32:64] = 2.0 ** -20
    yl = (y * scale).to(torch.bfloat16)  # the logical (R, K) operand
    stored = yl if axis in (-1, 1) else yl.t().contiguous()
    o2 = tq.mx_quantize(stored.to(DEV), axis=axis, rule="quest", hadamard=False, fp8=fmt, out_dtype=torch.float32,
                        row_exp=row_exp)
    diff = (o2.fp8.cpu().float() * o2.row_scale.cpu() != o2.deq.cpu()).sum().item()
    assert o2.flushed.item() == diff > 0
    if row_exp == "fused":  # the one-pass fold writes exactly what the two-pass fold writes
        for kw in (dict(x=x, rule="quest", hadamard=True, mask=True), dict(x=stored, rule="quest", hadamard=False),
                   dict(x=x, rule="absmax", stochastic=True, seed=5, hadamard=True)):
            xin = kw.pop("x").to(DEV)
            a = tq.mx_quantize(xin, axis=axis, fp8=fmt, deq=False, row_exp="exact", **kw)
            b = tq.mx_quantize(xin, axis=axis, fp8=fmt, deq=False, row_exp="fused", **kw)
            assert torch.equal(a.fp8.view(torch.uint8), b.fp8.view(torch.uint8))
            assert torch.equal(a.row_scale, b.row_scale) and a.flushed.item() == b.flushed.item()
            if a.mask is not None:
                assert torch.equal(a.mask, b.mask)


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("blk", [1, 128])
def test_fp8_block_scaling_is_exact_in_one_pass(axis, blk):
    """fp8_block: FP8 + one scale per 1x128 / 128x128 block, written by the quantizer itself."""
    g = torch.Generator().manual_seed(40 + blk + axis)
    R, K = (128, 256) if DEV == "cpu" else (1024, 2048)
    # rows of varied magnitude (σ ≈ 1.4 binades): a 128x128 block then spans ≲ 10 binades, inside e4m3's 14
    xl = (torch.randn(R, K, generator=g) * torch.exp(torch.randn(R, 1, generator=g))).to(torch.bfloat16)
    stored = (xl if axis == -1 else xl.t().contiguous()).to(DEV)
    bits = 0x5A5A1234
    for rule, kw in (("quest", dict(mask=True)), ("absmax", dict(stochastic=True, seed=3))):
        ref = tq.mx_quantize(stored, axis=axis, rule=rule, signs=bits, out_dtype=torch.float32, **kw)
        q = tq.mx_quantize(stored, axis=axis, rule=rule, signs=bits, deq=False, fp8="e4m3", fp8_block=blk, **kw)
        assert q.row_scale is None and q.scale_rows == blk and q.flushed.item() == 0
        assert torch.equal(q.fp8_values(), ref.deq)  # bitwise: same rounding, same SR stream
        if rule == "quest":
            assert torch.equal(q.mask, ref.mask)
        # layouts F.scaled_mm takes: (R, K/128) column-major for 1x128, (R/128, K/128 padded to 4) for 128x128
        if blk == 1:
            assert q.block_scale.shape == (R, K // 128) and q.block_scale.stride() == (1, R)
        else:
            assert q.block_scale.shape == (R // 128, -(-(K // 128) // 4) * 4) and q.block_scale.is_contiguous()
        # the saved FP8 operand read back through its block scales requantizes exactly like its values
        # (QuEST's power-of-two scales, what the fused layer saves; absmax's 4/3 is rounded to bf16 on the GPU)
        for ax in ((-1, 0) if rule == "quest" or DEV == "cpu" else ()):
            a = tq.mx_quantize(ref.deq, axis=ax, rule="absmax", signs=7, out_dtype=torch.float32)
            b = tq.mx_quantize(q.fp8, axis=ax, rule="absmax", signs=7, out_dtype=torch.float32,
                               in_scale=q.block_scale, in_scale_rows=blk)
            assert torch.equal(a.deq, b.deq)
    # groups spanning ~40 binades inside one block cannot all be exact in e4m3: counted
    y = torch.randn(R, K, generator=g)
    y[:, :32] *= 2.0 ** 20  # (QuEST floors σ near 1e-8, so the small side cannot go much lower)
    y[:, 32:64] *= 2.0 ** -20
    st = (y if axis == -1 else y.t().contiguous()).to(torch.bfloat16).to(DEV)
    o = tq.mx_quantize(st, axis=axis, rule="quest", hadamard=False, fp8="e4m3", fp8_block=blk)
    diff = (o.fp8_values().cpu() != o.deq.float().cpu()).sum().item()
    assert o.flushed.item() == diff > 0


@pytest.mark.parametrize("blk", [None, 1, 128])
def test_fp8_fold_ignores_all_zero_groups(blk):
    """A zero group gets the absmax rule's 2^-2 scale; it must not set the fold exponent of small gradients."""
    g = torch.Generator().manual_seed(5)
    e = torch.randn(128, 256, generator=g) * 2.0 ** -22
    e[:, :32] = 0.0     # the first group of every row (and of every block) is zero
    e[:2, :] = 0.0      # and two rows are zero throughout
    e = e.to(torch.bfloat16).to(DEV)
    kw = dict(fp8_block=blk) if blk else dict(row_exp="exact")
    q = tq.mx_quantize(e, rule="absmax", signs=3, fp8="e4m3", out_dtype=torch.float32, **kw)
    assert q.flushed.item() == 0
    assert torch.equal(q.fp8_values(), q.deq)


def test_sr_rounds_up_with_the_right_probability():
    """P(round up) equals the position inside the grid gap, at several points of the uniform's CDF."""
    fracs = torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95])
    rows = 64
    # each row is one 32-group: y0 = 4 pins the absmax scale (yq = 0.75·y), the other 31 sit at 1 + 0.5·f
    y = ((1 + 0.5 * fracs) / 0.75).repeat_interleave(rows)[:, None].expand(-1, 32).clone()
    y[:, 0] = 4.0
    x = y.to(torch.bfloat16)
    f_true = ((x.float()[:, 1:] * 0.75 - 1.0) / 0.5)  # exact bf16 value's position in the gap
    ups = []
    for seed in range(4):
        q = tq.mx_quantize(x.to(DEV), rule="absmax", stochastic=True, seed=seed, hadamard=False,
                           out_dtype=torch.float32).deq.cpu()
        ups.append((q[:, 1:] * 0.75 > 1.0 + 1e-6).float())
    up = torch.stack(ups).mean(0).reshape(len(fracs), -1).mean(1)
    expect = f_true.reshape(len(fracs), -1).mean(1)
    n = 4 * rows * 31
    assert ((up - expect).abs() <= 5 * torch.sqrt(expect * (1 - expect) / n) + 1e-3).all(), (up, expect)


def test_sr_keeps_grid_points_and_picks_a_neighbour():
    """Every SR value is one of its two E2M1 grid neighbours, values on the grid (zero included) never move, values
    just off a grid point go to it or its neighbour, and a group holding Inf or NaN comes back NaN (absmax)."""
    g = torch.Generator().manual_seed(11)
    rows = 64
    # each row: two 32-groups led by 4 (pins the absmax scale: a = 0.75·|x|, so 4 -> 3 and 2 -> 1.5 on the grid)
    on_grid = torch.tensor([0.0, 2.0, -2.0, 4.0, -4.0])[torch.randint(0, 5, (rows // 2, 64), generator=g)]
    off_grid = (torch.rand(rows // 2, 64, generator=g) * 8 - 4)
    x = torch.cat([on_grid, off_grid]).to(torch.bfloat16)
    x[rows // 2:, 1] = 4.0 * (1 - 2.0 ** -8)                  # just below a grid point (a = 3 - 2^-8·3)
    x[rows // 2:, 2] = 2.0 ** -20                             # just above zero
    x[:, ::32] = 4.0
    x[3, 40] = float("inf")                                   # the second group of rows 3 and 5 goes NaN
    x[5, 33] = float("nan")
    xf = x.float()
    a = torch.nan_to_num(xf.abs() * 0.75, nan=0.0).clamp(max=6.0)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    lo = grid[torch.searchsorted(grid, a, right=True) - 1]
    hi = grid[torch.searchsorted(grid, a)]
    bad = torch.zeros_like(x, dtype=torch.bool)
    bad[3, 32:] = bad[5, 32:] = True
    for seed in range(6):
        q = tq.mx_quantize(x.to(DEV), rule="absmax", stochastic=True, seed=seed, hadamard=False,
                           out_dtype=torch.float32).deq.cpu()
        assert torch.isnan(q[bad]).all() and not torch.isnan(q[~bad]).any(), seed
        m = q[~bad].abs() * 0.75
        assert ((m == lo[~bad]) | (m == hi[~bad])).all(), seed
        assert (torch.sign(q[~bad]) * torch.sign(xf[~bad]) >= 0).all(), seed
        assert torch.equal(q[: rows // 2][~bad[: rows // 2]], xf[: rows // 2][~bad[: rows // 2]]), seed


def test_sr_unbiased_reproducible_and_distinct_streams():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 64, generator=g).to(torch.bfloat16)
    xl = x.to(DEV)
    runs = [tq.mx_quantize(xl, rule="absmax", stochastic=True, seed=s, hadamard=False, out_dtype=torch.float32).deq.cpu()
            for s in range(200)]
    stack = torch.stack(runs)
    # unbiased: the mean over seeds converges to the input (absmax never clips). Bound each element by
    # 5 standard errors of the worst case p = 1/2 for its grid gap, and the pooled bias much tighter.
    xs = x.float()
    sc = (mx.absmax_scales(xs) * 4 / 3).repeat_interleave(32, dim=-1)
    a = (xs / sc).abs()
    gap = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)) * sc
    err = stack.mean(0) - xs
    assert (err.abs() <= 5 * gap / 2 / math.sqrt(len(runs))).all()
    assert abs((err / gap).mean().item()) < 5 * 0.5 / math.sqrt(len(runs) * err.numel())
    # the oracle's SR has the same per-element expectation and spread
    ref = torch.stack([mx.absmax_mxfp4(x.float(), stochastic=True, generator=torch.Generator().manual_seed(s))
                       for s in range(200)])
    assert (ref.mean(0) - stack.mean(0)).abs().max() < 0.5 * x.float().abs().max()
    assert abs(ref.var(0).mean().item() - stack.var(0).mean().item()) < 0.2 * ref.var(0).mean().item()
    # reproducible for a seed, distinct across seeds
    again = tq.mx_quantize(xl, rule="absmax", stochastic=True, seed=5, hadamard=False, out_dtype=torch.float32).deq.cpu()
    assert torch.equal(again, runs[5])
    assert not torch.equal(runs[5], runs[6])
    # every SR value is one of the two grid neighbours of the RTN-free exact value
    rtn = tq.mx_quantize(xl, rule="absmax", hadamard=False, out_dtype=torch.float32).deq.cpu()
    assert ((runs[0] - rtn).abs() <= x.float().abs().amax() * 2).all()


def test_masked_inverse_hadamard_matches_oracle():
    g = torch.Generator().manual_seed(9)
    gr = torch.randn(32, 128, generator=g)
    m = torch.rand(32, 128, generator=g) > 0.1
    out = tq.masked_inverse_hadamard(gr.to(DEV), m.to(DEV), scale=16 / 9, out_dtype=torch.float32).cpu()
    ref = hadamard.block_hadamard(gr * m * (16 / 9), 32, inverse=True)
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4)  # fp32 input: bf16 hi+lo split on GPU


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("kw", [dict(), dict(fp8="e4m3", fp8_block=1, deq=False), dict(fp8="e4m3", fp8_block=128, deq=False)])
def test_packed_mask_bits_are_the_quest_mask(axis, kw):
    """mask_bits: one int32 word per 32-group whose bit c is the bool mask of element c (bit 31 included), for
    direct and transposed reads and every output the fused layer uses; clipped and Inf/NaN groups give 0 bits."""
    g = torch.Generator().manual_seed(21 + axis)
    shape = (128, 256) if axis == -1 else (256, 128)
    x = torch.randn(*shape, generator=g) * torch.rand(shape[0], 1, generator=g) * 3
    x[5, :64] = 80.0  # groups with clipped values (|y/σ| >= 6)
    x[9, 7] = float("nan")
    x = x.to(torch.bfloat16).to(DEV)
    full = tq.mx_quantize(x, axis=axis, rule="quest", mask=True, **kw)
    packed = tq.mx_quantize(x, axis=axis, rule="quest", mask=True, mask_bits=True, **kw)
    assert packed.mask is None and packed.mask_bits.dtype == torch.int32
    assert packed.mask_bits.shape == (full.mask.shape[0], full.mask.shape[1] // 32)
    assert torch.equal(tq.unpack_mask_bits(packed.mask_bits).cpu(), full.mask.cpu())
    m = full.mask.cpu()
    assert (~m).any() and m.any() and (packed.mask_bits.cpu() < 0).any()  # clipped elements, and bit 31 set somewhere
    # the masked inverse rotation reads either form the same
    gr = torch.randn(*m.shape, generator=g).to(torch.bfloat16).to(DEV)
    assert torch.equal(tq.masked_inverse_hadamard(gr, full.mask), tq.masked_inverse_hadamard(gr, packed.mask_bits))


def test_unpack_mask_bits_and_bad_masks():
    w = torch.tensor([[1, -2**31, 0x5]], dtype=torch.int32)
    m = tq.unpack_mask_bits(w)
    assert m.shape == (1, 96) and m[0, 0] and m[0, 63] and m[0, 64] and m[0, 66] and m.sum() == 4
    with pytest.raises(ValueError, match="int32"):
        tq.unpack_mask_bits(w.to(torch.int64))
    gr = torch.randn(32, 128).to(DEV)
    with pytest.raises(ValueError, match="packed mask words"):
        tq.masked_inverse_hadamard(gr, torch.zeros(32, 3, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="shape"):
        tq.masked_inverse_hadamard(gr, torch.ones(32, 64, dtype=torch.bool, device=DEV))
    with pytest.raises(ValueError, match="mask=True"):
        tq.mx_quantize(gr, mask_bits=True)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="multiple of 32"):
        tq.mx_quantize(torch.randn(4, 48).to(DEV))
    with pytest.raises(ValueError, match="rule"):
        tq.mx_quantize(torch.randn(4, 64).to(DEV), rule="nope")


@pytest.mark.parametrize("axis", [-1, 0])
def test_requantizing_an_fp8_folded_operand_equals_requantizing_its_values(axis):
    g = torch.Generator().manual_seed(21)
    x = torch.randn(64, 128, generator=g).to(torch.bfloat16).to(DEV)
    fwd = tq.mx_quantize(x, rule="quest", fp8="e4m3", deq=True)  # X̂ as FP8 + power-of-two row scales
    assert fwd.flushed.item() == 0
    signs = hadamard.random_signs(32, g)
    a = tq.mx_quantize(fwd.deq, axis=axis, rule="absmax", signs=signs, out_dtype=torch.float32)
    b = tq.mx_quantize(fwd.fp8, axis=axis, rule="absmax", signs=signs, out_dtype=torch.float32, in_scale=fwd.row_scale)
    assert torch.equal(a.deq, b.deq)


@pytest.mark.parametrize("rule", ["absmax", "rtn_absmax"])
def test_absmax_scales_just_below_powers_of_two_match_the_oracle(rule):
    """Group maxima a hair below 2^k (float32 inputs): the kernel reads the exponent bits, the oracle frexp —
    both give 2^(k-1-2), bitwise equal values (float32 log2 would round these up to 2^k)."""
    g = torch.Generator().manual_seed(5)
    x = torch.rand(32, 128, generator=g) * 0.5
    for r in range(32):
        for j in range(4):
            x[r, 32 * j + (r + j) % 32] = 2.0 ** (r - 16 + 3 * j) * (1 - 2.0 ** -24) * (-1) ** r
    out = tq.mx_quantize(x.to(DEV), axis=-1, rule=rule, hadamard=False, out_dtype=torch.float32)
    ref = mx.absmax_mxfp4(x) if rule == "absmax" else mx.rtn_absmax_mxfp4(x)
    assert torch.equal(out.deq.cpu(), ref)


def _equal_nan(a, b):
    """Bitwise equal values, NaN where the other has NaN (payloads may differ)."""
    a, b = a.cpu().float(), b.cpu().float()
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


@pytest.mark.parametrize("rule", ["absmax", "rtn_absmax"])
def test_absmax_tiny_groups_clamp_to_e8m0_range_bitwise(rule):
    """Groups with amax < 2^-124 (float32 normals and subnormals): scale 2^-127 (E8M0 code 0) in kernel and oracle,
    bitwise, and the stored codes decode to the dequantized values (the kernel clamped at 2^-126, the oracle
    went down to 2^-129)."""
    g = torch.Generator().manual_seed(15)
    x = torch.randn(32, 64, generator=g)
    tiny = [1.5 * 2.0 ** -126, 2.0 ** -125, 1.5 * 2.0 ** -125, 2.0 ** -127, 2.0 ** -130, 1.5 * 2.0 ** -124, 2.0 ** -123]
    for i, a in enumerate(tiny):
        x[i, :32] = x[i, :32] / x[i, :32].abs().max() * a  # group max exactly a
    x[7, :32] = 0.0
    # float32 input (its small elements are float32 subnormals): Triton 3.6's CPU interpreter loads bf16
    # subnormals as -0.0, so a bf16 input would test the interpreter, not the kernel
    out = tq.mx_quantize(x.to(DEV), rule=rule, hadamard=False, mx=True, out_dtype=torch.float32)
    xf = x.float()
    ref = mx.absmax_mxfp4(xf) if rule == "absmax" else mx.rtn_absmax_mxfp4(xf)
    factor = 4.0 / 3.0 if rule == "absmax" else 1.0
    codes, e8 = mx.mx_codes(ref, mx.absmax_scales(xf), factor=factor)
    assert e8[:7, 0].tolist() == [0, 0, 0, 0, 0, 1, 2]
    assert torch.equal(out.deq.cpu(), ref)
    assert torch.equal(out.e8m0.cpu(), e8)
    assert torch.equal(out.codes.cpu(), formats.pack_e2m1(codes))
    dec = formats.e2m1_decode(formats.unpack_e2m1(out.codes.cpu())).reshape(-1, 32)
    dec = dec * formats.e8m0_decode(out.e8m0.cpu()).reshape(-1, 1) * out.factor
    assert torch.equal(dec.reshape(ref.shape), out.deq.cpu())
    # groups down to 2^-127 keep nonzero values; 2^-130 is below what a 2^-127 scale can hold (E8M0's limit): 0
    assert (ref[[0, 1, 2, 3, 5, 6], :32].abs().amax(1) > 0).all() and (ref[4, :32] == 0).all()


def test_quest_overflowing_and_nonfinite_groups_bitwise():
    """QuEST on groups whose squares overflow float32 (|x| ~ 1e20 … 2e38): σ is computed on the group scaled by
    2^-72, finite and bitwise as the oracle; groups holding Inf/NaN give NaN values, mask False, E8M0 code 255
    and element codes 0, NaN in FP8 (not counted as flushes); every other group is untouched."""
    g = torch.Generator().manual_seed(16)
    x = torch.randn(32, 64, generator=g)
    x[0] *= 1e20
    x[1, :32] *= 3e37
    x[2, :32] = 2e38
    x[2, 1:32:2] = -2e38
    x[3, 32:] *= 2.0 ** 70
    x[4, 3] = float("inf")
    x[5, 40] = float("nan")
    x[6, 0] = -float("inf")
    x = x.to(torch.bfloat16)
    xf = x.float()
    ref, ref_mask = mx.quest_mxfp4(xf)
    s = mx.quest_scales(xf)
    codes, e8 = mx.mx_codes(ref, s)
    nan_g = torch.isnan(s)
    assert nan_g.sum().item() == 3 and torch.isfinite(ref[:4]).all() and torch.isfinite(ref[7:]).all()
    out = tq.mx_quantize(x.to(DEV), rule="quest", hadamard=False, mask=True, mx=True, out_dtype=torch.float32)
    assert _equal_nan(out.deq, ref)
    assert torch.equal(out.mask.cpu(), ref_mask)
    assert torch.equal(out.e8m0.cpu(), e8)
    assert torch.equal(out.codes.cpu(), formats.pack_e2m1(codes))
    for fmt in ("e4m3", "e5m2"):  # the FP8 fold keeps the NaN groups NaN and the others exact
        for row_exp in ("exact", "fused"):
            f = tq.mx_quantize(x.to(DEV), rule="quest", hadamard=False, fp8=fmt, row_exp=row_exp,
                               out_dtype=torch.float32)
            v = f.fp8_values().cpu()
            assert torch.equal(torch.isnan(v), nan_g.repeat_interleave(32, -1))
            ok = ~torch.isnan(v)
            diff = (v[ok] != ref[ok]).sum().item()
            assert f.flushed.item() == diff
            # row 0 (both groups ~1e20) and the ordinary rows are exact; rows 1-3 span > 100 binades (flushed)
            assert torch.equal(v[0], ref[0]) and torch.equal(v[7:], ref[7:]) and diff > 0


@pytest.mark.parametrize("kw", [dict(fp8_block=1), dict(fp8_block=128), dict(row_exp="exact"), dict(row_exp="fused")])
def test_flush_count_at_the_exactness_boundary(kw):
    """A group folded exactly at the smallest exact offset (d = FP8_MIN_D) keeps every value; one binade lower its
    0.5- and 1.5-valued elements fall between e4m3's subnormal steps. The kernels skip the per-element check
    in tiles where no group sits below the bound, so the count must still equal the inexact values exactly."""
    R, K = 128, 128
    y = torch.zeros(R, K)
    y[:, :32] = 2.0 ** 10                      # group 0: amax 2^10 -> e = 8 sets the fold exponent
    y[:, 32:64] = 2.0 ** -4 * 0.6              # group 1: amax 2^-4 -> e = -6, d = -6 - 8 + 6 = -8 (exact)
    y[:, 64] = 2.0 ** -5                       # group 2: amax 2^-5 -> e = -7, d = -9 (below the bound)
    y[:, 65:96] = 2.0 ** -7 * (2 / 3)          # ... its other values round to q = 0.5: 0.5 * 2^-9 is not e4m3
    y[::2, 96:128] = -(2.0 ** -7) * 2          # half the rows: q = 1.5 in a group of e = -7 (also not e4m3)
    y[::2, 96] = 2.0 ** -5
    q = tq.mx_quantize(y.to(torch.bfloat16).to(DEV), rule="absmax", hadamard=False, fp8="e4m3",
                       out_dtype=torch.float32, **kw)
    inexact = q.fp8_values().cpu() != q.deq.float().cpu()
    assert not inexact[:, :64].any()           # at the bound: exact
    assert inexact[:, 65:96].all()             # one binade lower: every 0.5 is lost
    assert q.flushed.item() == inexact.sum().item()


def test_cast_bf16_reads_float32_as_its_bf16_rounding():
    """cast_bf16: the kernel rounds a float32 operand to bf16 as it loads it — bitwise the operand of
    ``x.to(torch.bfloat16)``, ties to even, NaN, ±Inf, subnormals and bf16's largest finite value included."""
    g = torch.Generator().manual_seed(31)
    x = torch.randn(128, 256, generator=g) * torch.exp(4 * torch.randn(128, 1, generator=g))
    # ties: exactly half a bf16 ulp above a bf16 number with an even / odd last bit, and just off the tie
    base = torch.tensor([1.0, 1.0078125, 3.0, 3.015625])
    ulp = torch.tensor([2.0 ** -7, 2.0 ** -7, 2.0 ** -6, 2.0 ** -6])
    x[0, :4] = base + ulp / 2
    x[0, 4:8] = base + ulp / 2 * (1 + 2.0 ** -10)
    x[0, 8:12] = base + ulp / 2 * (1 - 2.0 ** -10)
    x[1, :6] = torch.tensor([3.3895313892515355e38, -3.3895314e38, 1e-39, -1e-40, 0.0, -0.0])
    x[2, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])  # their groups: NaN values, as the oracle
    xd = x.to(DEV)
    for kw in (dict(rule="quest", mask=True), dict(rule="absmax", stochastic=True, seed=4, signs=0x1357),
               dict(rule="quest", fp8="e4m3", fp8_block=128, deq=False, mask=True)):
        a = tq.mx_quantize(xd.to(torch.bfloat16), **kw)
        b = tq.mx_quantize(xd, cast_bf16=True, **kw)
        for name in ("deq", "mask", "fp8", "block_scale"):
            u, v = getattr(a, name), getattr(b, name)
            if u is not None:
                assert _equal_nan(u.float().cpu(), v.float().cpu()), name
    with pytest.raises(ValueError, match="cast_bf16"):
        tq.mx_quantize(xd.to(torch.bfloat16), cast_bf16=True)


def _assert_same_outputs(ref, got, attrs, ctx):
    """Two :class:`QuantizedOperand` s hold the same ``attrs``: both absent, or equal bit for bit (NaN included)."""
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    for attr in attrs:
        u, v = getattr(ref, attr), getattr(got, attr)
        assert (u is None) == (v is None), (ctx, attr)
        if u is not None:
            assert u.dtype == v.dtype and torch.equal(u.view(bits[u.dtype.itemsize]), v.view(bits[v.dtype.itemsize])), \
                (ctx, attr)


@pytest.mark.skipif(DEV != "cuda", reason="the register cap is a ptxas option: the CPU interpreter has no registers")
def test_a_register_cap_changes_no_output():
    """``maxnreg`` (ptxas ``.maxnreg``: fewer registers, spills, more programs per SM) is a speed knob only: each of
    the fused layer's recipes gives bitwise the uncapped outputs at caps down to 64 registers (heavy spilling) and
    under the default table."""
    g = torch.Generator().manual_seed(41)
    x = (torch.randn(512, 1024, generator=g) * torch.exp(3 * torch.randn(512, 1, generator=g))).to(DEV)
    xb = x.to(torch.bfloat16)
    fwd = tq.mx_quantize(xb, rule="quest", mask=True, mask_bits=True, fp8="e4m3", fp8_block=1, deq=False)
    recipes = {
        "X fwd": (xb, dict(rule="quest", mask=True, mask_bits=True, fp8="e4m3", fp8_block=1, deq=False)),
        "W fwd": (x, dict(rule="quest", mask=True, mask_bits=True, cast_bf16=True, fp8="e4m3", fp8_block=128,
                          deq=False)),
        "E SR": (xb, dict(rule="absmax", stochastic=True, seed=7, signs=0x5A5A5A5A, fp8="e4m3", fp8_block=1)),
        "Et RTN": (xb, dict(rule="absmax", axis=0, signs=0x5A5A5A5A, fp8="e4m3", fp8_block=1, deq=False)),
        "Xt from FP8": (fwd.fp8, dict(rule="absmax", axis=0, in_scale=fwd.block_scale, in_scale_rows=1, fp8="e4m3",
                                      fp8_block=128, deq=False)),
    }
    for name, (t, kw) in recipes.items():
        ref = tq.mx_quantize(t, maxnreg=0, **kw)  # uncapped
        for cap in (96, 64, None):  # None: the launch kind's default (MAXNREG)
            _assert_same_outputs(ref, tq.mx_quantize(t, maxnreg=cap, **kw), ("deq", "mask_bits", "fp8", "block_scale",
                                                                            "flushed"), (name, cap))


def test_a_bad_register_cap_is_refused():
    x = torch.randn(32, 64).to(DEV)
    for bad in (8, 300, 96.0, "96"):
        with pytest.raises(ValueError, match="maxnreg"):
            tq.mx_quantize(x, maxnreg=bad)


class _LaunchSpy:
    """Stands in for ``_mx_quant_kernel``: records each launch's ``maxnreg``, then runs the real kernel."""

    def __init__(self, kernel):
        self.kernel, self.caps = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.caps.append(kw.get("maxnreg"))
            return self.kernel[grid](*args, **kw)
        return launch


def test_each_launch_kind_gets_its_register_cap(monkeypatch):
    """The block-scaled FP8 launches take the cap of their tile and read from ``MAXNREG`` (the measured table by
    default; a ``<kind> SR`` entry for stochastic rounding's); other launches, and 128×128 blocks run in slices
    (``BLOCK128_SPLIT``), are uncapped; ``maxnreg=`` overrides the table per call and ``0`` lifts the cap."""
    assert tq.MAXNREG == tq.MAXNREG_MEASURED  # nothing in the test environment overrides it
    assert tq.BLOCK128_SPLIT == tq.BLOCK128_SPLIT_MEASURED
    table = {"1x128": 91, "1x128 T": None, "1x128 T SR": 111, "128x128": 77, "128x128 T": 64}
    monkeypatch.setattr(tq, "MAXNREG", table)
    monkeypatch.setattr(tq, "BLOCK128_SPLIT", {"128x128": 1, "128x128 SR": 4, "128x128 T": 1, "128x128 T SR": 1})
    spy = _LaunchSpy(tq._mx_quant_kernel)
    monkeypatch.setattr(tq, "_mx_quant_kernel", spy)
    x = torch.randn(256, 128).to(DEV).to(torch.bfloat16)
    blk = dict(rule="absmax", fp8="e4m3", deq=False)
    for kw, cap in [(dict(fp8_block=1), 91), (dict(fp8_block=1, axis=0), None), (dict(fp8_block=128), 77),
                    (dict(fp8_block=128, axis=0), 64), (dict(fp8_block=1, maxnreg=0), None),
                    (dict(fp8_block=1, axis=0, maxnreg=80), 80),
                    # stochastic rounding takes its kind's own entry where the table has one, else the kind's
                    (dict(fp8_block=1, axis=0, stochastic=True), 111), (dict(fp8_block=1, stochastic=True), 91),
                    # a sliced 128x128 launch (here the SR kind's) runs uncapped unless the call caps it
                    (dict(fp8_block=128, stochastic=True), None), (dict(fp8_block=128, stochastic=True, maxnreg=96), 96),
                    (dict(fp8_block=128, axis=0, stochastic=True), 64)]:
        spy.caps.clear()
        tq.mx_quantize(x, **blk, **kw)
        assert spy.caps == [cap], kw
    spy.caps.clear()
    tq.mx_quantize(x, rule="quest")  # the dequantized output: a launch no cap was measured for
    tq.mx_quantize(x, rule="quest", fp8="e4m3", deq=False)  # row-scaled FP8: two launches (row exponents, fold)
    assert spy.caps == [None, None, None]


def test_direct_launches_without_fp8_take_their_own_tile_and_cap(monkeypatch):
    """A direct read writing no FP8 (dequantized values, MX codes) takes ``GPU_BLOCK_DIRECT`` and ``MAXNREG_DIRECT`` on
    the GPU when K is a multiple of the tile's 256 columns; other K, transposed and FP8 launches keep ``GPU_BLOCK``
    uncapped; ``QUARTET_QBLOCK`` names a tile for every launch and lifts the cap; the CPU interpreter keeps its tile."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # _blocks reads only the device's type
    monkeypatch.delenv("QUARTET_QBLOCK", raising=False)
    assert tq._blocks(64, 512, cuda, direct=True) == (*tq.GPU_BLOCK_DIRECT, tq.MAXNREG_DIRECT)
    assert tq._blocks(64, 384, cuda, direct=True) == (tq.GPU_BLOCK[0], 128, tq.GPU_BLOCK[2], None)
    assert tq._blocks(64, 512, cuda) == (*tq.GPU_BLOCK, None)
    assert tq._blocks(64, 512, cpu, direct=True) == (16, 64, 4, None)
    monkeypatch.setenv("QUARTET_QBLOCK", "8,64,2")
    assert tq._blocks(64, 512, cuda, direct=True) == (8, 64, 2, None)
    monkeypatch.delenv("QUARTET_QBLOCK")
    # mx_quantize asks for the direct tile exactly where it applies and launches with the tile's cap
    asked = []

    def fake_blocks(R, K, device, direct=False):
        asked.append(direct)
        return (16, 64, 4, 80) if direct else (16, 64, 4, None)

    monkeypatch.setattr(tq, "_blocks", fake_blocks)
    spy = _LaunchSpy(tq._mx_quant_kernel)
    monkeypatch.setattr(tq, "_mx_quant_kernel", spy)
    x = torch.randn(64, 256).to(DEV).to(torch.bfloat16)
    for kw, direct, cap in [(dict(), True, 80), (dict(mx=True, deq=False), True, 80), (dict(maxnreg=0), True, None),
                            (dict(maxnreg=96), True, 96), (dict(axis=0), False, None),
                            (dict(fp8="e4m3", fp8_block=1, deq=False), False, tq.MAXNREG["1x128"])]:
        asked.clear()
        spy.caps.clear()
        tq.mx_quantize(x, rule="quest", **kw)
        assert asked == [direct] and spy.caps == [cap], kw
    spy.caps.clear()
    tq.mx_quantize(x, rule="quest", block=(16, 64, 4))  # a tile named by the call: uncapped, _blocks not asked
    assert spy.caps == [None]


def test_the_register_cap_table_from_the_environment(monkeypatch):
    """``QUARTET_MAXNREG``: unset -> the measured table; ``none`` -> no caps; ``a[,b]`` -> a for the 1×128 reads, b
    (default a) for the 128×128 ones, each cap an int or ``none``; anything else a one-line error naming the variable."""
    # (an override names the four tile/read kinds: stochastic rounding's launches then take their kind's cap)
    cases = {"": tq.MAXNREG_MEASURED, "none": dict.fromkeys(["1x128", "1x128 T", "128x128", "128x128 T"]),
             "96": {"1x128": 96, "1x128 T": 96, "128x128": 96, "128x128 T": 96},
             "96,64": {"1x128": 96, "1x128 T": 96, "128x128": 64, "128x128 T": 64},
             " 80, None ": {"1x128": 80, "1x128 T": 80, "128x128": None, "128x128 T": None}}
    for text, want in cases.items():
        monkeypatch.setenv("QUARTET_MAXNREG", text)
        assert tq._caps_from_env() == want, text
    for bad in ("lots", "96,x", "96;64"):
        monkeypatch.setenv("QUARTET_MAXNREG", bad)
        with pytest.raises(ValueError, match="QUARTET_MAXNREG"):
            tq._caps_from_env()


@pytest.mark.parametrize("blk", [1, 128])
def test_transposed_fp8_input_scales_per_row_change_nothing(blk, monkeypatch):
    """A block-scaled FP8 input read transposed (the backward's X̂ᵀ and Ŵᵀ) loads its scales once per stored row of the
    tile (``IN_SCALE_PER_ROW``) instead of once per element: bitwise the same outputs, in every output mode the layer
    and the tests use, including a tile taller than 128 rows (which keeps the per-element load)."""
    g = torch.Generator().manual_seed(70 + blk)
    R, K = (256, 256) if DEV == "cpu" else (1024, 2048)
    x = (torch.randn(R, K, generator=g) * torch.exp(2 * torch.randn(R, 1, generator=g))).to(torch.bfloat16).to(DEV)
    q = tq.mx_quantize(x, rule="quest", mask=True, deq=False, fp8="e4m3", fp8_block=blk)
    base = dict(axis=0, rule="absmax", signs=0x5A5A5A5A, in_scale=q.block_scale, in_scale_rows=blk)
    cases = [dict(fp8="e4m3", fp8_block=128, deq=False), dict(fp8="e4m3", fp8_block=1, deq=False),
             dict(stochastic=True, seed=9, out_dtype=torch.float32), dict(fp8="e4m3", row_exp="exact", deq=False)]
    if DEV == "cpu":
        cases.append(dict(out_dtype=torch.float32, block=(256, 64, 4)))  # 128 % 256 != 0: the per-element load
    for kw in cases:
        out = {}
        for per_row in (False, True):
            monkeypatch.setattr(tq, "IN_SCALE_PER_ROW", per_row)
            out[per_row] = tq.mx_quantize(q.fp8, **base, **kw)
        _assert_same_outputs(out[False], out[True], ("deq", "fp8", "block_scale", "row_scale", "flushed"), kw)


def test_a_sliced_128x128_block_changes_nothing(monkeypatch):
    """``BLOCK128_SPLIT``: a 128×128-block program run as row slices that store E2M1 values and group exponents, then
    fold in place by the block's exponent, gives bitwise the one-piece tile's outputs — FP8 values, block scales, masks,
    the flush count — for the fused layer's three 128×128 recipes (W fwd, Ŵᵀ and X̂ᵀ read back from FP8, RTN and SR), on
    blocks that flush (groups 40 binades apart), hold zero groups and rows, a NaN/Inf group, and (direct reads) a last
    block cut short (R not a multiple of 128)."""
    g = torch.Generator().manual_seed(88)
    R, K = (200, 256) if DEV == "cpu" else (1000, 2048)
    x = torch.randn(R, K, generator=g) * torch.exp(2 * torch.randn(R, 1, generator=g))
    x[:, :32] *= 2.0 ** 20
    x[:, 32:64] *= 2.0 ** -20       # with the first group: flushes inside e4m3's range
    x[:, 128:160] = 0.0             # a zero group in every row of the second block column
    x[5:9, :] = 0.0                 # zero rows
    x[130, 200:203] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    x = x.to(DEV)
    xb = x.to(torch.bfloat16)
    # the saved FP8 operands the backward reads transposed (their stored rows are the new group axis: whole blocks)
    xs = xb[:128 * (R // 128)]
    fwd1 = tq.mx_quantize(xs, rule="quest", mask=True, deq=False, fp8="e4m3", fp8_block=1)
    fwd128 = tq.mx_quantize(xs, rule="quest", mask=True, deq=False, fp8="e4m3", fp8_block=128)
    rtn = dict(rule="absmax", axis=0, signs=0x5A5A5A5A, fp8="e4m3", fp8_block=128, deq=False)
    recipes = {
        "W fwd": (x, dict(rule="quest", mask=True, mask_bits=True, cast_bf16=True, fp8="e4m3", fp8_block=128,
                          deq=False)),
        "W fwd e5m2": (xb, dict(rule="quest", mask=True, fp8="e5m2", fp8_block=128, deq=False)),
        "Wt from FP8": (fwd128.fp8, dict(in_scale=fwd128.block_scale, in_scale_rows=128, **rtn)),
        "Xt from FP8": (fwd1.fp8, dict(in_scale=fwd1.block_scale, in_scale_rows=1, **rtn)),
        "Xt SR": (fwd1.fp8, dict(in_scale=fwd1.block_scale, in_scale_rows=1, stochastic=True, seed=5, **rtn)),
        "E direct": (xb, dict(rule="absmax", signs=3, fp8="e4m3", fp8_block=128)),
    }
    for name, (t, kw) in recipes.items():
        out = {}
        for split in (1, 2, 4, 8):
            monkeypatch.setattr(tq, "BLOCK128_SPLIT", tq.split_table(split))
            out[split] = tq.mx_quantize(t, **kw)
        for split in (2, 4, 8):
            _assert_same_outputs(out[1], out[split], ("deq", "mask", "mask_bits", "fp8", "block_scale", "flushed"),
                                 (name, split))
        if name == "W fwd":
            assert out[1].flushed.item() > 0  # the flush path ran
    monkeypatch.setattr(tq, "BLOCK128_SPLIT", tq.split_table(3))
    with pytest.raises(ValueError, match="BLOCK128_SPLIT"):
        tq.mx_quantize(xb, rule="absmax", fp8="e4m3", fp8_block=128)


def test_the_slices_table_from_the_environment(monkeypatch):
    """``QUARTET_QBLOCK128_SPLIT``: unset -> the measured table (per launch kind); ``n`` -> n slices for every kind;
    anything but 1, 2, 4, 8 a one-line error naming the variable."""
    monkeypatch.delenv("QUARTET_QBLOCK128_SPLIT", raising=False)
    assert tq._split_from_env() == tq.BLOCK128_SPLIT_MEASURED
    monkeypatch.setenv("QUARTET_QBLOCK128_SPLIT", " 1 ")
    assert tq._split_from_env() == tq.split_table(1)
    for bad in ("3", "four", "16"):
        monkeypatch.setenv("QUARTET_QBLOCK128_SPLIT", bad)
        with pytest.raises(ValueError, match="QUARTET_QBLOCK128_SPLIT"):
            tq._split_from_env()


@pytest.mark.parametrize("rule", ["absmax", "rtn_absmax"])
@pytest.mark.parametrize("rotate", [False, True])
def test_absmax_nonfinite_groups_are_nan_as_the_oracle(rule, rotate, monkeypatch):
    """The backward's absmax rules on groups holding Inf or NaN (an overflowed gradient): NaN values, E8M0 code 255 and
    element codes 0, NaN in block-scaled FP8 (not counted as flushes, one-piece or sliced 128×128 blocks) — as the
    oracle and QuEST — and every other group bitwise the oracle's. (The GPU's plain max drops NaN and its min turns NaN
    into 6: before, such a group came back as finite values and hid the overflow.)"""
    g = torch.Generator().manual_seed(90)
    x = torch.randn(128, 256, generator=g)
    x[4, 3] = float("inf")
    x[5, 40] = float("nan")          # one NaN among 31 finite values: a plain max would drop it
    x[6, 0] = -float("inf")
    x[7, 64:96] = float("nan")       # a group of NaN only
    x = x.to(torch.bfloat16)
    xf = x.float()
    rot = hadamard.block_hadamard(xf, 32, None) if rotate else xf
    ref = mx.absmax_mxfp4(rot) if rule == "absmax" else mx.rtn_absmax_mxfp4(rot)
    nan_g = torch.isnan(mx.absmax_scales(rot))
    assert nan_g.sum().item() == 4 and torch.equal(torch.isnan(ref), nan_g.repeat_interleave(32, -1))
    out = tq.mx_quantize(x.to(DEV), rule=rule, hadamard=rotate, mx=True, out_dtype=torch.float32)
    assert _equal_nan(out.deq, ref)
    assert torch.equal(out.e8m0.cpu() == 255, nan_g)
    assert (out.codes.cpu().reshape(128, -1, 16)[nan_g] == 0).all()
    for blk, split in ((1, 1), (128, 1), (128, 4)):  # (slices apply to 128x128 blocks only)
        monkeypatch.setattr(tq, "BLOCK128_SPLIT", tq.split_table(split))
        f = tq.mx_quantize(x.to(DEV), rule=rule, hadamard=rotate, fp8="e4m3", fp8_block=blk, out_dtype=torch.float32)
        v = f.fp8_values().cpu()
        assert torch.equal(torch.isnan(v), torch.isnan(ref)), (blk, split)
        ok = ~torch.isnan(v)
        assert f.flushed.item() == (v[ok] != ref[ok]).sum().item() == 0, (blk, split)


def _mx_edge_matrix() -> torch.Tensor:
    """A float32 (128, 256) matrix with every edge of the non-finite rule (docs/precision.md) in its own 32-groups:
    row 0 NaN / +Inf / -Inf / all-NaN groups; row 1 all zero and row 2 a zero group; row 3 groups of float32
    subnormals (1 to 3 ulps of 2^-149, ~1e-40, ~1e-39); row 4 group maxima a hair below powers of two; row 5 huge
    finite groups (2.5e38, 1e38); the other rows random."""
    g = torch.Generator().manual_seed(31)
    x = torch.randn(128, 256, generator=g)
    x[0, 5], x[0, 40], x[0, 70] = float("nan"), float("inf"), -float("inf")
    x[0, 96:128] = float("nan")
    x[1] = 0.0
    x[2, 32:64] = 0.0
    tiny = 2.0 ** -149
    x[3, :32] = torch.randint(-3, 4, (32,), generator=g).float() * tiny
    x[3, 32:64] = torch.randint(-1, 2, (32,), generator=g).float() * tiny
    x[3, 64:96] = torch.randn(32, generator=g) * 1e-40
    x[3, 96:128] = torch.randn(32, generator=g) * 1e-39
    x[4] = torch.rand(256, generator=g) * 0.5
    for j in range(8):
        x[4, 32 * j + j] = 2.0 ** (4 * j - 14) * (1 - 2.0 ** -24) * (-1) ** j
    x[5, :32] = torch.randn(32, generator=g).sign() * 2.5e38
    x[5, 32:64] = torch.randn(32, generator=g) * 1e38 / 4
    return x


@pytest.mark.parametrize("dev", [pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("rule", ["quest", "absmax", "rtn_absmax"])
def test_edge_groups_equal_the_oracle_in_every_output(rule, dev, monkeypatch):
    """Every MX rule on :func:`_mx_edge_matrix` (float32, unrotated: the rotated NaN/Inf cases are
    test_absmax_nonfinite_groups_are_nan_as_the_oracle and test_quest_overflowing_and_nonfinite_groups_bitwise):
    dequantized values bitwise the oracle's with NaN in exactly the groups holding NaN/Inf, the QuEST mask, E8M0 and
    element codes as the oracle's storage form, and FP8 (1x128, 128x128 one-piece and sliced blocks, per-row fold)
    NaN in exactly those groups and elsewhere the oracle's values except the counted flushes."""
    x = _mx_edge_matrix()
    ref = {"quest": lambda t: mx.quest_mxfp4(t)[0], "absmax": mx.absmax_mxfp4, "rtn_absmax": mx.rtn_absmax_mxfp4}[rule](x)
    scales = mx.quest_scales(x) if rule == "quest" else mx.absmax_scales(x)
    nan_g = torch.isnan(scales)
    assert nan_g.sum().item() == 4 and nan_g[0, :4].all()
    assert torch.equal(torch.isnan(ref), nan_g.repeat_interleave(32, -1)) and (ref[1:3][x[1:3] == 0] == 0).all()
    factor = 4.0 / 3.0 if rule == "absmax" else 1.0
    codes, e8 = mx.mx_codes(ref, scales, factor=factor)
    out = tq.mx_quantize(x.to(dev), rule=rule, hadamard=False, mask=rule == "quest", mx=True, out_dtype=torch.float32)
    assert _equal_nan(out.deq, ref)
    if rule == "quest":
        assert torch.equal(out.mask.cpu(), mx.quest_mxfp4(x)[1])
    assert torch.equal(out.e8m0.cpu(), e8)
    assert torch.equal(out.codes.cpu(), formats.pack_e2m1(codes))
    for kw, split in ((dict(fp8_block=1), 1), (dict(fp8_block=128), 1), (dict(fp8_block=128), 4),
                      (dict(row_exp="exact"), 1), (dict(row_exp="fused"), 1)):
        monkeypatch.setattr(tq, "BLOCK128_SPLIT", tq.split_table(split))
        f = tq.mx_quantize(x.to(dev), rule=rule, hadamard=False, fp8="e4m3", out_dtype=torch.float32, **kw)
        v = f.fp8_values().cpu()
        assert torch.equal(torch.isnan(v), torch.isnan(ref)), (kw, split)
        assert torch.isfinite(v[1:]).all() and (v[1:3][x[1:3] == 0] == 0).all(), (kw, split)
        ok = ~torch.isnan(v)
        if rule == "absmax":
            # (not row 3: its 1x128 block scale 2^(e-6)·4/3 is a float32 subnormal, rounded before it multiplies the
            # codes, so a decoded value may differ from the oracle's by that rounding without being a counted flush)
            ok[3] = False
            assert f.flushed.item() >= (v[ok] != ref[ok]).sum().item(), (kw, split)
        else:
            assert f.flushed.item() == (v[ok] != ref[ok]).sum().item(), (kw, split)
        if kw.get("fp8_block") != 128:  # the random rows fold exactly (a 128x128 block shares row 5's huge exponent)
            assert torch.equal(v[6:], ref[6:]), (kw, split)
