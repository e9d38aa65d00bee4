"""A fit never overstates: E on its bound is flagged, efficiencies inherit a flagged base, headlines say so."""
from __future__ import annotations

import numpy as np

from analysis.fit import fit_base, fit_efficiency
from analysis.laws import predict
from analysis.report import fit_all
from analysis.load import frame_from_table

import pandas as pd

from analysis_testdata import PAPER_PARAMS


def _grid(params, sizes, ratios, noise=0.0, seed=0, eff=(1.0, 1.0)):
    rng = np.random.default_rng(seed)
    nn, rr = np.meshgrid(sizes, ratios)
    n, d = nn.ravel(), (nn * rr).ravel()
    return n, d, predict(params, n, d, *eff) * np.exp(rng.normal(0, noise, n.size))


NO_FLOOR = {**PAPER_PARAMS, "E": 0.0}  # a pure power law: no irreducible loss to find


def test_e_at_zero_is_hit_bound_not_converged():
    n, d, loss = _grid(NO_FLOOR, np.array([1e6, 2e6, 4e6, 8e6]), np.array([5, 10, 20, 40]), noise=0.002)
    base = fit_base(n, d, loss)
    assert base.params["E"] < 1e-3 * loss.min()
    assert base.status == "hit_bound" and "E =" in base.message and "lower bound" in base.message


def test_planted_floor_still_converges():
    n, d, loss = _grid(PAPER_PARAMS, np.array([3e7, 5e7, 1e8, 2e8, 4e8]), np.array([25, 50, 100, 200, 400]),
                       noise=0.002)
    assert fit_base(n, d, loss).status == "converged"


def test_efficiencies_inherit_a_flagged_base_and_headlines_say_so():
    sizes, ratios = np.array([1e6, 2e6, 4e6, 8e6]), np.array([5, 10, 20, 40])
    base_n, base_d, base_l = _grid(NO_FLOOR, sizes, ratios, noise=0.002)
    base = fit_base(base_n, base_d, base_l)
    qn, qd, ql = _grid(NO_FLOOR, sizes, ratios, noise=0.002, seed=1, eff=(0.6, 0.9))
    eff = fit_efficiency(base, qn, qd, ql, "joint", scheme="q")
    assert eff.status == base.status == "hit_bound" and eff.message.startswith("inherited from the base fit")
    rows = [{"n_params": a, "tokens": b, "loss": c, "forward": "bf16", "backward": "bf16"} for a, b, c in
            zip(base_n, base_d, base_l)]
    rows += [{"n_params": a, "tokens": b, "loss": c, "forward": "quest", "backward": "rtn"} for a, b, c in
             zip(qn, qd, ql)]
    report = fit_all(frame_from_table(pd.DataFrame(rows)), "busbridge")
    (head,) = report.headlines
    assert head["text"].startswith("NOT A FINDING (hit_bound") and head["caveat"].startswith("hit_bound")
