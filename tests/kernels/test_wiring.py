"""apply_precision installs the fused Quartet layer on kernel backends; it trains like the reference.

On a CPU box the ``triton`` backend runs in Triton's interpreter. ``get_backend`` refuses a GPU backend
on a CPU model (that check is tested in tests/quant), so these tests build the kernel backend directly
with :func:`quartet.kernels.backends.make_backend` and hand it to ``apply_precision``.
"""
from __future__ import annotations

import copy
import json

import pytest
import torch

pytest.importorskip("triton")

import quartet.quant as Q  # noqa: E402
from quartet.quant.config import PrecisionConfig  # noqa: E402
from quartet.kernels import linear as L  # noqa: E402
from quartet.model import Llama  # noqa: E402
from quartet.quant.linear import OPERANDS, QuantLinear  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def triton_backend(resolve_backends_to):
    """Resolve every backend request to the kernel ``triton`` backend (bypasses the CUDA-only device check)."""
    return resolve_backends_to("triton")


def _model(seed=0, n_layer=2):
    """A tiny Llama; ``n_layer=1`` still has four fused layers (qkv, proj, w12, c_proj) at half the cost of two
    blocks, which matters under Triton's CPU interpreter (a forward + backward of two blocks takes ~7 s)."""
    torch.manual_seed(seed)
    return Llama(n_layer, 64, 2, 128, 32, ffn_multiple_of=32).to(DEV)


def _loss_and_grads(model, tokens):
    model.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_kernel_backend_installs_fused_layer_and_plan_says_so(triton_backend):
    model = _model()
    weights = {n: m.weight for n, m in model.block_linears().items()}
    plan = Q.apply_precision(model, PrecisionConfig(name="quartet"), seed=1, device=DEV)
    assert plan.implementation == L.IMPL_FUSED
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["implementation"] == L.IMPL_FUSED
    assert all(m["implementation"] == L.IMPL_FUSED for m in d["modules"].values())
    assert "fused QuartetLinear" in plan.summary()
    for n, mod in model.named_modules():
        if n in weights:
            assert isinstance(mod, L.FusedQuantLinear) and mod.weight is weights[n]
    # a scheme the fused layer does not cover keeps the operand-by-operand QuantLinear on the same backend
    other = _model()
    plan = Q.apply_precision(other, PrecisionConfig(name="rtn_bwd"), seed=1, device=DEV)
    assert plan.implementation.startswith("QuantLinear")
    assert not any(isinstance(m, L.FusedQuantLinear) for m in other.modules())
    assert any(type(m) is QuantLinear for m in other.modules())


def test_reference_backend_keeps_quantlinear():
    model = _model().cpu()
    plan = Q.apply_precision(model, PrecisionConfig(name="quartet", backend="reference"), seed=1, device="cpu")
    assert plan.implementation.startswith("QuantLinear")
    assert not any(isinstance(m, L.FusedQuantLinear) for m in model.modules())


def test_fused_model_trains_like_reference_quantlinear(triton_backend):
    """Same weights, same tokens: fused layer (bf16 operands and outputs) vs reference QuantLinear (float32).

    Stated tolerance: loss within 0.2% relative; each parameter gradient's relative L2 distance to the
    reference at most 0.35 and at most 0.6x the distance between the reference and unquantized BF16
    training (≈0.45-0.6 on this tiny fresh model, whose gradients are small and rounding-sensitive): the
    fused layer differs from the oracle by a few FP4 rounding flips caused by its bf16 inputs, far less
    than quantization itself. (Measured on the CPU interpreter: loss 1e-4 relative, worst gradient 0.28;
    the seam path on the same kernels: 0.22.)"""
    ref = _model()
    fused, plain = copy.deepcopy(ref), copy.deepcopy(ref)
    Q.apply_precision(ref, PrecisionConfig(name="quartet", backend="reference"), seed=5, device=DEV)
    Q.apply_precision(fused, PrecisionConfig(name="quartet"), seed=5, device=DEV)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 128, (2, 33), generator=g).to(DEV)
    _, gp = _loss_and_grads(plain, tokens)
    Q.set_step(ref, 1)
    Q.set_step(fused, 1)
    lr, gr = _loss_and_grads(ref, tokens)
    lf, gf = _loss_and_grads(fused, tokens)
    assert abs(lf.item() - lr.item()) / lr.item() < 2e-3, (lf.item(), lr.item())
    for n in gr:
        d, quant = _rel(gf[n], gr[n]), _rel(gp[n], gr[n])
        assert d < 0.35 and d < 0.6 * quant, (n, d, quant)


