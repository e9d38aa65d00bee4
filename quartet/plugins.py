"""Loading the fast backends: the step between picking a device and building a model's quantized layers.

:mod:`quartet.quant` keeps the registry of backends and never names the kernel package, which sits above it
(its fused layers are quant layers). Importing :mod:`quartet.kernels` registers its backends and fused layers
there. The code that picks a device — the trainer's setup (:class:`quartet.train.Trainer`) and the benchmark
scripts — calls :func:`load_kernels` before it asks
:func:`quartet.quant.apply_precision` for a backend, so ``precision.backend=auto`` sees every backend this machine
has, and a backend asked for by name that could not load says why.
"""
from __future__ import annotations

__all__ = ["load_kernels"]


def load_kernels() -> bool:
    """Import the kernel package once so it registers its backends; False (and the reason recorded in the
    registry, for the error a named backend then raises) when it cannot be imported on this machine."""
    try:
        import quartet.kernels  # noqa: F401  (registers its backends on import)
    except ImportError as exc:  # no kernels package / a broken optional dependency on this machine
        from quartet.quant.backend import note_plugin_failure

        note_plugin_failure("quartet.kernels", f"{type(exc).__name__}: {exc}")
        return False
    return True
