"""Element formats: E2M1 (FP4), E8M0 (power-of-two scales), E4M3 / E5M2 (FP8) and INT4.

Maths in one paragraph. A block-scaled low-precision tensor stores x ≈ s · q, where q is an element
of a tiny grid and s is a scale shared by a group of elements. For E2M1 (1 sign, 2 exponent, 1
mantissa bit) the non-negative grid is {0, 0.5, 1, 1.5, 2, 3, 4, 6}; the 4-bit code of a value is
``sign << 3 | index`` where ``index`` is its position in that grid (the OCP bit pattern). Rounding to
nearest (RTN) uses the midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 as thresholds with a value
rounded *up* only when strictly above the threshold (``|y| > t``), i.e. ties go toward zero, exactly as
the Quartet kernels compare (MS-AMP's FP4 kernel differs: it rounds positive ties up); anything beyond 6
saturates to 6. −0 has its own code 8 (sign bit set, magnitude 0). Stochastic rounding (SR) picks the upper
neighbour of the bracketing grid pair with probability (|y| − lo)/(hi − lo), so E[q] = y inside
[−6, 6]. E8M0 is an 8-bit biased exponent: code c means 2^(c−127), c = 255 is NaN. FP8 uses
PyTorch's native ``float8_e4m3fn`` / ``float8_e5m2`` casts (round-to-nearest-even) after clamping
to the format's largest finite value, so overflow saturates instead of producing NaN/Inf. E4M3 spaces its
values 2^(e−3) apart in the binade [2^e, 2^(e+1)) (e ≥ −6) and 2^-9 apart below 2^-6 (subnormals); stochastic
rounding to E4M3 picks the upper of the two neighbours with probability (|v| − lo)/(hi − lo).

Everything here is pure PyTorch, device-agnostic, and computes in float32. Scales divide by a
non-power-of-two constant c as ``amax * (1/c)``: CUDA turns a division by a Python scalar into that
multiplication anyway, so writing it explicitly makes CPU and GPU results bitwise identical.

Non-finite inputs. Every quantizer of the package follows one rule (docs/precision.md, "Non-finite inputs"): the
unit that shares one scale (group, tile, row or tensor) comes out entirely NaN when it holds a NaN or ±Inf, so a
diverging run reaches the trainer's non-finite check, and the other units are untouched. For the absmax scales here
(:func:`absmax_scale`) the unit's scale is NaN, and x/NaN and q·NaN carry it to every element (each rounding keeps
NaN a NaN). An all-zero unit gets scale 1 and stays 0; a scale amax·(1/c) that underflows float32 to 0 (amax a few
times 2^-149) flushes its unit to ±0 (:func:`scale_divisor`) instead of giving 0/0 = NaN.
"""
from __future__ import annotations

import torch

__all__ = [
    "E2M1_GRID",
    "E2M1_THRESHOLDS",
    "E2M1_MAX",
    "round_to_e2m1",
    "e2m1_encode",
    "e2m1_decode",
    "pack_e2m1",
    "unpack_e2m1",
    "e8m0_encode",
    "e8m0_decode",
    "E4M3_MAX",
    "E5M2_MAX",
    "round_to_fp8",
    "round_to_e4m3_stochastic",
    "fp8_quantize",
    "absmax_scale",
    "scale_divisor",
    "exact_pow2",
    "round_to_int4",
    "int4_quantize",
    "INT4_MAX",
    "FLOAT32_TINY",
]

#: The 8 non-negative E2M1 values; the index of a value is its 3-bit magnitude code.
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
#: RTN decision thresholds (midpoints of the grid); |y| > t rounds up past t.
E2M1_THRESHOLDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
#: Largest E2M1 magnitude.
E2M1_MAX = 6.0

#: Largest finite magnitudes of the FP8 formats.
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
_FP8_DTYPES = {"e4m3": (torch.float8_e4m3fn, E4M3_MAX), "e5m2": (torch.float8_e5m2, E5M2_MAX)}

#: Symmetric INT4 range used here: −7 … 7 (−8 is left unused so the grid is zero-centred).
INT4_MAX = 7.0

#: float32's smallest positive (subnormal) value 2^-149: the floor of a scale that must not underflow to 0.
FLOAT32_TINY = 2.0 ** -149


