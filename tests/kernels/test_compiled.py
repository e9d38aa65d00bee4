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


@pytest.mark.slow
@pytest.mark.timeout(900)
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
