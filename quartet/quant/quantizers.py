"""Quantizer specifications and their reference (pure PyTorch) implementations.

Maths of the quantizers that do not live in :mod:`quartet.quant.mx` (MX / NVFP4 block scaling) or
:mod:`quartet.quant.quartet2` (Four Over Six, MS-EDEN):

* MS-FP4 (Wang et al. 2025): absmax E2M1 with an FP32 scale per row of the operand as the GEMM
  sees it (per token for activations, per output channel for weights): s = amax_row/6, x̂ = RTN(x/s)·s.
  - Outlier Clamping and Compensation (OCC, activations): per row, clamp to the values at
    sorted-index int((1−α)·n) and int(α·n) (α = 0.99 → ~2% of entries clipped), quantize the clamped
    Xc, and keep the sparse residual ΔX = X − Xc in high precision; the GEMM then computes
    Q(Xc)·Wᵀ + ΔX·Wᵀ, which equals the unclamped product up to FP4 error of the bulk.
  - Differentiable Gradient Estimator (DGE, weights): the forward stays hard RTN, the backward
    replaces the straight-through derivative 1 by f′(x) = (1/k)·|2u/δ − 1|^(1/k − 1), capped at
    ``cap``, evaluated on the scaled weight x = W/s, where δ is the local E2M1 grid spacing
    (0.5 for |x| < 2, 1 for 2 ≤ |x| < 4, 2 above) and u the distance from the interval's left end.
* LUQ (Chmiel et al.) for gradients: radix-2 levels amax·2^−j, j = 0…6 (sign + 3-bit exponent,
  one code reserved for zero). Values below the smallest level α = amax·2^−6 underflow
  stochastically (to ±α with probability |x|/α, else 0); values between two powers of two round
  up with probability (|x| − lo)/lo. Both steps are unbiased.
* INT4 forward of the LUQ baseline: symmetric absmax per row, levels −7…7, round to nearest.
* Tile-scaled kinds (``tile_rows > 1`` for ``nvfp4``, ``scaling="block"`` for ``fp8``): one scale per
  ``tile_rows × group`` tile of the operand matrix — :mod:`quartet.quant.blockwise`.

Non-finite inputs, one rule for every kind (docs/precision.md, "Non-finite inputs"): the unit that shares one scale
comes out entirely NaN when it holds a NaN or ±Inf, and the other units are untouched. MS-FP4's and INT4's unit is
the row (or, INT4 ``scaling="tensor"``, the tensor): its scale is NaN; with OCC the row is judged before clamping,
and its DGE factor is NaN too. LUQ has one scale, the tensor's max, so its unit is the tensor: any NaN/Inf makes all
of it NaN (NaN once made it all zero). All-zero units stay 0; subnormal inputs stay finite (a LUQ level α = amax·2^-6
that underflows float32 is held at 2^-149 so that zeros stay zero).

A :class:`QuantizerSpec` is a frozen, printable description; :func:`reference_quantize` runs it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from quartet.quant import mx, quartet2
from quartet.quant.blockwise import fp8_blockwise_quantize, nvfp4_quantize_2d
from quartet.quant.formats import (
    E2M1_MAX,
    FLOAT32_TINY,
    absmax_scale,
    exact_pow2,
    floor_log2,
    fp8_quantize,
    int4_quantize,
    round_to_e2m1,
    scale_divisor,
)

__all__ = [
    "QuantizerSpec",
    "QTensor",
    "QUANTIZER_KINDS",
    "GROUPED_KINDS",
    "reference_quantize",
    "dge_derivative",
    "occ_clamp",
    "ms_fp4_quantize",
    "luq_quantize",
    "quantizer_stats",
]

#: kind -> short description (used in error messages and the quant map)
QUANTIZER_KINDS = {
    "quest": "QuEST MXFP4 (σ-scale, RTN, clip mask)",
    "absmax": "absmax×3/4 MXFP4 (no clipping; RTN or SR)",
    "ocp": "OCP MX absmax MXFP4 (RTN, saturating)",
    "ms_fp4": "MS-FP4 per-row absmax E2M1 (optional OCC / DGE)",
    "fp8": "FP8 current scaling (e4m3 / e5m2; per tensor, row, or 1x128 / 128x128 block)",
    "nvfp4": "NVFP4 (16-groups, E4M3 block scale, FP32 tensor scale)",
    "nvfp4_4o6": "NVFP4 with Four Over Six block scales (RTN; amax to 6 or 4, the smaller error wins)",
    "nvfp4_sr1617": "NVFP4 stochastic rounding with 16/17 scale headroom (never clips: unbiased)",
    "ms_eden": "MS-EDEN NVFP4 (RTN elements, EDEN-corrected E4M3 scales rounded stochastically)",
    "mxfp8": "MXFP8 (OCP MX: E4M3 elements, E8M0 scale per 32, RTN, saturating)",
    "int4": "symmetric absmax INT4",
    "luq": "LUQ log-FP4 (stochastic underflow + log SR)",
}

#: kinds that scale groups of ``group`` elements along the last dim (which must be a multiple of it)
GROUPED_KINDS = frozenset({"quest", "absmax", "ocp", "nvfp4", "nvfp4_4o6", "nvfp4_sr1617", "ms_eden", "mxfp8"})
#: kinds that draw random numbers whatever ``stochastic`` says
_RANDOM_KINDS = frozenset({"luq", "nvfp4_sr1617", "ms_eden"})


@dataclass(frozen=True)
class QuantizerSpec:
    """What one GEMM operand is quantized to. The group axis is always the operand's last dim
    (the GEMM reduction axis as the operand is fed to ``a @ b.T``)."""

    kind: str
    stochastic: bool = False
    #: group size along the reduction axis (MX 32, NVFP4 16); ignored by per-row/tensor kinds
    group: int = 32
    #: fp8 element format: e4m3 | e5m2
    fmt: str = "e4m3"
    #: fp8 / int4 scale granularity: tensor | row (| block: fp8 only, one scale per tile_rows × group tile)
    scaling: str = "tensor"
    #: rows per scale tile (1 = 1-D groups along the reduction axis); nvfp4: 16 (16×16 tiles, NVIDIA's weight
    #: rule); fp8 with scaling=block: 1 (1×128 activation/gradient tiles) or 128 (128×128 weight blocks)
    tile_rows: int = 1
    #: QuEST: floor the scale to a power of two (E8M0). False only for analysis.
    floor: bool = True
    #: MS-FP4 OCC quantile (0 = off)
    clip_quantile: float = 0.0
    #: MS-FP4 DGE sharpness k (0 = plain straight-through)
    dge_k: float = 0.0
    #: MS-FP4 DGE derivative cap
    dge_cap: float = 3.0

    def __post_init__(self):
        if self.kind not in QUANTIZER_KINDS:
            raise ValueError(f"quantizer kind must be one of {sorted(QUANTIZER_KINDS)}, got {self.kind!r}")
        if self.tile_rows > 1 and self.kind == "nvfp4" and (self.tile_rows != self.group or self.stochastic):
            raise ValueError(f"2-D NVFP4 (a weight rule) takes square tiles and round-to-nearest, got "
                             f"{self.tile_rows}x{self.group}{' with SR' if self.stochastic else ''}")

    def label(self) -> str:
        """Short human-readable description, e.g. ``quest/g32`` or ``absmax/g32/sr``."""
        parts = [self.kind]
        if self.kind in GROUPED_KINDS:
            parts.append(f"g{self.group}" if self.tile_rows == 1 else f"{self.tile_rows}x{self.group}")
        if self.kind == "fp8":
            parts += [self.fmt, self.scaling if self.scaling != "block" else f"{self.tile_rows}x{self.group}"]
        if self.kind == "int4":
            parts.append(self.scaling)
        if self.kind == "quest" and not self.floor:
            parts.append("nofloor")
        if self.clip_quantile:
            parts.append(f"occ{self.clip_quantile:g}")
        if self.dge_k:
            parts.append(f"dge{self.dge_k:g}")
        if self.stochastic:
            parts.append("sr")
        return "/".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class QTensor:
    """A quantized GEMM operand as a backend returns it.

    ``values``: dequantized float32 values (in the transform's basis), same shape as the input.
    ``grad_factor``: elementwise factor for the straight-through gradient (QuEST mask, DGE f′) or None.
    ``residual``: high-precision sparse part that the GEMM adds back (OCC) or None.
    ``stats``: quantization statistics when requested. ``data``: backend-private storage (codes...).
    """

    values: torch.Tensor
    grad_factor: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    stats: dict[str, float] | None = None
    data: Any = None

    def dequantized(self) -> torch.Tensor:
        """x̂ including the high-precision residual (what the GEMM effectively multiplies)."""
        return self.values if self.residual is None else self.values + self.residual


def dge_derivative(x: torch.Tensor, k: float = 5.0, cap: float = 3.0) -> torch.Tensor:
    """DGE derivative f′(x) = min((1/k)·|2u/δ − 1|^(1/k − 1), cap) on scaled weights x ∈ [−6, 6]."""
    x = x.float()
    a = x.abs()
    delta = torch.where(a < 2, torch.full_like(a, 0.5), torch.where(a < 4, torch.ones_like(a), torch.full_like(a, 2.0)))
    u = x - torch.floor(x / delta) * delta
    t = (2 * u / delta - 1).abs()
    # t == 0 (interval midpoint) gives inf, which the cap turns into ``cap``.
    with torch.no_grad():
        d = (1.0 / k) * torch.pow(t, 1.0 / k - 1.0)
    return d.clamp(max=cap)


def occ_clamp(x: torch.Tensor, quantile: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Clamp each row of ``x`` to its [int((1−q)·n), int(q·n)] order statistics → (clamped, residual)."""
    n = x.shape[-1]
    srt = torch.sort(x.float(), dim=-1).values
    lo_i = min(max(int((1.0 - quantile) * n), 0), n - 1)
    hi_i = min(max(int(quantile * n), 0), n - 1)
    lo = srt[..., lo_i : lo_i + 1]
    hi = srt[..., hi_i : hi_i + 1]
    xc = torch.maximum(torch.minimum(x.float(), hi), lo)
    return xc, x.float() - xc


def ms_fp4_quantize(x: torch.Tensor, clip_quantile: float = 0.0, dge_k: float = 0.0, dge_cap: float = 3.0) -> QTensor:
    """MS-FP4 per-row absmax E2M1 (optionally with OCC residual and DGE gradient factor)."""
    x = x.float()
    residual = None
    amax = x.abs().amax(dim=-1, keepdim=True)
    if clip_quantile:
        x, residual = occ_clamp(x, clip_quantile)
        # the row's scale comes from the clamped row, but a row holding Inf/NaN must go NaN even where OCC clamped
        # its Inf into range (the Inf would hide in the residual)
        amax = torch.where(torch.isfinite(amax), x.abs().amax(dim=-1, keepdim=True), amax)
    s = absmax_scale(amax, E2M1_MAX)
    y = x / scale_divisor(s)
    q = round_to_e2m1(y)
    factor = dge_derivative(y, dge_k, dge_cap) if dge_k else None
    return QTensor(values=q * s, grad_factor=factor, residual=residual, data={"scale": s})


def luq_quantize(x: torch.Tensor, generator: torch.Generator | None = None, levels: int = 7) -> torch.Tensor:
    """LUQ radix-2 FP4 of a gradient tensor (per-tensor max; unbiased)."""
    x = x.float()
    a = x.abs()
    amax = a.amax()
    top = float(amax)  # (one host sync)
    if not math.isfinite(top):  # the levels are amax·2^-j: one NaN/Inf makes the whole tensor NaN
        return torch.full_like(x, float("nan"))
    if top == 0:
        return torch.zeros_like(x)
    # at least float32's smallest subnormal: an alpha that underflowed to 0 sent zeros up the log branch
    alpha = (amax * 2.0 ** (-(levels - 1))).clamp(min=FLOAT32_TINY)
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
    # Stochastic underflow below the smallest level.
    under = torch.where(u * alpha < a, alpha, torch.zeros_like(a))
    # Log SR between lo = 2^floor(log2 a) (relative to amax, exact exponent) and 2·lo.
    lo = exact_pow2(floor_log2(torch.clamp(a, min=alpha) / amax)) * amax
    up = u < (a - lo) / lo
    over = torch.where(up, 2 * lo, lo).clamp(max=amax)
    q = torch.where(a < alpha, under, over)
    return torch.copysign(q, x)


def _generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
    return g


def reference_quantize(x: torch.Tensor, spec: QuantizerSpec, seed: int | None = None) -> QTensor:
    """Run ``spec`` on ``x`` (float32, group axis last) with pure PyTorch → :class:`QTensor`.

    ``seed`` seeds the stochastic-rounding generator (reproducible); None uses the global RNG.
    """
    x = x.float()
    kind = spec.kind
    gen = _generator(seed, x.device) if spec.stochastic or kind in _RANDOM_KINDS else None
    if kind == "quest":
        xq, mask = mx.quest_mxfp4(x, spec.group, spec.floor)
        return QTensor(values=xq, grad_factor=mask, data={"scale": mx.quest_scales(x, spec.group, spec.floor)})
    if kind == "absmax":
        return QTensor(values=mx.absmax_mxfp4(x, spec.stochastic, gen, spec.group),
                       data={"scale": mx.absmax_scales(x, spec.group)})
    if kind == "ocp":
        return QTensor(values=mx.rtn_absmax_mxfp4(x, spec.group), data={"scale": mx.absmax_scales(x, spec.group)})
    if kind == "ms_fp4":
        return ms_fp4_quantize(x, spec.clip_quantile, spec.dge_k, spec.dge_cap)
    if kind == "fp8" and spec.scaling == "block":
        xq, s = fp8_blockwise_quantize(x, spec.tile_rows, spec.group, spec.fmt)
        return QTensor(values=xq, data={"scale": s})
    if kind == "fp8":
        xq, s = fp8_quantize(x, spec.fmt, spec.scaling)
        return QTensor(values=xq, data={"scale": s})
    if kind == "nvfp4" and spec.tile_rows > 1:
        xq, block, ts = nvfp4_quantize_2d(x, spec.group)
        return QTensor(values=xq, data={"scale": block * ts})
    if kind == "nvfp4":
        xq, block, ts = mx.nvfp4_quantize(x, spec.stochastic, gen, spec.group)
        return QTensor(values=xq, data={"scale": block * ts})
    if kind in ("nvfp4_4o6", "nvfp4_sr1617", "ms_eden"):  # Quartet II's NVFP4 quantizers
        if kind == "nvfp4_4o6":
            xq, block, ts = quartet2.nvfp4_four_over_six(x, spec.group)
        elif kind == "nvfp4_sr1617":
            xq, block, ts = quartet2.nvfp4_sr_headroom(x, gen, spec.group)
        else:
            xq, block, ts = quartet2.ms_eden_quantize(x, gen, spec.group)
        return QTensor(values=xq, data={"scale": block * ts})
    if kind == "mxfp8":
        return QTensor(values=mx.mxfp8_quantize(x, spec.group), data={"scale": mx.mxfp8_scales(x, spec.group)})
    if kind == "int4":
        xq, s = int4_quantize(x, spec.scaling, spec.stochastic, gen)
        return QTensor(values=xq, data={"scale": s})
    if kind == "luq":
        return QTensor(values=luq_quantize(x, gen))
    raise ValueError(f"unknown quantizer kind {kind!r}")  # pragma: no cover - checked in the spec


def quantizer_stats(x: torch.Tensor, q: QTensor) -> dict[str, float]:
    """Statistics of one quantization: clip fraction (STE mask), underflow-to-zero fraction,
    scale exponent range (log2 of the scales), and relative error ‖x̂ − x‖/‖x‖."""
    x = x.float()
    xq = q.dequantized()
    out: dict[str, float] = {}
    if q.grad_factor is not None and q.grad_factor.dtype == torch.bool:
        out["clip_frac"] = float(1.0 - q.grad_factor.float().mean())
    nz = x != 0
    n_nz = int(nz.sum())
    out["underflow_frac"] = float(((q.values == 0) & nz).sum()) / n_nz if n_nz else 0.0
    scale = q.data.get("scale") if isinstance(q.data, dict) else None
    if scale is not None:
        e = torch.log2(scale.float()[scale > 0])
        if e.numel():
            out["scale_exp_min"] = float(e.min())
            out["scale_exp_max"] = float(e.max())
    norm = float(x.norm())
    out["rel_err"] = float((xq - x).norm()) / norm if norm > 0 else 0.0
    return out
