"""Block-scaled quantizers: MXFP4 and MXFP8 (32-groups, E8M0 scales) and NVFP4 (16-groups, E4M3 scales).

Maths. Each group g of ``group`` consecutive elements along the last dim (the GEMM reduction axis)
gets one scale s_g and the elements are stored as E2M1 values q with x̂ = q·s_g.

* QuEST (forward of Quartet): assume the (Hadamard-rotated) group is Gaussian with population
  standard deviation σ; the MSE-optimal E2M1 clipping range for N(0, σ²) is ±2.92247856·σ, so the
  ideal scale is 2.92247856σ/6 = 0.48707976σ. E8M0 can only hold powers of two, so
  s = 2^floor(log2(0.48707976·σ + 1e-8)); the effective clip 6s then lies in (1.46σ, 2.92σ].
  Values are rounded to nearest and saturate at ±6; the mask |x/s| < 6 marks the unclipped
  elements, through which the straight-through gradient flows. σ of a group whose squares overflow
  float32 (|x| ≳ 1e19) is computed on the group scaled by 2^-72; a group holding Inf/NaN gets a NaN
  scale (E8M0 code 255), so its x̂ is NaN and its mask False: a diverging run shows up as NaN.
* Absmax ×3/4 (backward of Quartet): s = 2^(floor(log2 amax) − 2)·4/3, i.e. the values are
  multiplied by 3/4 after the OCP power-of-two scaling so that max|x/s| ∈ [3, 6): nothing is ever
  clipped, which keeps stochastic rounding unbiased. x̂ = q·s already contains the 4/3, so a
  product of two such operands carries the paper's 16/9 output correction implicitly.
* OCP MX rule: s = 2^(floor(log2 amax) − 2) (E2M1's largest exponent is 2): max|x/s| ∈ [4, 8),
  values above 6 saturate.
* Every MXFP4 scale is a power of two inside E8M0's range 2^-127 … 2^127: the absmax exponent
  floor(log2 amax) − 2 is clamped to it AFTER subtracting 2, so a group with amax < 2^-124 gets
  2^-127 (its values then lie below 6 and are not clipped), and x̂ equals what its stored codes decode to.
* NVFP4: groups of 16, a per-tensor FP32 scale S = amax/(6·448) and a per-group E4M3 scale
  e = E4M3(amax_g/6/S), so x̂ = q·e·S. A block scale that would underflow E4M3 (amax_g/6/S < 2^-10,
  a group more than ~2^18 below the tensor's amax) is raised to E4M3's smallest subnormal 2^-9 so
  the group keeps its largest values (rounded coarsely) instead of becoming zero.
* MXFP8 (OCP MX v1.0, E4M3 elements): s = 2^(floor(log2 amax) − 8), 8 being E4M3's largest exponent
  (448 = 1.75·2^8), clamped to E8M0's range after the shift like MXFP4; x̂ = E4M3_RTNE(x/s)·s. max|x/s| ∈
  [256, 512), so values in (448, 512)·s saturate to 448·s (the spec's saturating conversion); values below
  2^-10·s flush to 0 through E4M3's subnormals. A group holding Inf/NaN gets a NaN scale and NaN values.

Non-finite inputs, one rule for every quantizer (docs/precision.md, "Non-finite inputs"): the unit that shares one
scale comes out entirely NaN when it holds a NaN or ±Inf, and every other unit is bitwise what it would be with that
unit zeroed. Here the unit is the group: MX gives it the E8M0 NaN scale (above). NVFP4's scale has two levels, and
the tensor's amax is taken over the groups that hold only finite values, so one bad group does not move S (which
would requantize every other group); its E4M3 block scale is NaN (E4M3 has a NaN, 0x7F). An all-zero group keeps a
finite scale and zero values. In a tensor of subnormals a few times 2^-149, S is held at 2^-149 and a group scale e·S
that underflows float32 to 0 flushes the group to ±0 (:func:`quartet.quant.formats.scale_divisor`) rather than
dividing 0 by 0.

All functions take an already-rotated tensor, work in float32 on any device and are vectorised
over groups (one reshape, no Python loops).
"""
from __future__ import annotations

import torch

from quartet.quant.formats import (
    E2M1_MAX,
    E4M3_MAX,
    FLOAT32_TINY,
    e2m1_encode,
    e8m0_encode,
    exact_pow2,
    floor_log2,
    round_to_e2m1,
    round_to_fp8,
    scale_divisor,
)

