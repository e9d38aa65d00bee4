"""The backend registry: kernels plug in from above (``quartet.plugins.load_kernels``); quant never loads them.

The import rule itself (no arrow from ``quartet.quant`` to the kernels, no circle) is tests/test_layering.py."""
from __future__ import annotations

import pytest

from quartet.errors import ConfigError
from quartet.quant import backend as B


def test_a_named_backend_that_could_not_load_says_why(monkeypatch):
    """A plugin that failed to import is named, with its reason, in the one-line error for a backend it would have
    registered; ``auto`` still runs on what is registered."""
    monkeypatch.setattr(B, "_PLUGIN_ERRORS", {"somekernels": "ImportError: no module named 'triton'"})
    monkeypatch.setattr(B, "_REGISTRY", {"reference": B._REGISTRY["reference"]})
    with pytest.raises(ConfigError) as err:
        B.get_backend("triton", "cpu")
    msg = str(err.value)
    assert "\n" not in msg and "precision.backend='triton' is not available here" in msg
    assert "somekernels failed to import: ImportError: no module named 'triton'" in msg
    assert B.get_backend("auto", "cpu").name == "reference"


def test_load_kernels_registers_the_fast_backends():
    """What the trainer calls once it has picked a device: afterwards ``auto`` chooses among the kernel backends."""
    from quartet.plugins import load_kernels

    assert load_kernels() is True
    assert {"triton", "hopper_fp8", "blackwell_mxfp4", "reference"} <= set(B.available_backends())
    assert B.available_backends()[0] == "blackwell_mxfp4" and B.available_backends()[-1] == "reference"


def test_load_kernels_records_an_import_failure(monkeypatch):
    import builtins

    from quartet.plugins import load_kernels

    real_import = builtins.__import__

    def no_kernels(name, *args, **kw):
        if name == "quartet.kernels":
            raise ImportError("simulated: no kernels here")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(B, "_PLUGIN_ERRORS", {})
    monkeypatch.setattr(builtins, "__import__", no_kernels)
    assert load_kernels() is False
    assert B._PLUGIN_ERRORS == {"quartet.kernels": "ImportError: simulated: no kernels here"}
