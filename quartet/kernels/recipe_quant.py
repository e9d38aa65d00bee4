"""Fused Triton quantizers of the training recipes: one pass over an operand, values a BF16 GEMM multiplies exactly.

Covers the quantizer kinds of ``mxfp8``, ``nvfp4``, ``nvfp4_recipe``, ``quartet2``, ``ms_fp4``, ``luq_int4`` and
``fp8_deepseek`` (the maths, and the oracle every output here is checked against, is :mod:`quartet.quant`).

The one idea. Every recipe writes an operand as x̂ = q · s_g · P: q a code of a tiny grid (E2M1, E4M3, E5M2, INT4,
LUQ's ±2^-j), s_g a per-group scale (E8M0 power of two, E4M3 block scale, MS-EDEN's corrected scale) and P a scale
shared by a whole row or the whole tensor (NVFP4's FP32 tensor scale, a row's absmax/6, LUQ's amax). ``q · s_g``
has at most 6 significant bits (E2M1 × E4M3) and lies far inside BF16's exponent range, so it is a BF16 number
exactly; P is factored out and applied to the GEMM's output (a tensor scale multiplies it, a row scale of the
left / right operand scales its rows / columns). So the kernel writes ``values = q·s_g`` in BF16 and returns P, and
the GEMM on BF16 tensor cores with FP32 accumulation equals the oracle's FP32 GEMM on x̂ up to the order of its
sums and one rounding of the scale product. FP8 kinds with one scale per tile (DeepSeek's 1×128 / 128×128) write
FP8 codes and their scales in the layouts ``F.scaled_mm`` reads instead.

One kernel, two passes over the same tile code:

* ``PASS_AMAX``: the tensor's amax (of the rotated values where the operand is rotated) into one int32 cell, by
  ``atomic_max`` on the float's bits (non-negative floats order like their bits; NaN's bits exceed +Inf's, so a
  NaN anywhere wins). NVFP4's kinds take it over the groups that hold only finite values (a non-finite group goes
  NaN alone); FP8 tensor scaling and LUQ over everything (one NaN/Inf makes the tensor scale NaN, as the oracle).
* ``PASS_QUANT``: load a ``BR × BK`` tile of the logical operand (rows × reduction axis, read through strides, so a
  transposed operand costs no copy), rotate each ``HB``-block along the reduction axis by ``diag(signs)·H`` (a ±1
  ``tl.dot``: exact products, one scale by fp32(1/√HB), as :func:`quartet.quant.hadamard.block_hadamard`), take
  every unit's amax (a ``TR × G`` tile: 1×16, 1×32, 16×16, 1×128 or 128×128), compute the scales with the oracle's
  operations in its order (``amax·(1/c)`` by an fp32 constant, IEEE division ``div_rn``, E4M3 round-to-nearest-
  even done in arithmetic so the CPU interpreter and the GPU agree), round (RTN with the oracle's ties, or
  stochastic with in-kernel Philox keyed by the element or group index and a device seed), and store.

Exactness. Deterministic kinds are bitwise the oracle's on any input, the non-finite and subnormal edges included
(tests/kernels/test_recipe_quant.py); stochastic ones follow the oracle's rule with their own uniforms (Philox
cannot replay ``torch.Generator``): each output is one of the oracle's two neighbours, unbiased. Rotated kinds are
bitwise where the ±1 sums are exact in float32: BF16 inputs (8 significant bits) over a 16-block whose values span
at most ~12 binades, over a 128-block at most ~9 (the sum's 24 bits hold the span, the bits and the carries); a
wider block rounds its sum once more than the oracle's float64. NVFP4's 4/6 choice sums its errors in float64, as
the oracle; MS-EDEN's correction sums in float32 (a last-bit difference of the scale before its stochastic
rounding), and a group whose scale underflows float32 is left uncorrected instead of NaN. Element-wise stochastic
rounding draws 16-bit uniforms, eight per Philox call; MS-EDEN's per-group scale rounding draws ``tl.rand``'s
32-bit ones.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from quartet.kernels.triton_quant import HAS_TRITON, sylvester_pm1
from quartet.quant.formats import E2M1_MAX, E4M3_MAX, E5M2_MAX, INT4_MAX
from quartet.quant.quantizers import QuantizerSpec
from quartet.quant.quartet2 import FOUR_OVER_SIX_SCALE_MAX, MS_EDEN_CLIP, MS_EDEN_SCALE_MAX

if HAS_TRITON:
    import triton
    import triton.language as tl

    from quartet.kernels.triton_quant import _max_keep_nan, _pm1_dot_fp32, _rtn_e2m1, _to_bf16, _to_fp8_nan

__all__ = ["RecipeOperand", "kernel_kind", "supports", "draws_random", "recipe_quantize", "row_quantize",
           "occ_thresholds", "hadamard_pm1"]

#: kernel kinds (constexpr codes)
K_MXFP8, K_NVFP4, K_4O6, K_EDEN, K_FP8_BLOCK, K_FP8_TENSOR, K_LUQ = range(7)
#: row-scaled kinds of the row kernel
R_INT4, R_MSFP4 = 0, 1
#: which tensor amax a kind needs: none, over finite groups (NVFP4's), over everything (NaN/Inf propagate)
AMAX_NONE, AMAX_FINITE, AMAX_ALL = 0, 1, 2
PASS_AMAX, PASS_QUANT = 0, 1



@dataclass(frozen=True)
class _Kind:
    code: int
    group: int
    tile_rows: int
    amax: int
    #: FP8 element format of the codes (E4M3 unless the spec says e5m2)
    e5m2: bool = False


def kernel_kind(spec: QuantizerSpec) -> _Kind | None:
    """The tile kernel's kind of ``spec``, or None where the tile kernel does not run it (the row kinds: :func:`row_quantize`)."""
    k = spec.kind
    if k == "mxfp8" and spec.group == 32 and spec.tile_rows == 1:
        return _Kind(K_MXFP8, 32, 1, AMAX_NONE)
    if k == "nvfp4" and spec.group == 16 and spec.tile_rows in (1, 16):
        return _Kind(K_NVFP4, 16, spec.tile_rows, AMAX_FINITE)
    if k == "nvfp4_4o6" and spec.group == 16 and spec.tile_rows == 1:
        return _Kind(K_4O6, 16, 1, AMAX_FINITE)
    if k == "ms_eden" and spec.group == 16 and spec.tile_rows == 1:
        return _Kind(K_EDEN, 16, 1, AMAX_FINITE)
    if k == "fp8" and spec.scaling == "block" and spec.fmt == "e4m3" and spec.group == 128 and spec.tile_rows in (1, 128):
        return _Kind(K_FP8_BLOCK, 128, spec.tile_rows, AMAX_NONE)
    if k == "fp8" and spec.scaling == "tensor":
        return _Kind(K_FP8_TENSOR, 16, 1, AMAX_ALL, e5m2=spec.fmt == "e5m2")
    if k == "luq":
        return _Kind(K_LUQ, 16, 1, AMAX_ALL)
    return None


