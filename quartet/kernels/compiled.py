"""``compiled``: the reference quantizers fused by ``torch.compile`` — the GPU path of every scheme without a
hand-written kernel (mxfp8, nvfp4, nvfp4_recipe, quartet2, ms_fp4, luq_int4, …).

Why: the oracle (:func:`quartet.quant.quantizers.reference_quantize`) spells each quantizer as 20–60 elementwise
PyTorch operations (scales, E4M3/E2M1 rounding, clamps, masks). Run eagerly on a GPU, every one is a kernel
launch and a full read + write of the operand, six operands per linear per step: at the ladder's sizes that is
most of the step. Inductor fuses each chain into a few kernels that read the operand once.

What stays exact: the function compiled *is* the oracle's, called with the same arguments. The random draws
(stochastic rounding, LUQ, MS-EDEN) come from a ``torch.Generator`` seeded per operand, which Dynamo cannot
trace: it breaks the graph there and draws eagerly from the same generator, so the compiled path consumes the
same random numbers as the oracle. Data-dependent branches (QuEST's NaN check, LUQ's all-zero test) break the
graph the same way. Inductor may contract ``a*b + c`` into one FMA where eager rounds twice, so a value that
lands within an ulp of a rounding boundary can round the other way: the GPU tests bound that to a tiny fraction
of elements, one grid step each (``tests/quant/test_gpu.py``); on the CPU the compiled path is bitwise the
oracle's.

Division and subnormals: Inductor's Triton code divides with ``div.full.f32`` unless told otherwise — at most 2 ulp
off, and flushing float32 subnormals to zero. Off by an ulp, a bf16 value that sits exactly on a rounding tie of
the E2M1/E4M3 grid (common: bf16 has 8 significant bits) rounds either way, and a group whose scale is a
subnormal divides by zero (its zeros became NaN: two MXFP8 runs of the recipe table stopped on non-finite
gradients). So the backend turns on Inductor's IEEE division (``div_rn``, as eager) and, where the installed
PyTorch has the switch, libdevice without flush-to-zero (:func:`inductor_numerics`); powers of two are built from
bits (:func:`quartet.quant.formats.exact_pow2`), not ``exp2``. What can still flush (a subnormal input or scale in a
PyTorch without the FTZ switch) is held to the oracle's rule that a finite tensor never quantizes to NaN/Inf
(:func:`finite_if_input_finite`): such values come back 0.

Recompiles: Dynamo specialises on the quantizer spec (a frozen dataclass) and, after the first shape change, on
symbolic shapes; a Llama's linears give a few dozen variants, so the recompile limit is raised (below) instead
of letting later variants fall back to eager silently. Inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``)
makes every run after the first on a machine mostly cache hits.
"""
from __future__ import annotations

import functools

import torch

from quartet.quant.backend import ReferenceBackend
from quartet.quant.hadamard import block_hadamard
from quartet.quant.quantizers import QTensor, QuantizerSpec, quantizer_stats, reference_quantize

__all__ = ["CompiledReferenceBackend", "compiled_quantize", "finite_if_input_finite", "inductor_numerics"]

#: Dynamo's per-code-object variant limit while quantizers compile (its default, 8, is below a model's count of
#: spec × shape variants; past the limit a call silently runs eagerly).
RECOMPILE_LIMIT = 256


def finite_if_input_finite(values: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``values`` with NaN/±Inf replaced by 0 when every element of ``x`` is finite, else ``values`` unchanged.

    The oracle never quantizes a finite tensor to a non-finite value (a unit holding NaN/Inf comes back NaN, nothing
    else does), so a non-finite value from a finite tensor can only be a flushed subnormal (module docstring). No
    host sync: the test is a 0-d tensor inside the compiled graph."""
    all_finite = torch.isfinite(x).all()
    return torch.where(torch.isfinite(values) | ~all_finite, values, torch.zeros_like(values))


def _rotate_quantize(x: torch.Tensor, spec: QuantizerSpec, block: int | None, signs: torch.Tensor | None,
                     seed: int | None) -> QTensor:
    """The oracle's rotate-then-quantize (:meth:`ReferenceBackend.quantize` without statistics)."""
    xr = block_hadamard(x, block, signs) if block else x.float()
    q = reference_quantize(xr, spec, seed)
    q.values = finite_if_input_finite(q.values, xr)
    return q


def inductor_numerics() -> dict[str, bool]:
    """Turn on Inductor's eager-equal float32 division (``div_rn``) and, where this PyTorch has it, libdevice
    without flush-to-zero; returns what was set (the option names moved between PyTorch releases). Process-wide
    (Inductor has no per-function switch): set when the first quantizer compiles, so a run whose recipe never
    takes this backend keeps Inductor's defaults."""
    import torch._inductor.config as inductor_config

    done = {}
    numerics = getattr(inductor_config, "eager_numerics", None)
    for obj, key in ((numerics, "division_rounding"), (inductor_config, "emulate_divison_rounding"),
                     (numerics, "disable_ftz")):
        if obj is not None and hasattr(obj, key):
            setattr(obj, key, True)
            done[key] = True
    return done


@functools.cache
def _compiled():
    import torch._dynamo.config as dynamo_config

    for key in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, key):
            setattr(dynamo_config, key, max(getattr(dynamo_config, key), RECOMPILE_LIMIT))
    inductor_numerics()
    return torch.compile(_rotate_quantize, fullgraph=False)


def compiled_quantize(x: torch.Tensor, spec: QuantizerSpec, *, block: int | None = None,
                      signs: torch.Tensor | None = None, seed: int | None = None) -> QTensor:
    """:func:`reference_quantize` of ``x`` (rotated by ``block_hadamard`` when ``block``) under ``torch.compile``."""
    return _compiled()(x, spec, block, signs, seed)


class CompiledReferenceBackend(ReferenceBackend):
    """The oracle's quantizers compiled by Inductor; GEMMs as the oracle (float32 inputs; TF32 where the trainer
    allows it on the GPU). Chosen by ``auto`` on CUDA for quantizers no hand-written kernel runs."""

    name = "compiled"

    def supports_device(self, device) -> bool:
        return torch.device(device).type == "cuda"

    def quantize(self, x, spec, *, block=None, signs=None, seed=None, stats=False):
        q = compiled_quantize(x, spec, block=block, signs=signs, seed=seed)
        if stats:
            xr = block_hadamard(x, block, signs) if block else x.float()
            q.stats = quantizer_stats(xr, q)
        return q

    def describe(self, device):
        return f"{self.name}: the reference quantizers fused by torch.compile (Inductor), float32/TF32 GEMMs, on {device}"
