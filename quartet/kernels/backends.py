"""Kernel backends registered behind :mod:`quartet.quant.backend` (the seam of the quantized linear).

``triton``           fused Triton quantizers + BF16 GEMM on dequantized values (any CUDA GPU)
``hopper_fp8``       fused quantizers writing FP8 with folded power-of-two scales (per row, or per 1×128 /
                     128×128 block in the fused layer) + FP8 scaled matmul (sm_89/sm_90+)
``blackwell_mxfp4``  fused quantizers writing packed E2M1/E8M0 + native MXFP4 ``scaled_mm`` (sm_100+)
``fused``            the recipes' fused Triton quantizers + BF16 tensor-core GEMMs, scales after the GEMM
                     (:mod:`quartet.kernels.recipe_linear`; any CUDA GPU), the compiled oracle for statistics steps

They handle the MX kinds ``quest``, ``absmax`` (RTN/SR) and ``ocp`` with 32-groups and an optional
32-Hadamard; ``hopper_fp8`` also runs the ``fp8`` scheme (tensor scaling) and ``fp8_deepseek`` (E4M3 in 1×128 /
128×128 blocks) on its FP8 layers (:mod:`quartet.kernels.fp8_linear`, :mod:`quartet.kernels.fp8_block_linear`);
any other quantizer makes ``unsupported_reason`` answer, so ``auto`` skips them and a
backend named in the config fails at start-up. ``auto`` prefers blackwell > hopper > triton > fused > compiled >
reference: the MX and FP8 layers where they cover a scheme, the fused recipe layer for the other recipes — and, as
:func:`quartet.quant.backend.get_backend` gives a backend with a fused layer for the scheme precedence over a higher
one without, for the forward-only / backward-only variants of ``fp8`` too (its FP8 layer runs all six operands only).
"""
from __future__ import annotations

import torch

from quartet.kernels import gemm as G
from quartet.kernels.triton_quant import HAS_TRITON, masked_inverse_hadamard, mx_quantize

_RULE = {"quest": "quest", "absmax": "absmax", "ocp": "rtn_absmax"}


def _base():
    from quartet.quant.backend import Backend

    return Backend


def make_backend(name: str):
    """An instance of the kernel backend ``name`` without the device check (tests, the CPU interpreter)."""
    if name == "fused":
        return _fused_class()()
    triton_cls, hopper_cls, blackwell_cls = _make_classes()
    return {"triton": triton_cls, "hopper_fp8": hopper_cls, "blackwell_mxfp4": blackwell_cls}[name]()


