"""The gap forecast (analysis.predict.gap_forecast) and benchmarks/halves_forecast.py's forecast and comparison."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis.laws import predict
from analysis.predict import LawFit, Point, gap_forecast
from tests.analysis.committed_fits import assert_refit_agrees, refit
from tests.repo_scripts import REPO, load_script

HALVES = REPO / "benchmarks" / "results" / "halves"
BASE = {"A": 300.0, "alpha": 0.4, "B": 2e5, "beta": 0.7, "E": 1.0, "gamma": 0.9}


@pytest.fixture(scope="module")
def script():
    return load_script("benchmarks/halves_forecast.py")


def _planted(n_draws=40):
    """A fit whose refits scatter the base law's A and q_fwd's effN; q_bwd has effD 0.9 in every refit."""
    draws = tuple(({**BASE, "A": BASE["A"] * (0.8 + 0.01 * i)}, {"q_fwd": (0.5 + 0.005 * i, 1.0), "q_bwd": (1.0, 0.9)})
                  for i in range(n_draws))
    return LawFit(params=dict(BASE), effs={"q_fwd": (0.6, 1.0, "converged", ""), "q_bwd": (1.0, 0.9, "converged", "")},
                  draws=draws)


def test_gap_forecast_is_the_laws_difference_with_the_refits_range():
    fit, pt = _planted(), Point(2e7, 1e8)
    g = gap_forecast(fit, pt, "q_fwd")
    assert g["gap"] == pytest.approx(float(predict(BASE, 2e7, 1e8, 0.6, 1.0) - predict(BASE, 2e7, 1e8)))
    assert g["gap"] > 0 and g["draws"] == 40
    lo, hi = g["interval"]
    # the range is over each refit's own difference: effN 0.5-0.7 brackets the point's 0.6
    per_draw = [float(predict(p, 2e7, 1e8, *e["q_fwd"]) - predict(p, 2e7, 1e8)) for p, e in fit.draws]
    assert lo == pytest.approx(pd.Series(per_draw).quantile(0.025)) and hi == pytest.approx(pd.Series(per_draw).quantile(0.975))
    assert lo < g["gap"] < hi
    assert gap_forecast(fit, pt, "bf16")["gap"] == 0.0 and gap_forecast(fit, pt, "bf16")["interval"] == (0.0, 0.0)
    assert gap_forecast(_planted(5), pt, "q_fwd")["interval"] is None  # too few refits for a range
    with pytest.raises(Exception, match="not in the fit"):
        gap_forecast(fit, pt, "nope")


def test_committed_forecast_is_what_its_fit_gives(script):
    committed = json.loads((HALVES / "forecast.json").read_text())
    again = script.make_forecast(HALVES / "forecast_fit.json", ["model=llama_20m"])
    assert [c["run_ids"] for c in again["cells"]] == [c["run_ids"] for c in committed["cells"]]
    for a, b in zip(again["cells"], committed["cells"]):
        assert a["gap"] == pytest.approx(b["gap"]) and a["gap_interval"] == pytest.approx(b["gap_interval"])
        assert a["loss"] == pytest.approx(b["loss"])
    # every run of the stage is a 20.5M run the forecast covers (bf16 partners aside), none already in the fit's data
    fitted = set(json.loads((HALVES / "forecast_fit.json").read_text())["provenance"]["input"]["run_ids"])
    assert all(r.startswith("llama_20m-") and r not in fitted for c in committed["cells"] for r in c["run_ids"])


def test_compare_judges_each_cell_by_its_paired_gap(script):
    f = json.loads((HALVES / "forecast.json").read_text())
    rows = []
    for c in f["cells"]:
        for seed, rid in zip(c["seeds"], c["run_ids"]):
            common = {"n_params": c["n_params"], "tokens": c["tokens"], "seed": seed, "model": c["model"]}
            rows.append({**common, "precision": "bf16", "loss": 2.0 + 0.01 * seed, "run_id": f"b-{seed}-{c['dn']}"})
            rows.append({**common, "precision": c["precision"], "loss": 2.0 + 0.01 * seed + c["gap"], "run_id": rid})
    losses = pd.DataFrame(rows).drop_duplicates(["run_id"])
    out = script.compare(f, losses)
    assert out["gaps_judged"] == len(f["cells"]) and out["gaps_inside"] == len(f["cells"])
    assert all(r["gap"] == pytest.approx(r["gap_forecast"]) for r in out["cells"])
    # one cell's gap moved beyond its range is judged outside; a cell without runs is not judged
    first = f["cells"][0]
    moved = losses.copy()
    moved.loc[moved["run_id"].isin(first["run_ids"]), "loss"] += 1.0
    out = script.compare(f, moved[~moved["run_id"].isin(f["cells"][1]["run_ids"])])
    assert out["cells"][0]["gap_inside"] is False and out["cells"][1]["gap_inside"] is None
    assert out["gaps_judged"] == len(f["cells"]) - 1
    assert "| llama_20m |" in script.render_compare(out)


def test_committed_comparison_is_the_forecast_against_the_committed_runs(script):
    """compare.json is what `halves_forecast.py compare` gives on the committed forecast and losses, and it judged
    every forecast cell (the 20.5M stage trained in full)."""
    f = json.loads((HALVES / "forecast.json").read_text())
    again = script.compare(f, script.load_table(HALVES / "losses.csv"))
    committed = json.loads((HALVES / "compare.json").read_text())
    assert again["gaps_judged"] == committed["gaps_judged"] == len(f["cells"])
    assert again["gaps_inside"] == committed["gaps_inside"]
    for a, b in zip(again["cells"], committed["cells"]):
        assert a["gap"] == pytest.approx(b["gap"]) and a["gap_inside"] == b["gap_inside"]


@pytest.mark.slow
def test_quartet_fit_reproduces_the_forecasts_fit(tmp_path):
    """`quartet fit` on the runs the forecast's fit read (its provenance's run ids: the stage before the 20.5M runs)
    gives forecast_fit.json again, as far as docs/analysis.md's "Reproducibility of refits" says a refit does."""
    saved = json.loads((HALVES / "forecast_fit.json").read_text())
    losses = pd.read_csv(HALVES / "losses.csv")
    before = losses[losses["run_id"].isin(saved["provenance"]["input"]["run_ids"])]
    assert len(before) == len(saved["provenance"]["input"]["run_ids"])
    before.to_csv(tmp_path / "losses.csv", index=False)
    got = refit(tmp_path / "losses.csv", tmp_path / "fit.json", saved, "--bootstrap", "200")
    assert_refit_agrees(got, saved, "halves")


@pytest.mark.slow
def test_quartet_fit_reproduces_the_halves_fit(tmp_path):
    """`quartet fit benchmarks/results/halves/losses.csv --bootstrap 200` (both stages) gives fit.json again."""
    saved = json.loads((HALVES / "fit.json").read_text())
    got = refit(HALVES / "losses.csv", tmp_path / "fit.json", saved, "--bootstrap", "200")
    assert_refit_agrees(got, saved, "halves")
