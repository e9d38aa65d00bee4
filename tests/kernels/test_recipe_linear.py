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


def _ops(plan):
    return (plan.fwd_a, plan.fwd_b, plan.dx_a, plan.dx_b, plan.dw_a, plan.dw_b)


def test_recipe_plans_reuse_the_forward_operand_only_where_their_scheme_leaves_it_to_the_backward():
    """A recipe's plan quantizes every operand its scheme quantizes and leaves nothing unquantized: its only plain
    operands are MS-FP4's and LUQ's backward W / X, the forward's Ŵ / X̂ reused; the backward reads X̂, Ŵ exactly
    where the scheme's source is ``quantized``."""
    for name in FUSED:
        s, plan = _scheme(name), RL.plan_for(_scheme(name))
        specs = (s.fwd.a, s.fwd.b, s.dx.a, s.dx.b, s.dw.a, s.dw.b)
        for spec, op in zip(specs, _ops(plan)):
            assert op is RL.Plain.REUSED if spec is None else (isinstance(op, RL.OperandPlan) and op.spec == spec), (
                name, spec, op)
        assert RL.Plain.UNQUANTIZED not in _ops(plan), name
        assert plan.keep_x == plan.keep_w == (s.bwd_source == "quantized"), name


@pytest.mark.parametrize("recipe", FUSED)
def test_half_variant_plans_keep_one_half_of_their_recipes_plan(recipe):
    """``<recipe>_fwd``: the recipe's forward operands; E unquantized, and the backward multiplies the forward's X̂, Ŵ
    (reused) where the recipe's backward reads them, else X, W unquantized. ``<recipe>_bwd``: X, W unquantized in the
    forward; the recipe's backward operands and rotations, any operand it reuses now the unquantized X / W."""
    whole = RL.plan_for(_scheme(recipe))
    fwd, bwd = RL.plan_for(_scheme(f"{recipe}_fwd")), RL.plan_for(_scheme(f"{recipe}_bwd"))
    U, R = RL.Plain.UNQUANTIZED, RL.Plain.REUSED
    back = R if whole.bwd_source == "quantized" else U
    assert _ops(fwd) == (whole.fwd_a, whole.fwd_b, U, back, U, back)
    assert (fwd.dx_hb, fwd.dw_hb, fwd.bwd_source) == (0, 0, whole.bwd_source)
    assert _ops(bwd) == (U, U, whole.dx_a, U if whole.dx_b is R else whole.dx_b,
                         whole.dw_a, U if whole.dw_b is R else whole.dw_b)
    assert (bwd.dx_hb, bwd.dw_hb, bwd.dx_signs, bwd.dw_signs) == (whole.dx_hb, whole.dw_hb, whole.dx_signs,
                                                                  whole.dw_signs)
    assert not (bwd.keep_x or bwd.keep_w)  # an unquantized forward leaves nothing quantized to reuse
    assert len({whole.key, fwd.key, bwd.key}) == 3


def test_the_recipe_layer_leaves_rotated_and_tile_scaled_fp8_variants_to_their_own_layers():
    """Quartet's halves rotate the forward (or run MXFP4 backward quantizers this layer has no kernel for) and
    fp8_deepseek's halves need FP8 tile GEMMs (:mod:`quartet.kernels.fp8_block_linear` runs them)."""
    from quartet.quant.schemes import HALF_VARIANTS

    for name, (recipe, _half) in HALF_VARIANTS.items():
        assert RL.covers(_scheme(name)) == (recipe in FUSED), name


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


#: the half variants of the recipes this layer runs, by what their GEMMs draw
HALVES = tuple(f"{r}{h}" for r in FUSED for h in ("_fwd", "_bwd"))
STOCHASTIC_HALVES = ("nvfp4_bwd", "nvfp4_recipe_bwd", "quartet2_bwd", "luq_int4_bwd")


def _bf16_valued(*ts):
    return tuple(t.bfloat16().float() for t in ts)


@pytest.mark.parametrize("name", [n for n in HALVES if n not in STOCHASTIC_HALVES])
def test_deterministic_half_variants_match_the_oracle(name):
    """On inputs that are BF16 numbers (what the layer rounds its unquantized operands to is then exact) the layer is
    the oracle's up to summation order -- but for luq_int4's and ms_fp4's reused X̂, Ŵ, rounded once to BF16 as in
    their recipe's layer."""
    x, w, e = _bf16_valued(*_inputs(6))
    (yr, gxr, gwr), (yf, gxf, gwf) = _pair(name, x, w, e)
    tol = 5e-3 if name in ("ms_fp4_fwd", "luq_int4_fwd") else 2e-5
    assert _rel(yf, yr) < tol and _rel(gxf, gxr) < tol and _rel(gwf, gwr) < tol, (
        _rel(yf, yr), _rel(gxf, gxr), _rel(gwf, gwr))