__all__ = [
    "QUEST_SCALE_FACTOR",
    "quest_scales",
    "quest_mxfp4",
    "absmax_scales",
    "absmax_mxfp4",
    "rtn_absmax_mxfp4",
    "mx_codes",
    "MXFP8_ELEM_EMAX",
    "mxfp8_scales",
    "mxfp8_quantize",
    "mxfp8_codes",
    "e4m3_block_scale",
    "nvfp4_tensor_scale",
    "nvfp4_quantize",
]

#: The smallest positive E4M3 value (subnormal 2^-9), the smallest NVFP4 block scale.
E4M3_MIN_SUBNORMAL = 2.0 ** -9

#: OCP MX: the largest exponent of an E4M3 element (448 = 1.75·2^8); the MXFP8 scale is 2^(floor(log2 amax) − 8).
MXFP8_ELEM_EMAX = 8

#: 2.92247856 / 6: the MSE-optimal E2M1 clip for a unit Gaussian, divided by the largest grid value.
QUEST_SCALE_FACTOR = 0.48707976


def _grouped(x: torch.Tensor, group: int) -> torch.Tensor:
    k = x.shape[-1]
    if k % group:
        raise ValueError(f"last dim {k} is not a multiple of the group size {group}")
    return x.float().reshape(*x.shape[:-1], k // group, group)


def _pow2_floor(v: torch.Tensor, shift: int = 0) -> torch.Tensor:
    """2^(floor(log2 v) + shift) for v > 0, the exponent clamped to E8M0's range [-127, 127] AFTER the shift;
    2^shift where v is 0 (empty group); NaN where v is NaN or Inf (E8M0's NaN code 255).
    The exponent is exact (:func:`~quartet.quant.formats.floor_log2`), as the kernels read the float's exponent
    bits."""
    e = (floor_log2(v) + shift).clamp(-127, 127)
    s = torch.where(v > 0, exact_pow2(e), torch.full_like(v, 2.0 ** shift))
    return torch.where(torch.isfinite(v), s, torch.full_like(v, float("nan")))


#: QuEST's σ of a group whose squares overflow is computed on the group times 2^-72 (exact), then scaled back:
#: |x| ≤ 2^128 becomes ≤ 2^56, so 32 squares of deviations (≤ 2^57) sum to < 2^120.
_QUEST_DOWN, _QUEST_UP = 2.0 ** -72, 2.0 ** 72


def _quest_sigma_scaled(g: torch.Tensor, ones: torch.Tensor, group: int) -> torch.Tensor:
    """0.48707976·σ of the groups ``g`` (population std, the one-pass formula below)."""
    mean = (g @ ones).squeeze(-1) / group
    mean_sq = ((g * g) @ ones).squeeze(-1) / group
    return QUEST_SCALE_FACTOR * (mean_sq - mean * mean).clamp_(min=0).sqrt_()


def quest_scales(x: torch.Tensor, group: int = 32, floor: bool = True) -> torch.Tensor:
    """Per-group QuEST scale, shape (..., K/group): 2^floor(log2(0.48707976·σ + 1e-8)).

    ``floor=False`` returns the unrounded 0.48707976·σ + 1e-8 (not representable in E8M0; used to
    compare with the paper's Gaussian MSE).
    """
    g = _grouped(x, group)
    # Population std with the one-pass formula sqrt(E[x²] − E[x]²); the group sums go through one matmul with a
    # ones vector, several times faster on CPU than Tensor.std over a 32-wide dim. The Triton kernel computes the
    # two-pass form (mean first, then E[(x − mean)²]) with its own summation order, so the two σ agree to a few
    # ulps, not bitwise; the power-of-two floor makes the scales bitwise equal except for σ within those ulps of
    # a binade boundary (or under heavy cancellation, |mean| ≫ σ, where the one-pass form loses digits).
    ones = torch.ones(group, 1, device=g.device, dtype=g.dtype)
    sd = _quest_sigma_scaled(g, ones, group)
    bad = ~torch.isfinite(sd)
    if bool(bad.any()):
        # squares (or sums) overflowed float32, or the group holds Inf/NaN: redo those groups scaled by 2^-72
        # (exact), as the kernel does; Inf/NaN inputs stay non-finite and give a NaN scale
        down = torch.where(bad, _QUEST_DOWN, 1.0).unsqueeze(-1)
        sd = torch.where(bad, _quest_sigma_scaled(g * down, ones, group) * _QUEST_UP, sd)
    raw = sd + 1e-8
    if floor:
        return _pow2_floor(raw)
    return torch.where(torch.isfinite(raw), raw, torch.full_like(raw, float("nan")))


def quest_mxfp4(x: torch.Tensor, group: int = 32, floor: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """QuEST MXFP4 of an already-rotated tensor → (x̂ float32, mask bool = |x/s| < 6).

    A group with a NaN scale (it holds Inf/NaN) gives x̂ = NaN and mask False for all its elements."""
    g = _grouped(x, group)
    s = quest_scales(x, group, floor).unsqueeze(-1)
    nan = torch.isnan(s)
    y = torch.where(nan, 0.0, g / torch.where(nan, 1.0, s))  # (no Inf/NaN reaches the rounding)
    xq = torch.where(nan, float("nan"), round_to_e2m1(y) * s)
    mask = (y.abs() < E2M1_MAX) & ~nan
    return xq.reshape(x.shape), mask.reshape(x.shape)


def absmax_scales(x: torch.Tensor, group: int = 32) -> torch.Tensor:
    """Per-group power-of-two part of the absmax scale, shape (..., K/group): 2^(floor(log2 amax) − 2), the exponent
    clamped to E8M0's [-127, 127] (so amax < 2^-124 gives 2^-127); 2^-2 for an all-zero group; NaN for a group
    holding Inf/NaN (E8M0 code 255: its values come back NaN, so an overflowed gradient is not hidden)."""
    return _pow2_floor(_grouped(x, group).abs().amax(dim=-1), shift=-2)


def absmax_mxfp4(x: torch.Tensor, stochastic: bool = False, generator: torch.Generator | None = None,
                 group: int = 32) -> torch.Tensor:
    """Absmax ×3/4 MXFP4 (Quartet backward): x̂ = q·2^(floor(log2 amax) − 2)·4/3, never clips.

    ``stochastic=True`` uses unbiased stochastic rounding with ``generator``.
    """
    g = _grouped(x, group)
    p2 = absmax_scales(x, group).unsqueeze(-1)
    # Same operation order as the kernels: divide by the exact power of two, then multiply by 3/4.
    y = (g / p2) * 0.75
    q = round_to_e2m1(y, stochastic=stochastic, generator=generator)
    return ((q * p2) * (4.0 / 3.0)).reshape(x.shape)


def rtn_absmax_mxfp4(x: torch.Tensor, group: int = 32) -> torch.Tensor:
    """OCP MX rule: s = 2^(floor(log2 amax) − 2), round to nearest, saturate at ±6."""
    g = _grouped(x, group)
    s = absmax_scales(x, group).unsqueeze(-1)
    return (round_to_e2m1(g / s) * s).reshape(x.shape)


def mx_codes(xq: torch.Tensor, scales: torch.Tensor, group: int = 32, factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Storage form of an MXFP4 tensor → (4-bit E2M1 codes uint8, E8M0 scale codes uint8).

    ``scales`` are the per-group power-of-two scales (shape (..., K/group), e.g. from
    :func:`quest_scales` or :func:`absmax_scales`); ``factor`` is the extra multiplier folded into
    the values (4/3 for :func:`absmax_mxfp4`, whose GEMM output the kernel multiplies by 16/9).
    Pack the codes with :func:`quartet.quant.formats.pack_e2m1`. A zero element is stored as code 0 whatever its
    sign, as the kernels store it; a group with a NaN scale (E8M0 code 255) stores element codes 0.
    """
    g = _grouped(xq, group)
    sc = scales.float().unsqueeze(-1)
    nan = ~torch.isfinite(sc)
    y = torch.where(nan, 0.0, g / (torch.where(nan, 1.0, sc) * factor))
    # y is within an ulp of a grid point; re-rounding absorbs the float error of q·s/s. Adding +0 turns −0 into +0.
    q = round_to_e2m1(y) + 0.0
    return e2m1_encode(q).reshape(xq.shape), e8m0_encode(scales)


def mxfp8_scales(x: torch.Tensor, group: int = 32) -> torch.Tensor:
    """Per-group MXFP8 scale, shape (..., K/group): 2^(floor(log2 amax) − 8), the exponent clamped to E8M0's
    [-127, 127] after the shift (amax < 2^-119 gives 2^-127); 2^-8 for an all-zero group; NaN for a group holding
    Inf/NaN (E8M0 code 255)."""
    return _pow2_floor(_grouped(x, group).abs().amax(dim=-1), shift=-MXFP8_ELEM_EMAX)


def mxfp8_quantize(x: torch.Tensor, group: int = 32) -> torch.Tensor:
    """MXFP8 (OCP MX, E4M3 elements) fake quantization: x̂ = E4M3_RTNE(x/s)·s with s = :func:`mxfp8_scales`,
    saturating at ±448·s; the groups with a NaN scale come back NaN."""
    g = _grouped(x, group)
    s = mxfp8_scales(x, group).unsqueeze(-1)
    nan = torch.isnan(s)
    y = torch.where(nan, 0.0, g / torch.where(nan, 1.0, s))  # dividing by a power of two is exact
    return torch.where(nan, float("nan"), round_to_fp8(y, "e4m3") * s).reshape(x.shape)


def mxfp8_codes(xq: torch.Tensor, scales: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Storage form of an MXFP8 tensor → (E4M3 element codes uint8, E8M0 scale codes uint8).

    Decoding ``codes.view(torch.float8_e4m3fn)`` times the decoded scales gives ``xq`` back exactly; a group with a
    NaN scale (code 255) stores element codes 0."""
    g = _grouped(xq, group)
    sc = scales.float().unsqueeze(-1)
    nan = ~torch.isfinite(sc)
    y = torch.where(nan, 0.0, g / torch.where(nan, 1.0, sc))
    return y.to(torch.float8_e4m3fn).view(torch.uint8).reshape(xq.shape), e8m0_encode(scales)


def nvfp4_tensor_scale(amax_g: torch.Tensor, c: float, scale_max: float) -> torch.Tensor:
    """NVFP4's FP32 tensor scale S = amax/(c·scale_max) from the groups' (or tiles') maxima ``amax_g``: the amax is
    taken over the groups holding only finite values (a non-finite group goes NaN alone, module docstring); 1.0
    when none of them is nonzero; never below float32's smallest subnormal 2^-149."""
    amax = torch.where(torch.isfinite(amax_g), amax_g, torch.zeros_like(amax_g)).amax()
    # held at 2^-149: a tensor of few-ulp subnormals made S = 0 and its block scales 0/0 = NaN
    return torch.where(amax > 0, amax * (1.0 / (c * scale_max)), torch.ones_like(amax)).clamp(min=FLOAT32_TINY)


def e4m3_block_scale(amax_g: torch.Tensor, c: float, tensor_scale: torch.Tensor) -> torch.Tensor:
    """NVFP4 block scale that maps a group's amax to the E2M1 value ``c``: E4M3(amax_g/c/S), S the FP32 tensor scale.

    A nonzero group whose scale underflows E4M3 gets the smallest subnormal 2^-9 (1.0 would zero it: its values
    would all round to 0); an all-zero group gets 1.0; a group holding Inf/NaN gets NaN (its values come out NaN)."""
    block = round_to_fp8(amax_g * (1.0 / c) / tensor_scale, "e4m3")
    block = torch.where(amax_g > 0, block.clamp(min=E4M3_MIN_SUBNORMAL), torch.ones_like(block))
    return torch.where(torch.isfinite(amax_g), block, torch.full_like(block, float("nan")))


def nvfp4_quantize(x: torch.Tensor, stochastic: bool = False, generator: torch.Generator | None = None,
                   group: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 fake quantization → (x̂ float32, per-group E4M3 scale (float32 values), FP32 tensor scale).

    A group holding Inf/NaN gets a NaN block scale and NaN values; the tensor scale ignores it."""
    g = _grouped(x, group)
    amax_g = g.abs().amax(dim=-1)
    tensor_scale = nvfp4_tensor_scale(amax_g, E2M1_MAX, E4M3_MAX)
    block = e4m3_block_scale(amax_g, E2M1_MAX, tensor_scale)
    s = (block * tensor_scale).unsqueeze(-1)
    q = round_to_e2m1(g / scale_divisor(s), stochastic=stochastic, generator=generator)
    return (q * s).reshape(x.shape), block, tensor_scale
