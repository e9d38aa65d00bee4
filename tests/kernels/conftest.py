"""Kernel tests run Triton kernels on the CPU through Triton's interpreter when no GPU is present.

The interpreter is chosen when triton's ``jit`` decorator runs, so the variable is set here, before
any test module imports :mod:`quartet.kernels`.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


class FastLayerChecks:
    """Checks shared by the FP8 tensor-core layers (``fp8`` and ``fp8_deepseek``): each against the reference
    :class:`~quartet.quant.linear.QuantLinear` of its scheme. Tests get it through the ``layer_checks`` fixture."""

    dev = "cuda" if torch.cuda.is_available() else "cpu"

    def oracle_and_fast(self, scheme, layer_cls, T: int, K: int, N: int, seed: int):
        """(y, dX, dW) of the reference layer on the CPU and of ``layer_cls`` on ``dev`` for the same inputs."""
        from quartet.quant.backend import ReferenceBackend
        from quartet.quant.linear import QuantLinear

        g = torch.Generator().manual_seed(seed)
        x = torch.randn(T, K, generator=g)
        w = torch.randn(N, K, generator=g) * 0.05
        e = torch.randn(T, N, generator=g) * 1e-3
        ref_layer = QuantLinear(torch.nn.Parameter(w.clone()), scheme, ReferenceBackend())
        xr = x.clone().requires_grad_(True)
        yr = ref_layer(xr)
        yr.backward(e)
        fast = layer_cls(torch.nn.Parameter(w.clone().to(self.dev)), scheme, ReferenceBackend())
        xf = x.clone().to(self.dev).requires_grad_(True)
        yf = fast(xf)
        yf.backward(e.to(self.dev))
        return (yr, xr.grad, ref_layer.weight.grad), (yf.cpu(), xf.grad.cpu(), fast.weight.grad.cpu())

    def assert_matches_oracle(self, scheme, layer_cls, T: int, K: int, N: int, seed: int, tol: float):
        """The three GEMM outputs within ``tol`` (relative norm) of the oracle's: the same quantized operands on both
        sides, only the GEMMs' accumulation differs."""
        for name, a, b in zip(("y", "dx", "dw"), *self.oracle_and_fast(scheme, layer_cls, T, K, N, seed)):
            assert a.shape == b.shape, name
            rel = float((a - b).detach().norm() / a.detach().norm())
            assert rel < tol, (name, rel)

    def assert_stats_steps_take_the_seam_path(self, scheme, layer_cls, N: int, K: int, T: int, tol: float):
        """On a statistics step the layer records x/w stats through the seam path; otherwise none, same output."""
        from quartet.kernels.backends import make_backend

        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(N, K).to(self.dev) * 0.05)
        layer = layer_cls(w, scheme, make_backend("hopper_fp8"), stats_every=2)
        x = torch.randn(T, K).to(self.dev)
        layer.set_step(2)
        y_stats = layer(x)
        stats = layer.pop_stats()
        assert set(stats) == {"x", "w"} and stats["x"]["rel_err"] > 0
        layer.set_step(3)
        y_fast = layer(x)
        assert layer.pop_stats() == {}
        assert float((y_stats - y_fast).detach().norm() / y_stats.detach().norm()) < tol

    def assert_model_trains_on_hopper(self, precision: str, implementation: str):
        """``apply_precision`` on a 2-block Llama on the GPU installs ``implementation``; one step has finite loss."""
        import pytest

        from quartet.kernels.gemm import hopper_available
        from quartet.model import Llama
        from quartet.quant import apply_precision
        from quartet.quant.config import PrecisionConfig

        if not hopper_available():
            pytest.skip("needs an FP8 GPU")
        torch.manual_seed(0)
        model = Llama(2, 128, 2, 512, 64, device="cuda")
        plan = apply_precision(model, PrecisionConfig(name=precision, forward=precision, backward=precision), seed=0)
        assert plan.backend == "hopper_fp8" and plan.implementation == implementation
        idx = torch.randint(0, 512, (4, 64), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, idx)
        loss.backward()
        assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())


@pytest.fixture
def layer_checks() -> FastLayerChecks:
    return FastLayerChecks()


def _edge_tensors(shape: tuple[int, int], seed: int = 0) -> dict[str, torch.Tensor]:
    """Named inputs for the non-finite rule (issue #30, docs/precision.md "Non-finite inputs"): one NaN, +Inf or -Inf
    at element (3, 5) of a random matrix, all zeros, float32 subnormals whose amax/c underflows to 0 (a few times
    2^-149), subnormals with ~16 bits (1e-40) and huge finite values (up to 2.5e38)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    out = {}
    for name, v in (("nan", float("nan")), ("inf", float("inf")), ("-inf", -float("inf"))):
        out[name] = x.clone()
        out[name][3, 5] = v
    out["zeros"] = torch.zeros(shape)
    out["3 ulps"] = torch.randint(-3, 4, shape, generator=g).float() * 2.0 ** -149
    out["1e-40"] = x * 1e-40
    out["huge"] = x / x.abs().amax() * 2.5e38
    return out


@pytest.fixture
def resolve_backends_to(monkeypatch):
    """``resolve_backends_to(name)``: make ``quartet.quant.apply_precision`` resolve every backend request but
    ``reference`` to the kernel backend ``name`` (bypasses its CUDA-only device check, so it runs in the CPU
    interpreter); returns that backend."""
    import quartet.quant as Q
    from quartet.kernels.backends import make_backend

    def resolve(name: str):
        be, real = make_backend(name), Q.get_backend
        monkeypatch.setattr(Q, "get_backend",
                            lambda n, device, specs, **kw: real(n, device, specs, **kw) if n == "reference" else be)
        return be

    return resolve


@pytest.fixture
def edge_tensors():
    """:func:`_edge_tensors` (shape, seed) -> dict of named edge-case matrices."""
    return _edge_tensors
