"""Fast GPU backends behind the :mod:`quartet.quant` backend seam.

- :mod:`quartet.kernels.triton_quant` — fused Hadamard + MXFP4 quantizers (Triton).
- :mod:`quartet.kernels.gemm` — Hopper FP8 (FP4 values folded into FP8), Blackwell MXFP4 and BF16 GEMMs.
- :mod:`quartet.kernels.linear` — the fused Quartet linear layer that chains them.
- :mod:`quartet.kernels.bench` — ``quartet bench``; :mod:`quartet.kernels.timing` — its timing rule.

Importing this package needs only torch (triton is imported lazily where present).
"""

try:
    from quartet.kernels.backends import register as _register

    _register()
except Exception:  # pragma: no cover - a broken optional dependency must not break `import quartet`
    import traceback as _tb

    _REGISTER_ERROR = _tb.format_exc()