def test_fused_seeds_follow_the_reference_rule_and_ddp_numbering(triton_backend):
    """Signs/seeds equal QuantLinear's; micro-batch k run alone with first_call=k equals micro-batch k of a
    single process (what DDP rank r does with first_call = r x micro-batches)."""
    base = _model(1, n_layer=1)
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    for m in (a, b):
        Q.apply_precision(m, PrecisionConfig(name="quartet_sr"), seed=9, device=DEV)
    lay = [m for m in a.modules() if isinstance(m, L.FusedQuantLinear)][3]
    lay.set_step(4, first_call=3)
    for gemm in ("dx", "dw"):
        assert torch.equal(_synced(lay).signs(3, gemm, "cpu"), lay.signs(3, gemm, 32, "cpu"))
    for slot in ("dx_e", "dx_w", "dw_e", "dw_x"):
        assert _synced(lay).operand_seed(3, slot) == lay.operand_seed(3, OPERANDS.index(slot)) & 0x7FFF_FFFF
    g = torch.Generator().manual_seed(4)
    mb = [torch.randint(0, 128, (1, 33), generator=g).to(DEV) for _ in range(2)]
    Q.set_step(a, 7, first_call=0)
    _loss_and_grads(a, mb[0])
    _, ga = _loss_and_grads(a, mb[1])  # second micro-batch of a single process (call 1)
    Q.set_step(b, 7, first_call=1)
    _, gb = _loss_and_grads(b, mb[1])  # "rank 1" starting at global micro-batch 1
    for n in ga:
        assert torch.equal(ga[n], gb[n]), n
    Q.set_step(b, 7, first_call=0)
    _, gc = _loss_and_grads(b, mb[1])  # wrong numbering: different SR streams and signs
    assert any(not torch.equal(ga[n], gc[n]) for n in ga if "blocks" in n)


def _synced(layer):
    layer.fused.step = layer.step
    return layer.fused


def test_stats_steps_run_the_seam_path_and_record_stats(triton_backend):
    model = _model(2)
    Q.apply_precision(model, PrecisionConfig(name="quartet", stats_every=2), seed=1, device=DEV)
    tokens = torch.randint(0, 128, (1, 33), generator=torch.Generator().manual_seed(0)).to(DEV)
    Q.set_step(model, 2)
    _loss_and_grads(model, tokens)
    stats = Q.collect_stats(model)
    assert "q/blocks.0.attn.qkv/x/clip_frac" in stats and "q/blocks.1.mlp.c_proj/dw_e/rel_err" in stats
    Q.set_step(model, 3)
    loss, grads = _loss_and_grads(model, tokens)
    assert Q.collect_stats(model) == {} and torch.isfinite(loss)
    assert all(torch.isfinite(v).all() for v in grads.values())


