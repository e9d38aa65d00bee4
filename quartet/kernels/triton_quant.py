"""Fused MXFP4 operand quantizers in Triton: one pass over a bf16 operand.

The maths (the same as the pure-PyTorch oracle in :mod:`quartet.quant`):

* An operand of a GEMM ``C = A @ B.T`` is read as a logical matrix ``A[r, k]`` (``R`` rows, ``K`` the
  contraction axis) straight from its stored layout — a row-major tensor gives ``A`` itself, and the same
  tensor read with swapped strides gives ``Aᵀ``. So the transposed operands of the backward GEMMs
  (``Eᵀ``, ``X̂ᵀ``, ``Ŵᵀ``) are quantized without a transpose copy: the kernel loads the tile with the
  strides it is given and always *writes* ``(R, K)`` row-major, the layout FP8/FP4 GEMMs want.
* Each 32-group along ``k`` is rotated by ``y = (x ⊙ s) @ H₃₂`` (``s`` optional random ±1 signs applied
  BEFORE the Sylvester Hadamard, ``H₃₂`` orthonormal). We multiply by the ±1 matrix on the tensor cores
  (bf16 products of ±1 are exact, fp32 accumulation) and scale by ``1/√32`` afterwards.
* A group scale ``σ_g``: QuEST ``2^⌊log2(0.48707976·std(y)+1e-8)⌋`` (population std), the Quartet
  backward absmax rule ``2^(⌊log2 amax⌋−2)·4/3`` (nothing clips), or the OCP rule ``2^(⌊log2 amax⌋−2)``.
  ``⌊log2 v⌋`` is read from the float's exponent bits, so it is exact (no ``log2`` approximation). The absmax
  exponents are clamped to E8M0's range [−127, 127] after the −2 (2^-127 is a float32 subnormal, built from
  its bits). QuEST's σ of a group whose squares overflow float32 is recomputed on the group scaled by 2^-72
  (only in tiles that have such a group). A group holding Inf/NaN gets NaN values, mask False, E8M0 code 255
  (element codes 0) and NaN in FP8 under every rule — as the oracle — so a non-finite gradient stays visible.
* ``y/σ`` is rounded onto the E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6}: round-to-nearest with the thresholds
  0.25/0.75/1.25/1.75/2.5/3.5/5, or stochastically (P(up) = distance to the lower grid point over the
  gap, uniform numbers from Triton's Philox keyed by (seed, element index)); it saturates at 6. The
  QuEST mask is ``|y/σ| < 6``.
* Outputs (chosen per call): the dequantized ``q·σ`` (exact in bf16), packed E2M1 codes + E8M0 scales
  (Blackwell MXFP4), or FP8 with a folded per-row scale (Hopper): every E2M1 value times a power of two is
  an FP8 number, so ``q·σ_g = fp8(q·2^(e_g − e_row + shift)) · 2^(e_row − shift)`` [·4/3] where ``e_row`` is
  the largest group exponent of the row. That is exact while ``e_row − e_g`` stays within the FP8 format's
  range (≈14 binades for e4m3, ≈28 for e5m2); values beyond it are *flushed* (rounded in FP8) and counted.
  Block-scaled FP8 folds against the largest exponent of a 1×128 or 128×128 block instead. A 128×128 block may
  be quantized in row slices: each stores ``±q`` (exact in FP8) and its group exponents, and one in-place pass
  applies the fold once the block's exponent is known — the same bytes as folding in one piece.
"""
from __future__ import annotations

import math
import os

import torch

from quartet.quant.formats import exact_pow2, floor_log2

try:  # Triton ships with CUDA builds of torch; on a CPU box it is optional (interpreter mode for tests).
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None
    HAS_TRITON = False

#: scale rules (constexpr codes of the kernel)
RULE_QUEST, RULE_ABSMAX43, RULE_ABSMAX = 0, 1, 2
RULES = {"quest": RULE_QUEST, "absmax": RULE_ABSMAX43, "rtn_absmax": RULE_ABSMAX}
#: output modes of the kernel
MODE_DEQ, MODE_MX, MODE_ROWEXP, MODE_FP8, MODE_STAGE, MODE_BLOCK = 0, 1, 2, 3, 4, 5
#: FP8 folding: the per-group value q·2^(d+shift) with d = e_g - e_row <= 0 is exact down to ``min_exp``
#: (the exponent of the format's smallest subnormal step that still holds a 2-bit E2M1 significand).
FP8_FORMATS = {
    # name: (torch dtype name, shift so that 6·2^shift fits, smallest exact exponent of 0.5·2^(d+shift))
    "e4m3": ("float8_e4m3fn", 6, -9),   # 6·64 = 384 <= 448; subnormal step 2^-9
    "e5m2": ("float8_e5m2", 13, -16),   # 6·8192 = 49152 <= 57344; subnormal step 2^-16
}
INV_SQRT32 = 1.0 / math.sqrt(32.0)


def sylvester_pm1(n: int = 32) -> torch.Tensor:
    """The unnormalized ±1 Sylvester Hadamard matrix of order ``n`` (a power of two), float32."""
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