@pytest.mark.parametrize("name", STOCHASTIC_HALVES)
def test_stochastic_half_variants_forward_exact_gradients_as_noisy_as_the_oracle(name):
    x, w, e = _bf16_valued(*_inputs(7))
    (yr, gxr, gwr), (yf, gxf, gwf) = _pair(name, x, w, e)
    assert _rel(yf, yr) < 2e-5
    _, gx0, gw0 = _exact(x, w, e)
    for fast, ref, exact in ((gxf, gxr, gx0), (gwf, gwr, gw0)):
        ef, er = _rel(fast, exact), _rel(ref, exact)
        assert 0.5 < ef / er < 2.0, (name, ef, er)


def test_a_token_count_off_the_rotation_block_pads_to_it():
    """quartet2 with 256-point rotations: the weight gradient rotates along the token axis, so the layer pads the
    tokens to the plan's multiple (256 here, not 128); 100 tokens in a (2, 50, K) batch then run as the oracle's
    zero-padded reduction: the forward exact, the gradients as noisy as the oracle's."""
    scheme = build_scheme(PrecisionConfig(name="quartet2", hadamard_block=256))
    plan = RL.plan_for(scheme)
    assert plan.multiple == 256
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 50, 256, generator=g)
    w, e = torch.randn(256, 256, generator=g) * 0.05, torch.randn(2, 50, 256, generator=g) * 1e-3
    ref = QuantLinear(torch.nn.Parameter(w.clone()), scheme, ReferenceBackend(), seed=0, layer_index=1)
    fast = RL.recipe_quant_linear(torch.nn.Parameter(w.clone().to(DEV)), scheme, make_backend("fused"), seed=0,
                                  layer_index=1)
    (yr, gxr, gwr), (yf, gxf, gwf) = _run(ref, x, e), _run(fast, x.to(DEV), e.to(DEV))
    assert yf.shape == yr.shape == (2, 50, 256) and gxf.shape == x.shape and gwf.shape == w.shape
    assert _rel(yf, yr) < 2e-5
    _, gx0, gw0 = _exact(x.reshape(100, 256), w, e.reshape(100, 256))
    for fast_g, ref_g, exact in ((gxf.reshape(100, 256), gxr.reshape(100, 256), gx0), (gwf, gwr, gw0)):
        ef, er = _rel(fast_g, exact), _rel(ref_g, exact)
        assert 0.5 < ef / er < 2.0, (ef, er)


def _bf16_mm(a, b):
    """``a @ b`` of the operands rounded to BF16, in float64."""
    return a.bfloat16().double() @ b.bfloat16().double()


#: a float32-accumulated product of exact operands against float64: ~√K·2⁻²⁴ relative (measured 1.3e-6 on an H200 at
#: these shapes); an operand rounded otherwise (float32 kept, or quantized) moves the product by ≥ 1e-4
_F32_SUM = 1e-5


def test_unquantized_operands_are_the_tensors_in_bf16_and_the_backward_reads_the_recipes_source():
    """On float32 inputs: an unquantized operand is the tensor rounded to BF16 (X, W in a backward-only forward; E,
    and X, W where the recipe's backward requantizes the inputs, in a forward-only backward), while a forward-only
    variant of a recipe whose backward reads the quantized X̂, Ŵ multiplies those."""
    from quartet.quant.quantizers import reference_quantize

    x, w, e = _inputs(8)
    _, (y, _, _) = _pair("mxfp8_bwd", x, w, e)
    assert _rel(y, _bf16_mm(x, w.t())) < _F32_SUM
    _, (_, gx, gw) = _pair("mxfp8_fwd", x, w, e)  # bwd_source input: E·W, Eᵀ·X
    assert _rel(gx, _bf16_mm(e, w)) < _F32_SUM and _rel(gw, _bf16_mm(e.t(), x)) < _F32_SUM
    fp8 = _scheme("fp8")
    x_hat, w_hat = (reference_quantize(t, fp8.fwd.a).values for t in (x, w))
    _, (_, gx, gw) = _pair("fp8_fwd", x, w, e)  # bwd_source quantized: E·Ŵ, Eᵀ·X̂
    e16 = e.bfloat16().double()  # (X̂, Ŵ: BF16 codes times a tensor scale, exact)
    assert _rel(gx, e16 @ w_hat.double()) < _F32_SUM and _rel(gw, e16.t() @ x_hat.double()) < _F32_SUM
    e_hat = reference_quantize(e, _scheme("ms_fp4").dx.a).values
    _, (_, gx, _) = _pair("ms_fp4_bwd", x, w, e)  # the recipe reuses Ŵ; the forward left W unquantized
    assert _rel(gx, e_hat.double() @ w.bfloat16().double()) < _F32_SUM


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


@pytest.mark.parametrize("name", ["mxfp8", "quartet2", "fp8_fwd"])
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
        # MS-EDEN: the oracle's and the kernel's draws differ; fp8_fwd: its backward multiplies E in BF16
        limit = {"mxfp8": 1e-4, "fp8_fwd": 1e-2}.get(name, 0.5)
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


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4", "fp8_fwd", pytest.param("nvfp4_bwd", marks=pytest.mark.slow)])
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
