"""benchmarks/halves_table.py: the recipe law's table from the half runs' fit and the fast paths' speeds."""
from __future__ import annotations

import json

import pytest

from analysis.speed import breakeven_speedup
from tests.repo_scripts import REPO, load_script

HALVES = REPO / "benchmarks" / "results" / "halves"


@pytest.fixture(scope="module")
def table():
    return load_script("benchmarks/halves_table.py")


def test_committed_table_is_what_the_script_writes_and_the_page_shows(table, tmp_path):
    assert table.main(["--out", str(tmp_path), "--docs", ""]) == 0
    written = (tmp_path / "table.md").read_text()
    assert (tmp_path / "halves.png").stat().st_size > 10_000
    assert written == (HALVES / "table.md").read_text()
    page = (REPO / "docs" / "recipes.md").read_text()
    begin, end = f"<!-- {table.PAGE_BLOCK}: begin -->", f"<!-- {table.PAGE_BLOCK}: end -->"
    assert page[page.index(begin) + len(begin) + 1: page.index(end)] == written


def _fit(**halves):
    """A fit JSON with recipes q (both halves fitted, as given) and r (no halves run)."""
    effs = [{"scheme": "q", "kind": "joint", "eff_n": 0.7, "eff_d": 0.9},
            {"scheme": "r", "kind": "joint", "eff_n": 0.5, "eff_d": 1.0}]
    for name, (kind, key, value, verdict) in halves.items():
        effs.append({"scheme": name, "kind": kind, key: value, f"{key}_interval_base_fixed": [value - 0.1, value + 0.1],
                     "verdicts": {key: {"base_fixed": verdict}}})
    return {"base": {"params": {"A": 300.0, "alpha": 0.4, "B": 2e5, "beta": 0.7, "E": 1.0, "gamma": 0.9},
                     "law": "busbridge", "status": "converged"},
            "efficiencies": effs, "headlines": [{"at_n": 2e7, "at_ratio": 20.0}],
            "consistency": [{"recipe": "q", "observed_gap": 0.05, "predicted_gap": 0.04, "verdict": "not rejected"}],
            "provenance": {"options": {"runs": 10, "pinned_width": 0.3}}}


def test_rows_combine_the_two_halves_and_judge_the_speed(table):
    fit = _fit(q_fwd=("forward", "eff_n", 0.6, "pinned"), q_bwd=("backward", "eff_d", 0.95, "pinned"))
    speed = {"rows": [{"config": "bf16:graphs", "step_ms_median": 100.0}, {"config": "q:graphs", "step_ms_median": 50.0},
                      {"config": "r:graphs", "step_ms_median": 200.0}], "device": "test"}
    rows = {r["recipe"]: r for r in table.rows(fit, speed)}
    assert rows["q"]["breakeven"] == pytest.approx(float(breakeven_speedup(fit["base"]["params"], 0.6, 0.95, 2e7, 4e8)))
    assert rows["q"]["speed"] == pytest.approx(2.0) and rows["r"]["speed"] == pytest.approx(0.5)
    assert rows["r"]["eff_n"] is None and rows["r"]["breakeven"] is None
    md = table.markdown(list(rows.values()), fit, "fit.json", speed)
    q_line = next(line for line in md.splitlines() if line.startswith("| `q`"))
    assert "0.600 [0.50, 0.70] pinned" in q_line and "+0.050 / +0.040 (not rejected)" in q_line
    assert q_line.endswith(f"| {rows['q']['breakeven']:.2f}× | 2.00× | yes |")
    assert "| `r` | not run | not run |" in md and "Not run: the halves of `r`" in md
    # a pay-off resting on an efficiency that is not pinned says so
    loose = _fit(q_fwd=("forward", "eff_n", 0.6, "wider than 0.3"), q_bwd=("backward", "eff_d", 0.95, "pinned"))
    assert "yes (an efficiency not pinned)" in table.markdown(table.rows(loose, speed), loose, "fit.json", speed)
