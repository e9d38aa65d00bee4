"""The GPU recipe test's forward check, exercised on the CPU: it must pass a fast first layer that emits bf16 rounded
as the oracle rounds, and fail one that truncates to bf16 (an epilogue bug the quantization-error check lets through).

The "fast" pair is the CPU oracle itself with its first layer's output forced to bf16 either way; the check compares it
with the oracle matched to bf16 between the layers (``test_gpu_recipes.run_fast_and_oracle``).
"""
from __future__ import annotations

import pytest
import torch

import test_gpu_recipes as gpu_test


def _to_bf16(out: torch.Tensor, truncate: bool) -> torch.Tensor:
    if not truncate:
        return out.bfloat16()
    cut = (out.detach().contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32)  # drop the low 16 bits
    return (out + (cut - out).detach()).bfloat16()  # gradients flow as through a cast


@pytest.mark.parametrize("name", ["fp8", "quartet"])
def test_the_forward_check_passes_bf16_rounding_and_fails_truncation(name):
    bound = gpu_test.forward_drift_bound(name)
    drift = {}
    for truncate in (False, True):
        fast, _ = gpu_test._pair("cpu", name, "reference")
        fast[0].register_forward_hook(lambda _m, _i, out, t=truncate: _to_bf16(out, t))
        y_fast, _, y_oracle, _ = gpu_test.run_fast_and_oracle(name, fast, "cpu")
        drift[truncate] = gpu_test._rel(y_fast, y_oracle)
    # rounded as the matched oracle rounds: only the second layer's bf16 output differs, far inside the bound
    assert drift[False] < bound / 4, (drift, bound)
    assert drift[True] > bound, (drift, bound)
