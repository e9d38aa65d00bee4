"""The fused recipe layer (quartet.kernels.recipe_linear) against the reference QuantLinear of each recipe.

Deterministic recipes (mxfp8, fp8, ms_fp4's RTN backward) match the oracle's output and both gradients up to
summation order (and ms_fp4's documented BF16 rounding of its saved operands); stochastic ones (nvfp4's and the
NVFP4 recipe's SR gradients, quartet2's MS-EDEN, LUQ) match the forward exactly as well and draw gradients whose
error against the unquantized gradient is the oracle's in size, and whose mean over draws is the oracle's mean.
On a CPU box the kernels run in Triton's interpreter.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import quartet.quant as Q  # noqa: E402
from quartet.kernels import recipe_linear as RL  # noqa: E402
from quartet.kernels.backends import make_backend  # noqa: E402
from quartet.model import Llama  # noqa: E402
from quartet.quant.backend import ReferenceBackend  # noqa: E402
from quartet.quant.config import PrecisionConfig  # noqa: E402
from quartet.quant.linear import QuantLinear  # noqa: E402
from quartet.quant.schemes import RECIPES, build_scheme  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
#: the recipes the fused layer runs
FUSED = ("mxfp8", "nvfp4", "nvfp4_recipe", "quartet2", "ms_fp4", "luq_int4", "fp8")
DETERMINISTIC = ("mxfp8", "fp8", "ms_fp4")
T, K, N = (128, 256, 128) if DEV == "cpu" else (1024, 1024, 512)


def _scheme(name):
    return build_scheme(PrecisionConfig(name=name))


def _rel(a, b):
    return float((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm())


def test_plan_covers_exactly_the_recipes_without_an_fp8_or_mx_layer():
    covered = {name for name in RECIPES if RL.covers(_scheme(name))}
    assert covered == set(FUSED)  # bf16 converts nothing; fp8_deepseek needs FP8 GEMMs; quartet* rotate the forward
    for name in ("quest_fwd", "sr_bwd", "rtn_fwd", "fp8_deepseek", "quartet"):
        assert not RL.covers(_scheme(name)), name


def test_no_fused_layer_claims_a_half_recipe_variant():
    """A forward-only or backward-only variant leaves one half of the GEMMs unquantized, which no fused layer runs:
    the recipe layer, the FP8 tensor-core layers and the fused Quartet layer all decline it, so ``auto`` converts it
    operand by operand on the backend whose quantizers it picks (``compiled`` where no kernel runs them)."""
    from quartet.kernels.linear import fused_covers
    from quartet.quant.schemes import HALF_VARIANTS

    for name in HALF_VARIANTS:
        s = _scheme(name)
        assert not RL.covers(s), name
        assert not any(fused_covers(s, b) for b in ("hopper_fp8", "triton", "blackwell_mxfp4")), name


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g) * torch.exp(torch.randn(T, 1, generator=g))
    w = torch.randn(N, K, generator=g) * 0.05
    e = torch.randn(T, N, generator=g) * 1e-3
    return x, w, e


def _run(layer, x, e, step=0):
    layer.set_step(step)
    xi = x.clone().requires_grad_(True)
    y = layer(xi)
    y.backward(e)
    return y.detach().cpu(), xi.grad.cpu(), layer.weight.grad.cpu()


def _pair(name, x, w, e, step=0, seed=0):
    scheme = _scheme(name)
    ref = QuantLinear(torch.nn.Parameter(w.clone()), scheme, ReferenceBackend(), seed=seed, layer_index=1)
    fast = RL.recipe_quant_linear(torch.nn.Parameter(w.clone().to(DEV)), scheme, make_backend("fused"), seed=seed,
                                  layer_index=1)
    assert isinstance(fast, RL.RecipeQuantLinear)
    return _run(ref, x, e, step), _run(fast, x.to(DEV), e.to(DEV), step)


def _exact(x, w, e):
    """The unquantized layer's output and gradients (float64)."""
    return (x.double() @ w.double().t(), e.double() @ w.double(), e.double().t() @ x.double())


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_deterministic_recipes_match_the_oracle(name):
    x, w, e = _inputs(1)
    (yr, gxr, gwr), (yf, gxf, gwf) = _pair(name, x, w, e)
    tol = 5e-3 if name == "ms_fp4" else 2e-5  # ms_fp4: X̂ and Ŵ rounded once to BF16 (module docstring)
    assert _rel(yf, yr) < tol and _rel(gxf, gxr) < tol and _rel(gwf, gwr) < tol, (
        _rel(yf, yr), _rel(gxf, gxr), _rel(gwf, gwr))


@pytest.mark.parametrize("name", [n for n in FUSED if n not in DETERMINISTIC])
def test_stochastic_recipes_forward_exact_gradients_as_noisy_as_the_oracle(name):
    x, w, e = _inputs(2)
    (yr, gxr, gwr), (yf, gxf, gwf) = _pair(name, x, w, e)
    assert _rel(yf, yr) < (5e-3 if name == "luq_int4" else 2e-5)
    _, gx0, gw0 = _exact(x, w, e)
    for fast, ref, exact in ((gxf, gxr, gx0), (gwf, gwr, gw0)):
        ef, er = _rel(fast, exact), _rel(ref, exact)
        assert 0.5 < ef / er < 2.0, (name, ef, er)


