"""The recipe quantizer kernels (quartet.kernels.recipe_quant) against the pure-PyTorch oracle.

Deterministic kinds bitwise (values, group scales, tensor / row scales) on fresh random inputs, plain and transposed
reads, rotated and not, and on the formats' edges; stochastic kinds in distribution (each output one of the oracle's
two grid neighbours, unbiased over many draws, reproducible per seed). On a CPU box the kernels run in Triton's
interpreter on small shapes; on a GPU the same tests run on the device at larger ones.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from quartet.kernels import recipe_quant as rq  # noqa: E402
from quartet.quant import blockwise, formats, hadamard, mx, quartet2  # noqa: E402
from quartet.quant.quantizers import QuantizerSpec, ms_fp4_quantize  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
#: (rows, reduction) of the logical operand; multiples of 128 (the largest group / tile / Hadamard block)
SHAPE = (48, 128) if DEV == "cpu" else (1024, 2048)

MXFP8 = QuantizerSpec("mxfp8", group=32)
NVFP4 = QuantizerSpec("nvfp4", group=16)
NVFP4_SR = QuantizerSpec("nvfp4", group=16, stochastic=True)
NVFP4_2D = QuantizerSpec("nvfp4", group=16, tile_rows=16)
FOUR_SIX = QuantizerSpec("nvfp4_4o6", group=16)
EDEN = QuantizerSpec("ms_eden", group=16)
FP8_1x128 = QuantizerSpec("fp8", fmt="e4m3", scaling="block", group=128, tile_rows=1)
FP8_128 = QuantizerSpec("fp8", fmt="e4m3", scaling="block", group=128, tile_rows=128)
E5M2 = QuantizerSpec("fp8", fmt="e5m2", scaling="tensor")
E4M3 = QuantizerSpec("fp8", fmt="e4m3", scaling="tensor")
LUQ = QuantizerSpec("luq", stochastic=True)
INT4 = QuantizerSpec("int4", scaling="row")


class same:
    """Bitwise-equal values with NaN in the same places (and -0 == +0); false, it tells where (its repr)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor):
        self.a, self.b = a.float().cpu(), b.float().cpu()
        self.ok = self.a.shape == self.b.shape and bool(((self.a == self.b) | (self.a.isnan() & self.b.isnan())).all())

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        if self.a.shape != self.b.shape:
            return f"shapes {tuple(self.a.shape)} != {tuple(self.b.shape)}"
        bad = ~((self.a == self.b) | (self.a.isnan() & self.b.isnan()))
        idx = bad.nonzero()[:6].tolist()
        return f"{int(bad.sum())} differ, e.g. " + ", ".join(f"{i}: {self.a[tuple(i)]} vs {self.b[tuple(i)]}" for i in idx)


def _source(shape, axis, seed, dtype=torch.bfloat16, spread=True):
    """A stored tensor whose logical operand (axis) has ``shape``; rows of different magnitudes."""
    g = torch.Generator().manual_seed(seed)
    r, k = shape
    x = torch.randn(r, k, generator=g)
    if spread:
        x = x * torch.exp(torch.randn(r, 1, generator=g) * 1.5)
    x = x.to(dtype)
    return (x if axis == -1 else x.t().contiguous()), x.float()


def _seed(v: int) -> torch.Tensor:
    return torch.tensor([v], dtype=torch.int64, device=DEV)


def _nvfp4_oracle(spec, xl):
    if spec.kind == "nvfp4" and spec.tile_rows > 1:
        return blockwise.nvfp4_quantize_2d(xl, 16)
    if spec.kind == "nvfp4":
        return mx.nvfp4_quantize(xl, False, None, 16)
    return quartet2.nvfp4_four_over_six(xl, 16)


def _expand(gs: torch.Tensor, rows: int, cols: int, shape) -> torch.Tensor:
    return blockwise.expand_tile_scales(gs.float().cpu(), rows, cols, shape)


