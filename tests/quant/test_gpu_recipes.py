"""Every training recipe of the recipe table on the GPU, against the CPU oracle (skipped without CUDA).

Three checks per recipe (``quartet.quant.schemes.RECIPES``) and per forward-only / backward-only variant
(``HALF_VARIANTS``; a variant of any recipe but Quartet's on a fused layer, as tests/kernels/test_auto_backend.py
resolves them on the CPU):

1. the path ``auto`` picks on the GPU (a fused kernel layer, the FP8 tensor-core layers, or the ``compiled``
   backend) is a fast one, never the eager oracle;
2. a block linear's forward output and weight gradient carry no more quantization error than the CPU oracle's
   (same weights, bf16-valued inputs, seeds; stochastic rounding draws differ between the devices' generators),
   and its forward equals the oracle's -- rounded to bf16 between the layers where the fast layer emits bf16 --
   within 1% (1.5x the oracle's own drift under a reordered sum where that is larger: quartet);
3. a short training run on the GPU stays finite and learns.

The ``compiled`` backend is also checked quantizer by quantizer against the eager oracle on the same GPU and the
same seeds — random inputs and the formats' edges (powers of two and values just below, subnormals, zeros,
huge values, NaN and Inf) — where both draw the same random numbers, so the outputs agree element for element
except where Inductor's FMA contraction moves a value across a rounding boundary, and in groups whose scale or
inputs are float32 subnormals (amax below about 2^-119): a GPU may flush those (``quartet/kernels/compiled.py``),
so they are held only to finite values of the right sign — the zeros among them included, which came out NaN
before the backend's division and powers of two were made exact.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from repo_scripts import load_script

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]


def _recipes():
    from quartet.quant.schemes import RECIPES

    return [r for r in RECIPES if r != "bf16"]


def _variants():
    """The forward-only and backward-only variant of every recipe (the effN / effD runs train on their fast paths)."""
    from quartet.quant.schemes import HALF_VARIANTS

    return list(HALF_VARIANTS)


#: the two layers, their input and the oracle's drift measurements (one definition for this test and the benchmark)
PAIR = load_script("benchmarks/oracle_sensitivity.py")
_precision = PAIR.precision


def _pair(device: str, name: str, backend: str):
    return PAIR.two_layers(name, device, backend)


def _run(m, device: str, step: int = 1):
    from quartet.quant import set_step

    set_step(m, step)
    y = m(PAIR.block_input(device))
    y.float().square().mean().backward()
    return y.detach().float().cpu(), m[0].weight.grad.float().cpu()


_rel = PAIR.rel


def run_fast_and_oracle(name: str, fast, device: str):
    """Run the fast pair ``fast`` (on ``device``) and the CPU oracle's pair of recipe ``name``: ``(y_fast, g_fast,
    y_oracle, g_oracle)``. Where the fast first layer emits bf16 (fused, FP8 layers) the oracle's first layer output
    is rounded to bf16 too, so the two differ only by the fast path's own arithmetic."""
    between: list[torch.dtype] = []
    fast[0].register_forward_hook(lambda _m, _i, out: between.append(out.dtype))
    y_fast, g_fast = _run(fast, device)
    cpu, _ = _pair("cpu", name, "reference")
    if between[0] == torch.bfloat16:
        cpu[0].register_forward_hook(lambda _m, _i, out: out.bfloat16().float())
    y_cpu, g_cpu = _run(cpu, "cpu")
    return y_fast, g_fast, y_cpu, g_cpu


#: recipes whose fused layer rounds an operand the oracle keeps in float32 (quartet/kernels/recipe_linear.py): ms_fp4's
#: X̂ = Q(Xc)·s + ΔX (the outlier residual has no common scale) is multiplied in BF16, 2^-9 per element, which the
#: second layer's FP4 rounding amplifies to ~1.3% of the two layers' output (H200, measured)
ROUNDED_FORWARD = {"ms_fp4": 2e-2}


def forward_drift_bound(name: str) -> float:
    """How far a correct fast forward may sit from the (matched) oracle: 1% of its norm, or 1.5x the oracle's own
    drift under a reordered sum where that is larger (benchmarks/oracle_sensitivity.py: 0.1-0.3% for most recipes,
    2% for quartet, whose first layer puts a fifth of its outputs exactly on bf16 ties), or a documented rounding of
    the fused layer (:data:`ROUNDED_FORWARD`, which a forward-only variant shares with its recipe)."""
    from quartet.quant.schemes import HALF_VARIANTS

    recipe, half = HALF_VARIANTS.get(name, (name, "both"))
    rounded = ROUNDED_FORWARD.get(recipe, 0.0) if half != "backward" else 0.0  # a _bwd's forward is BF16
    return max(1e-2, rounded, 1.5 * PAIR.measure(name, draws=3, noise=1e-5)["reordered_max"])


