"""GEMMs on quantized operands: Hopper FP8 (FP4 values folded into FP8), Blackwell MXFP4, BF16 fallback.

* Hopper (sm_90) has no FP4 tensor cores, but every MXFP4 value q·2^e is an FP8 number once the row's
  largest group exponent is factored out (see :mod:`quartet.kernels.triton_quant`), so an MXFP4 GEMM
  is run *exactly* as an FP8 GEMM with one float32 scale per row of each operand:
  ``C = (A8 · diag(sa)) (B8 · diag(sb))ᵀ`` through ``torch._scaled_mm`` (rowwise scaling, fast
  accumulation off: Hopper's fast accumulation adds ~1e-4 relative error at K = 16k). The fused Quartet
  layer instead scales per block — 1×128 for the left operand, 128×128 for the right one — so the
  quantizer knows the scale inside its own tile and writes FP8 in one pass; ``F.scaled_mm`` multiplies
  them with its ``BlockWise1x128`` / ``BlockWise128x128`` recipes (~4% slower GEMMs than rowwise on an H200).
* Blackwell (sm_100+): native MXFP4 — packed E2M1 codes with E8M0 scales per 32 along K, the scales
  rearranged into the 128×4-tile swizzle that ``torch.nn.functional.scaled_mm`` documents
  (``SwizzleType.SWIZZLE_32_4_4``). The non-power-of-two factor of the absmax×3/4 rule (4/3 per
  operand) cannot live in E8M0 and multiplies the output instead.
* Fallback: BF16 GEMM on the dequantized values (exact inputs: q·2^e is a bf16 number).
"""
from __future__ import annotations

import torch

from quartet.kernels.triton_quant import QuantizedOperand


def hopper_fp8_mm(a: QuantizedOperand, b: QuantizedOperand, out_dtype: torch.dtype = torch.bfloat16,
                  fast_accum: bool = False) -> torch.Tensor:
    """``a @ b.T`` for two FP8-folded operands (R_a, K) and (R_b, K) → (R_a, R_b).

    Row-scaled operands go through ``torch._scaled_mm`` (rowwise scales); block-scaled ones (``a``
    with 1×128 blocks, ``b`` with 128×128 or 1×128 blocks, see ``mx_quantize(fp8_block=...)``) through
    ``F.scaled_mm`` with the ``BlockWise1x128`` / ``BlockWise128x128`` recipes (no fast accumulation:
    cuBLAS refuses it for block scaling). A 1×128-scaled ``b`` passes its ``(R_b, K/128)`` column-major scales
    as they are: that is the layout cuBLAS takes for the right operand's 1×128 recipe (``benchmarks/scaled_mm_probe.py``).
    """
    if a.fp8 is None or b.fp8 is None:
        raise ValueError("hopper_fp8_mm needs operands quantized with fp8='e4m3'|'e5m2'")
    if a.fp8.dtype == torch.float8_e5m2 and b.fp8.dtype == torch.float8_e5m2:
        raise ValueError("FP8 GEMM: at most one operand may be e5m2")
    if a.block_scale is not None or b.block_scale is not None:
        if a.scale_rows != 1 or b.scale_rows not in (1, 128):
            raise ValueError("block-scaled FP8 GEMM needs a with 1x128 blocks and b with 128x128 or 1x128 blocks, got "
                             f"{a.scale_rows}x128 and {b.scale_rows}x128")
        import torch.nn.functional as F
        from torch.nn.functional import ScalingType

        if b.scale_rows == 1:
            return F.scaled_mm(a.fp8, b.fp8.t(), a.block_scale, ScalingType.BlockWise1x128,
                               b.block_scale, ScalingType.BlockWise1x128, output_dtype=out_dtype)
        return F.scaled_mm(a.fp8, b.fp8.t(), a.block_scale, ScalingType.BlockWise1x128,
                           b.block_scale.t(), ScalingType.BlockWise128x128, output_dtype=out_dtype)
    return torch._scaled_mm(a.fp8, b.fp8.t(), scale_a=a.row_scale, scale_b=b.row_scale.t(),
                            out_dtype=out_dtype, use_fast_accum=fast_accum)


