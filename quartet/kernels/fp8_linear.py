"""The FP8 training linear on tensor cores: E4M3 X and W, E5M2 gradients, one current scale per tensor.

The ``fp8`` scheme of :mod:`quartet.quant.schemes` (tensor-wise current scaling) run for real instead of as
float32 fake quantization. For a tensor ``T`` and format ``f`` (E4M3: max 448, E5M2: max 57344):

    s_T = amax|T| / max_f   (1 when T is all zeros),     T8 = f(clamp(T / s_T)),     T̂ = T8 · s_T

which is exactly :func:`quartet.quant.formats.fp8_quantize` — the same float32 operations (its scale helpers), so
the FP8 codes are bitwise the oracle's, non-finite inputs included: the unit of a tensor scale is the tensor, so a
NaN or ±Inf anywhere in T makes s_T NaN and all of T̂ (and the GEMMs it enters) NaN, where the trainer sees it. The three GEMMs multiply the codes on FP8 tensor cores (``torch._scaled_mm``,
float32 accumulation) and apply the two scales to the product:

    forward   Y  = X̂ Ŵᵀ  = (X8 W8ᵀ) · s_X s_W
    input     dX = Ê Ŵ   = (E8 W8)  · s_E s_W        (E8 in E5M2)
    weight    dW = Êᵀ X̂  = (E8ᵀ X8) · s_E s_X

The backward reuses the forward's codes of X̂ and Ŵ (the scheme's ``bwd_source = quantized``): requantizing
a tensor-scaled FP8 tensor with its own tensor scale gives back the same codes (its amax is max_f · s), so
nothing is quantized twice. Everything here is plain PyTorch (no Python-side state per call), so
``torch.compile`` fuses the amax, scale and cast of each operand into the surrounding kernels.
``torch._scaled_mm`` needs every GEMM dimension to be a multiple of 16: tokens are zero-padded (zero rows
change neither the amax nor the product), features must already be multiples of 16.
"""
from __future__ import annotations

import torch

from quartet.quant.formats import absmax_scale, scale_divisor
from quartet.quant.linear import QuantLinear

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
_FMAX = {E4M3: 448.0, E5M2: 57344.0}
#: every dimension of ``torch._scaled_mm`` must be a multiple of this
MULTIPLE = 16


