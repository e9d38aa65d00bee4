"""The ``compiled`` backend: the oracle's quantizers under torch.compile, what ``auto`` takes on a GPU for every
quantizer without a hand-written kernel. On the CPU the compiled path is bitwise the oracle's (the GPU comparison,
edges included, is tests/quant/test_gpu_recipes.py)."""
from __future__ import annotations

import pytest
import torch

from quartet.kernels.compiled import CompiledReferenceBackend
from quartet.quant.backend import ReferenceBackend, available_backends
from quartet.quant.hadamard import random_signs
from quartet.quant.quantizers import QuantizerSpec


def test_compiled_ranks_below_every_kernel_and_above_the_eager_oracle():
    order = available_backends()
    assert order.index("compiled") > order.index("triton") and order.index("compiled") < order.index("reference")
    fast = CompiledReferenceBackend()
    assert fast.supports_device("cuda") and not fast.supports_device("cpu")  # auto never compiles on the CPU


def test_a_finite_tensor_never_quantizes_to_nan_or_inf_on_the_compiled_path():
    from quartet.kernels.compiled import finite_if_input_finite

    values = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -2.0])
    # a finite input: what is not finite can only be a flushed subnormal, and comes back 0
    assert torch.equal(finite_if_input_finite(values, torch.ones(5)), torch.tensor([1.0, 0.0, 0.0, 0.0, -2.0]))
    # an input holding NaN/Inf: its units' NaN are the oracle's rule and stay
    x = torch.tensor([1.0, 1.0, float("inf"), 1.0, 1.0])
    out = finite_if_input_finite(values, x)
    assert torch.equal(out.isnan(), values.isnan()) and torch.equal(out.isinf(), values.isinf())


def test_compiled_backend_turns_on_eager_equal_division():
    import torch._inductor.config as inductor_config

    from quartet.kernels.compiled import inductor_numerics

    done = inductor_numerics()
    assert "division_rounding" in done or "emulate_divison_rounding" in done
    numerics = getattr(inductor_config, "eager_numerics", None)
    assert getattr(numerics, "division_rounding", False) or getattr(inductor_config, "emulate_divison_rounding", False)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_compiled_quantizers_are_bitwise_the_oracle_on_the_cpu():
    specs = [(QuantizerSpec("nvfp4", group=16, stochastic=True), 16), (QuantizerSpec("ms_eden", group=16), 128),
             (QuantizerSpec("luq", stochastic=True), None), (QuantizerSpec("mxfp8", group=32), None)]
    ref, fast = ReferenceBackend(), CompiledReferenceBackend()
    for i, (spec, block) in enumerate(specs):
        for rows, cols in [(64, 256), (96, 128)]:  # a second shape: the recompiled (dynamic) graph too
            x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(i)) * 3
            x[0, :4] = torch.tensor([0.0, 2.0 ** -130, float("nan"), 448.0])
            signs = random_signs(block, torch.Generator().manual_seed(i)) if block else None
            a = ref.quantize(x, spec, block=block, signs=signs, seed=99).values
            b = fast.quantize(x, spec, block=block, signs=signs, seed=99).values
            assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) and torch.equal(a.isnan(), b.isnan()), spec
