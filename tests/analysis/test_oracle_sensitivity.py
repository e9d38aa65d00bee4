"""benchmarks/oracle_sensitivity.py: the drift of a recipe's oracle under bf16 rounding and reordered sums."""
from __future__ import annotations

import torch


def test_bf16_tie_share_counts_exact_halfway_values_only(oracle_sensitivity):
    one = torch.tensor(1.0)
    ulp = torch.nextafter(one.bfloat16(), torch.tensor(2.0).bfloat16()).float() - 1.0  # bf16 spacing at 1
    t = torch.stack([one, one + ulp, one + ulp / 2, one + ulp / 2 + 2 ** -23, one + ulp / 4])
    assert oracle_sensitivity.bf16_tie_share(t) == torch.tensor(1 / 5).item()  # only 1 + ulp/2 is halfway


def test_no_perturbation_no_drift_and_the_rounding_moves_the_output(oracle_sensitivity):
    row = oracle_sensitivity.measure("fp8", draws=2, noise=0.0)
    assert row["reordered_median"] == 0.0 and row["reordered_max"] == 0.0  # bf16 rounding of the same sums
    assert 0.0 < row["bf16_between"] < row["quant_error"]
    moved = oracle_sensitivity.measure("fp8", draws=2, noise=1e-5)
    assert 0.0 < moved["reordered_median"] <= moved["reordered_max"]
