"""benchmarks/recipes_check.py: the fast recipe paths' re-trained runs paired with the recipe table's runs by id."""
from __future__ import annotations

import math

import pytest

from analysis.load import load_table
from tests.repo_scripts import REPO, load_script

RECIPES = REPO / "benchmarks" / "results" / "recipes"


@pytest.fixture(scope="module")
def check():
    return load_script("benchmarks/recipes_check.py")


@pytest.fixture(scope="module")
def committed(check):
    return check.load_check_runs(RECIPES / "check_runs.tar.gz"), load_table(RECIPES / "compiled_losses.csv")


def test_committed_check_pairs_every_run_with_the_tables_run_of_its_id(check, committed):
    fast, table = committed
    out, pooled = check.compare(fast, table)
    assert pooled["pairs"] == len(fast) == 21
    assert sorted(out["recipe"]) == sorted(fast["precision"].unique())
    assert (out["seeds"] == 3).all()
    # the band is the stated 95% band of a difference of two three-seed means of the table's paired gap
    row = out.iloc[0]
    assert row["band"] == pytest.approx(2 * row["noise_sd"] * math.sqrt(2 / 3))
    # the committed check.md is what the script writes from the committed runs
    assert (RECIPES / "check.md").read_text() == check.render(out, pooled)


def test_a_shift_beyond_the_band_is_judged_and_a_foreign_run_refused(check, committed):
    fast, table = committed
    shifted = fast.copy()
    shifted.loc[shifted["precision"] == "mxfp8", "loss"] += 0.5
    shifted.loc[shifted["precision"] == "nvfp4", "loss"] -= 0.5
    out, _ = check.compare(shifted, table)
    verdict = dict(zip(out["recipe"], out["verdict"]))
    assert verdict["mxfp8"] == "fast path higher" and verdict["nvfp4"] == "fast path lower"
    foreign = fast.copy()
    foreign.loc[0, "run_id"] = "llama_7m-dn5-mxfp8-s9-00000000"
    with pytest.raises(SystemExit, match="not in the table"):
        check.compare(foreign, table)
