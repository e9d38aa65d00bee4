"""Quartet II (Panferov et al., arXiv 2601.22813) quantizers: NVFP4 "Four Over Six" and MS-EDEN.

Maths. NVFP4 stores x̂ = q·e_g·S: q on the E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}, one E4M3 block scale e_g per
16 consecutive elements along the GEMM reduction axis, one FP32 tensor scale S (see :mod:`quartet.quant.mx`).

* Unbiased NVFP4 stochastic rounding (Quartet II §3.1, the baseline MS-EDEN is measured against): E4M3 may
  round a block scale down by up to a factor 16/17, which would push the block's amax past 6 where SR must
  clip (a bias). Mapping the amax to 6·16/17 instead (S = amax/(6·16/17·448), e = E4M3(amax_g/(6·16/17·S)))
  keeps every |x/(e·S)| ≤ 6, so SR of the elements is exactly unbiased, E[x̂] = x, at the cost of using a
  little less of the grid. (:func:`quartet.quant.mx.nvfp4_quantize` maps the amax to 6 and is slightly biased.)
* Four Over Six (Cook et al., arXiv 2512.02010; the forward quantizer of Quartet II). E2M1's last step, 4 → 6,
  is twice as wide as the one before, so a block whose largest value maps to 6 represents values near its
  maximum coarsely. Every 16-group is rounded to nearest twice, with its amax mapped to 6 (e = E4M3(amax_g/6/S))
  and to 4 (e = E4M3(amax_g/4/S)), and keeps the candidate with the smaller squared error Σ(x̂ − x)² (a tie
  keeps 6). The tensor scale is S = amax/(6·256) instead of amax/(6·448): the 4-branch scale is 1.5× the
  6-branch one and must still fit E4M3 (256·1.5 = 384 ≤ 448). Deterministic, and biased like any RTN.
* MS-EDEN (Quartet II §3.3, Algorithm 1; the backward quantizer). EDEN (Vargaftik et al.) makes a biased
  quantizer unbiased by rotating first and rescaling afterwards: for y = RHT(x) and RTN values ŷ, the estimate
  S·ŷ with S = ⟨y, y⟩/⟨y, ŷ⟩ is, in expectation over the random rotation, x itself. S lies within a few percent
  of 1, finer than E4M3's relative step (1/8), so MS-EDEN folds it into the group scale by *stochastic*
  rounding: the elements are rounded to nearest (no per-element randomness) and only the 16-group's scale is
  random, E[SR_E4M3(S_g·e_g)] = S_g·e_g. Per 16-group g of the rotated tensor:
      S = amax/(c·256)                 (256: headroom for the correction and the upward SR step)
      e_g = E4M3(amax_g/(c·S)),        y = x/(e_g·S),   q = RTN_E2M1(y)   (|y| > 6 saturates)
      S_g = Σ y²/Σ y·q                 (1 for an all-zero group)
      x̂ = q · SR_E4M3(S_g·e_g) · S
  with the clipping factor c = 6·(16/17)/0.93 ≈ 6.07 of the authors' code (``backward_scale_override =
  17/16·0.93``, the upper end of the paper's window 6·16/17 ≤ c ≤ 6·16/17/0.93): the amax lands a little past
  6 and saturates, which the correction S_g accounts for. The correction is taken over each 16-group (paper
  v2, and the fused RHT-128 kernel of the authors' ``Quartet_II_linear``; their Triton training code and
  another CUDA kernel take it over the 128-element rotation group). Unbiasedness needs the random-sign
  Hadamard in front, which the scheme supplies (``random_hadamard`` on the backward GEMMs); without one the
  estimate is biased like RTN.

Both functions take the already-rotated tensor, work in float32 on any device (the error and correction sums
in float64, so CPU and GPU agree on the 4/6 choice) and follow :func:`quartet.quant.mx.nvfp4_quantize`'s edge
rules: a nonzero block whose E4M3 scale underflows is raised to 2^-9, an all-zero block gets scale 1.

Non-finite inputs (the rule of every quantizer, docs/precision.md): a 16-group holding a NaN or ±Inf gets a NaN block
scale and comes out entirely NaN, so the trainer's non-finite check sees it; the tensor scale is taken over the
finite groups (:func:`quartet.quant.mx.nvfp4_tensor_scale`), so every other group is what it would be without it
(Four Over Six keeps the bad group's NaN 6-branch; MS-EDEN's correction and its stochastic rounding keep the NaN).
"""
from __future__ import annotations

import torch

from quartet.quant.formats import E2M1_MAX, E4M3_MAX, round_to_e2m1, round_to_e4m3_stochastic
from quartet.quant.mx import _grouped, e4m3_block_scale, nvfp4_tensor_scale

