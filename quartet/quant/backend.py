"""The backend seam: who quantizes GEMM operands and runs the GEMMs.

The quantized linear (:mod:`quartet.quant.linear`) never calls a quantizer or ``matmul`` itself;
it asks its :class:`Backend` for three things:

* ``quantize(x, spec, block=None, signs=None, seed=None, stats=False) -> QTensor`` — optionally
  rotate ``x`` block-wise along its last dim (``block_hadamard(x, block, signs)``), then quantize
  it with ``spec`` along the last dim. Fast backends fuse the two steps.
* ``gemm(a, b) -> Tensor`` — ``a.values @ b.values.T`` (plus ``a.residual @ b.values.T`` when the
  quantizer kept a high-precision residual), float32, (M, K) × (N, K) → (M, N).
* ``transform(x, block, signs, inverse)`` and ``matmul(a, b)`` for the high-precision parts
  (the inverse rotation of gradients; GEMMs a scheme leaves unquantized).

:class:`ReferenceBackend` is the pure-PyTorch oracle and runs everything on any device.
Faster backends (``triton``, ``hopper_fp8``, ``blackwell_mxfp4``, and ``compiled``: the oracle's quantizers fused
by ``torch.compile``, for schemes no hand-written kernel covers) live in the kernel package, above this
one: importing it registers them here with :func:`register_backend`. This package never imports or loads
it; the code that picks a device (the trainer, the benchmarks) loads it first
(:func:`quartet.plugins.load_kernels`), and a plugin that failed to load says why through
:func:`note_plugin_failure`. :func:`get_backend` resolves ``auto`` to the highest-priority registered
backend that supports the device and every quantizer of the scheme. A backend that was asked for
by name and cannot run raises :class:`quartet.errors.ConfigError`: there is no silent fallback.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from quartet.errors import ConfigError
from quartet.quant.hadamard import block_hadamard
from quartet.quant.quantizers import QTensor, QuantizerSpec, quantizer_stats, reference_quantize

__all__ = [
    "Backend",
    "ReferenceBackend",
    "register_backend",
    "get_backend",
    "available_backends",
    "note_plugin_failure",
    "BACKEND_NAMES",
]

#: Names a config may use (``auto`` resolves to one of the registered ones).
BACKEND_NAMES = ("auto", "reference", "compiled", "fused", "triton", "hopper_fp8", "blackwell_mxfp4")


class Backend:
    """Interface of a GEMM-operand quantization + GEMM implementation. Subclass and register."""

    #: registry name
    name: str = "base"

    def supports_device(self, device: torch.device) -> bool:
        """True when this backend can run on ``device`` at all."""
        raise NotImplementedError

    def unsupported_reason(self, spec: QuantizerSpec, device: torch.device) -> str | None:
        """None when ``spec`` can run on ``device``; otherwise a one-line reason."""
        return None if self.supports_device(device) else f"backend {self.name!r} does not run on {device}"

    def quantize(self, x: torch.Tensor, spec: QuantizerSpec, *, block: int | None = None,
                 signs: torch.Tensor | None = None, seed: int | None = None, stats: bool = False) -> QTensor:
        """Rotate (if ``block``) then quantize ``x`` along its last dim. See the module docstring."""
        raise NotImplementedError

    def gemm(self, a: QTensor, b: QTensor) -> torch.Tensor:
        """(M, K) × (N, K) → (M, N) float32 product of two quantized operands."""
        raise NotImplementedError

    def transform(self, x: torch.Tensor, block: int, signs: torch.Tensor | None = None, inverse: bool = False) -> torch.Tensor:
        """Block Hadamard of ``x`` (float32); ``inverse`` undoes the forward rotation."""
        return block_hadamard(x, block, signs, inverse)

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """High-precision ``a @ b.T`` in float32 for GEMMs a scheme leaves unquantized."""
        return a.float() @ b.float().t()

    def describe(self, device: torch.device) -> str:
        """One line for the run log: which implementation runs the GEMMs."""
        return f"{self.name} on {device}"

    def fused_layer(self, scheme) -> tuple[Callable, str] | None:
        """``(factory, implementation name)`` when this backend runs ``scheme``'s block linears as one fused
        layer instead of operand by operand, else None (the default: the seam path, :class:`QuantLinear`).

        ``factory(weight, scheme, backend, **QuantLinear keywords)`` returns the layer, or None where a layer's
        shape is not covered. Offered through the backend so that ``quartet.quant`` never names the kernels."""
        return None

    def bind_device_draws(self, model: torch.nn.Module, device) -> bool:
        """Switch ``model``'s fused layers to their traceable (compilable, CUDA-graph safe) form; True when there
        were any. The seam path has none."""
        return False


class ReferenceBackend(Backend):
    """Pure PyTorch fake quantization (quantize → dequantize → float32 matmul). Runs anywhere."""

    name = "reference"

    def supports_device(self, device: torch.device) -> bool:
        return True

    def quantize(self, x, spec, *, block=None, signs=None, seed=None, stats=False):
        xr = block_hadamard(x, block, signs) if block else x.float()
        q = reference_quantize(xr, spec, seed)
        if stats:
            q.stats = quantizer_stats(xr, q)
        return q

    def gemm(self, a, b):
        out = a.values @ b.values.t()
        if a.residual is not None:
            # OCC compensation: the sparse high-precision residual times the quantized weight.
            out = out + a.residual @ b.values.t()
        if b.residual is not None:
            out = out + a.values @ b.residual.t()
        return out

    def describe(self, device):
        return f"reference (pure PyTorch fake-quant, float32 matmul) on {device}"


# name -> (factory(device) -> Backend, priority)
_REGISTRY: dict[str, tuple[Callable[[torch.device], Backend], int]] = {}
# plugin (package name) -> why it could not register its backends
_PLUGIN_ERRORS: dict[str, str] = {}


def register_backend(name: str, factory: Callable[[torch.device], Backend], priority: int = 0) -> None:
    """Register ``factory(device) -> Backend`` under ``name``; ``auto`` prefers higher ``priority``."""
    _REGISTRY[name] = (factory, priority)


register_backend("reference", lambda device: ReferenceBackend(), priority=-1000)


def note_plugin_failure(plugin: str, reason: str) -> None:
    """Record that ``plugin`` (a package that registers backends) could not load, and why: a backend asked for by
    name that is then missing names the reason in its error."""
    _PLUGIN_ERRORS[plugin] = reason


def available_backends() -> list[str]:
    """Registered backend names, highest priority first."""
    return sorted(_REGISTRY, key=lambda n: -_REGISTRY[n][1])


def _check(backend: Backend, device: torch.device, specs: Iterable[QuantizerSpec]) -> str | None:
    if not backend.supports_device(device):
        return f"backend {backend.name!r} does not run on {device}"
    for spec in specs:
        reason = backend.unsupported_reason(spec, device)
        if reason:
            return reason
    return None


def get_backend(name: str = "auto", device: torch.device | str = "cpu", specs: Iterable[QuantizerSpec] = (),
                scheme=None) -> Backend:
    """Resolve a backend by name for ``device`` and the quantizers ``specs`` it must run.

    ``auto``: the highest-priority registered backend whose device and quantizer checks pass (``reference`` always
    passes) — given the ``scheme`` (a :class:`~quartet.quant.schemes.Scheme`), the highest-priority one of those with
    a fused layer for it (:meth:`Backend.fused_layer`), where any has one: a fused layer outruns the operand-by-operand
    path of a backend above it. A named backend that is unknown or cannot run raises :class:`ConfigError` with the
    reason.
    """
    device = torch.device(device)
    specs = list(specs)
    if name == "auto":
        runs = []
        for cand in available_backends():
            try:
                backend = _REGISTRY[cand][0](device)
            except Exception:  # a kernel backend that cannot even be built here is not a candidate
                continue
            if _check(backend, device, specs) is None:
                if scheme is None or backend.fused_layer(scheme) is not None:
                    return backend
                runs.append(backend)
        if runs:
            return runs[0]
        raise ConfigError("precision.backend=auto: no registered backend can run this scheme")  # pragma: no cover
    if name not in _REGISTRY:
        extra = "".join(f" ({plugin} failed to import: {why})" for plugin, why in _PLUGIN_ERRORS.items())
        raise ConfigError(f"precision.backend={name!r} is not available here; registered: "
                          f"{', '.join(available_backends())}{extra}")
    try:
        backend = _REGISTRY[name][0](device)
    except Exception as exc:
        raise ConfigError(f"precision.backend={name!r} cannot start on {device}: {exc}") from exc
    reason = _check(backend, device, specs)
    if reason:
        raise ConfigError(f"precision.backend={name!r} cannot run this scheme on {device}: {reason}")
    return backend
