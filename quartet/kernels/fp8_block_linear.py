"""DeepSeek-V3 FP8 on Hopper tensor cores: the ``fp8_deepseek`` scheme's three GEMMs through ``F.scaled_mm``'s
block-wise recipes.

The scheme (:func:`quartet.quant.schemes.build_scheme`, maths in :mod:`quartet.quant.blockwise`): E4M3 codes with
one float32 scale per 1×128 tile of activations / gradients and per 128×128 block of weights. Writing
``Q₁(T)`` for 1×128 tiles along T's last dim and ``Q₁₂₈(W)`` for 128×128 blocks:

    forward   Y  = Q₁(X) · Q₁₂₈(W)ᵀ            BlockWise1x128 × BlockWise128x128   (reduces in_features)
    input     dX = Q₁(E) · Ŵ                   BlockWise1x128 × BlockWise128x128   (reduces out_features; Ŵ reused)
    weight    dW = Q₁(Eᵀ) · Q₁(X̂ᵀ)ᵀ            BlockWise1x128 × BlockWise1x128     (reduces tokens; X̂ re-tiled)

The codes and scales come from one fused Triton kernel per operand (:func:`quartet.kernels.recipe_quant.recipe_quantize`:
amax, ``amax·(1/448)``, a correctly rounded divide, round-to-nearest-even with saturation, the scales written in the
layouts ``F.scaled_mm`` reads), bitwise the oracle's :func:`quartet.quant.blockwise.fp8_blockwise_codes` (a tile
holding NaN/±Inf included: NaN scale and codes, so its GEMM rows go NaN); only the GEMMs differ, by the order of their
float32 accumulation. Shapes the kernel does not tile (not multiples of 128) take the oracle's functions. The
backward keeps the forward's FP8 codes (Ŵ for the input gradient — a 128×128 block transposes into a block — and
X̂, re-quantized along the token axis for the weight gradient straight from its codes and scales), as DeepSeek-V3
caches FP8 activations. The kernel calls are registered operators: the layer compiles and CUDA-graphs.

The recipe's forward-only and backward-only variants (``fp8_deepseek_fwd`` / ``_bwd``, :func:`part`) run the
quantized half as above and the other on BF16 tensor cores (:class:`FP8BlockForwardOnlyFn`,
:class:`FP8BlockBackwardOnlyFn`).

cuBLAS wants every GEMM dimension tiled by 128 here: in/out features must be multiples of 128 (other layers stay
on the operand-by-operand path) and tokens are zero-padded to 128 (zero rows change no tile maximum and no sum).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from quartet.kernels import recipe_quant as rq
from quartet.kernels.fp8_linear import token_padded
from quartet.kernels.gemm import bf16_matmul
from quartet.quant.blockwise import expand_tile_scales, fp8_blockwise_codes
from quartet.quant.linear import QuantLinear
from quartet.quant.quantizers import QuantizerSpec

E4M3 = torch.float8_e4m3fn
#: block edge of the DeepSeek-V3 recipe (and of cuBLAS's block-wise FP8 scaling)
BLOCK = 128


_TILE_SPECS = {rows: QuantizerSpec("fp8", fmt="e4m3", scaling="block", group=BLOCK, tile_rows=rows) for rows in (1, BLOCK)}


@torch.library.custom_op("quartet::fp8_tiles", mutates_args=())
def fp8_tiles(x: torch.Tensor, rows: int, axis: int, in_scale: torch.Tensor | None,
              in_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 codes (R, C) row-major of the logical operand (``x``, or ``xᵀ`` read down with ``axis=0``) and their
    ``rows``×128 tile scales as stored: 1×128 (C/128, R) — its transpose is the (R, C/128) outer-dim-major view
    ``F.scaled_mm`` takes —, 128×128 (R/128, C/128 padded to 4, padding ones). ``in_scale``: x is FP8 codes with
    these ``in_rows``×128 tile scales (multiplied on load)."""
    out = rq.recipe_quantize(x, _TILE_SPECS[rows], axis=axis, in_scale=in_scale, in_scale_rows=in_rows)
    return out.values, (out.gscale.t() if rows == 1 else out.gscale)


