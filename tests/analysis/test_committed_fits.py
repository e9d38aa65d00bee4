"""The refit policy of committed_fits.py (docs/analysis.md, "Reproducibility of refits") accepts what another CPU
does to a refit and refuses what a changed fit does."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from committed_fits import assert_refit_agrees

REPO = Path(__file__).resolve().parents[2]
BRANCHES = json.loads((REPO / "benchmarks" / "results" / "branches" / "fit_branches.json").read_text())


def _converged(fit: dict) -> dict:
    """``fit`` with every status ``converged``: the same numbers judged as a fit the data pin down."""
    out = copy.deepcopy(fit)
    for part in (out["base"], *out["efficiencies"]):
        part["status"] = "converged"
    return out


def _moved(fit: dict, where: str, value) -> dict:
    """``fit`` with one number replaced: ``where`` is "param:NAME", "end:NAME:I" or "eff:KEY" (the first scheme)."""
    out = copy.deepcopy(fit)
    kind, *key = where.split(":")
    if kind == "param":
        out["base"]["params"][key[0]] = value
    elif kind == "end":
        out["base"]["intervals"][key[0]][int(key[1])] = value
    else:
        out["efficiencies"][0][key[0]] = value
    return out


def test_a_flagged_fit_may_move_in_its_valley_but_not_leave_it():
    """The branch fit is flagged (alpha = 14.8): its A moved 30x and its interval's ends by a factor 131 (of a
    271-decade interval) between CPUs and still agrees; leaving the interval or changing the status does not."""
    eff = BRANCHES["efficiencies"][0]
    for where, value in (("param:A", 30 * BRANCHES["base"]["params"]["A"]), ("end:A:0", 5.1e9), ("end:A:1", None),
                         ("eff:eff_n", eff["eff_n_interval"][1])):
        assert_refit_agrees(_moved(BRANCHES, where, value), BRANCHES, where)
    for where, value in (("param:alpha", 200.0), ("end:E:0", 0.3), ("eff:eff_n", 0.6)):
        with pytest.raises(AssertionError):
            assert_refit_agrees(_moved(BRANCHES, where, value), BRANCHES, where)
    restated = copy.deepcopy(BRANCHES)
    restated["base"]["status"] = "converged"
    with pytest.raises(AssertionError):
        assert_refit_agrees(restated, BRANCHES, "status")


def test_a_converged_fit_keeps_what_the_data_pin_down():
    """In a converged fit a pinned point estimate (the efficiency's interval is 1.4x wide) agrees to 1e-6, even inside
    its interval; an unpinned one (A's interval spans 271 decades) only within a quarter of that width."""
    fit = _converged(BRANCHES)
    eff = fit["efficiencies"][0]["eff_n"]
    assert_refit_agrees(_moved(fit, "eff:eff_n", eff * (1 + 5e-7)), fit, "pinned, 5e-7")
    assert_refit_agrees(_moved(fit, "param:A", 30 * fit["base"]["params"]["A"]), fit, "unpinned A")
    with pytest.raises(AssertionError):
        assert_refit_agrees(_moved(fit, "eff:eff_n", eff * (1 + 1e-5)), fit, "pinned, 1e-5")
    fit["efficiencies"][0]["eff_n_interval"] = [0.9, 0.99]  # 1.1x wide: pinned
    with pytest.raises(AssertionError):
        assert_refit_agrees(_moved(fit, "eff:eff_n", 0.95), fit, "pinned point inside its interval")