def _row_kind(spec: QuantizerSpec) -> int | None:
    if spec.kind == "int4" and spec.scaling == "row" and not spec.stochastic:
        return R_INT4
    if spec.kind == "ms_fp4":
        return R_MSFP4
    return None


def supports(spec: QuantizerSpec) -> bool:
    """Whether a kernel of this module runs ``spec``."""
    return kernel_kind(spec) is not None or _row_kind(spec) is not None


def draws_random(spec: QuantizerSpec) -> bool:
    """Whether quantizing with ``spec`` draws random numbers (stochastic rounding, MS-EDEN, LUQ)."""
    return spec.stochastic or spec.kind in ("luq", "ms_eden")


if HAS_TRITON:
    #: the scale constants as Python doubles, rounded once to float32 where they multiply a tensor (as torch does
    #: with ``amax * (1.0 / c)``)
    INV_6 = tl.constexpr(1.0 / E2M1_MAX)
    INV_4 = tl.constexpr(1.0 / 4.0)
    INV_6_448 = tl.constexpr(1.0 / (E2M1_MAX * E4M3_MAX))
    INV_6_256 = tl.constexpr(1.0 / (E2M1_MAX * FOUR_OVER_SIX_SCALE_MAX))
    INV_EDEN = tl.constexpr(1.0 / MS_EDEN_CLIP)
    INV_EDEN_256 = tl.constexpr(1.0 / (MS_EDEN_CLIP * MS_EDEN_SCALE_MAX))
    INV_448 = tl.constexpr(1.0 / E4M3_MAX)
    INV_57344 = tl.constexpr(1.0 / E5M2_MAX)
    INV_7 = tl.constexpr(1.0 / INT4_MAX)

    if os.environ.get("TRITON_INTERPRET") == "1":
        @triton.jit
        def _mul_rn(a, b):
            """a·b rounded once (the interpreter does not contract)."""
            return a * b
    else:
        @triton.jit
        def _mul_rn(a, b):
            """a·b rounded once, never contracted with a following add into an FMA (``mul.rn``): where the oracle
            rounds the product before adding, so must the kernel."""
            return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32,
                                             is_pure=True, pack=1)

    @triton.jit
    def _copysign(mag, v):
        """|mag| with the sign bit of v (NaN keeps its payload; -0 stays -0), as torch.copysign."""
        m = mag.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        return (m | (v.to(tl.int32, bitcast=True) & -2147483648)).to(tl.float32, bitcast=True)

    @triton.jit
    def _tiny():
        """float32's smallest subnormal 2^-149 (a Python constant below 2^-126 would make Triton compute in float64)."""
        return tl.full((), 1, tl.int32).to(tl.float32, bitcast=True)

    @triton.jit
    def _pow2(e):
        """2^e (float32) for int32 e in [-149, 127], from the bits (subnormals included)."""
        normal = ((tl.minimum(tl.maximum(e, -126), 127) + 127) << 23).to(tl.float32, bitcast=True)
        sub = (1 << tl.minimum(tl.maximum(e + 149, 0), 22)).to(tl.float32, bitcast=True)
        return tl.where(e >= -126, normal, sub)

    @triton.jit
    def _floor_log2(a):
        """floor(log2 a) (int32) for finite a > 0, subnormals included (scaled by 2^64 first: exact)."""
        sub = a < 1.1754943508222875e-38
        an = tl.where(sub, a * 18446744073709551616.0, a)
        e = ((an.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        return tl.where(sub, e - 64, e)

    @triton.jit
    def _rne_fp8(v, EMIN: tl.constexpr, MBITS: tl.constexpr, FMAX: tl.constexpr):
        """v on the FP8 grid (E4M3: EMIN -6, MBITS 3, FMAX 448; E5M2: -14, 2, 57344): |v| clamped to FMAX, then
        round to nearest even, as ``x.clamp(-fmax, fmax).to(float8)``; NaN stays NaN. In arithmetic (the CPU
        interpreter's cast does not round): the spacing is 2^(e − MBITS) in [2^e, 2^(e+1)) (e ≥ EMIN, subnormals
        below), a / spacing < 16 is exact and (m + 2^23) − 2^23 rounds it to the nearest even integer."""
        a = tl.minimum(tl.abs(v), FMAX, propagate_nan=tl.PropagateNan.ALL)
        e = tl.maximum(_floor_log2(a), EMIN)
        m = a * _pow2(MBITS - e)
        r = (m + 8388608.0) - 8388608.0
        return _copysign(r * _pow2(e - MBITS), v)

    @triton.jit
    def _sr_e4m3(v, u):
        """Unbiased stochastic rounding of v to E4M3 with uniforms u, saturating at 448
        (:func:`quartet.quant.formats.round_to_e4m3_stochastic`)."""
        a = tl.minimum(tl.abs(v), 448.0, propagate_nan=tl.PropagateNan.ALL)
        e = tl.maximum(_floor_log2(a), -6) - 3
        lo = tl.floor(a * _pow2(-e)) * _pow2(e)
        up = u < (a - lo) * _pow2(-e)
        return _copysign(lo + tl.where(up, _pow2(e), 0.0), v)

    @triton.jit
    def _sr_e2m1(a, u):
        """Stochastic rounding of a = |y| to the E2M1 grid (:func:`quartet.quant.formats.round_to_e2m1`, SR branch)."""
        a = tl.minimum(a, 6.0, propagate_nan=tl.PropagateNan.ALL)
        step = tl.where(a > 4.0, 2.0, tl.where(a > 2.0, 1.0, 0.5))
        t = a / step  # a power of two: exact
        lo = tl.floor(t)
        return (lo + tl.where(u < t - lo, 1.0, 0.0)) * step

    @triton.jit
    def _tile_uniforms(seed, row0, col0, K, BR: tl.constexpr, BK: tl.constexpr):
        """One uniform in (0, 1) per element of the (BR, BK) tile at (row0, col0), eight from each Philox call (its
        four 32-bit outputs split in 16-bit halves: an eighth of ``tl.rand``'s work), keyed by (seed, element index
        / 8) with a fixed bijection inside the eight. Resolution 2^-16, centred: P(u < f) is within 2^-17 of f."""
        rows = row0 + tl.arange(0, BR)
        c8 = col0 // 8 + tl.arange(0, BK // 8)
        r0, r1, r2, r3 = tl.randint4x(seed, rows[:, None] * (K // 8) + c8[None, :])
        rr = tl.join(tl.join(r0, r1), tl.join(r2, r3))  # (BR, BK/8, 2, 2)
        rr = tl.join(rr & 0xFFFF, (rr >> 16) & 0xFFFF)  # (BR, BK/8, 2, 2, 2)
        r16 = tl.reshape(rr, (BR, BK))
        # 2^23 + r exactly, from the bits (no integer-to-float conversion)
        return ((r16 | 0x4B000000).to(tl.float32, bitcast=True) - 8388607.5) * 1.52587890625e-05

    @triton.jit
    def _tensor_scale(A, INV_CS: tl.constexpr):
        """NVFP4's FP32 tensor scale from the amax over finite groups (:func:`quartet.quant.mx.nvfp4_tensor_scale`)."""
        return tl.maximum(tl.where(A > 0.0, A * INV_CS, 1.0), _tiny())

    @triton.jit
    def _block_scale(a_u, INV_C: tl.constexpr, S):
        """E4M3(amax_g·(1/c)/S), at least 2^-9 for a nonzero group, 1 for a zero one, NaN for a non-finite one
        (:func:`quartet.quant.mx.e4m3_block_scale`)."""
        b = _rne_fp8(tl.math.div_rn(a_u * INV_C, S), -6, 3, 448.0)
        b = tl.where(a_u > 0.0, tl.maximum(b, 0.001953125), 1.0)
        return tl.where(a_u < float("inf"), b, float("nan"))

    @triton.jit
    def _rtn_signed(t):
        return _copysign(_rtn_e2m1(tl.abs(t)), t)

    @triton.jit
    def _load_rotated(x_ptr, R, K, s_r, s_k, isc_ptr, is_r, is_k, h_ptr, signs_ptr, pid_r, pid_k,
                      IN_SCALE: tl.constexpr, IN_DIV_R: tl.constexpr, IN_DIV_K: tl.constexpr, HB: tl.constexpr,
                      HAS_SIGNS: tl.constexpr, DOT_MODE: tl.constexpr, INV_SQRT: tl.constexpr,
                      BR: tl.constexpr, BK: tl.constexpr, TRANS: tl.constexpr):
        """The ``BR × BK`` tile (rows, reduction axis) of the logical operand as float32: loaded through its
        strides (zeros past the edges), times its input scale (an FP8 operand read back), rotated per ``HB``-block."""
        rows = pid_r * BR + tl.arange(0, BR)
        cols = pid_k * BK + tl.arange(0, BK)
        inb = (rows < R)[:, None] & (cols < K)[None, :]
        if TRANS:
            # xᵀ read down its columns: load the tile in its stored order (coalesced), transpose in registers
            xs = tl.load(x_ptr + cols[:, None].to(tl.int64) * s_k + rows[None, :].to(tl.int64) * s_r,
                         mask=(cols < K)[:, None] & (rows < R)[None, :], other=0.0)
            x = tl.trans(xs).to(tl.float32)
        else:
            x = tl.load(x_ptr + rows[:, None].to(tl.int64) * s_r + cols[None, :].to(tl.int64) * s_k, mask=inb,
                        other=0.0).to(tl.float32)
        if IN_SCALE:
            soff = (rows // IN_DIV_R)[:, None].to(tl.int64) * is_r + (cols // IN_DIV_K)[None, :].to(tl.int64) * is_k
            x = x * tl.load(isc_ptr + soff, mask=inb, other=0.0)
        if HB > 0:
            c = tl.arange(0, HB)
            h = tl.load(h_ptr + c[:, None] * HB + c[None, :])
            if HAS_SIGNS:
                h = h * tl.load(signs_ptr + c)[:, None]  # diag(s)·H: still ±1, the products stay exact
            xu = tl.reshape(x, (BR * BK // HB, HB))
            if DOT_MODE == 0:  # the CPU interpreter: float64, then one rounding (as the oracle's float64 sums)
                yu = tl.dot(xu.to(tl.float64), h.to(tl.float64)).to(tl.float32)
            elif DOT_MODE == 1:  # BF16-valued input: ±1 products exact, float32 accumulation on the tensor cores
                yu = tl.dot(xu.to(tl.bfloat16), h.to(tl.bfloat16), out_dtype=tl.float32)
            else:  # float32 input
                yu = _pm1_dot_fp32(xu, h)
            x = tl.reshape(yu * INV_SQRT, (BR, BK))
        return x, rows, cols, inb

    @triton.jit
    def _nanmax(a, axis: tl.constexpr, keep_dims: tl.constexpr = False):
        """max(a) along ``axis``, NaN where a NaN is there (the GPU's plain max drops NaN; a reduction with a custom
        combine function would keep it, but crawls in the CPU interpreter): two built-in reductions."""
        nan = tl.max((a != a).to(tl.int32), axis=axis, keep_dims=keep_dims)
        m = tl.max(tl.where(a != a, 0.0, a), axis=axis, keep_dims=keep_dims)
        return tl.where(nan > 0, float("nan"), m)

    @triton.jit
    def _unit_amax(y4):
        """Largest magnitude of every ``TR × G`` unit of a (BR/TR, TR, BK/G, G) tile, NaN where the unit holds one
        (Inf stays Inf): shape (BR/TR, 1, BK/G, 1)."""
        return _nanmax(_nanmax(tl.abs(y4), 3, True), 1, True)

    @triton.jit
    def _rq_kernel(x_ptr, R, K, s_r, s_k, isc_ptr, is_r, is_k, h_ptr, signs_ptr, amax_ptr, seed_ptr,
                   out_ptr, o_r, o_k, gs_ptr, gs_r, gs_k, post_ptr,
                   PASS: tl.constexpr, KIND: tl.constexpr, G: tl.constexpr, TR: tl.constexpr, AMAX: tl.constexpr,
                   E5M2: tl.constexpr, STOCHASTIC: tl.constexpr, HB: tl.constexpr, HAS_SIGNS: tl.constexpr,
                   DOT_MODE: tl.constexpr, INV_SQRT: tl.constexpr, IN_SCALE: tl.constexpr, IN_DIV_R: tl.constexpr,
                   IN_DIV_K: tl.constexpr, WRITE_GS: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
                   TRANS: tl.constexpr = False, OUT_T: tl.constexpr = False):
        pid_r = tl.program_id(0)
        pid_k = tl.program_id(1)
        y, rows, cols, inb = _load_rotated(x_ptr, R, K, s_r, s_k, isc_ptr, is_r, is_k, h_ptr, signs_ptr, pid_r,
                                           pid_k, IN_SCALE, IN_DIV_R, IN_DIV_K, HB, HAS_SIGNS, DOT_MODE, INV_SQRT,
                                           BR, BK, TRANS)
        y4 = tl.reshape(y, (BR // TR, TR, BK // G, G))
        if PASS == 0:
            # the tensor's amax: over finite units (NVFP4's rule) or over everything (NaN/Inf win)
            a_u = tl.reshape(_unit_amax(y4), (BR // TR * (BK // G),))
            if AMAX == 1:
                tmax = tl.max(tl.where(a_u < float("inf"), a_u, 0.0), axis=0)
            else:
                tmax = _nanmax(a_u, 0)
            tl.atomic_max(amax_ptr, tmax.to(tl.int32, bitcast=True))
        else:
            _quant_tile(y, y4, rows, cols, inb, R, K, pid_r, pid_k, amax_ptr, seed_ptr, out_ptr, o_r, o_k, gs_ptr,
                        gs_r, gs_k, post_ptr, KIND, G, TR, AMAX, E5M2, STOCHASTIC, WRITE_GS, BR, BK, OUT_T)

    @triton.jit
    def _quant_tile(y, y4, rows, cols, inb, R, K, pid_r, pid_k, amax_ptr, seed_ptr, out_ptr, o_r, o_k, gs_ptr, gs_r,
                    gs_k, post_ptr, KIND: tl.constexpr, G: tl.constexpr, TR: tl.constexpr, AMAX: tl.constexpr,
                    E5M2: tl.constexpr, STOCHASTIC: tl.constexpr, WRITE_GS: tl.constexpr, BR: tl.constexpr,
                    BK: tl.constexpr, OUT_T: tl.constexpr):
        """The quantization pass of :func:`_rq_kernel` on a loaded (rotated) tile."""
        if AMAX != 0:
            A = tl.load(amax_ptr).to(tl.float32, bitcast=True)
        if STOCHASTIC:
            seed = tl.load(seed_ptr)
        post = 1.0
        if KIND == 5:  # FP8, one current scale for the tensor: values are the codes, the scale is the post-scale
            if E5M2:
                S = tl.where(A > 0.0, A * INV_57344, 1.0)
            else:
                S = tl.where(A > 0.0, A * INV_448, 1.0)
            S = tl.where(A < float("inf"), S, float("nan"))
            t = tl.math.div_rn(y, tl.where(S == 0.0, float("inf"), S))
            if E5M2:
                v = _rne_fp8(t, -14, 2, 57344.0)
            else:
                v = _rne_fp8(t, -6, 3, 448.0)
            post = S
        elif KIND == 6:  # LUQ: levels amax·2^-j, stochastic underflow and log rounding with one uniform per element
            alpha = tl.maximum(A * 0.015625, _tiny())
            a = tl.abs(y)
            u = _tile_uniforms(seed, pid_r * BR, pid_k * BK, K, BR, BK)
            under = tl.where(u * alpha < a, alpha, 0.0)
            lo = _pow2(_floor_log2(tl.math.div_rn(tl.maximum(a, alpha), A))) * A
            up = u < tl.math.div_rn(a - lo, lo)
            over = tl.minimum(tl.where(up, 2.0 * lo, lo), A)
            q = _copysign(tl.where(a < alpha, under, over), y)
            q = tl.where(A > 0.0, q, 0.0)
            # the levels are exact powers of two times A: factor A out (values 2^-j, exact in BF16) unless A is so
            # small that A·2^-6 or a level underflows (then the values are q themselves and the post-scale 1)
            factor = A >= 1.0e-30
            v = tl.where(factor, tl.math.div_rn(q, tl.where(A > 0.0, A, 1.0)), q)
            post = tl.where(factor, A, 1.0)
            bad = (A != A) | (A == float("inf"))
            v = tl.where(bad, float("nan"), v)
            post = tl.where(bad, 1.0, post)
        else:
            a_u = _unit_amax(y4)
            if KIND == 0:  # MXFP8: E4M3 elements, E8M0 scale 2^(floor(log2 amax) - 8) clamped to [-127, 127]
                e = tl.minimum(tl.maximum(_floor_log2(tl.where(a_u > 0.0, a_u, 1.0)) - 8, -127), 127)
                s = tl.where(a_u > 0.0, _pow2(e), 0.00390625)
                s = tl.where(a_u < float("inf"), s, float("nan"))
                v4 = _rne_fp8(tl.math.div_rn(y4, s), -6, 3, 448.0) * s
                gs = s
            elif KIND == 1:  # NVFP4: E4M3 block scale (16-group or 16x16 tile), FP32 tensor scale; RTN or SR
                S = _tensor_scale(A, INV_6_448)
                blk = _block_scale(a_u, INV_6, S)
                s = blk * S
                t = tl.math.div_rn(y4, tl.where(s == 0.0, float("inf"), s))
                if STOCHASTIC:
                    u = tl.reshape(_tile_uniforms(seed, pid_r * BR, pid_k * BK, K, BR, BK), (BR // TR, TR, BK // G, G))
                    q = _copysign(_sr_e2m1(tl.abs(t), u), t)
                else:
                    q = _rtn_signed(t)
                v4 = q * blk
                gs = blk
                post = S
            elif KIND == 2:  # NVFP4 Four Over Six: the group's amax to 6 or to 4, the smaller squared error wins
                S = _tensor_scale(A, INV_6_256)
                b6 = _block_scale(a_u, INV_6, S)
                b4 = _block_scale(a_u, INV_4, S)
                s6 = b6 * S
                s4 = b4 * S
                t6 = tl.math.div_rn(y4, s6)
                t4 = tl.math.div_rn(y4, s4)
                q6 = _rtn_signed(tl.where(t6 != t6, 0.0, t6))
                q4 = _rtn_signed(tl.where(t4 != t4, 0.0, t4))
                y64 = y4.to(tl.float64)
                d6 = (q6 * s6).to(tl.float64) - y64
                d4 = (q4 * s4).to(tl.float64) - y64
                e6 = tl.sum(d6 * d6, axis=3, keep_dims=True)
                e4 = tl.sum(d4 * d4, axis=3, keep_dims=True)
                four = e4 < e6  # a NaN error compares False: a non-finite group stays on the NaN 6-branch
                v4 = tl.where(four, q4 * b4, q6 * b6)
                gs = tl.where(four, b4, b6)
                post = S
            elif KIND == 3:  # MS-EDEN: RTN elements, EDEN-corrected block scale rounded stochastically to E4M3
                S = _tensor_scale(A, INV_EDEN_256)
                blk = _block_scale(a_u, INV_EDEN, S)
                t = tl.math.div_rn(y4, blk * S)
                t = tl.minimum(tl.maximum(tl.where(t != t, 0.0, t), -3.4028234663852886e38), 3.4028234663852886e38)
                q = _rtn_signed(t)
                # the correction's sums in float32 (the oracle: float64): a last-bit difference of the unrounded scale,
                # which only its stochastic rounding sees
                yy = tl.sum(t * t, axis=3, keep_dims=True)
                yq = tl.sum(t * q, axis=3, keep_dims=True)
                # a group whose blk·S underflows to 0 (amax below ~2^-130) has t clamped to ±FLT_MAX and sums that
                # overflow: no correction there (inf/inf would make its scale, and so its values, NaN)
                ok = (yq > 0.0) & (yq < float("inf")) & (yy < float("inf"))
                corr = tl.where(ok, tl.math.div_rn(yy, tl.where(ok, yq, 1.0)), 1.0)
                urow = pid_r * BR + tl.arange(0, BR)
                ucol = pid_k * (BK // G) + tl.arange(0, BK // G)
                uoff = tl.reshape(urow[:, None] * (K // G) + ucol[None, :], (BR, 1, BK // G, 1))
                sc = _sr_e4m3(blk * corr, tl.rand(seed, uoff))
                v4 = q * sc
                gs = sc
                post = S
            else:  # KIND 4: FP8 E4M3 with one scale amax/448 per 1x128 or 128x128 tile (DeepSeek-V3)
                s = tl.where(a_u > 0.0, a_u * INV_448, 1.0)
                s = tl.where(a_u < float("inf"), s, float("nan"))
                v4 = _rne_fp8(tl.math.div_rn(y4, tl.where(s == 0.0, float("inf"), s)), -6, 3, 448.0)
                gs = s
            v = tl.reshape(v4, (BR, BK))
            if WRITE_GS:
                NU_R: tl.constexpr = BR // TR
                NU_K: tl.constexpr = BK // G
                ur = pid_r * NU_R + tl.arange(0, NU_R)
                uc = pid_k * NU_K + tl.arange(0, NU_K)
                um = (ur < (R + TR - 1) // TR)[:, None] & (uc < K // G)[None, :]
                tl.store(gs_ptr + ur[:, None].to(tl.int64) * gs_r + uc[None, :].to(tl.int64) * gs_k,
                         tl.reshape(gs, (NU_R, NU_K)), mask=um)
        if out_ptr.dtype.element_ty == tl.bfloat16:
            v = _to_bf16(v)
        elif out_ptr.dtype.element_ty != tl.float32:
            v = _to_fp8_nan(v, out_ptr.dtype.element_ty)
        if OUT_T:
            # written like the source: store in its (stored) order too
            tl.store(out_ptr + cols[:, None].to(tl.int64) * o_k + rows[None, :].to(tl.int64) * o_r, tl.trans(v),
                     mask=(cols < K)[:, None] & (rows < R)[None, :])
        else:
            tl.store(out_ptr + rows[:, None].to(tl.int64) * o_r + cols[None, :].to(tl.int64) * o_k, v, mask=inb)
        if AMAX != 0:
            if (pid_r == 0) & (pid_k == 0):
                tl.store(post_ptr, post)

    @triton.jit
    def _rq_row_kernel(x_ptr, R, K, s_r, s_k, lo_ptr, hi_ptr, val_ptr, deq_ptr, fac_ptr, post_ptr,
                       KIND: tl.constexpr, OCC: tl.constexpr, WRITE_VAL: tl.constexpr, WRITE_DEQ: tl.constexpr,
                       WRITE_FAC: tl.constexpr, DGE_INV_K: tl.constexpr, DGE_P: tl.constexpr,
                       DGE_CAP: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr):
        """Row-scaled kinds: INT4 (absmax/7, RTN half away from zero) and MS-FP4 (absmax/6 E2M1, optional outlier
        clamping to the per-row thresholds ``lo``/``hi`` with the residual added back, optional DGE factor). Two
        passes over each block of rows: the row's amax, then the values (the second read mostly hits L2). ``NK``:
        blocks of ``BK`` along the row (a constant: the interpreter cannot loop to a runtime bound)."""
        rows = tl.program_id(0) * BR + tl.arange(0, BR)
        rm = rows < R
        amax = tl.zeros((BR,), tl.float32)
        camax = tl.zeros((BR,), tl.float32)
        if OCC:
            lo = tl.load(lo_ptr + rows, mask=rm, other=0.0)
            hi = tl.load(hi_ptr + rows, mask=rm, other=0.0)
        for kb in tl.range(0, NK):
            cols = kb * BK + tl.arange(0, BK)
            m = rm[:, None] & (cols < K)[None, :]
            x = tl.load(x_ptr + rows[:, None].to(tl.int64) * s_r + cols[None, :].to(tl.int64) * s_k, mask=m,
                        other=0.0).to(tl.float32)
            amax = _max_keep_nan(amax, _nanmax(tl.abs(x), 1))
            if OCC:
                xc = tl.maximum(tl.minimum(x, hi[:, None], propagate_nan=tl.PropagateNan.ALL), lo[:, None],
                                propagate_nan=tl.PropagateNan.ALL)
                camax = _max_keep_nan(camax, _nanmax(tl.abs(xc), 1))
        if OCC:
            # the scale comes from the clamped row, but a row holding Inf/NaN goes NaN even where OCC clamped it
            amax = tl.where(amax < float("inf"), camax, amax)
        if KIND == 0:
            s = tl.where(amax > 0.0, amax * INV_7, 1.0)
        else:
            s = tl.where(amax > 0.0, amax * INV_6, 1.0)
        s = tl.where(amax < float("inf"), s, float("nan"))
        tl.store(post_ptr + rows, s, mask=rm)
        sd = tl.where(s == 0.0, float("inf"), s)
        for kb in tl.range(0, NK):
            cols = kb * BK + tl.arange(0, BK)
            m = rm[:, None] & (cols < K)[None, :]
            offs = rows[:, None].to(tl.int64) * K + cols[None, :]
            x = tl.load(x_ptr + rows[:, None].to(tl.int64) * s_r + cols[None, :].to(tl.int64) * s_k, mask=m,
                        other=0.0).to(tl.float32)
            xc = x
            if OCC:
                xc = tl.maximum(tl.minimum(x, hi[:, None], propagate_nan=tl.PropagateNan.ALL), lo[:, None],
                                propagate_nan=tl.PropagateNan.ALL)
            y = tl.math.div_rn(xc, sd[:, None])
            if KIND == 0:
                yc = tl.minimum(tl.maximum(y, -7.0, propagate_nan=tl.PropagateNan.ALL), 7.0,
                                propagate_nan=tl.PropagateNan.ALL)
                q = _copysign(tl.minimum(tl.floor(tl.abs(yc) + 0.5), 7.0, propagate_nan=tl.PropagateNan.ALL), yc)
            else:
                q = _rtn_signed(y)
            if WRITE_VAL:
                tl.store(val_ptr + offs, _to_bf16(q), mask=m)
            if WRITE_DEQ:
                d = q * s[:, None]
                if OCC:
                    d = _mul_rn(q, s[:, None]) + (x - xc)
                if deq_ptr.dtype.element_ty == tl.float32:
                    tl.store(deq_ptr + offs, d, mask=m)
                else:
                    tl.store(deq_ptr + offs, _to_bf16(d), mask=m)
            if WRITE_FAC:
                # DGE derivative (1/k)|2u/δ − 1|^(1/k − 1), capped, on the scaled value y (δ the local grid step)
                a = tl.abs(y)
                delta = tl.where(a < 2.0, 0.5, tl.where(a < 4.0, 1.0, 2.0))
                uu = y - tl.floor(y / delta) * delta
                t = tl.abs(2.0 * uu / delta - 1.0)
                if DGE_P == 0.0:  # k = 1: pow(t, 0) = 1 everywhere (t = 0 and NaN included), as the oracle's pow
                    d = tl.zeros_like(t) + DGE_INV_K
                else:
                    d = DGE_INV_K * tl.exp2(tl.log2(t) * DGE_P)
                tl.store(fac_ptr + offs, tl.minimum(d, DGE_CAP, propagate_nan=tl.PropagateNan.ALL), mask=m)


# ------------------------------------------------------------------------------------------------------------------
# Python wrappers
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class RecipeOperand:
    """One quantized GEMM operand as the recipe layer multiplies it.

    ``values``: the logical (R, K) operand, reduction axis last — q·s_g in BF16 (or FP8 codes), possibly a
    transposed view of a tensor stored like the source. ``post``: the scale factored out of every value (0-d
    float32; 1 where there is none) or, for row-scaled kinds, one per row (R,). ``gscale``: the per-unit scales
    when asked for (tests, statistics; FP8 tile kinds: always, in ``F.scaled_mm``'s layout). ``amax``: the int32
    cell holding the tensor amax the values were scaled with (reusable by another quantization of the same
    tensor). Row kinds also give ``deq`` (x̂ rounded to BF16, the OCC residual included) and ``factor`` (DGE)."""

    values: torch.Tensor
    post: torch.Tensor | None = None
    gscale: torch.Tensor | None = None
    amax: torch.Tensor | None = None
    deq: torch.Tensor | None = None
    factor: torch.Tensor | None = None


_PM1: dict[tuple, torch.Tensor] = {}


def hadamard_pm1(n: int, device) -> torch.Tensor:
    """The ±1 Sylvester matrix of order ``n`` on ``device`` (BF16 on a GPU, what its tensor-core dot reads; float32
    elsewhere), cached: create it before CUDA-graph capture."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (n, device.type, device.index)
    if key not in _PM1:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        _PM1[key] = sylvester_pm1(n).to(device=device, dtype=dtype).contiguous()
    return _PM1[key]


def _logical(x: torch.Tensor, axis: int) -> tuple[int, int, int, int]:
    if x.dim() != 2:
        raise ValueError(f"expected a 2-D operand, got shape {tuple(x.shape)}")
    if axis in (-1, 1):
        return x.shape[0], x.shape[1], x.stride(0), x.stride(1)
    if axis == 0:
        return x.shape[1], x.shape[0], x.stride(1), x.stride(0)
    raise ValueError(f"axis must be 0, 1 or -1, got {axis}")


def _tile(kind: _Kind, hb: int, cuda: bool) -> tuple[int, int, int]:
    """(BR, BK, warps) of a launch: BK covers a group, a Hadamard block and a 128-tile; BR a tile's rows."""
    bk = max(kind.group, hb, 128)
    br = max(kind.tile_rows, 32 if cuda else 64)  # the CPU interpreter: few large programs
    if cuda and hb >= 64:
        br = 64  # the Hadamard matrix is read per program: more rows share it
    if cuda and br * bk > 8192 and kind.tile_rows < 128:
        br = max(kind.tile_rows, 8192 // bk)
    warps = 8 if br * bk >= 8192 else 4
    return br, bk, warps


def recipe_quantize(x: torch.Tensor, spec: QuantizerSpec, *, axis: int = -1, hadamard: int = 0,
                    signs: torch.Tensor | None = None, seed: torch.Tensor | None = None,
                    amax: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                    layout: str = "source", in_scale: torch.Tensor | None = None, in_scale_rows: int = 1,
                    gscale: bool = False) -> RecipeOperand:
    """Quantize the logical operand of ``x`` (``axis=-1``: x itself; ``axis=0``: xᵀ, read without a copy) along its
    last axis with ``spec``, after a ``hadamard``-point block rotation (0: none) with ``signs`` (±1, before H).

    ``seed``: one int64 on the device, the Philox seed of stochastic kinds (MS-EDEN and LUQ always draw).
    ``amax``: the int32 cell of an earlier call on the same tensor and rotation (skips the amax pass).
    ``layout``: ``"source"`` writes the values in x's own memory layout (``values`` is then a transposed view when
    ``axis=0``; cheapest for BF16 GEMMs, which take either), ``"logical"`` row-major (R, K) (what FP8 GEMMs need).
    ``in_scale`` (float32) multiplies x on load, one per (stored row // ``in_scale_rows``, stored col // 128):
    an FP8 operand read back through its 1×128 / 128×128 tile scales. ``out_dtype`` float32 keeps values exact
    where BF16 could not hold them (subnormal MXFP8 groups; tests). FP8 tile kinds write E4M3 codes."""
    if not HAS_TRITON:
        raise RuntimeError("triton is not installed; the fused quantizers need it")
    kind = kernel_kind(spec)
    if kind is None:
        raise ValueError(f"recipe_quantize does not run {spec.label()}")
    R, K, s_r, s_k = _logical(x, axis)
    multiple = max(kind.group, hadamard or 1)
    if K % multiple:
        raise ValueError(f"the reduction axis ({K}) must be a multiple of {multiple} for {spec.label()}")
    if hadamard and (hadamard < 16 or hadamard & (hadamard - 1)):
        raise ValueError(f"hadamard block must be a power of two >= 16, got {hadamard}")
    if kind.tile_rows > 1 and R % kind.tile_rows:
        raise ValueError(f"{spec.label()} needs rows ({R}) in whole {kind.tile_rows}-row tiles")
    stochastic = draws_random(spec)
    if stochastic and (seed is None or seed.numel() != 1 or seed.dtype != torch.int64):
        raise ValueError(f"{spec.label()} draws random numbers: pass seed= one int64 on the device")
    dev = x.device
    cuda = dev.type == "cuda"
    br, bk, warps = _tile(kind, hadamard, cuda)
    if kind.code == K_FP8_BLOCK:
        out_dtype = torch.float8_e4m3fn
        layout = "logical"
    if layout == "source" and axis == 0:
        store = torch.empty(x.shape, device=dev, dtype=out_dtype)  # stored like x: logical (r, k) at [k, r]
        o_r, o_k, values = 1, R, store.t()
    elif layout in ("source", "logical"):
        values = torch.empty(R, K, device=dev, dtype=out_dtype)
        o_r, o_k = K, 1
    else:
        raise ValueError(f"layout must be 'source' or 'logical', got {layout!r}")
    nur, nuk = -(-R // kind.tile_rows), K // kind.group
    gs_t, gs_r, gs_k = values, 0, 0
    gs_out = None
    if kind.code == K_FP8_BLOCK:
        if kind.tile_rows == 1:  # (R, K/128) stored outer-dim-major, as F.scaled_mm's BlockWise1x128 reads it
            store = torch.empty(nuk, R, device=dev, dtype=torch.float32)
            gs_out, gs_t, gs_r, gs_k = store.t(), store, 1, R
        else:  # (R/128, K/128 padded to 4) row-major, pad ones (BlockWise128x128, quartet.kernels.gemm)
            ld = -(-nuk // 4) * 4
            gs_t = torch.ones(nur, ld, device=dev, dtype=torch.float32)
            gs_out, gs_r, gs_k = gs_t, ld, 1
    elif gscale:
        if kind.code in (K_FP8_TENSOR, K_LUQ):  # the kernel writes no per-group scales for these
            raise ValueError(f"{spec.label()} has one scale for the whole tensor (the operand's post), no group "
                             f"scales: gscale=True is for group- and tile-scaled kinds")
        gs_t = torch.empty(nur, nuk, device=dev, dtype=torch.float32)
        gs_out, gs_r, gs_k = gs_t, nuk, 1
    dummy = torch.empty(1, device=dev, dtype=torch.float32)
    h = hadamard_pm1(hadamard, dev) if hadamard else dummy
    sg = signs.to(device=dev, dtype=torch.float32).contiguous() if signs is not None else dummy
    if signs is not None and sg.numel() != hadamard:
        raise ValueError(f"signs must hold {hadamard} values, got {sg.numel()}")
    isc, is_r, is_k, div_r, div_k = dummy, 0, 0, 1, 1
    if in_scale is not None:
        if in_scale_rows not in (1, 128) or in_scale.dtype != torch.float32 or in_scale.dim() != 2:
            raise ValueError("in_scale: a 2-D float32 tile scale with 1 or 128 rows per tile")
        isc = in_scale
        # scale index of logical (r, k): stored (r, k) or (k, r) -> (stored row // rows, stored col // 128)
        if axis == 0:
            div_r, div_k, is_r, is_k = 128, in_scale_rows, in_scale.stride(1), in_scale.stride(0)
        else:
            div_r, div_k, is_r, is_k = in_scale_rows, 128, in_scale.stride(0), in_scale.stride(1)
    if kind.amax != AMAX_NONE and amax is None:
        amax = torch.zeros(1, device=dev, dtype=torch.int32)
        run_amax = True
    else:
        run_amax = False
    post = torch.ones((), device=dev, dtype=torch.float32) if kind.amax != AMAX_NONE else None
    dot_mode = 0 if not cuda else (1 if x.dtype == torch.bfloat16 and in_scale is None else 2)
    grid = (triton.cdiv(R, br), triton.cdiv(K, bk))
    common = dict(KIND=kind.code, G=kind.group, TR=kind.tile_rows, AMAX=kind.amax, E5M2=kind.e5m2,
                  TRANS=s_r == 1 and s_k != 1,
                  STOCHASTIC=stochastic, HB=hadamard, HAS_SIGNS=signs is not None, DOT_MODE=dot_mode,
                  INV_SQRT=float(torch.tensor(1.0 / math.sqrt(hadamard or 1), dtype=torch.float32)),
                  IN_SCALE=in_scale is not None, IN_DIV_R=div_r, IN_DIV_K=div_k, BR=br, BK=bk, num_warps=warps)
    seed_t = seed if seed is not None else torch.zeros(1, device=dev, dtype=torch.int64)
    amax_t = amax if amax is not None else torch.zeros(1, device=dev, dtype=torch.int32)
    args = (x, R, K, s_r, s_k, isc, is_r, is_k, h, sg, amax_t, seed_t)
    if run_amax:
        _rq_kernel[grid](*args, values, 0, 0, dummy, 0, 0, dummy, PASS=PASS_AMAX, WRITE_GS=False, **common)
    _rq_kernel[grid](*args, values, o_r, o_k, gs_t, gs_r, gs_k, post if post is not None else dummy,
                     PASS=PASS_QUANT, WRITE_GS=gs_out is not None, OUT_T=o_r == 1 and o_k != 1, **common)
    return RecipeOperand(values=values, post=post, gscale=gs_out, amax=amax if kind.amax != AMAX_NONE else None)


def occ_thresholds(x: torch.Tensor, quantile: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (lo, hi) clamp of MS-FP4's outlier clamping: the row's order statistics at int((1−q)·n) and int(q·n)
    (:func:`quartet.quant.quantizers.occ_clamp`), by ``torch.topk`` (the same values as the oracle's sort)."""
    n = x.shape[-1]
    lo_i = min(max(int((1.0 - quantile) * n), 0), n - 1)
    hi_i = min(max(int(quantile * n), 0), n - 1)
    hi = torch.topk(x, n - hi_i, dim=-1, largest=True, sorted=True).values[..., -1]
    lo = torch.topk(x, lo_i + 1, dim=-1, largest=False, sorted=True).values[..., -1]
    return lo.float().contiguous(), hi.float().contiguous()


def row_quantize(x: torch.Tensor, spec: QuantizerSpec, *, values: bool = True, deq: bool = False,
                 factor: bool = False, deq_dtype: torch.dtype = torch.bfloat16) -> RecipeOperand:
    """Row-scaled kinds (INT4 per row, MS-FP4) of a 2-D ``x`` along its last dim.

    ``values``: the codes q (exact in BF16), ``post`` their per-row scales (R,); ``deq``: x̂ = q·s (+ the OCC
    residual) in ``deq_dtype``; ``factor``: MS-FP4's DGE gradient factor (float32)."""
    if not HAS_TRITON:
        raise RuntimeError("triton is not installed; the fused quantizers need it")
    kind = _row_kind(spec)
    if kind is None:
        raise ValueError(f"row_quantize does not run {spec.label()}")
    if x.dim() != 2:
        raise ValueError(f"expected a 2-D operand, got shape {tuple(x.shape)}")
    R, K = x.shape
    dev = x.device
    occ = kind == R_MSFP4 and bool(spec.clip_quantile)
    fac = factor and kind == R_MSFP4 and bool(spec.dge_k)
    dummy = torch.empty(1, device=dev, dtype=torch.float32)
    lo, hi = occ_thresholds(x, spec.clip_quantile) if occ else (dummy, dummy)
    val_t = torch.empty(R, K, device=dev, dtype=torch.bfloat16) if values else None
    deq_t = torch.empty(R, K, device=dev, dtype=deq_dtype) if deq else None
    fac_t = torch.empty(R, K, device=dev, dtype=torch.float32) if fac else None
    post = torch.empty(R, device=dev, dtype=torch.float32)
    cuda = dev.type == "cuda"
    br, bk = (16, 256) if cuda else (64, 128)
    k_dge = float(spec.dge_k) if fac else 1.0
    _rq_row_kernel[(triton.cdiv(R, br),)](
        x, R, K, x.stride(0), x.stride(1), lo, hi, val_t if values else dummy, deq_t if deq else dummy,
        fac_t if fac else dummy, post, KIND=kind, OCC=occ, WRITE_VAL=values, WRITE_DEQ=deq, WRITE_FAC=fac,
        DGE_INV_K=1.0 / k_dge, DGE_P=1.0 / k_dge - 1.0, DGE_CAP=float(spec.dge_cap), BR=br, BK=bk, NK=triton.cdiv(K, bk), num_warps=4)
    return RecipeOperand(values=val_t, post=post, deq=deq_t, factor=fac_t)
