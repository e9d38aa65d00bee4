"""benchmarks/recipes_design.py: the design simulation for pinning the recipes' effN and effD."""
from __future__ import annotations

import numpy as np
import pytest


def test_designs_share_their_common_cells_draws(design):
    """Common random numbers: two designs of one seed differ only by the cells one of them adds."""
    cells = design.ladder_cells()
    base, effs = design.planted()
    sd_b, sd_g = design.noise_sds()
    cur = design.simulate_table(7, cells, design.CURRENT, base, effs, sd_b, sd_g)
    more = design.simulate_table(7, cells, design.CURRENT + [("llama_1m", "dn40", 1)], base, effs, sd_b, sd_g)
    merged = more.merge(cur, on=["run_id"], how="left", suffixes=("", "_cur"))
    same = merged["loss_cur"].notna()
    assert np.allclose(merged.loc[same, "loss"], merged.loc[same, "loss_cur"])
    assert set(merged.loc[~same, "run_id"]) == {f"llama_1m-dn40-{name}" for name in effs}
    assert (cur["precision"] == "bf16").sum() == len(cells) == 15


def test_added_runs_skip_what_the_ladder_ran_and_cost_the_planners_hours(design):
    from cluster.profiles import gpu_hours, load_profile

    cells = design.ladder_cells()
    recipes = ["bf16", "fp8", "quartet", "mxfp8", "quartet2"]
    sps = {("llama_1m", r): 0.1 for r in recipes}
    cost = design.design_cost([("llama_1m", "dn40", 1)], cells, recipes, sps)
    c = cells[(cells["model"] == "llama_1m") & (cells["budget"] == "dn40")].iloc[0]
    prof = load_profile("local_gpu")
    assert cost["added_runs"] == 2  # bf16, fp8 and quartet are the ladder's runs
    assert cost["gpu_h_planner"] == pytest.approx(sum(gpu_hours(prof, c.n_params, c.tokens, r)
                                                      for r in ("mxfp8", "quartet2")))
    assert cost["longest_run_min"] == pytest.approx(c.steps * 0.1 / 60)
    assert cost["gpu_h_measured"] == pytest.approx(2 * c.steps * 0.1 / 4 / 3600)


def test_a_wide_design_pins_effn_where_the_current_one_is_wider(design):
    """Planted quartet-like (effN 0.55, effD 1.0) at the seed noise: with a recipe run at all 15 ladder cells its
    effN interval is off the bounds and narrower than with the table's six cells."""
    effs = {"q": (0.55, 1.0)}
    cells = design.ladder_cells()
    wide = design.simulate(design.DESIGNS["all 15 ladder cells"], reps=1, bootstrap=20, effs=effs, cells=cells)
    cur = design.simulate([], reps=1, bootstrap=20, effs=effs, cells=cells)
    w_wide = float((wide["effN_hi"] - wide["effN_lo"]).iloc[0])
    w_cur = float((cur["effN_hi"] - cur["effN_lo"]).iloc[0])
    assert bool(wide["pinned_N"].iloc[0]) and wide["covers_N"].iloc[0]
    assert w_wide < w_cur