@pytest.mark.parametrize("name", _recipes() + _variants())
def test_recipe_block_linear_on_gpu_matches_the_cpu_oracle(name, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    from quartet.quant.schemes import HALF_VARIANTS

    gpu, plan = _pair("cuda", name, "auto")
    assert plan.backend != "reference", f"{name}: auto fell back to the eager oracle on the GPU"
    if HALF_VARIANTS.get(name, ("quartet",))[0] not in ("quartet", "quartet_sr"):
        assert "operand by operand" not in plan.implementation, (name, plan.backend, plan.implementation)
    y_gpu, g_gpu, y_cpu, g_cpu = run_fast_and_oracle(name, gpu, "cuda")
    hp, _ = _pair("cpu", "bf16", "reference")
    y_hp, g_hp = _run(hp, "cpu")
    assert torch.isfinite(y_gpu).all() and torch.isfinite(g_gpu).all()
    # forward: no more quantization error than the oracle's, and the oracle's output up to the fast path's arithmetic
    err_gpu, err_cpu = _rel(y_gpu, y_hp), _rel(y_cpu, y_hp)
    assert err_gpu <= 1.25 * err_cpu + 2e-3, (name, plan.backend, err_gpu, err_cpu)
    bound = forward_drift_bound(name)
    assert _rel(y_gpu, y_cpu) < bound, (name, plan.backend, _rel(y_gpu, y_cpu), bound)
    # backward: the GPU's quantization error of the weight gradient is the oracle's (not a broken scale or axis)
    err_gpu, err_cpu = _rel(g_gpu, g_hp), _rel(g_cpu, g_hp)
    assert err_gpu <= 1.25 * err_cpu + 2e-3, (name, plan.backend, err_gpu, err_cpu)


_SUBNORMAL_ROW = 2


def _drop_row(t: torch.Tensor, row: int) -> torch.Tensor:
    return torch.cat([t[:row], t[row + 1:]])


def _edge_inputs(rows: int, cols: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(rows, cols, generator=g) * 2
    edges = torch.tensor([0.0, -0.0, 1.0, 2.0, 4.0, 6.0, 448.0, 2.0 ** -126, 2.0 ** -140, -2.0 ** -149,
                          torch.nextafter(torch.tensor(2.0), torch.tensor(0.0)).item(),
                          torch.nextafter(torch.tensor(8.0), torch.tensor(0.0)).item(), 1e30, -1e30, 0.5, 0.25])
    x[0, : edges.numel()] = edges  # one row of edges inside otherwise normal groups
    x[1] = 0.0  # an all-zero row
    x[_SUBNORMAL_ROW] *= 2.0 ** -130  # a subnormal row,
    x[_SUBNORMAL_ROW, ::7] = 0.0  # with zeros: 0 divided by a flushed scale was the NaN that stopped MXFP8 runs
    x[3, 5] = float("nan")
    x[4, 40] = float("inf")
    x[5, 70] = float("-inf")
    x[6] = torch.exp2(torch.randint(-10, 10, (cols,), generator=g).float())  # exact powers of two
    return x


def _compiled_specs():
    from quartet.quant.schemes import build_scheme

    specs = {}
    for name in _recipes():
        for spec, block in build_scheme(_precision(name)).rotated_specs():
            specs[spec.label()] = (spec, block)
    return sorted(specs.items())


_SPECS = _compiled_specs()


@pytest.mark.parametrize("label,spec_block", _SPECS, ids=[k for k, _ in _SPECS])
def test_compiled_quantizers_equal_the_eager_oracle_on_the_gpu(label, spec_block):
    from quartet.kernels.compiled import CompiledReferenceBackend
    from quartet.quant.backend import ReferenceBackend
    from quartet.quant.hadamard import random_signs

    spec, block = spec_block
    ref, fast = ReferenceBackend(), CompiledReferenceBackend()
    for trial, (rows, cols) in enumerate([(256, 512), (384, 256), (128, 1024)]):
        x = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(10 + trial)) * 3).cuda()
        if trial == 0:
            x = _edge_inputs(rows, cols).cuda()
        signs = random_signs(block, torch.Generator().manual_seed(trial)).cuda() if block else None
        a = ref.quantize(x, spec, block=block, signs=signs, seed=1234 + trial).values
        b = fast.quantize(x, spec, block=block, signs=signs, seed=1234 + trial).values
        assert torch.equal(torch.isnan(a), torch.isnan(b)), label
        if trial == 0:  # the subnormal row (see the module docstring): finite, same sign, nothing more
            sub_a, sub_b = a[_SUBNORMAL_ROW], b[_SUBNORMAL_ROW]
            # (where the oracle marks the row NaN -- a tensor-wide or 2-D group shared with the NaN row -- so must
            # the fast path: checked above)
            finite = ~torch.isnan(sub_a)
            assert torch.isfinite(sub_b[finite]).all() and not (sub_a * sub_b < 0).any(), label
            a, b = _drop_row(a, _SUBNORMAL_ROW), _drop_row(b, _SUBNORMAL_ROW)
        differ = (a != b) & ~torch.isnan(a)
        frac = float(differ.float().mean())
        assert frac <= 1e-3, (label, trial, frac)
        if differ.any():  # a boundary flip moves a value by one step of its grid, not more
            rel = ((a - b).abs() / a.abs().clamp_min(1e-30))[differ]
            assert float(rel.max()) <= 0.5 + 1e-6, (label, trial, float(rel.max()))


@pytest.mark.parametrize("name", _recipes() + _variants())
def test_recipe_trains_on_the_gpu(name, tmp_path):
    """40 steps of a 1M Llama on the repository's docs: finite, and the loss falls well below its start."""
    from quartet.config import compose, resolve
    from quartet.train import Trainer

    cfg = compose(["data=files", f"data.paths=[{REPO / 'docs'}]", "data.vocab_size=300", "data.val_fraction=0.2",
                   f"data.dir={tmp_path / 'data'}", "model=llama_1m", "model.seq_len=128", "optim.batch_size=16",
                   "budget=tokens", f"budget.tokens={40 * 16 * 128}", "run.device=cuda", f"precision={name}",
                   "run.compile=false", "logging=quiet", "run.threads=2", f"run.out_dir={tmp_path / 'runs'}"])
    resolve(cfg)
    trainer = Trainer(cfg)
    assert trainer.plan.backend != "reference", name
    losses = [trainer._step()[0] for _ in range(40)]
    assert all(math.isfinite(v) for v in losses), (name, losses)
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0, (name, losses[0], losses[-5:])