__all__ = [
    "SR_HEADROOM",
    "nvfp4_sr_headroom",
    "FOUR_OVER_SIX_SCALE_MAX",
    "MS_EDEN_CLIP",
    "MS_EDEN_SCALE_MAX",
    "nvfp4_four_over_six",
    "ms_eden_quantize",
]

#: Quartet II §3.1: the largest factor by which E4M3 round-to-nearest can shrink a block scale is 16/17.
SR_HEADROOM = 16.0 / 17.0
#: Largest block scale 4/6 plans for on the 6-branch (the 4-branch reaches 1.5× this, still below E4M3's 448).
FOUR_OVER_SIX_SCALE_MAX = 256.0
#: MS-EDEN's clipping factor c: the E2M1 value a group's amax maps to before its scale is rounded.
MS_EDEN_CLIP = E2M1_MAX * (16.0 / 17.0) / 0.93
#: Largest block scale MS-EDEN plans for before the correction (headroom up to E4M3's 448).
MS_EDEN_SCALE_MAX = 256.0


def _scaled(g: torch.Tensor, block: torch.Tensor, ts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(y = g/(block·S), the scale block·S) of a grouped tensor. A group holding Inf/NaN has a NaN block scale: its y
    are zeroed here (no NaN reaches the rounding or the EDEN sums) and x̂ = q·(block·S) comes out NaN."""
    s = (block * ts).unsqueeze(-1)
    return torch.nan_to_num(g / s, nan=0.0), s


def _rtn(g: torch.Tensor, block: torch.Tensor, ts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E2M1 values q, scaled inputs y) of a grouped tensor, round to nearest."""
    y, _ = _scaled(g, block, ts)
    return round_to_e2m1(y), y


def nvfp4_sr_headroom(x: torch.Tensor, generator: torch.Generator | None = None,
                      group: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unbiased NVFP4 stochastic rounding (amax mapped to 6·16/17, never clipped) → (x̂, E4M3 block scales, S)."""
    g = _grouped(x, group)
    c = E2M1_MAX * SR_HEADROOM
    amax_g = g.abs().amax(dim=-1)
    ts = nvfp4_tensor_scale(amax_g, c, E4M3_MAX)
    block = e4m3_block_scale(amax_g, c, ts)
    y, s = _scaled(g, block, ts)
    return (round_to_e2m1(y, stochastic=True, generator=generator) * s).reshape(x.shape), block, ts


def nvfp4_four_over_six(x: torch.Tensor, group: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 with Four Over Six block scales → (x̂ float32, chosen E4M3 block scales, FP32 tensor scale).

    ``block_scale == E4M3(amax_g/4/S)`` marks the groups that took the 4-branch."""
    g = _grouped(x, group)
    amax_g = g.abs().amax(dim=-1)
    ts = nvfp4_tensor_scale(amax_g, E2M1_MAX, FOUR_OVER_SIX_SCALE_MAX)
    cands = []
    for c in (E2M1_MAX, 4.0):
        block = e4m3_block_scale(amax_g, c, ts)
        q, _ = _rtn(g, block, ts)
        xq = q * (block * ts).unsqueeze(-1)
        cands.append((xq, block, (xq.double() - g.double()).square().sum(dim=-1)))
    (x6, b6, e6), (x4, b4, e4) = cands
    four = e4 < e6  # (a NaN error compares False: a non-finite group stays on the NaN 6-branch)
    return torch.where(four.unsqueeze(-1), x4, x6).reshape(x.shape), torch.where(four, b4, b6), ts


def ms_eden_quantize(x: torch.Tensor, generator: torch.Generator | None = None, group: int = 16,
                     stochastic: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MS-EDEN NVFP4 of an already-rotated tensor → (x̂ float32, per-group scales, FP32 tensor scale).

    The scales are the EDEN-corrected block scales S_g·e_g rounded stochastically to E4M3 with one uniform per
    group from ``generator``. ``stochastic=False`` returns them unrounded (not E4M3 values): x̂ is then the mean
    of the stochastic x̂ over the rounding draws, for analysis and tests."""
    g = _grouped(x, group)
    amax_g = g.abs().amax(dim=-1)
    ts = nvfp4_tensor_scale(amax_g, MS_EDEN_CLIP, MS_EDEN_SCALE_MAX)
    block = e4m3_block_scale(amax_g, MS_EDEN_CLIP, ts)
    q, y = _rtn(g, block, ts)
    yd = y.double()
    yy, yq = yd.square().sum(dim=-1), (yd * q.double()).sum(dim=-1)
    corr = torch.where(yq > 0, yy / torch.where(yq > 0, yq, 1.0), 1.0).float()
    scale = block * corr
    if stochastic:
        scale = round_to_e4m3_stochastic(scale, generator)
    return (q * (scale * ts).unsqueeze(-1)).reshape(x.shape), scale, ts