def _micro_batches(model, step, first_call, batches):
    """One optimizer step's micro-batches the way the trainer runs them; returns losses and summed grads."""
    model.zero_grad(set_to_none=True)
    Q.set_step(model, step, first_call=first_call)
    losses = []
    for i, tokens in enumerate(batches):
        Q.begin_micro_batch(model, i)
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        losses.append(loss.item())
    return losses, {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_traceable_fused_layer_equals_the_eager_layer_bit_for_bit(triton_backend):
    """The registered-operator form (draws read from device buffers) computes exactly what the eager layer does,
    SR streams and DDP micro-batch numbering included, and a wrong draw changes the result."""
    base = _model(3, n_layer=1)
    eager, traced = copy.deepcopy(base), copy.deepcopy(base)
    Q.apply_precision(eager, PrecisionConfig(name="quartet_sr"), seed=9, device=DEV)
    plan = Q.apply_precision(traced, PrecisionConfig(name="quartet_sr"), seed=9, device=DEV, traceable=True)
    assert plan.traceable and plan.to_dict()["traceable"] and "traceable operators" in plan.summary()
    layers = [m for m in traced.modules() if isinstance(m, L.FusedQuantLinear)]
    assert layers and all(m.device_draws is layers[0].device_draws for m in layers)
    assert not any(n.startswith("draw_") or ".draw_" in n for n in traced.state_dict())  # not checkpointed
    g = torch.Generator().manual_seed(4)
    batches = [torch.randint(0, 128, (1, 33), generator=g).to(DEV) for _ in range(2)]
    le, ge = _micro_batches(eager, 7, 1, batches)
    lt, gt = _micro_batches(traced, 7, 1, batches)
    assert le == lt
    for n in ge:
        assert torch.equal(ge[n], gt[n]), n
    # the buffers hold the reference rule's draws of the last micro-batch (global call 2)
    lay = layers[2]
    assert torch.equal(lay.draw_signs[1].cpu(), lay.signs(2, "dw", 32, "cpu"))
    assert int(lay.draw_seeds[0]) == lay.operand_seed(2, 2) & 0x7FFF_FFFF  # dx_e
    # stale draws (no begin_micro_batch for the second micro-batch) give other gradients
    traced.zero_grad(set_to_none=True)
    Q.set_step(traced, 7, first_call=1)
    for tokens in batches:
        traced(tokens[:, :-1], tokens[:, 1:]).backward()
    assert any(not torch.equal(ge[n], p.grad) for n, p in traced.named_parameters() if "blocks" in n)


def test_fused_operators_shape_functions_and_autograd_registration(triton_backend):
    """torch.library.opcheck: schema, fake (shape) functions and the autograd formula of the forward operator."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=g).bfloat16().to(DEV).requires_grad_(True)
    w = (torch.randn(96, 64, generator=g) * 0.1).to(DEV).requires_grad_(True)
    signs = (torch.randint(0, 2, (2, 32), generator=g) * 2 - 1).float().to(DEV)
    seeds = torch.arange(4, dtype=torch.int64).to(DEV)
    torch.library.opcheck(L.fused_linear_fwd, (x, w, signs, seeds, "triton", True, False))
    # packed masks: int32 words per 32-group saved for the backward (shape functions and autograd the same)
    torch.library.opcheck(L.fused_linear_fwd, (x, w, signs, seeds, "triton", True, False, 128, True))


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_traceable_fused_model_compiles_as_one_graph(triton_backend, backend):
    """fullgraph=True: the fused Quartet layers no longer split the compiled model, and the compiled step equals
    the eager one. ``aot_eager`` traces the same graph but runs every op as eager does: losses and gradients are
    bitwise equal. Under ``inductor`` the non-quantized ops round differently (fused kernels, other reduction
    orders, chosen per machine and process state); a last-bit difference that crosses an MXFP4 rounding boundary
    flips one code, which on this 64-token model moves one parameter's gradient by up to a few percent (measured
    on an H100 under different test orders: tok_emb 0.78%, a norm weight 4.6%): the loss is still held to 1e-5
    and the whole gradient (all parameters as one vector) to 2e-2, well under what a wrong draw or a wrong scale
    does (tens of percent); the per-parameter check is aot_eager's, bitwise."""
    base = _model(5)
    eager, traced = copy.deepcopy(base), copy.deepcopy(base)
    for m in (eager, traced):
        Q.apply_precision(m, PrecisionConfig(name="quartet"), seed=2, device=DEV, traceable=True)
    torch._dynamo.reset()
    compiled = torch.compile(traced, fullgraph=True, backend=backend)
    tokens = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(1)).to(DEV)
    for step in (1, 2):
        le, ge = _micro_batches(eager, step, 0, [tokens])
        traced.zero_grad(set_to_none=True)
        Q.set_step(traced, step)
        Q.begin_micro_batch(traced, 0)
        loss = compiled(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        if backend == "aot_eager":
            assert loss.item() == le[0]
            for n, p in traced.named_parameters():
                assert torch.equal(p.grad, ge[n]), n
        else:
            assert loss.item() == pytest.approx(le[0], rel=1e-5)
            names = [n for n, _ in traced.named_parameters()]
            got = torch.cat([p.grad.reshape(-1) for _, p in traced.named_parameters()])
            assert _rel(got, torch.cat([ge[n].reshape(-1) for n in names])) < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(DEV != "cuda", reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("precision,tol", [("quartet", 2e-3), ("bf16", 5e-3), ("fp8", 5e-3)])
def test_traceable_models_train_in_cuda_graphs_like_the_eager_model(precision, tol):
    """run.compile_mode=reduce-overhead for the ladder's precisions: the compiled model is captured (no cudagraph
    skip; for quartet's traced fused layer no graph break either), replays read each micro-batch's fresh draws,
    and three optimizer steps of two micro-batches, accumulated the way the trainer does it, follow the eager
    model (quartet: the eager fused layer). The compiled non-quantized ops may round differently; fp8's compiled
    x/s may move a code by one FP8 step."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    base = Llama(2, 256, 4, 512, 128, ffn_multiple_of=256).to(DEV)
    eager, traced = copy.deepcopy(base), copy.deepcopy(base)
    cfg = PrecisionConfig(name=precision, forward=precision, backward=precision)
    Q.apply_precision(eager, cfg, seed=3, device=DEV)
    plan = Q.apply_precision(traced, cfg, seed=3, device=DEV, traceable=True)
    assert plan.traceable == (precision == "quartet")
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(traced, mode="reduce-overhead")
    g = torch.Generator().manual_seed(1)
    steps = [[torch.randint(0, 512, (8, 129), generator=g).to(DEV) for _ in range(2)] for _ in range(3)]
    curves = {}
    for name, model, run in (("eager", eager, eager), ("graphs", traced, compiled)):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for step, batches in enumerate(steps, start=1):
            Q.set_step(model, step)
            for i, tokens in enumerate(batches):
                Q.begin_micro_batch(model, i)
                torch.compiler.cudagraph_mark_step_begin()  # as the trainer: the last micro-batch's outputs are used
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = run(tokens[:, :-1], tokens[:, 1:])
                (loss / 2).backward()
                if i == 0:  # as the trainer: a replay would overwrite the graph-owned gradients being accumulated
                    for p in model.parameters():
                        p.grad = p.grad.clone() if p.grad is not None else None
                losses.append(loss.item())
            opt.step()
            opt.zero_grad(set_to_none=True)
        curves[name] = losses
    assert counters["inductor"]["cudagraph_skips"] == 0
    if precision == "quartet":
        assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert curves["graphs"] == pytest.approx(curves["eager"], rel=tol), curves