def _check_nvfp4_like(spec, out, xl):
    """values = q·block exactly; block and tensor scale bitwise; q·(block·S) is the oracle's x̂."""
    xq, block, ts = _nvfp4_oracle(spec, xl)
    rows = spec.tile_rows
    assert same(out.gscale, block.reshape(out.gscale.shape)), "block scales"
    assert same(out.post, ts), "tensor scale"
    g = _expand(out.gscale, rows, 16, xl.shape)
    q = out.values.float().cpu() / g
    assert same(q * (g * out.post.cpu()), xq), "x̂ = q·(block·S)"


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("spec", [NVFP4, NVFP4_2D, FOUR_SIX], ids=["nvfp4", "nvfp4_2d", "4o6"])
def test_nvfp4_kinds_bitwise(spec, axis):
    x, xl = _source(SHAPE, axis, seed=3 + axis)
    out = rq.recipe_quantize(x.to(DEV), spec, axis=axis, gscale=True)
    assert out.values.dtype == torch.bfloat16 and out.values.shape == SHAPE
    _check_nvfp4_like(spec, out, xl)


def test_four_over_six_takes_both_branches():
    x, xl = _source(SHAPE, -1, seed=11)
    out = rq.recipe_quantize(x.to(DEV), FOUR_SIX, gscale=True)
    _, block, ts = quartet2.nvfp4_four_over_six(xl)
    amax_g = xl.reshape(SHAPE[0], -1, 16).abs().amax(-1)
    four = block == mx.e4m3_block_scale(amax_g, 4.0, ts)
    assert 0 < int(four.sum()) < four.numel()  # the test exercises both branches
    _check_nvfp4_like(FOUR_SIX, out, xl)


@pytest.mark.parametrize("axis", [-1, 0])
def test_mxfp8_bitwise(axis):
    x, xl = _source(SHAPE, axis, seed=5, spread=True)
    out = rq.recipe_quantize(x.to(DEV), MXFP8, axis=axis, gscale=True, out_dtype=torch.float32)
    assert same(out.values, mx.mxfp8_quantize(xl))
    assert same(out.gscale, mx.mxfp8_scales(xl))
    bf = rq.recipe_quantize(x.to(DEV), MXFP8, axis=axis)
    assert same(bf.values, out.values)  # exact in BF16 away from the subnormal range


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("spec", [FP8_1x128, FP8_128], ids=["1x128", "128x128"])
def test_fp8_tiles_bitwise(spec, axis):
    shape = (256, 256) if DEV == "cpu" else SHAPE
    x, xl = _source(shape, axis, seed=9)
    out = rq.recipe_quantize(x.to(DEV), spec, axis=axis)
    codes, scale = blockwise.fp8_blockwise_codes(xl, spec.tile_rows, 128, "e4m3")
    assert out.values.dtype == torch.float8_e4m3fn and out.values.is_contiguous()
    assert same(out.values, codes)
    nr = scale.shape[0]
    assert same(out.gscale[:nr, :scale.shape[1]], scale)
    if spec.tile_rows == 1:
        assert out.gscale.stride() == (1, shape[0])  # what F.scaled_mm's BlockWise1x128 reads