def test_draws_are_reproducible_per_step_and_differ_across_steps():
    x, w, e = _inputs(3)
    layer = RL.recipe_quant_linear(torch.nn.Parameter(w.to(DEV)), _scheme("nvfp4"), make_backend("fused"), seed=5)
    a = _run(layer, x.to(DEV), e.to(DEV), step=3)
    layer.weight.grad = None
    b = _run(layer, x.to(DEV), e.to(DEV), step=3)
    layer.weight.grad = None
    c = _run(layer, x.to(DEV), e.to(DEV), step=4)
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    assert not torch.equal(a[2], c[2])


def test_statistics_steps_take_the_seam_path():
    x, w, _ = _inputs(4)
    layer = RL.recipe_quant_linear(torch.nn.Parameter(w.to(DEV)), _scheme("mxfp8"), ReferenceBackend(),
                                   stats_every=2)
    layer.set_step(2)
    y_stats = layer(x.to(DEV))
    stats = layer.pop_stats()
    assert set(stats) == {"x", "w"} and stats["x"]["rel_err"] > 0
    layer.set_step(3)
    y_fast = layer(x.to(DEV))
    assert layer.pop_stats() == {}
    assert _rel(y_fast.detach(), y_stats.detach()) < 2e-5


def _model(seed=0):
    torch.manual_seed(seed)
    return Llama(1, 128, 2, 256, 32, ffn_multiple_of=128).to(DEV)


@pytest.fixture
def fused_backend(resolve_backends_to):
    """Resolve every backend request to the kernel ``fused`` backend (bypasses the CUDA-only device check)."""
    return resolve_backends_to("fused")


def _loss_and_grads(model, tokens, params=None):
    """Loss and gradients of one forward/backward (``params``: the module whose parameters to read, when ``model``
    wraps it)."""
    params = params or model
    params.zero_grad(set_to_none=True)
    loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    return loss.detach().cpu(), {n: p.grad.detach().cpu().clone() for n, p in params.named_parameters()}


@pytest.mark.parametrize("name", ["mxfp8", "quartet2"])
def test_model_installs_the_fused_layer_and_trains_like_the_reference(name, fused_backend):
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (2, 33)).to(DEV)
    ref = _model()
    Q.apply_precision(ref, PrecisionConfig(name=name, backend="reference"), seed=3, device=DEV)
    fast = _model()
    plan = Q.apply_precision(fast, PrecisionConfig(name=name), seed=3, device=DEV)
    assert plan.backend == "fused" and plan.implementation == RL.IMPL_RECIPE
    assert all(isinstance(m, RL.RecipeQuantLinear) for m in fast.block_linears().values())
    Q.set_step(ref, 1)
    Q.set_step(fast, 1)
    lr, gr = _loss_and_grads(ref, tokens)
    lf, gf = _loss_and_grads(fast, tokens)
    assert abs(float(lf - lr)) < 1e-4 * float(lr)
    for n in gr:
        limit = 1e-4 if name == "mxfp8" else 0.5  # MS-EDEN: the oracle's and the kernel's draws differ
        assert _rel(gf[n], gr[n]) < limit, (n, _rel(gf[n], gr[n]))


def test_device_draws_equal_host_draws(fused_backend):
    """The arena a compiled model reads its draws from holds the numbers the eager layer makes per call: the same
    loss and gradients, uncompiled, for a stochastic recipe."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (2, 33)).to(DEV)
    host, arena = _model(), _model()
    Q.apply_precision(host, PrecisionConfig(name="nvfp4"), seed=7, device=DEV)
    Q.apply_precision(arena, PrecisionConfig(name="nvfp4"), seed=7, device=DEV, traceable=True)
    for step in (1, 2):
        Q.set_step(host, step)
        Q.set_step(arena, step)
        Q.begin_micro_batch(arena, 0)
        lh, gh = _loss_and_grads(host, tokens)
        la, ga = _loss_and_grads(arena, tokens)
        assert float(lh) == float(la)
        for n in gh:
            assert torch.equal(ga[n], gh[n]), (step, n)


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4"])
def test_compiled_model_with_device_draws_matches_eager(name, fused_backend):
    """run.compile's path: registered operators traced by torch.compile, draws from the device arena — the same
    loss and gradients as the eager layer with host draws, step for step."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (2, 33)).to(DEV)
    eager = _model()
    Q.apply_precision(eager, PrecisionConfig(name=name), seed=7, device=DEV)
    traced = _model()
    plan = Q.apply_precision(traced, PrecisionConfig(name=name), seed=7, device=DEV, traceable=True)
    assert plan.traceable
    compiled = torch.compile(traced, fullgraph=True, backend="aot_eager" if DEV == "cpu" else "inductor")
    for step in (1, 2):
        Q.set_step(eager, step)
        Q.set_step(traced, step)
        Q.begin_micro_batch(traced, 0)
        le, ge = _loss_and_grads(eager, tokens)
        lc, gc = _loss_and_grads(compiled, tokens, traced)
        assert abs(float(le - lc)) < 1e-5 * float(le)
        worst = max(ge, key=lambda n: _rel(gc[n], ge[n]))
        assert _rel(gc[worst], ge[worst]) < 1e-4, (step, worst, _rel(gc[worst], ge[worst]))