def _make_classes():
    Backend = _base()
    from quartet.quant.quantizers import QTensor

    class TritonBackend(Backend):
        """Fused Triton quantizers; GEMMs in BF16 on the (exact) dequantized values."""

        name = "triton"
        engine = "triton"

        def __init__(self):
            self.flushed = None  # device int32 counter of FP8 values that were not exact

        def fused_layer(self, scheme):
            """The fused Quartet layer (or, on ``hopper_fp8``, the FP8 tensor-core layer) where it covers
            ``scheme`` (:func:`quartet.kernels.linear.fused_covers`)."""
            from quartet.kernels import linear as fused

            if not fused.fused_covers(scheme, self.name):
                return None
            return fused.fused_quant_linear, fused.fused_implementation(scheme)

        def bind_device_draws(self, model, device):
            from quartet.kernels.linear import bind_device_draws

            return bind_device_draws(model, device) is not None

        def supports_device(self, device):
            return HAS_TRITON and torch.device(device).type == "cuda"

        def unsupported_reason(self, spec, device):
            if not self.supports_device(device):
                return f"backend {self.name!r} needs a CUDA GPU with triton (device {device})"
            if spec.kind not in _RULE:
                return f"backend {self.name!r} runs MX quantizers (quest/absmax/ocp), not {spec.label()}"
            if spec.group != 32:
                return f"backend {self.name!r} supports 32-groups only, not {spec.label()}"
            if spec.kind == "quest" and (spec.stochastic or not spec.floor):
                return f"backend {self.name!r}: QuEST must be RTN with power-of-two scales ({spec.label()})"
            return None

        def _opts(self):
            return {"deq": True, "out_dtype": torch.float32}

        def quantize(self, x, spec, *, block=None, signs=None, seed=None, stats=False):
            if block not in (None, 32):
                raise ValueError(f"{self.name}: Hadamard block must be 32, got {block}")
            shape = x.shape
            x2 = x.reshape(-1, shape[-1])
            if x2.dtype not in (torch.bfloat16, torch.float32):
                x2 = x2.float()
            op = mx_quantize(x2, axis=-1, rule=_RULE[spec.kind], stochastic=spec.stochastic,
                             seed=0 if seed is None else int(seed) & 0x7FFF_FFFF, hadamard=block is not None,
                             signs=signs, mask=spec.kind == "quest", **self._opts())
            if op.flushed is not None:
                self.flushed = op.flushed if self.flushed is None else self.flushed + op.flushed
            values = op.deq.reshape(shape) if op.deq is not None else None
            q = QTensor(values=values, grad_factor=op.mask.reshape(shape) if op.mask is not None else None, data=op)
            if stats:
                from quartet.quant.quantizers import quantizer_stats

                xr = self.transform(x, block, signs) if block else x.float()
                q.stats = quantizer_stats(xr, q)
            return q

        def gemm(self, a, b):
            return G.bf16_mm(a.data, b.data, out_dtype=torch.float32)

        def transform(self, x, block, signs=None, inverse=False):
            # the fixed-H inverse rotation of gradients runs as one fused kernel; the rest as the oracle
            if inverse and signs is None and block == 32 and x.dim() == 2 and x.is_cuda:
                return masked_inverse_hadamard(x, None, out_dtype=torch.float32)
            return super().transform(x, block, signs, inverse)

        def describe(self, device):
            return f"{self.name}: fused Triton Hadamard+MXFP4 quantizers, BF16 GEMM on dequantized values, on {device}"

    class HopperFP8Backend(TritonBackend):
        """MXFP4 values folded exactly into FP8 (per-row scales) and multiplied on FP8 tensor cores."""

        name = "hopper_fp8"

        def supports_device(self, device):
            device = torch.device(device)
            return HAS_TRITON and device.type == "cuda" and G.hopper_available()

        def _opts(self):
            # values (float32) stay available for the layer's saved tensors and statistics
            return {"deq": True, "out_dtype": torch.float32, "fp8": "e4m3"}

        def unsupported_reason(self, spec, device):
            # The fp8 scheme (tensor-wise current scaling) runs as FP8QuantLinear on the tensor cores, fp8_deepseek
            # (E4M3 in 1x128 / 128x128 blocks) as FP8BlockQuantLinear; their statistics steps (and layers whose
            # features are not multiples of 128) quantize operand by operand through the oracle (below).
            if spec.kind == "fp8":
                if not self.supports_device(device):
                    return f"backend {self.name!r} needs an FP8 GPU (sm_89/sm_90+) with triton (device {device})"
                block = (spec.scaling == "block" and spec.fmt == "e4m3" and spec.group == 128
                         and spec.tile_rows in (1, 128))
                return None if spec.scaling == "tensor" or block else (
                    f"backend {self.name!r} runs FP8 with tensor scaling or DeepSeek's E4M3 1x128/128x128 blocks, "
                    f"not {spec.label()}")
            return super().unsupported_reason(spec, device)

        def quantize(self, x, spec, *, block=None, signs=None, seed=None, stats=False):
            if spec.kind == "fp8":
                from quartet.quant.backend import ReferenceBackend

                return ReferenceBackend().quantize(x, spec, block=block, signs=signs, seed=seed, stats=stats)
            return super().quantize(x, spec, block=block, signs=signs, seed=seed, stats=stats)

        def gemm(self, a, b):
            if a.data is None or not hasattr(a.data, "fp8"):  # oracle-quantized FP8 values (statistics steps)
                return a.values.float() @ b.values.float().t()
            return G.hopper_fp8_mm(a.data, b.data, out_dtype=torch.float32)

        def describe(self, device):
            return (f"{self.name}: fused Triton quantizers -> FP8 e4m3 with power-of-two scales (fused Quartet "
                    f"layer: one per 1x128 / 128x128 block, F.scaled_mm block-wise; operand by operand: one per "
                    f"row, torch._scaled_mm), flushed values counted, on {device}")

    class BlackwellMXFP4Backend(TritonBackend):
        """Native MXFP4 GEMM through ``torch.nn.functional.scaled_mm`` (sm_100+)."""

        name = "blackwell_mxfp4"

        def supports_device(self, device):
            return HAS_TRITON and torch.device(device).type == "cuda" and G.blackwell_available()

        def _opts(self):
            return {"deq": True, "out_dtype": torch.float32, "mx": True}

        def gemm(self, a, b):
            return G.blackwell_mxfp4_mm(a.data, b.data, out_dtype=torch.float32)

        def describe(self, device):
            return f"{self.name}: fused Triton quantizers -> packed E2M1 + swizzled E8M0, F.scaled_mm MXFP4, on {device}"

    return TritonBackend, HopperFP8Backend, BlackwellMXFP4Backend


