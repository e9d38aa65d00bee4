"""Fast GPU backends behind the :mod:`quartet.quant` backend seam.

- :mod:`quartet.kernels.triton_quant` — fused Hadamard + MXFP4 quantizers (Triton).
- :mod:`quartet.kernels.gemm` — Hopper FP8 (FP4 values folded into FP8), Blackwell MXFP4 and BF16 GEMMs.
- :mod:`quartet.kernels.linear` — the fused Quartet linear layer that chains them.
- :mod:`quartet.kernels.timing` — the benchmarks' timing rule (the benchmark CLI is ``benchmarks/bench.py``).

Importing this package registers its backends (and, through them, the fused layers) into the registry of
:mod:`quartet.quant.backend`; the code that picks a device imports it (:func:`quartet.plugins.load_kernels`).
Arrows point one way: this package imports ``quartet.quant``, never the reverse. Importing it needs only torch
(triton is imported lazily where present).
"""

try:
    from quartet.kernels.backends import register as _register

    _register()
except Exception as _exc:  # pragma: no cover - a broken optional dependency must not break `import quartet`
    import traceback as _tb

    _REGISTER_ERROR = _tb.format_exc()
    # a backend asked for by name then says why it is missing
    from quartet.quant.backend import note_plugin_failure as _note

    _note(__name__, f"{type(_exc).__name__}: {_exc}")