@pytest.mark.parametrize("spec", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_fp8_tensor_bitwise(spec):
    x, xl = _source(SHAPE, -1, seed=13)
    out = rq.recipe_quantize(x.to(DEV), spec)
    xq, scale = formats.fp8_quantize(xl, spec.fmt, "tensor")
    assert same(out.post, scale)
    assert same(out.values.float().cpu() * out.post.cpu(), xq)


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("block", [16, 128])
@pytest.mark.parametrize("with_signs", [False, True])
def test_rotated_nvfp4_bitwise(axis, block, with_signs):
    x, xl = _source(SHAPE, axis, seed=17 + block)
    g = torch.Generator().manual_seed(block)
    signs = hadamard.random_signs(block, g) if with_signs else None
    out = rq.recipe_quantize(x.to(DEV), NVFP4, axis=axis, hadamard=block, signs=signs, gscale=True)
    _check_nvfp4_like(NVFP4, out, hadamard.block_hadamard(xl, block, signs))


def test_in_scale_reads_an_fp8_operand_back():
    """Codes times their 1×128 scales, read transposed and re-tiled (fp8_deepseek's X̂ᵀ): as the oracle on x̂."""
    shape = (256, 256)
    x, xl = _source(shape, -1, seed=21)
    q1 = rq.recipe_quantize(x.to(DEV), FP8_1x128)
    xhat = q1.values.float().cpu() * _expand(q1.gscale, 1, 128, shape)
    out = rq.recipe_quantize(q1.values, FP8_1x128, axis=0, in_scale=q1.gscale, in_scale_rows=1)
    codes, scale = blockwise.fp8_blockwise_codes(xhat.t(), 1, 128, "e4m3")
    assert same(out.values, codes) and same(out.gscale, scale)


# ---- rows ----------------------------------------------------------------------------------------------------
def test_int4_rows_bitwise():
    x, xl = _source(SHAPE, -1, seed=23)
    out = rq.row_quantize(x.to(DEV), INT4, deq=True, deq_dtype=torch.float32)
    xq, scale = formats.int4_quantize(xl, "row")
    assert same(out.post, scale.reshape(-1))
    assert same(out.values.float().cpu() * out.post.cpu()[:, None], xq)
    assert same(out.deq, xq)


@pytest.mark.parametrize("occ,dge", [(0.0, 0.0), (0.99, 0.0), (0.0, 5.0)])
def test_ms_fp4_rows(occ, dge):
    x, xl = _source(SHAPE, -1, seed=29)
    spec = QuantizerSpec("ms_fp4", clip_quantile=occ, dge_k=dge)
    out = rq.row_quantize(x.to(DEV), spec, deq=True, factor=True, deq_dtype=torch.float32)
    ref = ms_fp4_quantize(xl, occ, dge, 3.0)
    assert same(out.post, ref.data["scale"].reshape(-1))
    assert same(out.values.float().cpu() * out.post.cpu()[:, None], ref.values)
    assert same(out.deq, ref.dequantized())
    if dge:
        # exp2/log2 against torch.pow: a few ulps
        torch.testing.assert_close(out.factor.cpu(), ref.grad_factor, rtol=1e-5, atol=1e-6)
    else:
        assert out.factor is None
    if occ:
        assert float((ref.residual != 0).float().mean()) > 0.005  # the clamp bit


# ---- edges -----------------------------------------------------------------------------------------------------
DETERMINISTIC = {"mxfp8": MXFP8, "nvfp4": NVFP4, "nvfp4_2d": NVFP4_2D, "4o6": FOUR_SIX, "fp8_1x128": FP8_1x128,
                 "fp8_128x128": FP8_128, "e4m3": E4M3, "e5m2": E5M2, "int4": INT4,
                 "ms_fp4": QuantizerSpec("ms_fp4", clip_quantile=0.99, dge_k=5.0)}


@pytest.mark.parametrize("name", list(DETERMINISTIC))
def test_edges_bitwise(name, edge_tensors):
    """NaN/±Inf groups, zeros, subnormals a few ulps above 0, tiny and huge values: exactly the oracle's x̂ (float32
    values), the unit holding a non-finite value NaN and every other unit untouched."""
    spec = DETERMINISTIC[name]
    for edge, x in edge_tensors((32, 128) if spec.tile_rows < 128 else (128, 128)).items():
        if spec.kind in ("int4", "ms_fp4"):
            out = rq.row_quantize(x.to(DEV), spec, deq=True, deq_dtype=torch.float32)
            ref = (formats.int4_quantize(x, "row")[0] if spec.kind == "int4"
                   else ms_fp4_quantize(x, spec.clip_quantile, spec.dge_k, spec.dge_cap).dequantized())
            assert (check := same(out.deq, ref)), (name, edge, check)
            continue
        group_scaled = not (spec.kind == "fp8" and spec.scaling == "tensor")  # FP8 tensor: one scale, the post
        out = rq.recipe_quantize(x.to(DEV), spec, gscale=group_scaled, out_dtype=torch.float32)
        if spec.kind == "mxfp8":
            assert same(out.values, mx.mxfp8_quantize(x)), (name, edge)
        elif spec.kind in ("nvfp4", "nvfp4_4o6"):
            xq, block, ts = _nvfp4_oracle(spec, x)
            assert same(out.gscale, block) and same(out.post, ts), (name, edge)
            gs = _expand(out.gscale, spec.tile_rows, 16, x.shape)
            q = torch.where(gs == 0, 0.0, out.values.cpu() / gs)
            assert same(q * (gs * out.post.cpu()), xq), (name, edge)
        elif spec.scaling == "block":
            codes, scale = blockwise.fp8_blockwise_codes(x, spec.tile_rows, 128, "e4m3")
            # 128x128 scales come padded to 4 columns (quartet.kernels.gemm's layout)
            assert same(out.values, codes) and same(out.gscale[:, :scale.shape[1]], scale), (name, edge)
        else:
            xq, scale = formats.fp8_quantize(x, spec.fmt, "tensor")
            assert same(out.post, scale), (name, edge)
            assert same(out.values.cpu() * out.post.cpu(), xq), (name, edge)


def test_e4m3_rounding_on_ties_and_binade_edges():
    """The arithmetic E4M3 rounding (_rne_fp8) on the values torch's cast decides: midpoints (ties to even), values
    just below a power of two, subnormals, 448 and beyond, through the FP8 1×128 kind's unit scale 1."""
    grid = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mids = (grid[1:] + grid[:-1]) / 2
    below = torch.nextafter(grid[1:], torch.zeros_like(grid[1:]))
    vals = torch.cat([grid, mids, below, torch.tensor([2.0 ** -10, 3 * 2.0 ** -11, 5 * 2.0 ** -11])])
    vals = torch.cat([vals, -vals])
    rows = -(-vals.numel() // 127)  # 127 values and one 448 per 128-tile: every tile's scale is amax/448 = 1
    x = torch.zeros(rows * 127)
    x[: vals.numel()] = vals
    x = torch.cat([x.reshape(rows, 127), torch.full((rows, 1), 448.0)], 1)
    out = rq.recipe_quantize(x.to(DEV), FP8_1x128)
    codes, scale = blockwise.fp8_blockwise_codes(x, 1, 128, "e4m3")
    assert bool((scale == 1).all())
    assert same(out.values, codes)


# ---- stochastic kinds ------------------------------------------------------------------------------------------
def assert_unbiased(draws: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, target: torch.Tensor):
    """``draws`` (n, ...) each lo or hi, with target in [lo, hi] their expectation: every element's mean within
    6 theoretical standard errors (plus one step/n for the draws' discreteness), and all elements' errors
    together within 5 standard errors of 0."""
    n = draws.shape[0]
    gap = hi - lo
    p = torch.where(gap > 0, (target - lo) / torch.where(gap > 0, gap, 1), 0.0)
    sd = gap * (p * (1 - p)).clamp(min=0).sqrt()
    err = draws.mean(0) - target
    assert bool((err.abs() <= 6 * sd / n ** 0.5 + gap / n + 1e-6 * target.abs()).all())
    z = float(err.sum() * n / (n * sd.square().sum()).sqrt())
    assert abs(z) < 5, z


#: one block of values, repeated: every copy draws independently (Philox offsets differ) at the same tensor amax
BLOCK = (4, 128)


def _replicated(copies: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``copies`` stacked copies of one :data:`BLOCK` (same tensor amax): independent draws of the same values."""
    x, xl = _source(BLOCK, -1, seed=seed)
    return x.repeat(copies, 1), xl


def test_nvfp4_sr_neighbours_unbiased_and_reproducible():
    copies = 200
    x, xl = _replicated(copies, 31)
    out = rq.recipe_quantize(x.to(DEV), NVFP4_SR, seed=_seed(7), gscale=True)
    again = rq.recipe_quantize(x.to(DEV), NVFP4_SR, seed=_seed(7))
    other = rq.recipe_quantize(x.to(DEV), NVFP4_SR, seed=_seed(8))
    assert same(out.values, again.values) and not same(out.values, other.values)
    # the RTN quantizer's scales (the SR recipe shares them): q/… in {floor, ceil} of y/s on the E2M1 grid
    _, block, ts = mx.nvfp4_quantize(xl, False, None, 16)
    s = (block * ts).repeat(copies, 1).repeat_interleave(16, 1)
    t = xl.repeat(copies, 1) / s
    grid = formats.E2M1_GRID
    a = t.abs().clamp(max=6)
    lo = grid[torch.bucketize(a, grid, right=True) - 1]
    hi = grid[torch.bucketize(a, grid, right=False).clamp(max=7)]
    q = (out.values.float().cpu() / block.repeat(copies, 1).repeat_interleave(16, 1)).abs()
    assert bool(((q == lo) | (q == hi)).all())
    # unbiased: the mean over the copies is y/s clipped to ±6 (the RTN block scale may round down: NVFP4's bias)
    tq = t.clamp(-6, 6).abs().reshape(copies, *BLOCK)[0]
    assert_unbiased(q.reshape(copies, *BLOCK), lo.reshape(copies, *BLOCK)[0], hi.reshape(copies, *BLOCK)[0], tq)
    # uncorrelated across seeds: two seeds' rounding decisions coincide as often as independent draws would
    # (element i rounds up with p_i in either draw: P(both) = p_i²)
    gap = hi - lo
    p_up = torch.where(gap > 0, (t.clamp(-6, 6).abs() - lo) / torch.where(gap > 0, gap, 1), 0.0)
    up1 = q == torch.where(gap > 0, hi, -1)
    up2 = (other.values.float().cpu() / block.repeat(copies, 1).repeat_interleave(16, 1)).abs() == torch.where(
        gap > 0, hi, -1)
    both, expect = (up1 & up2).float(), p_up.square()
    se = float((expect * (1 - expect)).sum().sqrt()) / both.numel()
    assert abs(float(both.mean() - expect.mean())) < 5 * se


def test_ms_eden_scales_are_e4m3_neighbours_and_unbiased():
    copies = 200
    x, xl = _replicated(copies, 37)
    xr = hadamard.block_hadamard(xl, 128, None)
    out = rq.recipe_quantize(x.to(DEV), EDEN, hadamard=128, seed=_seed(3), gscale=True)
    # the oracle without the scale's rounding: RTN elements and the EDEN-corrected scale (its mean over draws)
    xq_mean, scale, ts = quartet2.ms_eden_quantize(xr, None, 16, stochastic=False)
    assert same(out.post, ts)
    sc = out.gscale.cpu().reshape(copies, BLOCK[0], 8)
    # every drawn scale is one of the two E4M3 neighbours of the unrounded one
    spacing = 2.0 ** (formats.floor_log2(scale.abs()).clamp(min=-6) - 3)
    lo = torch.floor(scale / spacing) * spacing
    assert bool(((sc == lo) | (sc == lo + spacing)).all())
    # unbiased scale (and so x̂)
    assert_unbiased(sc, lo, lo + spacing, scale)
    # the elements are the oracle's RTN codes
    g = mx._grouped(xr, 16)
    block = mx.e4m3_block_scale(g.abs().amax(-1), quartet2.MS_EDEN_CLIP, ts)
    q_ref, _ = quartet2._rtn(g, block, ts)
    q = out.values.float().cpu().reshape(copies, BLOCK[0], 8, 16) / sc[..., None]
    assert same(q, q_ref.expand(copies, -1, -1, -1))


def test_luq_neighbours_and_unbiased():
    copies = 200
    x, xl = _replicated(copies, 41)
    out = rq.recipe_quantize(x.to(DEV), LUQ, seed=_seed(5))
    A = xl.abs().amax()
    assert same(out.post, A)
    v = out.values.float().cpu().reshape(copies, *BLOCK)
    # every value is 0 or ±2^-j, j = 0..6, with x's sign
    mag = v.abs()
    pow2 = (mag == 0) | (mag == 2.0 ** formats.floor_log2(mag.clamp(min=2.0 ** -20)).float())
    assert bool(pow2.all()) and bool(((mag == 0) | (mag >= 2.0 ** -6)).all()) and bool((mag <= 1).all())
    assert bool(((v == 0) | (torch.sign(v) == torch.sign(xl))).all())
    # unbiased: the two levels bracketing |x| (0 and alpha below alpha = A/64)
    a = xl.abs() / A
    lo_l = torch.where(a < 2.0 ** -6, torch.zeros_like(a), 2.0 ** formats.floor_log2(a.clamp(min=2.0 ** -6)).float())
    hi_l = torch.where(a < 2.0 ** -6, torch.full_like(a, 2.0 ** -6), (2 * lo_l).clamp(max=1))
    assert bool(((mag == lo_l) | (mag == hi_l)).all())
    assert_unbiased(mag, lo_l, hi_l, a)


def test_stochastic_kinds_need_a_seed():
    x, _ = _source((16, 128), -1, seed=1)
    with pytest.raises(ValueError, match="seed"):
        rq.recipe_quantize(x.to(DEV), NVFP4_SR)


def test_tensor_scaled_kinds_have_no_group_scales_to_give():
    x, _ = _source((16, 128), -1, seed=1)
    for spec in (E4M3, LUQ):
        with pytest.raises(ValueError, match="no group scales"):
            rq.recipe_quantize(x.to(DEV), spec, gscale=True, seed=torch.tensor([1], device=DEV))


def test_ms_eden_keeps_a_group_below_the_scales_range_finite():
    """A tensor whose amax (2^-131) puts blk·S below float32's range: the group of 2^-149 values has t clamped to
    ±FLT_MAX, whose sums overflow; the correction is skipped there, so finite inputs give finite values."""
    x = torch.zeros(16, 128)
    x[0, 0] = 2.0 ** -131
    x[1, :] = 2.0 ** -149
    out = rq.recipe_quantize(x.to(DEV), EDEN, seed=torch.tensor([3], device=DEV), gscale=True,
                             out_dtype=torch.float32)
    assert bool(torch.isfinite(out.values.cpu()).all()) and bool(torch.isfinite(out.gscale.cpu()).all())
    assert float(out.values.cpu()[0, 0] * out.post.cpu()) > 0  # the amax element survives


def test_dge_with_k_1_is_one_everywhere_as_the_oracle():
    """k = 1: the DGE derivative's exponent 1/k − 1 is 0, so the factor is 1/k = 1 at every value, interval midpoints
    (t = 0, where exp2(log2(0)·0) would be NaN) included."""
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 1.0, 0.0, -0.25, -5.0])
    x = torch.cat([mids, torch.zeros(128 - mids.numel())]).repeat(16, 1)
    x[:, -1] = 6.0  # each row's scale amax/6 = 1: the values are their own scaled values
    spec = QuantizerSpec("ms_fp4", dge_k=1.0)
    out = rq.row_quantize(x.to(DEV), spec, deq=True, factor=True, deq_dtype=torch.float32)
    ref = ms_fp4_quantize(x, 0.0, 1.0, 3.0)
    assert same(out.post, ref.data["scale"].reshape(-1))
    assert bool((ref.grad_factor == 1).all())
    assert same(out.factor, ref.grad_factor)


def test_unsupported_spec_and_shape_say_why():
    x, _ = _source((16, 128), -1, seed=1)
    with pytest.raises(ValueError, match="does not run"):
        rq.recipe_quantize(x.to(DEV), QuantizerSpec("quest"))
    with pytest.raises(ValueError, match="multiple of 16"):
        rq.recipe_quantize(x[:, :120].contiguous().to(DEV), NVFP4)