def _on(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.to(device=like.device, dtype=torch.float32)


def _rtn_table_cpu() -> torch.Tensor:
    # value of RTN on the interval (k/4, (k+1)/4], k = 0..23, decided at the interval's midpoint
    mids = (torch.arange(24, dtype=torch.float32) + 0.5) / 4
    return E2M1_GRID[torch.bucketize(mids, E2M1_THRESHOLDS)]


_RTN_TABLES: dict[str, torch.Tensor] = {}


def _rtn_table(device: torch.device) -> torch.Tensor:
    key = str(device)
    if key not in _RTN_TABLES:
        _RTN_TABLES[key] = _rtn_table_cpu().to(device)
    return _RTN_TABLES[key]


def _uniform(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """U[0,1) draws from ``generator`` (which must live on ``device``) or the global RNG."""
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float32)


def round_to_e2m1(y: torch.Tensor, stochastic: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
    """Round (already scaled) values to the signed E2M1 grid, saturating at ±6.

    RTN: |y| > 0.25 → 0.5, > 0.75 → 1, > 1.25 → 1.5, > 1.75 → 2, > 2.5 → 3, > 3.5 → 4, > 5 → 6
    (ties go towards zero). SR: unbiased between the two bracketing grid points, drawing uniforms
    from ``generator`` (seeded by the caller for reproducibility).
    """
    y = y.float()
    a = y.abs().clamp(max=E2M1_MAX)
    if not stochastic:
        # Every RTN threshold is a multiple of 1/4 and ties go down, so the result is constant on each
        # interval (k/4, (k+1)/4]: one table lookup at index ceil(4|y|) − 1 (exact, and ~2x faster on
        # CPU than comparisons against the thresholds).
        idx = (a * 4.0).ceil_().sub_(1.0).nan_to_num_(0.0).clamp_(0.0, 23.0).to(torch.int64)
        q = torch.take(_rtn_table(a.device), idx)
        # NaN has no grid point: it stays NaN (the table index above only had to stay in range), so a diverging
        # operand reaches the trainer's non-finite check instead of turning into numbers
        q = torch.where(a.isnan(), a, q)
    else:
        # Spacing is 0.5 on [0, 2], 1 on [2, 4], 2 on [4, 6] (powers of two, so a/step is exact).
        # [a > 2], [a > 4] as exact 0/1 floats via a saturating clamp (any float above 2 or 4 differs
        # from it by far more than 1e-30); at a == 2 or 4 the smaller step gives the same result.
        h2 = (a - 2.0).mul_(1e30).clamp_(0.0, 1.0)
        h4 = (a - 4.0).mul_(1e30).clamp_(0.0, 1.0)
        step = h2.mul_(0.5).add_(0.5).add_(h4)  # 0.5, 1 or 2
        t = a / step
        lo = torch.floor(t)
        q = (lo + (_uniform(a.shape, generator, a.device) < (t - lo)).float()) * step
    return torch.copysign(q, y) if q.numel() else q


def e2m1_encode(q: torch.Tensor) -> torch.Tensor:
    """4-bit codes (uint8 holding 0..15) of values that lie exactly on the E2M1 grid; −0.0 → 8 (the sign bit is kept,
    so every code round-trips through :func:`e2m1_decode`)."""
    q = q.float()
    a = q.abs()
    idx = torch.bucketize(a, _on(E2M1_GRID, q))  # exact grid values land on their own index
    grid = _on(E2M1_GRID, q)
    if not torch.equal(grid[idx.clamp(max=7)], a):
        raise ValueError("e2m1_encode: input has values that are not on the E2M1 grid (round first)")
    sign = torch.signbit(q).to(torch.uint8)
    return (sign << 3) | idx.to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Float32 values of 4-bit E2M1 codes (uint8 0..15)."""
    c = codes.to(torch.int64)
    mag = _on(E2M1_GRID, codes)[c & 7]
    return torch.where((c & 8) != 0, -mag, mag)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack pairs of 4-bit codes along the last dim into bytes, the first code in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_e2m1: last dim must be even, got {codes.shape[-1]}")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] & 15) | ((c[..., 1::2] & 15) << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_e2m1`: bytes → 4-bit codes, last dim doubled."""
    p = packed.to(torch.uint8)
    return torch.stack((p & 15, p >> 4), dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)


def floor_log2(v: torch.Tensor) -> torch.Tensor:
    """floor(log2 v) for v > 0 (int32), exact: read from ``frexp`` (v = m·2^e, m ∈ [0.5, 1)), subnormals included.

    ``torch.floor(torch.log2(v))`` is not: in float32 it rounds up for v a hair below 2^k (log2(8·(1−2⁻²⁴)) is
    3.0). Every power-of-two scale of the oracle and the kernels' host side takes its exponent here."""
    return torch.frexp(v).exponent - 1


def exact_pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e as float32 for integer exponents e in [-149, 127], built from the float's bits: exact on every device and
    under ``torch.compile``. ``torch.exp2`` need not be: CUDA documents exp2f to 2 ulp, and Inductor's Triton kernels
    call libdevice with flush-to-zero, which returns 0 for a subnormal 2^e (pytorch/pytorch#125557)."""
    e = e.to(torch.int32)
    normal = (e + 127).clamp(min=1, max=254) << 23  # biased exponent in the exponent field, mantissa 0
    subnormal = torch.ones_like(e) << (e + 149).clamp(min=0, max=22)  # 2^-149 · 2^(e+149): one mantissa bit
    return torch.where(e >= -126, normal, subnormal).view(torch.float32)


def e8m0_encode(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 codes (uint8) of positive scales: floor(log2 s) + 127, clamped to [0, 254]; NaN/≤0/Inf → 255.

    Exact powers of two 2^-127 … 2^127 round-trip exactly (``frexp`` handles the subnormal 2^-127).
    """
    s = scale.float()
    code = (floor_log2(s).to(torch.int64) + 127).clamp(0, 254)
    bad = ~torch.isfinite(s) | (s <= 0)
    return torch.where(bad, torch.full_like(code, 255), code).to(torch.uint8)


def e8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """Float32 scales 2^(c − 127) of E8M0 codes; code 255 decodes to NaN."""
    c = codes.to(torch.int64)
    val = exact_pow2(c - 127)
    return torch.where(c == 255, torch.full_like(val, float("nan")), val)


def round_to_fp8(y: torch.Tensor, fmt: str = "e4m3") -> torch.Tensor:
    """Round float values to FP8 (``e4m3`` or ``e5m2``) with saturation; returns float32."""
    if fmt not in _FP8_DTYPES:
        raise ValueError(f"fp8 format must be one of {sorted(_FP8_DTYPES)}, got {fmt!r}")
    dtype, fmax = _FP8_DTYPES[fmt]
    return y.float().clamp(-fmax, fmax).to(dtype).float()


def round_to_e4m3_stochastic(v: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Unbiased stochastic rounding to E4M3 (float32 result), saturating at ±448: E[result] = v for |v| ≤ 448.

    The neighbours lo ≤ |v| ≤ hi are a multiple of the local spacing 2^(max(floor(log2|v|), −6) − 3) apart, so
    lo = floor(|v|/spacing)·spacing and p = (|v| − lo)/spacing are exact; values already on the grid come back
    unchanged (p = 0). One uniform per element from ``generator``; NaN stays NaN."""
    v = v.float()
    a = v.abs().clamp(max=E4M3_MAX)
    spacing = exact_pow2(floor_log2(a).clamp(min=-6) - 3)  # (a = 0: any spacing gives lo = 0, p = 0)
    lo = torch.floor(a / spacing) * spacing
    up = _uniform(a.shape, generator, a.device) < (a - lo) / spacing
    return torch.copysign(lo + up.float() * spacing, v)


def fp8_quantize(x: torch.Tensor, fmt: str = "e4m3", scaling: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """Current-scaling FP8 fake quantization → (dequantized float32, scale).

    ``scaling="tensor"``: one scale amax(|x|)/fmax for the tensor; ``"row"``: one per row (last
    dim is the GEMM reduction axis, so one scale per output row/column of the product).
    """
    if fmt not in _FP8_DTYPES:
        raise ValueError(f"fp8 format must be one of {sorted(_FP8_DTYPES)}, got {fmt!r}")
    x = x.float()
    scale = _absmax_scale(x, scaling, _FP8_DTYPES[fmt][1], "fp8")
    return round_to_fp8(x / scale_divisor(scale), fmt) * scale, scale


def absmax_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """The scale ``amax·(1/qmax)`` of units with largest magnitudes ``amax``: 1 where the amax is 0 (an all-zero unit
    divides by 1 and stays 0), NaN where it is Inf/NaN (the unit holds a non-finite value: all its x̂ come out NaN)."""
    s = torch.where(amax > 0, amax * (1.0 / qmax), torch.ones_like(amax))
    return torch.where(torch.isfinite(amax), s, torch.full_like(amax, float("nan")))


def scale_divisor(scale: torch.Tensor) -> torch.Tensor:
    """What x is divided by before rounding: ``scale``, or +Inf where it underflowed float32 to 0. x/0 would give
    ±Inf (saturated, then times 0: ±0) for the unit's nonzero values and NaN for its zeros; x/Inf gives the same ±0
    for the former and 0 for the latter, so the unit flushes to zero and finite inputs never make a NaN."""
    return torch.where(scale == 0, torch.full_like(scale, float("inf")), scale)


def _absmax_scale(x: torch.Tensor, scaling: str, qmax: float, what: str) -> torch.Tensor:
    """:func:`absmax_scale` over the tensor (``scaling="tensor"``) or per row of the last dim (``"row"``, keepdim)."""
    if scaling == "tensor":
        amax = x.abs().amax()
    elif scaling == "row":
        amax = x.abs().amax(dim=-1, keepdim=True)
    else:
        raise ValueError(f"{what} scaling must be 'tensor' or 'row', got {scaling!r}")
    return absmax_scale(amax, qmax)


def round_to_int4(y: torch.Tensor, stochastic: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
    """Round scaled values to the integers −7 … 7 (RTN half-away-from-zero, or unbiased SR)."""
    y = y.float().clamp(-INT4_MAX, INT4_MAX)
    if stochastic:
        lo = torch.floor(y)
        q = lo + (_uniform(y.shape, generator, y.device) < (y - lo)).float()
    else:
        q = torch.copysign(torch.floor(y.abs() + 0.5), y)
    return q.clamp(-INT4_MAX, INT4_MAX)


def int4_quantize(x: torch.Tensor, scaling: str = "row", stochastic: bool = False,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric absmax INT4 fake quantization → (dequantized float32, scale = amax/7).

    ``scaling`` is ``"row"`` (one scale per row of the last dim) or ``"tensor"``.
    """
    x = x.float()
    scale = _absmax_scale(x, scaling, INT4_MAX, "int4")
    return round_to_int4(x / scale_divisor(scale), stochastic, generator) * scale, scale