def _fused_class():
    from quartet.kernels import recipe_linear, recipe_quant
    from quartet.kernels.compiled import CompiledReferenceBackend

    class FusedRecipeBackend(CompiledReferenceBackend):
        """The recipe layer (:mod:`quartet.kernels.recipe_linear`) on every covered layer; operand by operand (layers
        of other shapes, statistics steps) the oracle's quantizers compiled by Inductor."""

        name = "fused"

        def supports_device(self, device):
            return HAS_TRITON and torch.device(device).type == "cuda"

        def unsupported_reason(self, spec, device):
            if not self.supports_device(device):
                return f"backend {self.name!r} needs a CUDA GPU with triton (device {device})"
            kind = recipe_quant.kernel_kind(spec)
            if (kind is None and not recipe_quant.supports(spec)) or (kind is not None
                                                                      and kind.code == recipe_quant.K_FP8_BLOCK):
                return f"backend {self.name!r} has no fused quantizer for {spec.label()}"
            return None

        def fused_layer(self, scheme):
            if not recipe_linear.covers(scheme):
                return None
            return recipe_linear.recipe_quant_linear, recipe_linear.IMPL_RECIPE

        def bind_device_draws(self, model, device):
            return recipe_linear.bind_recipe_draws(model, device)

        def describe(self, device):
            return (f"{self.name}: fused Triton quantizers writing exact BF16 values, BF16 tensor-core GEMMs with the "
                    f"tensor / row scales after the GEMM, on {device}")

    return FusedRecipeBackend


def register() -> None:
    """Register the kernel backends with the quantization seam (called on ``import quartet.kernels``)."""
    try:
        from quartet.quant.backend import register_backend
    except ImportError:  # the seam is not there (stand-alone benchmark checkout): nothing to register
        return
    triton_cls, hopper_cls, blackwell_cls = _make_classes()
    register_backend("triton", lambda device: triton_cls(), priority=10)
    register_backend("hopper_fp8", lambda device: hopper_cls(), priority=20)
    register_backend("blackwell_mxfp4", lambda device: blackwell_cls(), priority=30)
    # below every hand-written kernel, above the eager oracle: what ``auto`` takes on a GPU for the rest
    from quartet.kernels.compiled import CompiledReferenceBackend

    register_backend("compiled", lambda device: CompiledReferenceBackend(), priority=0)
    fused_cls = _fused_class()
    register_backend("fused", lambda device: fused_cls(), priority=5)