@fp8_tiles.register_fake
def _(x, rows, axis, in_scale, in_rows):
    R, C = (x.shape[1], x.shape[0]) if axis == 0 else tuple(x.shape)
    codes = x.new_empty((R, C), dtype=E4M3)
    if rows == 1:
        return codes, x.new_empty((C // BLOCK, R), dtype=torch.float32)
    return codes, x.new_empty((R // BLOCK, -(-(C // BLOCK) // 4) * 4), dtype=torch.float32)


def _kernel_tiles(t: torch.Tensor, R: int, C: int, rows: int) -> bool:
    """Whether the Triton kernel tiles this operand: whole tiles, on a GPU (or Triton's CPU interpreter)."""
    return (rq.HAS_TRITON and C % BLOCK == 0 and R % rows == 0
            and (t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"))


def quantize_fp8_blocks(t: torch.Tensor, rows: int, axis: int = -1, in_scale: torch.Tensor | None = None,
                        in_rows: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 codes (R, C), float32 scales (R/rows, C/128)) of a 2-D tensor (or its transpose, ``axis=0``) with
    ``rows``×128 tiles (rows 1 or 128); ``codes.float() * scale`` (broadcast over tiles) is the oracle's x̂ bitwise.
    ``in_scale``: ``t`` holds FP8 codes with these ``in_rows``×128 tile scales. A 1×128 scale comes as the
    outer-dim-major view ``F.scaled_mm`` reads."""
    R, C = (t.shape[1], t.shape[0]) if axis == 0 else tuple(t.shape)
    if _kernel_tiles(t, R, C, rows):
        codes, stored = fp8_tiles(t, rows, axis, in_scale, in_rows)
        return codes, (stored.t() if rows == 1 else stored[:, : C // BLOCK])
    src = t.float() if in_scale is None else dequantize_fp8_blocks(t, in_scale, in_rows)
    codes, scale = fp8_blockwise_codes(src.t() if axis == 0 else src, rows, BLOCK, "e4m3")
    return codes.to(E4M3), scale


def dequantize_fp8_blocks(codes: torch.Tensor, scale: torch.Tensor, rows: int) -> torch.Tensor:
    """x̂ = codes · scale as float32 (the oracle's multiplication, element for element)."""
    return codes.float() * expand_tile_scales(scale, rows, BLOCK, codes.shape)


# Scale layouts: those PyTorch's meta registration of ``F.scaled_mm`` checks (torch/_meta_registrations.py, the
# BlockWise1x128 / BlockWise128x128 cases): a 1×128 operand's scales (rows, K/128) with stride (1, rows); a
# 128×128 second operand's (L4, N/128) with stride (1, L4), L4 = K/128 rounded up to a multiple of 4.
def _left_scale(s: torch.Tensor) -> torch.Tensor:
    """A 1×128 operand's (R, C/128) scales stored outer-dim-major (column-major), the layout cuBLAS reads."""
    return s.t().contiguous().t()


def _block_scale_of_mat2(s: torch.Tensor) -> torch.Tensor:
    """A 128×128 right operand b (R, C) with block scales ``s`` (R/128, C/128) → the scale of ``b.T`` as
    ``F.scaled_mm`` takes it: (C/128 padded to 4, R/128) with stride (1, padded) (as :mod:`quartet.kernels.gemm`'s
    block-scaled GEMM passes it)."""
    r, c = s.shape
    buf = torch.ones(r, -(-c // 4) * 4, device=s.device, dtype=torch.float32)
    buf[:, :c] = s
    return buf.t()


@torch.library.custom_op("quartet::blockwise_scaled_mm", mutates_args=())
def blockwise_scaled_mm(a8: torch.Tensor, b8_t: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                        b_block_rows: int, out_dtype: torch.dtype) -> torch.Tensor:
    """``F.scaled_mm(a8, b8_t, …)`` with a's 1×128 recipe and b's 1×128 or 128×128 one, as a registered operator:
    Dynamo cannot trace ``F.scaled_mm`` itself (torch 2.11 breaks the graph there), an operator it can."""
    recipe_b = F.ScalingType.BlockWise128x128 if b_block_rows == BLOCK else F.ScalingType.BlockWise1x128
    return F.scaled_mm(a8, b8_t, scale_a, F.ScalingType.BlockWise1x128, scale_b, recipe_b, output_dtype=out_dtype)


@blockwise_scaled_mm.register_fake
def _(a8, b8_t, scale_a, scale_b, b_block_rows, out_dtype):
    return a8.new_empty((a8.shape[0], b8_t.shape[1]), dtype=out_dtype)


def _mm_1x128_128x128(a8, sa, b8, sb, out_dtype):
    """``a @ b.T`` for a (M, K) with 1×128 scales ``sa`` and b (N, K) with 128×128 block scales ``sb``."""
    return blockwise_scaled_mm(a8, b8.t(), _left_scale(sa), _block_scale_of_mat2(sb), BLOCK, out_dtype)


def _mm_1x128_1x128(a8, sa, b8, sb, out_dtype):
    """``a @ b.T`` for a (M, K) and b (N, K), both with 1×128 scales along K (b's scales (N, K/128), outer-dim-major
    like a's)."""
    return blockwise_scaled_mm(a8, b8.t(), _left_scale(sa), _left_scale(sb), 1, out_dtype)


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16)


class FP8BlockLinearFn(torch.autograd.Function):
    """``Y = X̂ Ŵᵀ`` with the DeepSeek-V3 FP8 operands in all three GEMMs. ``x2d``: (T, in), T % 128 == 0."""

    @staticmethod
    def forward(ctx, x2d: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype):
        with torch.autocast(device_type=x2d.device.type, enabled=False):
            x8, sx = quantize_fp8_blocks(x2d, 1)
            w8, sw = quantize_fp8_blocks(weight, BLOCK)
            y = _mm_1x128_128x128(x8, sx, w8, sw, out_dtype)
        ctx.save_for_backward(x8, sx, w8, sw)
        ctx.x_dtype, ctx.w_dtype = x2d.dtype, weight.dtype
        return y

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        x8, sx, w8, sw = ctx.saved_tensors
        gx = gw = None
        with torch.autocast(device_type=gy.device.type, enabled=False):
            e = gy.contiguous()
            if ctx.needs_input_grad[0]:
                e8, se = quantize_fp8_blocks(e, 1)
                # b = Ŵᵀ (in, out): the forward's codes transposed, each 128×128 block's scale with it
                gx = _mm_1x128_128x128(e8, se, w8.t().contiguous(), sw.t(), torch.float32).to(ctx.x_dtype)
            if ctx.needs_input_grad[1]:
                # Eᵀ and X̂ᵀ in 1×128 tiles along the tokens, read down E and the saved codes (no transposed copy)
                et8, set_ = quantize_fp8_blocks(e, 1, axis=0)
                xt8, sxt = quantize_fp8_blocks(x8, 1, axis=0, in_scale=sx, in_rows=1)
                gw = _mm_1x128_1x128(et8, set_, xt8, sxt, torch.float32).to(ctx.w_dtype)
        return gx, gw, None


def covers_shape(in_features: int, out_features: int) -> bool:
    """Whether a layer of this shape runs on the block-wise FP8 GEMMs (features multiples of 128)."""
    return in_features % BLOCK == 0 and out_features % BLOCK == 0


def part(scheme) -> str | None:
    """Which part of the ``fp8_deepseek`` operand set ``scheme`` quantizes: ``all`` (the recipe), ``forward`` (its
    forward GEMM, both backward GEMMs unquantized: ``fp8_deepseek_fwd``), ``backward`` (the reverse:
    ``fp8_deepseek_bwd``), or None where it is not one of them."""
    if scheme.bwd_source != "quantized" or any(g.transform != "none" for g in (scheme.fwd, scheme.dx, scheme.dw)):
        return None

    def is_block(s, rows):
        return (s is not None and s.kind == "fp8" and s.fmt == "e4m3" and s.scaling == "block" and s.group == BLOCK
                and s.tile_rows == rows)

    def plain(g):
        return g.a is None and g.b is None

    f, dx, dw = scheme.fwd, scheme.dx, scheme.dw
    forward = is_block(f.a, 1) and is_block(f.b, BLOCK)
    backward = is_block(dx.a, 1) and dx.b is None and is_block(dw.a, 1) and is_block(dw.b, 1)
    if forward and backward:
        return "all"
    if forward and plain(dx) and plain(dw):
        return "forward"
    if plain(f) and backward:
        return "backward"
    return None


def covers(scheme) -> bool:
    """Whether :class:`FP8BlockQuantLinear` implements ``scheme``: the ``fp8_deepseek`` operand set, or one half of it
    with the other unquantized (:func:`part`)."""
    return part(scheme) is not None


def fp8_block_linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None,
                     part: str = "all") -> torch.Tensor:
    """The fp8_deepseek linear (``part``: ``all``, or the ``forward`` / ``backward`` half alone, :func:`part`) on
    ``x`` of any leading shape (tokens zero-padded to a multiple of 128)."""
    out_features, in_features = weight.shape
    if not covers_shape(in_features, out_features):
        raise ValueError(f"fp8_block_linear needs in/out features that are multiples of {BLOCK}, got "
                         f"{in_features}x{out_features}")
    return token_padded(_FUNCTIONS[part].apply, x, weight, BLOCK, out_dtype)


class FP8BlockForwardOnlyFn(FP8BlockLinearFn):
    """``fp8_deepseek_fwd``: the recipe's forward GEMM; the backward GEMMs multiply E, unquantized (BF16), by the
    forward's Ŵ and X̂ (``bwd_source="quantized"``) on BF16 tensor cores. Ŵ and X̂ are rounded once to BF16 for them:
    their 128×128 / 1×128 scales vary along the backward GEMMs' reduction axes, so none can be factored out of the
    product (the rounding is BF16's, ≤ 2^-9 relative, as the recipe layer's saved MS-FP4 / INT4 operands)."""

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        x8, sx, w8, sw = ctx.saved_tensors
        gx = gw = None
        with torch.autocast(device_type=gy.device.type, enabled=False):
            e = _bf16(gy)
            if ctx.needs_input_grad[0]:  # dX = E·Ŵ
                w_hat = _bf16(dequantize_fp8_blocks(w8, sw, BLOCK))
                gx = bf16_matmul(e, w_hat.t(), torch.float32).to(ctx.x_dtype)
            if ctx.needs_input_grad[1]:  # dW = Eᵀ·X̂
                x_hat = _bf16(dequantize_fp8_blocks(x8, sx, 1))
                gw = bf16_matmul(e.t(), x_hat.t(), torch.float32).to(ctx.w_dtype)
        return gx, gw, None


class FP8BlockBackwardOnlyFn(torch.autograd.Function):
    """``fp8_deepseek_bwd``: the forward GEMM unquantized (BF16 X, W on BF16 tensor cores); the backward the recipe's
    on the high-precision X, W (the forward's X̂ = X): dW = Q₁(Eᵀ)·Q₁(Xᵀ)ᵀ on FP8 tensor cores, dX = Q₁(E)·W with W
    unquantized on BF16 tensor cores, Q₁(E) rounded once to BF16 for it (its 1×128 scales lie along the reduction
    axis; ≤ 2^-9 relative)."""

    @staticmethod
    def forward(ctx, x2d: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype):
        with torch.autocast(device_type=x2d.device.type, enabled=False):
            # the GEMM writes the output's dtype where it can (BF16 under autocast), as the BF16 model's linears
            gemm_dtype = out_dtype if out_dtype in (torch.bfloat16, torch.float32) else torch.float32
            y = bf16_matmul(_bf16(x2d), _bf16(weight), gemm_dtype).to(out_dtype)
        ctx.save_for_backward(x2d, weight)
        ctx.x_dtype, ctx.w_dtype = x2d.dtype, weight.dtype
        return y

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        x2d, weight = ctx.saved_tensors
        gx = gw = None
        with torch.autocast(device_type=gy.device.type, enabled=False):
            e = gy.contiguous()
            if ctx.needs_input_grad[0]:  # dX = Q₁(E)·W
                e8, se = quantize_fp8_blocks(e, 1)
                e_hat = _bf16(dequantize_fp8_blocks(e8, se, 1))
                gx = bf16_matmul(e_hat, _bf16(weight).t(), torch.float32).to(ctx.x_dtype)
            if ctx.needs_input_grad[1]:  # dW = Q₁(Eᵀ)·Q₁(Xᵀ)ᵀ, both tiled along the tokens
                et8, set_ = quantize_fp8_blocks(e, 1, axis=0)
                xt8, sxt = quantize_fp8_blocks(x2d, 1, axis=0)
                gw = _mm_1x128_1x128(et8, set_, xt8, sxt, torch.float32).to(ctx.w_dtype)
        return gx, gw, None


#: the autograd function of each :func:`part`
_FUNCTIONS = {"all": FP8BlockLinearFn, "forward": FP8BlockForwardOnlyFn, "backward": FP8BlockBackwardOnlyFn}


class FP8BlockQuantLinear(QuantLinear):
    """The reference :class:`~quartet.quant.linear.QuantLinear` of ``fp8_deepseek`` with tensor-core GEMMs.

    What ``apply_precision`` installs for ``fp8_deepseek`` on ``hopper_fp8`` where the layer's features are multiples
    of 128, and for its forward-only / backward-only variants (:func:`part`). Steps that record statistics run the
    operand-by-operand seam path (same quantizers, float32 GEMMs)."""

    def __init__(self, weight, scheme, backend, **kw):
        super().__init__(weight, scheme, backend, **kw)
        self.part = part(scheme)
        if self.part is None:
            raise ValueError(f"FP8BlockQuantLinear does not run scheme {scheme.name!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stats_enabled:
            return super().forward(x)
        return fp8_block_linear(x, self.weight, part=self.part)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", fp8_blockwise_tensor_cores=True"