if HAS_TRITON:

    @triton.jit
    def _exp2i(e):
        """2**e for an int32 tensor e in [-127, 127], built from the exponent bits (exact; 2^-127, E8M0's smallest
        scale, is the float32 subnormal 0x00400000)."""
        return tl.where(e > -127, (e + 127) << 23, 0x400000).to(tl.float32, bitcast=True)

    @triton.jit
    def _pm1_dot_fp32(x, h):
        """``x @ h`` for a float32 ``x`` and a ±1 matrix ``h`` on BF16 tensor cores: three BF16 slices hold all 24 bits
        of x and each ±1 product is exact, float32 accumulation."""
        hb = h.to(tl.bfloat16)
        b1 = x.to(tl.bfloat16)
        r1 = x - b1.to(tl.float32)
        b2 = r1.to(tl.bfloat16)
        b3 = (r1 - b2.to(tl.float32)).to(tl.bfloat16)
        y = tl.dot(b1, hb, out_dtype=tl.float32)
        y += tl.dot(b2, hb, out_dtype=tl.float32)
        y += tl.dot(b3, hb, out_dtype=tl.float32)
        return y

    @triton.jit
    def _max_keep_nan(a, b):
        """max(a, b), NaN if either is NaN (a reduction's combine function)."""
        return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)

    @triton.jit
    def _rtn_e2m1(a):
        """Round |y/σ| (a >= 0) to the E2M1 grid, ties toward zero (thresholds .25/.75/1.25/1.75/2.5/3.5/5); NaN stays
        NaN (the GPU's plain min would return 6).

        With the grid step ``st`` of a's binade range (0.5 below 2, 1 below 4, 2 above) the nearest
        point with ties down is ``ceil(a/st − 0.5)·st``: a/st and the subtraction are exact, so this
        equals the threshold chain bit for bit in ~10 instructions instead of 14 compares and selects.
        """
        big = a >= 4.0
        mid = a >= 2.0
        inv = tl.where(big, 0.5, tl.where(mid, 1.0, 2.0))
        step = tl.where(big, 2.0, tl.where(mid, 1.0, 0.5))
        return tl.minimum(tl.ceil(a * inv - 0.5) * step, 6.0, propagate_nan=tl.PropagateNan.ALL)

    @triton.jit
    def _exp2_wide(p):
        """2**p as float32 for int32 p down to -252 (two exact factors: a scale exponent can be < -126)."""
        half = p >> 1
        return _exp2i(half) * _exp2i(p - half)

    if os.environ.get("TRITON_INTERPRET") == "1":
        @triton.jit
        def _to_bf16(x):
            """float32 -> bf16 rounded to nearest even, as on the GPU and in torch (the CPU interpreter's own cast
            truncates): add half an ulp of bf16 less one, plus the kept lowest bit, then drop the low 16 bits."""
            b = x.to(tl.uint32, bitcast=True)
            r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
            return tl.where(x != x, x, r).to(tl.bfloat16)

        @triton.jit
        def _to_fp8_nan(val, dtype: tl.constexpr):
            """``val.to(dtype)`` (an FP8 dtype) with NaN stored as NaN (0x7F in e4m3fn and e5m2): Triton's CPU
            interpreter turns NaN into 384 in e4m3fn, so its cast is patched here."""
            bits = val.to(dtype).to(tl.uint8, bitcast=True)
            return tl.where(val != val, 0x7F, bits).to(tl.uint8).to(dtype, bitcast=True)
    else:
        @triton.jit
        def _to_bf16(x):
            """float32 -> bf16, round to nearest even (the GPU's cvt.rn)."""
            return x.to(tl.bfloat16)

        @triton.jit
        def _to_fp8_nan(val, dtype: tl.constexpr):
            """``val.to(dtype)``: on the GPU the FP8 conversion keeps NaN a NaN by itself (no per-element fix-up on
            the hot path)."""
            return val.to(dtype)

    @triton.jit
    def _fold_store_fp8(sq, e, e_ref, fp8_ptr, offs, inb, flush_ptr, SHIFT: tl.constexpr, gmul, gvalid,
                        MIN_D: tl.constexpr):
        """Store signed E2M1 values ``sq`` (G, 32) of group exponents ``e`` (G,) as FP8 folded against the
        row / block exponent ``e_ref``: ``fp8(sq · 2^(e − e_ref + shift))``, and add the values that FP8
        cannot hold exactly to the flush counter. ``d`` is clamped to the shift: a row or block with no
        nonzero group has ``e_ref = -127`` and only zeros.

        Every E2M1 value is a multiple of 0.5 with at most two significant bits, so a group's values are all
        exact in FP8 when ``0.5 · 2^d`` is at least the format's smallest step, i.e. ``d >= MIN_D``. Only a
        tile holding a group (``gvalid``: one that may be nonzero) below that bound pays the per-element
        check — a rare tile, so the check costs ~nothing where nothing can flush (the count is the same)."""
        d = tl.minimum(e - e_ref + SHIFT, SHIFT)
        # gmul (G,): 1.0, or NaN for a non-finite QuEST group -- folded into the group's scale, not per element
        val = sq * (_exp2i(tl.maximum(d, -126)) * gmul)[:, None]
        f8 = _to_fp8_nan(val, fp8_ptr.dtype.element_ty)
        if tl.max((gvalid & (d < MIN_D)).to(tl.int32), axis=0) > 0:
            _count_flushed(f8, val, inb, flush_ptr)
        tl.store(fp8_ptr + offs, f8, mask=inb)

    @triton.jit
    def _count_flushed(f8, val, inb, flush_ptr):
        """Add the values that FP8 did not hold exactly (``f8 != val``; NaN, a non-finite QuEST group, is not one) to
        the flush counter."""
        flushed = (f8.to(tl.float32) != val) & (val == val) & inb
        n_flushed = tl.sum(tl.sum(flushed.to(tl.int32), axis=1), axis=0)
        if n_flushed > 0:
            tl.atomic_add(flush_ptr, n_flushed)

    @triton.jit
    def _load_staged(fp8_ptr, gexp_ptr, rows, k0, R, K):
        """What a one-pass fold's first stage stored for groups ``(rows, k0)``: the signed E2M1 values (G, 32) as float32
        and the int32 group exponents (G,), with the values' offsets, in-bounds mask and row mask. NaN (a non-finite
        group, stored as 0x7F) is read from the bits: Triton's CPU interpreter decodes 0x7F as a finite number."""
        c = tl.arange(0, 32)
        rmask = rows < R
        inb = rmask[:, None] & (c[None, :] < 32)
        offs = rows[:, None].to(tl.int64) * K + k0[:, None] + c[None, :]
        q8 = tl.load(fp8_ptr + offs, mask=inb, other=0.0)
        q = tl.where((q8.to(tl.uint8, bitcast=True) & 0x7F) == 0x7F, float("nan"), q8.to(tl.float32))
        e = tl.load(gexp_ptr + rows.to(tl.int64) * (K // 32) + k0 // 32, mask=rmask, other=0).to(tl.int32)
        return q, e, offs, inb, rmask

    @triton.jit
    def _store_staged(sq, e_stage, fp8_ptr, gexp_ptr, offs, inb, rows, k0, rmask, K):
        """A one-pass fold's first stage for groups ``(rows, k0)``: the signed E2M1 values ``sq`` (exact in either FP8
        format; NaN for a non-finite group) and the int8 group exponents ``e_stage``, read back by :func:`_load_staged`
        once the fold exponent is known."""
        tl.store(fp8_ptr + offs, _to_fp8_nan(sq, fp8_ptr.dtype.element_ty), mask=inb)
        tl.store(gexp_ptr + rows.to(tl.int64) * (K // 32) + k0 // 32, e_stage.to(tl.int8), mask=rmask)

    @triton.jit
    def _fold_block_in_place(fp8_ptr, gexp_ptr, flush_ptr, bscale_ptr, bscale_ld, R, K, pid_r, pid_k,
                             SHIFT: tl.constexpr, FACTOR: tl.constexpr, MIN_D: tl.constexpr, BLOCK_R: tl.constexpr,
                             SPLIT: tl.constexpr):
        """The end of a 128×128 block quantized in ``SPLIT`` slices: ``±q → fp8(±q · 2^(e_g − e_blk + shift))`` in place
        and the block scale ``2^(e_blk − shift)·factor``, with ``e_blk`` the largest of the block's group exponents
        (``gexp``; ``-128`` marks a group that may not raise it: all zero, non-finite or past the last row — its
        values are zeros or NaN, exact under any exponent). The same values and flush count as the one-piece tile;
        the per-element flush check runs, over the whole block as there, only where an unmarked group's exponent is
        more than the format's range below ``e_blk`` (a group that may flush)."""
        # the slices' stores by other threads of the program are visible after the barrier
        tl.debug_barrier()
        NG: tl.constexpr = BLOCK_R * SPLIT * 4
        gb = tl.arange(0, NG)
        brow = pid_r * (BLOCK_R * SPLIT) + gb // 4
        ge = tl.load(gexp_ptr + brow.to(tl.int64) * (K // 32) + pid_k * 4 + gb % 4, mask=brow < R, other=-128)
        ge = ge.to(tl.int32)
        e_blk = tl.maximum(tl.max(ge, axis=0), -127)  # a block of marked groups only: -127, as the one-piece tile
        check = tl.min(tl.where(ge == -128, 127, ge), axis=0) - e_blk + SHIFT < MIN_D
        g = tl.arange(0, BLOCK_R * 4)
        for sub in tl.range(0, SPLIT, num_stages=1):
            rows = (pid_r * SPLIT + sub) * BLOCK_R + g // 4
            q, e, offs, inb, _ = _load_staged(fp8_ptr, gexp_ptr, rows, pid_k * 128 + (g % 4) * 32, R, K)
            d = tl.minimum(e - e_blk + SHIFT, SHIFT)
            val = q * _exp2i(tl.maximum(d, -126))[:, None]
            f8 = _to_fp8_nan(val, fp8_ptr.dtype.element_ty)
            if check:
                _count_flushed(f8, val, inb, flush_ptr)
            tl.store(fp8_ptr + offs, f8, mask=inb)
        tl.store(bscale_ptr + pid_r * bscale_ld + pid_k, _exp2_wide(e_blk - SHIFT) * FACTOR)

    @triton.jit
    def _mx_quant_kernel(
        x_ptr, R, K, stride_r, stride_k, in_scale_ptr, in_s0, in_s1,
        signs_ptr, h_ptr,
        deq_ptr, mask_ptr, codes_ptr, scale_ptr, fp8_ptr, rowexp_ptr, flush_ptr, bscale_ptr, bscale_ld,
        seed, signs_bits,
        RULE: tl.constexpr, STOCHASTIC: tl.constexpr, HADAMARD: tl.constexpr, HAS_SIGNS: tl.constexpr,
        MODE: tl.constexpr, WRITE_MASK: tl.constexpr, WRITE_DEQ: tl.constexpr, DOT_BF16: tl.constexpr,
        IN_SCALE: tl.constexpr, COL_ORDER: tl.constexpr, FP8_SHIFT: tl.constexpr, SEED_PTR: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, IN_T: tl.constexpr = False, IN_BR: tl.constexpr = 1,
        SCALE_BR: tl.constexpr = 1, FACTOR: tl.constexpr = 1.0, CAST_BF16: tl.constexpr = False,
        FP8_MIN_D: tl.constexpr = -8, MASK_BITS: tl.constexpr = False, IN_SCALE_VEC: tl.constexpr = False,
        SPLIT: tl.constexpr = 1,
    ):
        # The tile is handled as G groups x 32 elements from the start (no reshapes): group g covers
        # logical row r(g), columns k0(g) .. k0(g)+31. COL_ORDER numbers groups row-fastest, so that
        # neighbouring groups are neighbours in memory when the operand is read along its columns.
        NJ: tl.constexpr = BLOCK_K // 32
        G: tl.constexpr = BLOCK_R * NJ
        pid_r = tl.program_id(0)
        pid_k = tl.program_id(1)
        for sub in tl.range(0, SPLIT, num_stages=1):
            # SPLIT > 1: the program's 128-row block in SPLIT slices of BLOCK_R rows (see _fold_block_in_place)
            row0 = (pid_r * SPLIT + sub) * BLOCK_R
            g = tl.arange(0, G)
            if COL_ORDER:
                r_loc = g % BLOCK_R
                j_loc = g // BLOCK_R
            else:
                r_loc = g // NJ
                j_loc = g % NJ
            rows = row0 + r_loc
            k0 = pid_k * BLOCK_K + j_loc * 32
            c = tl.arange(0, 32)
            rmask = rows < R
            inb = rmask[:, None] & (c[None, :] < 32)
            kk = k0[:, None] + c[None, :]
            src = x_ptr + rows[:, None].to(tl.int64) * stride_r + kk.to(tl.int64) * stride_k
            xg = tl.load(src, mask=inb, other=0.0)
            if CAST_BF16:
                # a float32 operand (training's master weight) rounded to bf16 as it is loaded: the layer's
                # `.to(torch.bfloat16)` without its own kernel and copy
                xg = _to_bf16(xg)
            if IN_SCALE == 1:  # one input scale per logical row (FP8-stored operand read along its rows)
                xg = xg.to(tl.float32) * tl.load(in_scale_ptr + rows, mask=rmask, other=0.0)[:, None]
            elif IN_SCALE == 2:  # one input scale per logical column (read along its columns)
                xg = xg.to(tl.float32) * tl.load(in_scale_ptr + kk)
            elif IN_SCALE == 3:
                # a block-scaled FP8 operand: one scale per (stored row // IN_BR, stored column // 128)
                if IN_T and IN_SCALE_VEC:
                    # the scale of element (g, c) depends only on its stored row k0(g) + c: one load per stored row
                    # of the tile (BLOCK_K), broadcast over the tile's groups (the tile lies inside one 128-block of
                    # stored columns: BLOCK_R divides 128)
                    kv = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
                    sv = tl.load(in_scale_ptr + (kv // IN_BR) * in_s0 + (row0 // 128) * in_s1)
                    s3 = tl.reshape(sv, (NJ, 1, 32))
                    if COL_ORDER:
                        sg = tl.reshape(tl.broadcast_to(s3, (NJ, BLOCK_R, 32)), (G, 32))
                    else:
                        sg = tl.reshape(tl.broadcast_to(tl.reshape(sv, (1, NJ, 32)), (BLOCK_R, NJ, 32)), (G, 32))
                    xg = xg.to(tl.float32) * sg
                elif IN_T:
                    s_off = (kk // IN_BR) * in_s0 + (rows // 128)[:, None] * in_s1
                    xg = xg.to(tl.float32) * tl.load(in_scale_ptr + s_off, mask=inb, other=0.0)
                else:
                    s_off = (rows // IN_BR)[:, None] * in_s0 + (kk // 128) * in_s1
                    xg = xg.to(tl.float32) * tl.load(in_scale_ptr + s_off, mask=inb, other=0.0)

            # ---- rotation: (x ⊙ signs) @ H±1, then 1/sqrt(32) -----------------------------------------
            if HADAMARD:
                h = tl.load(h_ptr + c[:, None] * 32 + c[None, :])
                if HAS_SIGNS == 1:
                    sg = tl.load(signs_ptr + c)
                elif HAS_SIGNS == 2:
                    # signs passed by value as a 32-bit mask (bit i set: sign i is -1): no host-to-device copy
                    sg = 1.0 - 2.0 * ((signs_bits >> c) & 1).to(tl.float32)
                if HAS_SIGNS != 0:
                    h = h * sg[:, None]  # diag(s) @ H: still ±1, so the products stay exact
                if DOT_BF16 == 1:
                    y = tl.dot(xg.to(tl.bfloat16), h.to(tl.bfloat16), out_dtype=tl.float32)
                elif DOT_BF16 == 2:
                    y = _pm1_dot_fp32(xg.to(tl.float32), h)
                else:
                    y = tl.dot(xg.to(tl.float32), h.to(tl.float32), input_precision="ieee")
                y = y * 0.17677669529663687
            else:
                y = xg.to(tl.float32)

            # ---- group scale exponent (exact floor(log2 v) from the float bits) ---------------------------
            if RULE == 0:
                # two-pass population std (mean first); the oracle uses the one-pass sqrt(E[y²] − E[y]²), which
                # agrees after the power-of-two floor (see quartet.quant.mx.quest_scales)
                mean = tl.sum(y, axis=1) / 32.0
                dev_ = y - mean[:, None]
                var = tl.sum(dev_ * dev_, axis=1) / 32.0
                sd = 0.48707976 * tl.sqrt_rn(var)
                ovf = (var != var) | (var > 3.4028234663852886e38)
                if tl.max(ovf.to(tl.int32), axis=0) > 0:
                    # rare: some group's squares overflowed float32 (|y| ≳ 1e19) or it holds Inf/NaN. Redo those
                    # groups scaled by 2^-72 (exact), as the oracle; Inf/NaN stay non-finite (NaN scale below)
                    ys = y * tl.where(ovf, 2.117582368135751e-22, 1.0)[:, None]
                    mean_s = tl.sum(ys, axis=1) / 32.0
                    dev_s = ys - mean_s[:, None]
                    var_s = tl.sum(dev_s * dev_s, axis=1) / 32.0
                    sd = tl.where(ovf, (0.48707976 * tl.sqrt_rn(var_s)) * 4.722366482869645e21, sd)
                v = sd + 1e-8
                e = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # 128 where v is Inf/NaN: E8M0 code 255
            else:
                # a group holding Inf/NaN must get a non-finite amax (all exponent bits set). Rotated, every value of
                # such a group is Inf/NaN and the plain max sees it; unrotated, a lone NaN needs the NaN-keeping max
                # (the GPU's plain max returns the other operand). No layer call reads unrotated: its cost is unmeasured
                if HADAMARD:
                    v = tl.max(tl.abs(y), axis=1)
                else:
                    v = tl.reduce(tl.abs(y), 1, _max_keep_nan)
                v_exp = (v.to(tl.int32, bitcast=True) >> 23) & 0xFF
                # clamped to E8M0's range after the −2 (amax < 2^-124 → 2^-127); all-zero group: 2^-2 as the oracle
                e = tl.where(v > 0.0, tl.maximum(v_exp - 127 - 2, -127), -2)
            # a group holding Inf/NaN: NaN values, mask False, E8M0 NaN, FP8 NaN. QuEST's (a non-finite σ: e = 128)
            # multiplies its scale by NaN (gnan). An absmax group's (a non-finite amax, bad_g) values turn NaN by
            # themselves: its inverse scale is NaN and the rounding keeps NaN; leaving nan_g constant False under
            # the absmax rules keeps the per-group NaN work out of the backward's kernels (with it live, E and Eᵀ RTN
            # ran 4.5-5.5% slower: 5bc7341:benchmarks/results/bench_round8/nan_plainmax_rotated)
            nan_g = e > 127
            e = tl.minimum(e, 127)
            gnan = tl.where(nan_g, float("nan"), 1.0)  # multiplies a group's scale: NaN values without a per-element select
            if RULE == 0:
                bad_g = nan_g
            else:
                bad_g = v_exp == 0xFF

            # the exponent a group contributes to its row's / block's FP8 fold exponent: all-zero groups
            # (padding, dead units) and rows past the end must not raise it (absmax gives them 2^-2). A
            # row/block with no such group keeps -127; the fold then clamps d to the shift (its values are 0)
            g_valid = rmask & ((RULE == 0) | (v > 0.0)) & ~bad_g
            e_fold = tl.where(g_valid, e, -127)
            if MODE == 2 or MODE == 4:
                # the FP8 fold needs the largest group exponent of each output row
                if COL_ORDER:
                    er = tl.max(tl.reshape(e_fold, (NJ, BLOCK_R)), axis=0)
                else:
                    er = tl.max(tl.reshape(e_fold, (BLOCK_R, NJ)), axis=1)
                rr_ = row0 + tl.arange(0, BLOCK_R)
                tl.atomic_max(rowexp_ptr + rr_, er, mask=rr_ < R)
            if MODE != 2:
                # ---- scale and round ------------------------------------------------------------------
                inv_s = _exp2i(-e)
                if RULE != 0:
                    inv_s = tl.where(bad_g, float("nan"), inv_s)  # every value of the group NaN
                if RULE == 1:
                    # oracle order: divide by the exact power of two, then multiply by 3/4 (one rounding)
                    yq = (y * inv_s[:, None]) * 0.75
                else:
                    yq = y * inv_s[:, None]  # exact: power-of-two scale
                a = tl.abs(yq)
                if STOCHASTIC:
                    gid = rows * (K // 32) + k0 // 32
                    if SEED_PTR:  # the seed lives on the device (CUDA-graph replays draw fresh seeds)
                        sd = tl.load(seed)
                    else:
                        sd = seed
                    # one Philox call yields four 32-bit numbers, each split into two 16-bit uniforms r: draw per
                    # (group, 4 lanes) and spread the 32 uniforms over the group's 32 elements (a fixed bijection),
                    # an eighth of tl.rand's work; the generator was the SR kernel's cost
                    offs4 = gid[:, None] * 4 + tl.arange(0, 4)[None, :]
                    r0, r1, r2, r3 = tl.randint4x(sd, offs4)
                    rr = tl.join(tl.join(r0, r1), tl.join(r2, r3))
                    # r written under the exponent of 2^23 is the float 2^23 + r, exactly: no int->float conversion
                    # (I2F, an instruction of the slower conversion unit); the high half takes one LEA.HI, the low half
                    # two LOP3
                    rr = tl.reshape(tl.join(rr & 0xFFFF, rr >> 16), (G, 32))
                    u = (rr | 0x4B000000).to(tl.float32, bitcast=True)
                    # a/st = n + f (st the E2M1 grid step around a: 0.5 below 2, 1 below 4, then 2; n whole, f in
                    # [0, 1)) must go up to n + 1 with probability f. In units of 2^-16 of a step: one FMA gives
                    # v = 2^23 + r + round(2^16·a/st) exactly (a/st·2^16 is exact, the sum's ulp is 1), and n or
                    # n + 1 = floor(v/2^16 - 128), up when r >= 2^16 - round(2^16·f): P(up) = round(2^16·f)/2^16,
                    # within 2^-17 of f and centred. Two FMAs, a floor and a multiply instead of a floor, five
                    # arithmetic ops, a compare and a select (selects, not a division: the kernel is instruction
                    # bound). Grid points (f = 0) and zero never move (r < 2^16); NaN stays NaN, Inf clamps to 6
                    big = a >= 4.0
                    mid = a >= 2.0
                    inv_ulp = tl.where(big, 32768.0, tl.where(mid, 65536.0, 131072.0))  # 2^16 / st
                    step = tl.where(big, 2.0, tl.where(mid, 1.0, 0.5))
                    n = tl.floor((a * inv_ulp + u) * 1.52587890625e-05 - 128.0)
                    q = tl.minimum(n * step, 6.0, propagate_nan=tl.PropagateNan.ALL)
                else:
                    q = _rtn_e2m1(a)
                neg = yq < 0
                # the signed grid value, written once for all its uses: repeated at each use, ptxas gave the
                # transposed SR read more registers and it ran slower (measured: docs/kernels.md, tuning table)
                sq = tl.where(neg, -q, q)
                out_offs = rows[:, None].to(tl.int64) * K + kk

                if WRITE_MASK:
                    keep = (a < 6.0) & ~nan_g[:, None]
                    if MASK_BITS:
                        # one 32-bit word per group, bit c = element c: an eighth of the int8 mask's bytes, written
                        # here and read by the backward's inverse rotation (distinct powers of two: the sum is an OR)
                        words = tl.sum(keep.to(tl.int32) << c[None, :], axis=1)
                        tl.store(mask_ptr + rows.to(tl.int64) * (K // 32) + k0 // 32, words, mask=rmask)
                    else:
                        tl.store(mask_ptr + out_offs, keep.to(tl.int8), mask=inb)
                if WRITE_DEQ:
                    if RULE == 1:
                        deq = (sq * _exp2i(e)[:, None]) * 1.3333333333333333
                    else:
                        deq = sq * (_exp2i(e) * gnan)[:, None]
                    tl.store(deq_ptr + out_offs, deq.to(deq_ptr.dtype.element_ty), mask=inb)
                if MODE == 1:
                    mag = tl.where(q < 2.0, q * 2.0, tl.where(q < 4.0, q + 2.0, tl.where(q < 5.0, 6.0, 7.0)))
                    code = mag.to(tl.int32) | tl.where(neg & (q > 0.0), 8, 0)
                    code = tl.where(bad_g[:, None], 0, code)  # the group's E8M0 code 255 makes it NaN
                    lo_c, hi_c = tl.split(tl.reshape(code, (G, 16, 2)))
                    packed = (lo_c | (hi_c << 4)).to(tl.uint8)
                    c16 = tl.arange(0, 16)
                    pdst = codes_ptr + rows[:, None].to(tl.int64) * (K // 2) + (k0 // 2)[:, None] + c16[None, :]
                    tl.store(pdst, packed, mask=rmask[:, None] & (c16[None, :] < 16))
                    e8 = tl.where(bad_g, 255, e + 127)
                    tl.store(scale_ptr + rows.to(tl.int64) * (K // 32) + k0 // 32, e8.to(tl.uint8), mask=rmask)
                if MODE == 4:
                    # one-pass FP8 fold, stage 1: the signed E2M1 values and the group exponents (an int8 side
                    # buffer); _fp8_fold_kernel scales them in place once every row's largest exponent is known
                    _store_staged(sq * gnan[:, None], e, fp8_ptr, scale_ptr, out_offs, inb, rows, k0, rmask, K)
                if MODE == 5 and SPLIT > 1:
                    # one slice of a 128x128 block: its fold exponent is known only after the last slice, so the
                    # signed E2M1 values and the groups' fold exponents are stored as they are (-128 marks a group
                    # that may not raise the block's exponent); _fold_block_in_place rescales them once the block is
                    # done (the slices are still in L2)
                    _store_staged(sq * gnan[:, None], tl.where(g_valid, e, -128), fp8_ptr, scale_ptr, out_offs, inb,
                                  rows, k0, rmask, K)
                elif MODE == 5:
                    # FP8 with one scale per 1x128 (SCALE_BR=1) or 128x128 (SCALE_BR=128) block, the
                    # block-wise recipes of F.scaled_mm: the tile is exactly one block wide (BLOCK_K=128),
                    # so the block's largest group exponent is known here and no second pass is needed
                    if SCALE_BR == 1:
                        if COL_ORDER:
                            eb = tl.max(tl.reshape(e_fold, (NJ, BLOCK_R)), axis=0)
                            eg = tl.reshape(tl.broadcast_to(eb[None, :], (NJ, BLOCK_R)), (G,))
                        else:
                            eb = tl.max(tl.reshape(e_fold, (BLOCK_R, NJ)), axis=1)
                            eg = tl.reshape(tl.broadcast_to(eb[:, None], (BLOCK_R, NJ)), (G,))
                    else:
                        eb = tl.max(e_fold, axis=0)
                        eg = eb
                    _fold_store_fp8(sq, e, eg, fp8_ptr, out_offs, inb, flush_ptr, FP8_SHIFT, gnan,
                                    g_valid, FP8_MIN_D)
                    sc = _exp2_wide(eb - FP8_SHIFT) * FACTOR  # the block scale 2^(e_blk − shift)·factor
                    if SCALE_BR == 1:
                        # stored (K/128, R) row-major: the (R, K/128) column-major view F.scaled_mm wants
                        rr_ = row0 + tl.arange(0, BLOCK_R)
                        tl.store(bscale_ptr + pid_k.to(tl.int64) * R + rr_, sc, mask=rr_ < R)
                    else:
                        # stored (R/128, bscale_ld) row-major, K blocks padded to a multiple of 4
                        tl.store(bscale_ptr + pid_r * bscale_ld + pid_k, sc)
                if MODE == 3:
                    er = tl.load(rowexp_ptr + rows, mask=rmask, other=0)
                    _fold_store_fp8(sq, e, er, fp8_ptr, out_offs, inb, flush_ptr, FP8_SHIFT, gnan,
                                    g_valid, FP8_MIN_D)
        if SPLIT > 1:
            _fold_block_in_place(fp8_ptr, scale_ptr, flush_ptr, bscale_ptr, bscale_ld, R, K, pid_r, pid_k, FP8_SHIFT,
                                 FACTOR, FP8_MIN_D, BLOCK_R, SPLIT)

    @triton.jit
    def _fp8_fold_kernel(fp8_ptr, gexp_ptr, rowexp_ptr, flush_ptr, rowscale_ptr, R, K,
                         FP8_SHIFT: tl.constexpr, FACTOR: tl.constexpr, BLOCK_R: tl.constexpr,
                         BLOCK_K: tl.constexpr, FP8_MIN_D: tl.constexpr):
        """Stage 2 of the one-pass FP8 fold (in place): ±q  ->  fp8(±q · 2^(e_g − e_row + shift)).

        The same arithmetic and flush rule as MODE 3 of ``_mx_quant_kernel``, on 1 byte per element
        plus one int8 exponent per group, so it is memory bound and cheap next to re-rotating the input.
        """
        NJ: tl.constexpr = BLOCK_K // 32
        G: tl.constexpr = BLOCK_R * NJ
        g = tl.arange(0, G)
        rows = tl.program_id(0) * BLOCK_R + g // NJ
        k0 = tl.program_id(1) * BLOCK_K + (g % NJ) * 32
        q, e, offs, inb, rmask = _load_staged(fp8_ptr, gexp_ptr, rows, k0, R, K)
        er = tl.load(rowexp_ptr + rows, mask=rmask, other=0)
        _fold_store_fp8(q, e, er, fp8_ptr, offs, inb, flush_ptr, FP8_SHIFT, tl.full((G,), 1.0, tl.float32), rmask,
                        FP8_MIN_D)
        if tl.program_id(1) == 0:
            # the row scales 2^(e_row − shift)·factor
            rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
            er_ = tl.load(rowexp_ptr + rr, mask=rr < R, other=0)
            tl.store(rowscale_ptr + rr, _exp2_wide(er_ - FP8_SHIFT) * FACTOR, mask=rr < R)

    @triton.jit
    def _masked_ihadamard_kernel(g_ptr, mask_ptr, h_ptr, out_ptr, R, K, scale,
                                 HAS_MASK: tl.constexpr, DOT_MODE: tl.constexpr,
                                 BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
        """out = ((g ⊙ mask) · scale) @ H₃₂ᵀ blockwise along the last dim (the quantizer's STE backward)."""
        G: tl.constexpr = BLOCK_R * BLOCK_K // 32
        offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        inb = (offs_r[:, None] < R) & (offs_k[None, :] < K)
        offs = offs_r[:, None].to(tl.int64) * K + offs_k[None, :]
        g = tl.load(g_ptr + offs, mask=inb, other=0.0).to(tl.float32)
        if HAS_MASK == 1:  # one int8 per element
            m = tl.load(mask_ptr + offs, mask=inb, other=0)
            g = tl.where(m != 0, g, 0.0)
        j = tl.arange(0, 32)
        h = tl.load(h_ptr + j[:, None] * 32 + j[None, :])
        gg = tl.reshape(g, (G, 32))
        if HAS_MASK == 2:  # one int32 word per 32-group (mx_quantize(mask_bits=True)): bit j keeps element j
            NJ: tl.constexpr = BLOCK_K // 32
            gi = tl.arange(0, G)
            wrow = tl.program_id(0) * BLOCK_R + gi // NJ
            wcol = tl.program_id(1) * NJ + gi % NJ
            words = tl.load(mask_ptr + wrow.to(tl.int64) * (K // 32) + wcol, mask=(wrow < R) & (wcol < K // 32),
                            other=0)
            gg = tl.where(((words[:, None] >> j[None, :]) & 1) != 0, gg, 0.0)
        # H is symmetric, so H^T = H; a bf16 high part plus a bf16 low part keeps ~16 bits of an fp32 input
        if DOT_MODE == 0:  # exact fp32 (the CPU interpreter)
            y = tl.dot(gg, h, input_precision="ieee")
        else:
            hi = gg.to(tl.bfloat16)
            y = tl.dot(hi, h.to(tl.bfloat16), out_dtype=tl.float32)
            if DOT_MODE == 2:
                lo = (gg - hi.to(tl.float32)).to(tl.bfloat16)
                y += tl.dot(lo, h.to(tl.bfloat16), out_dtype=tl.float32)
        y = y * (scale * 0.17677669529663687)
        tl.store(out_ptr + offs, tl.reshape(y, (BLOCK_R, BLOCK_K)).to(out_ptr.dtype.element_ty), mask=inb)


# ------------------------------------------------------------------------------------------------
# Python wrappers
# ------------------------------------------------------------------------------------------------
_H_CACHE: dict[tuple[str, int | None], torch.Tensor] = {}


def _hmat(device: torch.device) -> torch.Tensor:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # one entry per GPU, however the device was named
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device.type, device.index)
    if key not in _H_CACHE:
        _H_CACHE[key] = sylvester_pm1(32).to(device=device, dtype=torch.float32).contiguous()
    return _H_CACHE[key]


def prepare_device(device) -> None:
    """Create the kernels' shared constants (the 32x32 Hadamard) on ``device`` now.

    Call before a model is captured in CUDA graphs: a constant first created during a graph's warm-up would be
    allocated in the graph's memory pool and then held by this cache, which torch rejects ("Detected 1 tensor(s)
    in the cudagraph pool not tracked as outputs") — the first ladder sweep with traced Quartet layers failed so."""
    _hmat(device)


def signs_to_bits(signs: torch.Tensor) -> int:
    """The 32-bit mask of 32 ±1 signs (bit i set where sign i is −1), for ``mx_quantize(signs=int)``."""
    neg = (signs.reshape(-1) < 0).tolist()
    if len(neg) != 32:
        raise ValueError(f"expected 32 signs, got {len(neg)}")
    return sum(1 << i for i, n in enumerate(neg) if n)


def unpack_mask_bits(words: torch.Tensor) -> torch.Tensor:
    """The bool ``(R, 32·W)`` mask of packed int32 words ``(R, W)`` (bit ``c`` of word ``j``: element ``32·j + c``)."""
    if words.dtype != torch.int32 or words.dim() != 2:
        raise ValueError(f"expected 2-D int32 mask words, got {words.dtype} of shape {tuple(words.shape)}")
    bit = torch.arange(32, device=words.device, dtype=torch.int32)
    return ((words.unsqueeze(-1) >> bit) & 1).bool().reshape(words.shape[0], -1)


class QuantizedOperand:
    """One quantized GEMM operand, always laid out ``(R, K)`` row-major with groups of 32 along ``K``.

    Fields are ``None`` unless requested: ``deq`` (dequantized values, bf16 by default), ``mask`` (bool,
    QuEST "not clipped") or ``mask_bits`` (the same packed: int32 ``(R, K/32)``, bit ``c`` of word ``j`` for element
    ``32·j + c``), ``fp8`` + ``row_scale`` (``(R, 1)`` float32; ``fp8 * row_scale == deq`` where
    nothing was flushed), ``codes`` (``(R, K/2)`` uint8, two E2M1 codes per byte, low nibble first) +
    ``e8m0`` (``(R, K/32)`` uint8 biased exponents), ``flushed`` (int32 count of FP8 values that are not
    exact), ``factor`` (the non-power-of-two part of the scale that E8M0 cannot hold: 4/3 for the
    Quartet backward absmax rule, else 1 — a GEMM on ``codes`` multiplies its output by the product).
    Block-scaled FP8 (``fp8_block``) has ``block_scale`` instead of ``row_scale``: float32 indexed
    ``[r // scale_rows, k // 128]`` — ``(R, K/128)`` column-major for ``scale_rows == 1`` (the 1×128
    recipe's layout), ``(R/128, K/128 padded to 4)`` row-major for ``scale_rows == 128`` — already the
    tensors ``F.scaled_mm`` takes (the second transposed, as the scale of ``b.T``).
    """

    __slots__ = ("deq", "mask", "mask_bits", "fp8", "row_scale", "codes", "e8m0", "flushed", "factor", "rowexp", "fp8_shift",
                 "block_scale", "scale_rows")

    def __init__(self, **kw):
        for name in self.__slots__:
            setattr(self, name, kw.get(name))
        if self.factor is None:
            self.factor = 1.0

    def fp8_values(self) -> torch.Tensor:
        """The FP8 operand times its row or block scales, float32 ``(R, K)`` (equals ``deq`` where
        nothing was flushed). For tests, debugging and the BF16 fallback."""
        if self.fp8 is None:
            raise ValueError("no FP8 output in this operand")
        v = self.fp8.to(torch.float32)
        if self.block_scale is None:
            return v * self.row_scale
        R, K = v.shape
        sc = self.block_scale.repeat_interleave(self.scale_rows, 0)[:R, : K // 128]
        return v * sc.repeat_interleave(128, 1)


def _logical(x: torch.Tensor, axis: int):
    """(R, K, stride_r, stride_k) of the logical matrix whose rows hold groups along ``axis``."""
    if x.dim() != 2:
        raise ValueError(f"expected a 2-D operand, got shape {tuple(x.shape)}")
    if axis in (-1, 1):
        return x.shape[0], x.shape[1], x.stride(0), x.stride(1)
    if axis == 0:
        return x.shape[1], x.shape[0], x.stride(1), x.stride(0)
    raise ValueError(f"axis must be 0, 1 or -1, got {axis}")


#: GPU tile (rows, cols, warps) of the quantizer launches: large enough to share the per-group scale work, small
#: enough for several programs per SM; ``QUARTET_QBLOCK=r,k,w`` overrides it and :data:`GPU_BLOCK_DIRECT` (for
#: sweeps). Measured: docs/kernels.md, tuning table.
GPU_BLOCK = (32, 128, 4)
#: Tile and register cap of the direct reads (``axis=-1``) that write no FP8 — dequantized values or MX codes, what the
#: ``triton`` backend runs — when the group axis is a multiple of 256: the wider, shorter tile under a cap of 80 runs
#: the dequantizing recipes nearer the copy bandwidth. Transposed reads and the FP8 launches keep :data:`GPU_BLOCK`
#: (the 1×128 FP8 launches are slower with 16-row tiles). Measured: docs/kernels.md, tuning table.
GPU_BLOCK_DIRECT = (16, 256, 4)
MAXNREG_DIRECT = 80
#: warps of the one-piece 128x128-row tiles of ``fp8_block=128`` (see :data:`BLOCK128_SPLIT`). The tile's registers
#: allow one program per SM, so more warps is the only way to more occupancy. ``QUARTET_QBLOCK128_WARPS`` overrides it
#: (for sweeps). Measured: docs/kernels.md, tuning table.
BLOCK128_WARPS = int(os.environ.get("QUARTET_QBLOCK128_WARPS", "16"))
#: Row slices of a ``fp8_block=128`` launch, by launch kind (``"128x128"``, `` T`` a transposed read, `` SR`` stochastic
#: rounding): 1 runs the 128×128 block as one 16-warp tile; ``n`` > 1 as ``n`` tiles of 128/n rows, one
#: after the other in a 4-warp program, each storing its signed E2M1 values and group exponents, then an in-place fold
#: by the block's exponent (the values are still in L2; ``_fold_block_in_place``). A sliced launch runs uncapped (its
#: tile is the 1×128 kind's shape: 4–5 programs per SM). Slices trade that occupancy for the second pass of the fold,
#: so the best count depends on the kind (the direct SR kind, which no layer call makes, follows direct RTN).
#: ``QUARTET_QBLOCK128_SPLIT=n`` gives every kind ``n`` slices (1: every block in one piece). Measured:
#: docs/kernels.md, tuning table.
BLOCK128_SPLIT_MEASURED: dict[str, int] = {"128x128": 4, "128x128 SR": 4, "128x128 T": 1, "128x128 T SR": 8}
#: warps of a sliced 128×128 program (a module attribute ``benchmarks/layer_variants.py --sections slicewarps`` swaps).
#: Measured: docs/kernels.md, tuning table.
BLOCK128_SPLIT_WARPS = 4


def split_table(n: int) -> dict[str, int]:
    """A :data:`BLOCK128_SPLIT` table giving every 128×128 launch kind ``n`` row slices."""
    return dict.fromkeys(BLOCK128_SPLIT_MEASURED, n)


def _split_from_env() -> dict[str, int]:
    """The slices table: :data:`BLOCK128_SPLIT_MEASURED`, or ``QUARTET_QBLOCK128_SPLIT``'s one count for every kind."""
    text = os.environ.get("QUARTET_QBLOCK128_SPLIT", "").strip()
    if not text:
        return dict(BLOCK128_SPLIT_MEASURED)
    if text not in ("1", "2", "4", "8"):
        raise ValueError(f"QUARTET_QBLOCK128_SPLIT must be 1, 2, 4 or 8 (row slices of a 128x128 block), got {text!r}")
    return split_table(int(text))


#: the slices in force (a module global the benchmarks swap; see :data:`BLOCK128_SPLIT_MEASURED`)
BLOCK128_SPLIT = _split_from_env()
#: Caps on the registers per thread of the block-scaled FP8 launches (ptxas ``.maxnreg``; the fused layer's recipes),
#: by launch kind: ``"1x128"`` / ``"128x128"`` the tile of ``fp8_block=1`` / ``128``, `` T`` a transposed read
#: (``axis=0``); None lets ptxas choose. Registers set these kernels' occupancy (65536 per SM): uncapped, the 1×128
#: recipes compile to 96–127 registers, 4–5 programs of 4 warps per SM, and the 128×128 ones to 93–127, one 16-warp
#: program per SM; a cap trades occupancy for instructions and, below ~96, spills (``benchmarks/sass_report.py
#: --maxnreg``), so each kind has the cap that ran it fastest (a cap that helps one kind slows another).
#: ``QUARTET_MAXNREG`` overrides the table for a process: ``none`` (nothing capped) or ``a[,b]``
#: (``a`` for both 1×128 kinds, ``b`` for both 128×128 kinds, default ``a``; either may be ``none``);
#: ``mx_quantize(maxnreg=...)`` overrides it per call. A key ``"<kind> SR"`` gives stochastic rounding's launches of that
#: kind their own cap (else they take the kind's): uncapped, the transposed 1×128 SR read compiles to 135 registers
#: (3 programs per SM instead of 4); capped at 128 it keeps 4 programs per SM without spills. Measured:
#: docs/kernels.md, tuning table.
MAXNREG_MEASURED: dict[str, int | None] = {"1x128": 96, "1x128 T": None, "1x128 T SR": 128, "128x128": None,
                                           "128x128 T": 64}


def caps_table(a: int | None, b: int | None) -> dict[str, int | None]:
    """A :data:`MAXNREG` table: cap ``a`` for both 1×128 reads, ``b`` for both 128×128 reads (None: uncapped), no
    ``"<kind> SR"`` entries (stochastic rounding takes its kind's cap)."""
    return {"1x128": a, "1x128 T": a, "128x128": b, "128x128 T": b}


def _caps_from_env() -> dict[str, int | None]:
    """The register-cap table: :data:`MAXNREG_MEASURED`, or what ``QUARTET_MAXNREG`` says instead."""
    text = os.environ.get("QUARTET_MAXNREG", "").strip().lower()
    if not text:
        return dict(MAXNREG_MEASURED)
    try:
        a, _, b = (part.strip() for part in text.partition(","))
        a_cap = None if a == "none" else int(a)
        b_cap = a_cap if not b else None if b == "none" else int(b)
    except ValueError:
        raise ValueError(f"QUARTET_MAXNREG must be 'none' or 'a[,b]' (register caps or 'none'), got {text!r}") from None
    return caps_table(a_cap, b_cap)


#: the register caps in force (a module global the benchmarks swap; see :data:`MAXNREG_MEASURED`)
MAXNREG = _caps_from_env()
#: load a transposed block-scaled FP8 input's scales once per stored row of the tile instead of once per element:
#: fewer loads and a quarter of the 128×128 tile's shared memory, so the backward's Ŵᵀ and X̂ᵀ reads run faster. A
#: module flag so that ``benchmarks/layer_variants.py --sections inscale`` can time both; the outputs are the same
#: either way. Measured: docs/kernels.md, tuning table.
IN_SCALE_PER_ROW = True


def _blocks(R: int, K: int, device: torch.device, direct: bool = False) -> tuple[int, int, int, int | None]:
    """Tile shape, warps and register cap: big tiles on the GPU, small ones for the CPU interpreter. (Transposed reads use
    the same tile: no other tile of ``benchmarks/layer_variants.py --sections tiles`` ran Eᵀ faster; docs/kernels.md,
    tuning table.) ``direct``: a direct read writing no FP8, which takes :data:`GPU_BLOCK_DIRECT` and its cap
    :data:`MAXNREG_DIRECT` when ``K`` is a multiple of 256 (a tile named by ``QUARTET_QBLOCK`` runs uncapped)."""
    if device.type != "cuda":
        return 16, 64, 4, None
    env = os.environ.get("QUARTET_QBLOCK")
    if env:
        br, bk, w = (int(v) for v in env.split(","))
        return br, bk, w, None
    if direct and K % GPU_BLOCK_DIRECT[1] == 0:
        return (*GPU_BLOCK_DIRECT, MAXNREG_DIRECT)
    br, bk, w = GPU_BLOCK
    while K % bk:
        bk //= 2
    return br, bk, w, None


def mx_quantize(
    x: torch.Tensor,
    *,
    axis: int = -1,
    rule: str = "quest",
    stochastic: bool = False,
    seed: int | torch.Tensor = 0,
    hadamard: bool = True,
    signs: torch.Tensor | None = None,
    deq: bool = True,
    mask: bool = False,
    mx: bool = False,
    fp8: str | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    block: tuple[int, int, int] | None = None,
    row_exp: str = "exact",
    in_scale: torch.Tensor | None = None,
    flush: torch.Tensor | None = None,
    fp8_block: int | None = None,
    in_scale_rows: int | None = None,
    cast_bf16: bool = False,
    mask_bits: bool = False,
    maxnreg: int | None = None,
) -> QuantizedOperand:
    """Quantize a 2-D operand to MXFP4 in one fused pass (plus a row-exponent pass when ``fp8`` is set).

    ``axis`` is the group (contraction) axis of the *stored* tensor: ``-1`` groups along rows of ``x``,
    ``0`` groups along its columns and returns outputs for ``x.T`` without ever copying ``x.T``.
    ``rule`` is ``quest`` | ``absmax`` (Quartet backward, ×4/3, no clipping) | ``rtn_absmax`` (OCP).
    ``stochastic`` rounds with Philox numbers keyed by ``seed`` and the element index (a new seed per
    call gives a new stream); ``seed`` may be a one-element int64 CUDA tensor, read by the kernel, so
    a captured CUDA graph can draw a new seed on the device for every replay. ``signs`` (32 values ±1) randomize the Hadamard (applied before H).
    ``fp8`` (``"e4m3"``/``"e5m2"``) also returns the operand folded into FP8 with one scale per row.
    ``row_exp`` picks the row's fold exponent: ``"exact"`` (a first kernel pass finds the largest group
    exponent) or ``"bound"`` (one bandwidth-bound ``max|x|`` reduction gives an upper bound, at most
    ~2.5 binades high: the values stay exact, the FP8 range left for small groups shrinks by that much)
    or ``"fused"`` (one full pass writes the signed E2M1 values into the FP8 buffer, int8 group
    exponents and the row maxima; a cheap in-place pass then applies the fold — the same output and
    flush count as ``"exact"`` without rotating and scaling the input twice).
    ``signs`` may also be a Python int, the 32-bit mask of the negative signs (bit i: sign i is −1), passed
    to the kernel by value (no host-to-device copy; see :func:`signs_to_bits`). ``flush`` (int32, one
    element, on the device) is the counter the FP8 fold adds its flushed values to (default: a new one).
    ``in_scale`` (float32, one power of two per *stored* row of ``x``) reads an FP8-folded operand back:
    the kernel multiplies ``x`` by it on load, so a saved FP8 ``X̂`` can be requantized without a bf16 copy.
    With ``in_scale_rows`` (1 or 128) ``in_scale`` is instead the ``block_scale`` of a block-scaled FP8
    ``x``, exactly as :class:`QuantizedOperand` holds it. On the GPU the rotation of such an input runs in
    bf16, which is exact for power-of-two scales (QuEST's X̂ and Ŵ, what the fused layer saves); a scale
    with the absmax rule's 4/3 factor is rounded to bf16 first.
    ``fp8_block`` (with ``fp8``) scales per block instead of per row, in one kernel pass: ``1`` gives
    one scale per 1×128 block (the ``BlockWise1x128`` recipe of ``F.scaled_mm``, for the left operand),
    ``128`` one per 128×128 block (``BlockWise128x128``, the right operand). ``K`` must be a multiple
    of 128. Exact while the 4 (or 4×128) groups of a block span ≤ ~14 binades (e4m3); flushes are counted.
    ``cast_bf16`` rounds a float32 ``x`` to bf16 as the kernel loads it: the same operand as
    ``mx_quantize(x.to(torch.bfloat16), ...)`` without the cast's kernel and copy (the fused layer's weight).
    ``mask_bits`` (with ``mask``) writes the QuEST mask packed, one int32 word per 32-group (``mask_bits``
    ``(R, K/32)``: bit ``c`` of word ``j`` is element ``32·j + c``; :func:`unpack_mask_bits`) instead of one bool per
    element — what the fused layer saves for its backward, an eighth of the bytes.
    ``maxnreg`` caps the registers per thread of the GPU launches, ``0`` lifts every cap (default: the block-scaled
    FP8 launches take :data:`MAXNREG`'s cap for their tile and read, the direct launches without FP8 on
    :data:`GPU_BLOCK_DIRECT` :data:`MAXNREG_DIRECT`, the others and the sliced 128×128 launches of
    :data:`BLOCK128_SPLIT` none; ignored by the CPU interpreter).
    It changes the speed, never the result.
    """
    if not HAS_TRITON:
        raise RuntimeError("triton is not installed; the fused quantizers need it")
    if rule not in RULES:
        raise ValueError(f"rule must be one of {sorted(RULES)}, got {rule!r}")
    if fp8 is not None and fp8 not in FP8_FORMATS:
        raise ValueError(f"fp8 must be one of {sorted(FP8_FORMATS)} or None, got {fp8!r}")
    if cast_bf16 and (x.dtype != torch.float32 or in_scale is not None):
        raise ValueError("cast_bf16 reads a float32 operand (without in_scale)")
    if mask_bits and not mask:
        raise ValueError("mask_bits packs the QuEST mask: ask for mask=True too")
    R, K, s_r, s_k = _logical(x, axis)
    if K % 32:
        raise ValueError(f"the group axis must be a multiple of 32, got {K}")
    col_order = s_r == 1 and s_k != 1  # a transposed read: neighbouring groups are neighbours in memory
    kind = f"{fp8_block}x128" + (" T" if col_order else "")
    launch = kind + (" SR" if stochastic else "")  # the tables' key: tile, read, rounding
    split = BLOCK128_SPLIT[launch] if fp8_block == 128 else 1
    if split not in (1, 2, 4, 8):
        raise ValueError(f"BLOCK128_SPLIT must give 1, 2, 4 or 8 row slices of a 128x128 block, got {split!r}")
    if maxnreg is None and fp8_block in (1, 128) and split == 1:
        maxnreg = MAXNREG.get(launch, MAXNREG[kind])  # an SR launch without its own entry takes its kind's cap
    if maxnreg is not None and not (isinstance(maxnreg, int) and (maxnreg == 0 or 24 <= maxnreg <= 255)):
        raise ValueError(f"maxnreg must be an int in [24, 255] (registers per thread) or 0 (no cap), got {maxnreg!r}")
    dev = x.device
    br, bk, warps, tile_cap = (*block, None) if block else _blocks(R, K, dev, direct=fp8 is None and not col_order)
    if maxnreg is None:
        maxnreg = tile_cap
    while K % bk:
        bk //= 2
    grid = (triton.cdiv(R, br), triton.cdiv(K, bk))
    h = _hmat(dev)
    if isinstance(signs, int):
        sg, bits, sign_mode = h, int(signs) & 0xFFFF_FFFF, 2
    elif signs is not None:
        sg, bits, sign_mode = signs.to(device=dev, dtype=torch.float32).contiguous(), 0, 1
    else:
        sg, bits, sign_mode = h, 0, 0  # dummy pointer if unused
    dummy = torch.empty(1, device=dev, dtype=torch.int32)
    out = QuantizedOperand(factor=4.0 / 3.0 if rule == "absmax" else 1.0)
    if deq:
        out.deq = torch.empty(R, K, device=dev, dtype=out_dtype)
    if mask and mask_bits:
        out.mask_bits = torch.empty(R, K // 32, device=dev, dtype=torch.int32)
    elif mask:
        out.mask = torch.empty(R, K, device=dev, dtype=torch.bool)
    in_s0 = in_s1 = 0
    if in_scale is not None and in_scale_rows is not None:
        if in_scale.dim() != 2 or in_scale.dtype != torch.float32 or in_scale.device != dev or in_scale_rows not in (1, 128):
            raise ValueError("a block in_scale must be the float32 block_scale of an FP8 operand on the same device")
        nr = -(-x.shape[0] // in_scale_rows)
        if in_scale.shape[0] != nr or in_scale.shape[1] < -(-x.shape[1] // 128):
            raise ValueError(f"block in_scale of shape {tuple(in_scale.shape)} does not cover x {tuple(x.shape)} "
                             f"with {in_scale_rows}x128 blocks")
        in_sc, in_mode = in_scale, 3
        in_s0, in_s1 = in_scale.stride()
    elif in_scale is not None:
        in_sc = in_scale.reshape(-1).to(device=dev, dtype=torch.float32).contiguous()
        if in_sc.numel() != x.shape[0]:
            raise ValueError(f"in_scale needs one value per stored row ({x.shape[0]}), got {in_sc.numel()}")
        in_mode = 1 if axis in (-1, 1) else 2
    else:
        in_sc, in_mode = dummy, 0
    if in_scale is not None and row_exp == "bound":
        row_exp = "exact"  # the max|x| bound would need the scaled values
    seed_ptr = isinstance(seed, torch.Tensor)
    if seed_ptr and (seed.numel() != 1 or seed.device != x.device):
        raise ValueError("a tensor seed must be one integer on the operand's device")
    common = dict(SEED_PTR=seed_ptr,
        RULE=RULES[rule], STOCHASTIC=bool(stochastic), HADAMARD=bool(hadamard), HAS_SIGNS=sign_mode,
        # bf16 tensor-core dot on the GPU (exact: ±1 weights); the CPU interpreter has no bf16 dot
        # tensor-core dots on the GPU: bf16 (exact for bf16/FP8 inputs), three bf16 slices for float32;
        # the CPU interpreter has no bf16 dot and uses an IEEE float32 dot
        DOT_BF16=(0 if dev.type != "cuda" else 1 if (x.dtype == torch.bfloat16 or in_scale is not None or cast_bf16)
                  else 2),
        CAST_BF16=bool(cast_bf16),
        IN_SCALE=in_mode, COL_ORDER=col_order, BLOCK_R=br, BLOCK_K=bk, num_warps=warps,
        IN_T=axis == 0, IN_BR=in_scale_rows or 1, MASK_BITS=bool(mask_bits), maxnreg=maxnreg or None,
    )
    mask_t = out.mask_bits if mask_bits else out.mask.view(torch.int8) if mask else dummy
    deq_t = out.deq if deq else dummy
    codes_t = e8_t = fp8_t = rowexp = dummy
    flush_in, flush = flush, dummy
    if mx:
        out.codes = torch.empty(R, K // 2, device=dev, dtype=torch.uint8)
        out.e8m0 = torch.empty(R, K // 32, device=dev, dtype=torch.uint8)
        codes_t, e8_t = out.codes, out.e8m0
    bscale_t, bscale_ld, scale_rows = dummy, 0, 1
    if fp8_block is not None:
        if fp8 is None or mx:
            raise ValueError("fp8_block needs fp8='e4m3'|'e5m2' (and no mx)")
        if fp8_block not in (1, 128):
            raise ValueError(f"fp8_block must be 1 (1x128 blocks) or 128 (128x128 blocks), got {fp8_block!r}")
        if K % 128:
            raise ValueError(f"block-scaled FP8 needs the group axis to be a multiple of 128, got {K}")
        # one program per scale block along K; 128 rows per program for 128x128 blocks
        bk = 128
        if fp8_block == 128:
            br = 128 // split
            if split == 1:
                warps = BLOCK128_WARPS if dev.type == "cuda" else warps
            elif dev.type == "cuda":
                warps = BLOCK128_SPLIT_WARPS
            # a sliced block keeps its slices' group fold exponents here until the block's own is known
            e8_t = torch.empty(R, K // 32, device=dev, dtype=torch.int8) if split > 1 else e8_t
        grid = (triton.cdiv(R, br * split), K // bk)
        common.update(BLOCK_R=br, BLOCK_K=bk, num_warps=warps, SCALE_BR=fp8_block, FACTOR=float(out.factor),
                      SPLIT=split)
        scale_rows = fp8_block
    # a block-scaled FP8 input read transposed: its scale depends on the element's stored row alone when the tile lies
    # inside one 128-block of stored columns, so the kernel loads one scale per stored row, not one per element
    common["IN_SCALE_VEC"] = in_mode == 3 and axis == 0 and 128 % br == 0 and IN_SCALE_PER_ROW
    if fp8 is not None:
        dtype_name, shift, min_exp = FP8_FORMATS[fp8]
        # a folded group is exact when 0.5·2^d (its smallest nonzero value) reaches the format's smallest step
        common["FP8_MIN_D"] = min_exp + 1
        flush = flush_in if flush_in is not None else torch.zeros(1, device=dev, dtype=torch.int32)
        if fp8_block is not None:
            mode = MODE_BLOCK  # the block's fold exponent is known inside the tile: one pass
        elif row_exp == "exact":
            rowexp = torch.full((R,), -127, device=dev, dtype=torch.int32)
            _mx_quant_kernel[grid](x, R, K, s_r, s_k, in_sc, in_s0, in_s1, sg, h, dummy, dummy, dummy, dummy, dummy,
                                   rowexp, dummy, dummy, 0, seed, bits, MODE=MODE_ROWEXP, WRITE_MASK=False, WRITE_DEQ=False,
                                   FP8_SHIFT=shift, **common)
            mode = MODE_FP8
        elif row_exp == "bound":
            rowexp = _row_exp_bound(x, axis, rule, hadamard)
            mode = MODE_FP8
        elif row_exp == "fused":
            rowexp = torch.full((R,), -127, device=dev, dtype=torch.int32)
            mode = MODE_STAGE
        else:
            raise ValueError(f"row_exp must be 'exact', 'bound' or 'fused', got {row_exp!r}")
        out.fp8 = torch.empty(R, K, device=dev, dtype=getattr(torch, dtype_name))
        fp8_t = out.fp8
        out.rowexp = rowexp
        out.fp8_shift = shift
        out.flushed = flush
        if mode == MODE_BLOCK:
            out.scale_rows = scale_rows
            if scale_rows == 1:
                # stored (K/128, R) row-major; the operand keeps its (R, K/128) column-major view
                out.block_scale = torch.empty(K // 128, R, device=dev, dtype=torch.float32).t()
            else:
                bscale_ld = -(-(K // 128) // 4) * 4  # K blocks padded to a multiple of 4 (cuBLAS)
                out.block_scale = torch.ones(triton.cdiv(R, 128), bscale_ld, device=dev, dtype=torch.float32)
            bscale_t = out.block_scale
        if mode == MODE_STAGE:
            e8_t = torch.empty(R, K // 32, device=dev, dtype=torch.int8)  # group exponents for stage 2
    else:
        shift = 0
        mode = MODE_MX if mx else MODE_DEQ
    if mx and fp8 is not None:
        raise ValueError("ask for mx codes or fp8, not both, in one call")
    if mode == MODE_DEQ and not (deq or mask):
        raise ValueError("nothing to compute: ask for deq, mask, mx or fp8")
    _mx_quant_kernel[grid](x, R, K, s_r, s_k, in_sc, in_s0, in_s1, sg, h, deq_t, mask_t, codes_t, e8_t, fp8_t, rowexp,
                           flush, bscale_t, bscale_ld, seed, bits, MODE=mode, WRITE_MASK=bool(mask), WRITE_DEQ=bool(deq), FP8_SHIFT=shift, **common)
    if mode == MODE_STAGE:
        rs = torch.empty(R, 1, device=dev, dtype=torch.float32)
        _fp8_fold_kernel[grid](out.fp8, e8_t, rowexp, flush, rs, R, K, FP8_SHIFT=shift, FACTOR=float(out.factor),
                               BLOCK_R=br, BLOCK_K=bk, num_warps=warps, FP8_MIN_D=common["FP8_MIN_D"])
        out.row_scale = rs
    elif fp8 is not None and mode != MODE_BLOCK:
        # row scale 2^(e_row - shift) [x4/3]; exact powers of two in float32
        out.row_scale = (exact_pow2(out.rowexp - out.fp8_shift) * out.factor).unsqueeze(1)
    return out


def _row_exp_bound(x: torch.Tensor, axis: int, rule: str, hadamard: bool) -> torch.Tensor:
    """An upper bound of each logical row's largest group exponent from max|x| of the row (one pass).

    Hadamard rotation can raise a group's max|y| to at most sqrt(32)·max|x| (Cauchy-Schwarz), and the
    QuEST σ of a group is at most its max|y| <= that bound.
    """
    dim = 1 if axis in (-1, 1) else 0
    amax = torch.linalg.vector_norm(x, ord=float("inf"), dim=dim, dtype=torch.float32)
    if hadamard:
        amax = amax * 5.6569  # >= sqrt(32) after float rounding
    v = 0.48707976 * amax + 1e-8 if rule == "quest" else amax
    e = floor_log2(v)  # exact, for v > 0
    if rule != "quest":
        e = (e - 2).clamp(min=-127)  # as the kernel's group exponents (E8M0's range)
    return torch.where(v > 0, e, torch.full_like(e, -2)).to(torch.int32).contiguous()


def masked_inverse_hadamard(g: torch.Tensor, mask: torch.Tensor | None, scale: float = 1.0,
                            out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``((g ⊙ mask)·scale) @ blockdiag(H₃₂)ᵀ`` along the last dim of a 2-D ``g`` (one fused pass).

    This is the straight-through backward of the rotated QuEST quantizer: zero the gradient where the
    forward value was clipped, then rotate back to the input basis. ``mask`` is bool ``(R, K)`` (one flag per
    element) or the packed int32 ``(R, K/32)`` words of ``mx_quantize(mask_bits=True)`` (bit ``c`` of word ``j``
    keeps element ``32·j + c``), or None (nothing masked).
    """
    if not HAS_TRITON:
        raise RuntimeError("triton is not installed; the fused kernels need it")
    g = g.contiguous()
    R, K = g.shape
    if K % 32:
        raise ValueError(f"the last dim must be a multiple of 32, got {K}")
    br, bk, warps, _ = _blocks(R, K, g.device)
    while K % bk:
        bk //= 2
    out = torch.empty(R, K, device=g.device, dtype=out_dtype or g.dtype)
    if mask is None:
        m, mask_mode = g, 0
    elif mask.dtype == torch.int32:
        if tuple(mask.shape) != (R, K // 32):
            raise ValueError(f"packed mask words must be ({R}, {K // 32}) for g {tuple(g.shape)}, got {tuple(mask.shape)}")
        m, mask_mode = mask.contiguous(), 2
    else:
        if tuple(mask.shape) != (R, K):
            raise ValueError(f"mask must have g's shape {tuple(g.shape)}, got {tuple(mask.shape)}")
        m, mask_mode = mask.contiguous().view(torch.int8), 1
    _masked_ihadamard_kernel[(triton.cdiv(R, br), triton.cdiv(K, bk))](
        g, m, _hmat(g.device), out, R, K, float(scale), HAS_MASK=mask_mode,
        DOT_MODE=0 if g.device.type != "cuda" else (1 if g.dtype == torch.bfloat16 else 2), BLOCK_R=br, BLOCK_K=bk, num_warps=warps)
    return out