def swizzle_mx_scales(e8m0: torch.Tensor) -> torch.Tensor:
    """Rearrange (R, K/32) E8M0 scales into the 128×4-tile layout of ``SWIZZLE_32_4_4`` (flattened).

    Rows are padded to a multiple of 128 and scale columns to a multiple of 4. Each (128 rows × 4
    columns) tile is stored contiguously as 32 row-groups of 16 bytes, where row-group ``i`` holds
    rows ``i, i+32, i+64, i+96`` of the tile, four scales each.
    """
    R, C = e8m0.shape
    Rp, Cp = -(-R // 128) * 128, -(-C // 4) * 4
    pad = torch.zeros(Rp, Cp, dtype=e8m0.dtype, device=e8m0.device)
    pad[:R, :C] = e8m0
    # (row-tile, 4 sub-blocks of 32 rows, 32 rows, col-tile, 4 cols) -> (row-tile, col-tile, 32, 4 sub, 4 cols)
    t = pad.view(Rp // 128, 4, 32, Cp // 4, 4).permute(0, 3, 2, 1, 4)
    return t.contiguous().flatten()


def unswizzle_mx_scales(flat: torch.Tensor, R: int, C: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_mx_scales` (for tests and debugging)."""
    Rp, Cp = -(-R // 128) * 128, -(-C // 4) * 4
    t = flat.view(Rp // 128, Cp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return t.reshape(Rp, Cp)[:R, :C]


def blackwell_available() -> bool:
    """True on a CUDA device of compute capability >= 10 with PyTorch's MXFP4 scaled matmul."""
    import torch.nn.functional as F

    return (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 10
            and hasattr(F, "scaled_mm") and hasattr(torch, "float4_e2m1fn_x2"))


def blackwell_mxfp4_mm(a: QuantizedOperand, b: QuantizedOperand, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Native MXFP4 ``a @ b.T`` through ``torch.nn.functional.scaled_mm`` (Blackwell only)."""
    import torch.nn.functional as F
    from torch.nn.functional import ScalingType, SwizzleType

    if a.codes is None or b.codes is None:
        raise ValueError("blackwell_mxfp4_mm needs operands quantized with mx=True")
    a4 = a.codes.view(torch.float4_e2m1fn_x2)
    b4 = b.codes.view(torch.float4_e2m1fn_x2)
    sa = swizzle_mx_scales(a.e8m0).view(torch.float8_e8m0fnu)
    sb = swizzle_mx_scales(b.e8m0).view(torch.float8_e8m0fnu)
    out = F.scaled_mm(a4, b4.t(), sa, ScalingType.BlockWise1x32, sb, ScalingType.BlockWise1x32,
                      swizzle_a=SwizzleType.SWIZZLE_32_4_4, swizzle_b=SwizzleType.SWIZZLE_32_4_4,
                      output_dtype=out_dtype)
    factor = a.factor * b.factor
    return out if factor == 1.0 else out * factor


def bf16_mm(a: QuantizedOperand, b: QuantizedOperand, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Fallback: BF16 GEMM on the dequantized operands."""
    return (a.deq.to(torch.bfloat16) @ b.deq.to(torch.bfloat16).t()).to(out_dtype)


@torch.library.custom_op("quartet::bf16_gemm", mutates_args=())
def bf16_gemm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``a @ bᵀ`` of BF16 operands with float32 accumulation, written in ``out_dtype`` (cuBLAS), as a registered
    operator: Inductor keeps it as the library call instead of lowering ``mm(out_dtype=)`` itself."""
    if out_dtype == torch.bfloat16:
        return torch.mm(a, b.t())
    return torch.mm(a, b.t(), out_dtype=out_dtype)


@bf16_gemm.register_fake
def _(a, b, out_dtype):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


def bf16_matmul(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``a @ bᵀ`` of BF16 operands with float32 accumulation: BF16 tensor cores on a GPU, float32 elsewhere (the
    values are exact)."""
    if a.is_cuda:
        return bf16_gemm(a, b, out_dtype)
    return (a.float() @ b.float().t()).to(out_dtype)


def hopper_available() -> bool:
    """True on a CUDA device with FP8 tensor cores (compute capability 8.9 or 9.x)."""
    if not torch.cuda.is_available():
        return False
    major, minor = torch.cuda.get_device_capability()
    return (major, minor) >= (8, 9)
