"""Speed model, break-even speedup and optimal-precision maps."""
from __future__ import annotations

import numpy as np
import pytest

from analysis.laws import predict
from analysis.speed import (BOPS_SPEEDUPS, OPTIONS, breakeven_speedup, effective_loss, headline, optimal_map,
                            option_speedups, rtx5090_speedups, training_speedup)

from analysis_testdata import PAPER_PARAMS


def test_training_speedups_match_paper_table1():
    got = {o: float(training_speedup(*BOPS_SPEEDUPS[o])) for o in OPTIONS}
    assert got == pytest.approx({"FP8:FP8": 1.0, "FP4:FP8": 1.2, "FP8:FP4": 1.5, "FP4:FP4": 2.0})


def test_rtx5090_interpolation():
    fw, bw = rtx5090_speedups([102_760_448, 6_476_005_376, 1e6, 1e12])
    np.testing.assert_allclose(fw, [1.644, 2.136, 1.644, 2.135])  # exact at table points, clamped outside
    np.testing.assert_allclose(bw, [0.555, 0.997, 0.555, 1.381])
    mid_fw, _ = rtx5090_speedups(np.sqrt(102_760_448 * 203_161_600))  # geometric midpoint: linear in log N
    assert mid_fw == pytest.approx((1.644 + 1.808) / 2)
    fw8, bw8 = option_speedups("FP8:FP4", 1e9, "rtx5090")
    assert fw8 == 1.0 and 0.7 < bw8 < 0.8


@pytest.mark.parametrize("eff_n,eff_d,n,ratio", [(0.65, 1.0, 1e9, 100), (0.642, 0.943, 8e8, 100),
                                                  (0.7, 0.95, 3e7, 800)])
def test_breakeven_closed_form_equalises_losses(eff_n, eff_d, n, ratio):
    d = n * ratio
    s = float(breakeven_speedup(PAPER_PARAMS, eff_n, eff_d, n, d))
    assert np.isfinite(s) and s > 1
    # uniform speedup s: sp_fw = sp_bw = s, so the effective loss is L(s·effN·N, effD·D)
    lq = effective_loss(PAPER_PARAMS, n, ratio, eff_n, eff_d, s, s)
    assert lq == pytest.approx(float(predict(PAPER_PARAMS, n, d)), rel=1e-10)
    assert effective_loss(PAPER_PARAMS, n, ratio, eff_n, eff_d, 1.01 * s, 1.01 * s) < predict(PAPER_PARAMS, n, d)


def test_breakeven_infinite_when_data_penalty_dominates():
    assert np.isinf(breakeven_speedup(PAPER_PARAMS, 0.5, 0.15, 8e8, 8e10))
    h = headline("luq", PAPER_PARAMS, 0.5, 0.15, 8e8, 100)
    assert "no speedup makes it pay off" in h["text"] and h["lost_params_pct"] == pytest.approx(50.0)


def test_optimal_map_regions_follow_the_paper():
    m = optimal_map(PAPER_PARAMS, (0.642, 0.943), speedups="bops", resolution=60)
    assert m.best.shape == (60, 60) and set(np.unique(m.best)) <= set(range(4))
    # With FP4 twice as fast everywhere, plain FP8:FP8 is never optimal and large D/N favours FP4:FP4.
    assert "FP8:FP8" not in {m.options[i] for i in np.unique(m.best)}
    assert m.option_at(7e10, 15e12 / 70e9) == "FP4:FP4"  # Llama 3 70B / 15T, the paper's claim
    assert m.option_at(1e8, 2000) == "FP4:FP4"
    # No FP4 speedup at all: FP8:FP8 is best everywhere.
    flat = optimal_map(PAPER_PARAMS, (0.642, 0.943), speedups={"FP4:FP8": (1, 1), "FP8:FP4": (1, 1),
                                                               "FP4:FP4": (1, 1)}, resolution=20)
    assert np.all(flat.best == 0)
    # Measured RTX 5090 speedups (backward slower than FP8 below ~6B): small models stay on FP8.
    rtx = optimal_map(PAPER_PARAMS, (0.642, 0.943), speedups="rtx5090", resolution=60)
    assert rtx.option_at(1.5e8, 30) == "FP8:FP8"
