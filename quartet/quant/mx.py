"""Block-scaled FP4 quantizers: MXFP4 (32-groups, E8M0 scales) and NVFP4 (16-groups, E4M3 scales).

Maths. Each group g of ``group`` consecutive elements along the last dim (the GEMM reduction axis)
gets one scale s_g and the elements are stored as E2M1 values q with x̂ = q·s_g.

* QuEST (forward of Quartet): assume the (Hadamard-rotated) group is Gaussian with population
  standard deviation σ; the MSE-optimal E2M1 clipping range for N(0, σ²) is ±2.92247856·σ, so the
  ideal scale is 2.92247856σ/6 = 0.48707976σ. E8M0 can only hold powers of two, so
  s = 2^floor(log2(0.48707976·σ + 1e-8)); the effective clip 6s then lies in (1.46σ, 2.92σ].
  Values are rounded to nearest and saturate at ±6; the mask |x/s| < 6 marks the unclipped
  elements, through which the straight-through gradient flows.
* Absmax ×3/4 (backward of Quartet): s = 2^(floor(log2 amax) − 2)·4/3, i.e. the values are
  multiplied by 3/4 after the OCP power-of-two scaling so that max|x/s| ∈ [3, 6): nothing is ever
  clipped, which keeps stochastic rounding unbiased. x̂ = q·s already contains the 4/3, so a
  product of two such operands carries the paper's 16/9 output correction implicitly.
* OCP MX rule: s = 2^(floor(log2 amax) − 2) (E2M1's largest exponent is 2): max|x/s| ∈ [4, 8),
  values above 6 saturate.
* NVFP4: groups of 16, a per-tensor FP32 scale S = amax/(6·448) and a per-group E4M3 scale
  e = E4M3(amax_g/6/S), so x̂ = q·e·S.

All functions take an already-rotated tensor, work in float32 on any device and are vectorised
over groups (one reshape, no Python loops).
"""
from __future__ import annotations

import torch

from quartet.quant.formats import (
    E2M1_MAX,
    E4M3_MAX,
    e2m1_encode,
    e8m0_encode,
    floor_log2,
    round_to_e2m1,
    round_to_fp8,
)

__all__ = [
    "QUEST_SCALE_FACTOR",
    "quest_scales",
    "quest_mxfp4",
    "absmax_scales",
    "absmax_mxfp4",
    "rtn_absmax_mxfp4",
    "mx_codes",
    "nvfp4_quantize",
]

#: 2.92247856 / 6: the MSE-optimal E2M1 clip for a unit Gaussian, divided by the largest grid value.
QUEST_SCALE_FACTOR = 0.48707976


def _grouped(x: torch.Tensor, group: int) -> torch.Tensor:
    k = x.shape[-1]
    if k % group:
        raise ValueError(f"last dim {k} is not a multiple of the group size {group}")
    return x.float().reshape(*x.shape[:-1], k // group, group)


def _pow2_floor(v: torch.Tensor) -> torch.Tensor:
    """2^floor(log2 v) for v > 0, clamped to the E8M0 range; 1.0 where v is 0 (empty group). The exponent is exact
    (:func:`~quartet.quant.formats.floor_log2`), as the kernels read the float's exponent bits."""
    e = floor_log2(v).clamp(-127, 127).to(v.dtype)
    return torch.where(v > 0, torch.exp2(e), torch.ones_like(v))


def quest_scales(x: torch.Tensor, group: int = 32, floor: bool = True) -> torch.Tensor:
    """Per-group QuEST scale, shape (..., K/group): 2^floor(log2(0.48707976·σ + 1e-8)).

    ``floor=False`` returns the unrounded 0.48707976·σ + 1e-8 (not representable in E8M0; used to
    compare with the paper's Gaussian MSE).
    """
    g = _grouped(x, group)
    # Population std (mean-subtracted) as the kernel: sqrt(E[x²] − E[x]²). The group sums go through
    # one matmul with a ones vector, several times faster on CPU than Tensor.std over a 32-wide dim.
    ones = torch.ones(group, 1, device=g.device, dtype=g.dtype)
    mean = (g @ ones).squeeze(-1) / group
    mean_sq = ((g * g) @ ones).squeeze(-1) / group
    sigma = (mean_sq - mean * mean).clamp_(min=0).sqrt_()
    raw = QUEST_SCALE_FACTOR * sigma + 1e-8
    return _pow2_floor(raw) if floor else raw


def quest_mxfp4(x: torch.Tensor, group: int = 32, floor: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """QuEST MXFP4 of an already-rotated tensor → (x̂ float32, mask bool = |x/s| < 6)."""
    g = _grouped(x, group)
    s = quest_scales(x, group, floor).unsqueeze(-1)
    y = g / s
    xq = round_to_e2m1(y) * s
    mask = y.abs() < E2M1_MAX
    return xq.reshape(x.shape), mask.reshape(x.shape)


def absmax_scales(x: torch.Tensor, group: int = 32) -> torch.Tensor:
    """Per-group power-of-two part of the absmax scale, shape (..., K/group): 2^(floor(log2 amax) − 2)."""
    amax = _grouped(x, group).abs().amax(dim=-1)
    return _pow2_floor(amax) * 0.25


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
    Pack the codes with :func:`quartet.quant.formats.pack_e2m1`.
    """
    g = _grouped(xq, group)
    y = g / (scales.float().unsqueeze(-1) * factor)
    # y is within an ulp of a grid point; re-rounding absorbs the float error of q·s/s.
    codes = e2m1_encode(round_to_e2m1(y))
    return codes.reshape(xq.shape), e8m0_encode(scales)


def nvfp4_quantize(x: torch.Tensor, stochastic: bool = False, generator: torch.Generator | None = None,
                   group: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 fake quantization → (x̂ float32, per-group E4M3 scale (float32 values), FP32 tensor scale)."""
    g = _grouped(x, group)
    amax = g.abs().amax()
    tensor_scale = torch.where(amax > 0, amax * (1.0 / (E2M1_MAX * E4M3_MAX)), torch.ones_like(amax))
    block = round_to_fp8(g.abs().amax(dim=-1) * (1.0 / E2M1_MAX) / tensor_scale, "e4m3")
    block = torch.where(block > 0, block, torch.ones_like(block))  # all-zero group (or E4M3 underflow)
    s = (block * tensor_scale).unsqueeze(-1)
    q = round_to_e2m1(g / s, stochastic=stochastic, generator=generator)
    return (q * s).reshape(x.shape), block, tensor_scale