def fp8_tensor_quantize(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 codes, float32 scale) of ``t`` with one current scale per tensor (the oracle's rule, bitwise)."""
    fmax = _FMAX[dtype]
    t = t.float()
    scale = absmax_scale(t.abs().amax(), fmax)
    return (t / scale_divisor(scale)).clamp(-fmax, fmax).to(dtype), scale


def _col_major(t8: torch.Tensor) -> torch.Tensor:
    """The same (R, C) matrix stored column-major (what ``_scaled_mm`` wants for its second operand)."""
    return t8.t().contiguous().t()


def _mm(a8: torch.Tensor, b8_cm: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, out_dtype: torch.dtype):
    """``(a8 · sa) @ (b8 · sb)`` for a row-major ``a8`` (M, K) and a column-major ``b8_cm`` (K, N)."""
    return torch._scaled_mm(a8, b8_cm, scale_a=sa, scale_b=sb, out_dtype=out_dtype)


class FP8LinearFn(torch.autograd.Function):
    """``Y = X̂ Ŵᵀ`` with FP8 operands in all three GEMMs (see the module docstring). ``x2d``: (T, in), T % 16 == 0."""

    @staticmethod
    def forward(ctx, x2d: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype):
        with torch.autocast(device_type=x2d.device.type, enabled=False):
            x8, sx = fp8_tensor_quantize(x2d, E4M3)
            w8, sw = fp8_tensor_quantize(weight, E4M3)
            y = _mm(x8, w8.t(), sx, sw, out_dtype)
        ctx.save_for_backward(x8, sx, w8, sw)
        ctx.w_dtype = weight.dtype
        ctx.x_dtype = x2d.dtype
        return y

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        x8, sx, w8, sw = ctx.saved_tensors
        gx = gw = None
        with torch.autocast(device_type=gy.device.type, enabled=False):
            e8, se = fp8_tensor_quantize(gy, E5M2)
            if ctx.needs_input_grad[0]:
                gx = _mm(e8, _col_major(w8), se, sw, torch.float32).to(ctx.x_dtype)
            if ctx.needs_input_grad[1]:
                gw = _mm(e8.t().contiguous(), _col_major(x8), se, sx, torch.float32).to(ctx.w_dtype)
        return gx, gw, None


def pad_tokens(x: torch.Tensor, multiple: int) -> tuple[torch.Tensor, int]:
    """``x`` flattened to (tokens, features) with zero token rows up to a multiple of ``multiple`` (zero rows change
    neither a scale nor a sum, and contribute nothing to a weight gradient); returns it and the real token count."""
    x2 = x.reshape(-1, x.shape[-1])
    T = x2.shape[0]
    pad = -T % multiple
    return (torch.nn.functional.pad(x2, (0, 0, 0, pad)) if pad else x2), T


def unpad_tokens(y: torch.Tensor, T: int) -> torch.Tensor:
    """The first ``T`` token rows of ``y``, sliced only where padding was added: autograd's backward of a slice,
    even a full one, allocates a zero tensor of the whole shape and copies the gradient into it (0.13 ms per
    16384x4096 layer on an H100, as long as a quantizer call)."""
    return y if y.shape[0] == T else y[:T]


def token_padded(fn, x: torch.Tensor, weight: torch.Tensor, multiple: int,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``fn(x2d, weight, out_dtype)`` on ``x`` of any leading shape flattened to (tokens, in), the tokens zero-padded
    to a multiple of ``multiple`` and sliced off the output.
    ``out_dtype`` defaults to the autocast dtype when autocast is on, else ``x.dtype``."""
    dev = x.device.type
    if out_dtype is None:
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    x2, T = pad_tokens(x, multiple)
    return unpad_tokens(fn(x2, weight, out_dtype), T).reshape(*x.shape[:-1], weight.shape[0])


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The fp8 scheme's linear on ``x`` of any leading shape (tokens padded to a multiple of 16)."""
    out_features, in_features = weight.shape
    if not covers_shape(in_features, out_features):
        raise ValueError(f"fp8_linear needs in/out features that are multiples of {MULTIPLE}, got "
                         f"{in_features}x{out_features}")
    return token_padded(FP8LinearFn.apply, x, weight, MULTIPLE, out_dtype)


def covers_shape(in_features: int, out_features: int) -> bool:
    """Whether a layer of this shape can run on ``torch._scaled_mm`` (features multiples of 16)."""
    return in_features % MULTIPLE == 0 and out_features % MULTIPLE == 0


def covers(scheme) -> bool:
    """Whether :class:`FP8QuantLinear` implements ``scheme``: the ``fp8`` scheme with tensor-wise scaling
    (E4M3 forward, E5M2 gradients). Layer shapes are checked apart (:func:`covers_shape`)."""
    specs = (scheme.fwd.a, scheme.fwd.b, scheme.dx.a, scheme.dx.b, scheme.dw.a, scheme.dw.b)
    want = ("e4m3", "e4m3", "e5m2", "e4m3", "e5m2", "e4m3")
    return all(s is not None and s.kind == "fp8" and s.scaling == "tensor" and s.fmt == f
               for s, f in zip(specs, want)) and all(g.transform == "none" for g in (scheme.fwd, scheme.dx, scheme.dw))


class FP8QuantLinear(QuantLinear):
    """The reference :class:`~quartet.quant.linear.QuantLinear` of the ``fp8`` scheme with tensor-core GEMMs.

    What ``apply_precision`` installs for ``fp8`` (tensor scaling) on the ``hopper_fp8`` backend. Steps that
    record statistics run the operand-by-operand seam path (same quantizers, float32 GEMMs); every other
    step runs :func:`fp8_linear`, which draws no random numbers and keeps no per-call state, so unlike the
    other quantized layers it may be traced by ``torch.compile``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stats_enabled:
            return super().forward(x)
        return fp8_linear(x, self.weight)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", fp8_tensor_cores=True"
