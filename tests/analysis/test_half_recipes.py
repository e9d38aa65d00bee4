"""Forward-only / backward-only runs, the two interval kinds, the consistency check and the rung rule, on planted
laws: losses drawn from a known law with known effN / effD and log-normal noise."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis.laws import predict
from analysis.report import HALF_SUFFIXES, fit_all, rung_rule
from analysis.verdict import PINNED_WIDTH, at_bound, pinned, verdict

PLANTED = {"A": 150.0, "alpha": 0.35, "B": 2000.0, "beta": 0.4, "E": 1.2, "gamma": 1.0}
SIZES = (3e6, 6e6, 1.2e7, 2.4e7)
RATIOS = (10.0, 20.0, 40.0, 80.0)
#: precision -> (forward label, backward label, effN, effD): recipe "a" and its halves agree (effN 0.7 forward-only,
#: effD 0.8 backward-only, the combined runs at 0.7 x 0.8); recipe "b"'s combined runs cost far more than its halves
HALVES = {"bf16": ("bf16", "bf16", 1.0, 1.0),
          "a_fwd": ("a4", "bf16", 0.7, 1.0), "a_bwd": ("bf16", "a4", 1.0, 0.8), "a": ("a4", "a4", 0.7, 0.8),
          "b_fwd": ("b4", "bf16", 0.9, 1.0), "b_bwd": ("bf16", "b4", 1.0, 0.95), "b": ("b4", "b4", 0.45, 0.6)}


def planted_table(noise: float = 0.003, seed: int = 0, sizes=SIZES, precisions=HALVES) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for name, (fw, bw, en, ed) in precisions.items():
        for n in sizes:
            for r in RATIOS:
                clean = float(predict(PLANTED, n, n * r, en, ed))
                rows.append({"run_id": f"{name}-{n:g}-{r:g}", "n_params": n, "tokens": n * r, "forward": fw,
                             "backward": bw, "precision": name, "loss": clean * float(np.exp(rng.normal(0, noise)))})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def report():
    return fit_all(planted_table(), bootstrap=60, seed=1, forecasts=False)


def test_half_runs_fit_one_efficiency_each_and_recover_the_planted_ones(report):
    fwd, bwd = report.eff("a_fwd"), report.eff("a_bwd")
    assert (fwd.kind, bwd.kind) == ("forward", "backward")
    assert fwd.eff_d == 1.0 and bwd.eff_n == 1.0  # effD = 1 by construction of a forward-only run, and back
    ints = report.intervals("a_fwd")
    for kind in ("full", "base_fixed"):
        lo, hi = ints[kind]["eff_n"]
        assert lo <= 0.7 <= hi, kind
        assert ints[kind]["eff_d"] is None  # forward-only rows constrain effN only
        lo, hi = report.intervals("a_bwd")[kind]["eff_d"]
        assert lo <= 0.8 <= hi and report.intervals("a_bwd")[kind]["eff_n"] is None, kind
    saved = json.loads(report.to_json())
    row = next(e for e in saved["efficiencies"] if e["scheme"] == "a_fwd")
    assert row["eff_d_interval"] is None and row["eff_d_interval_base_fixed"] is None
    assert set(row["verdicts"]) == {"eff_n"} and set(row["verdicts"]["eff_n"]) == {"full", "base_fixed"}
    assert set(saved["bootstrap"]["interval_kinds"]) == {"full", "base_fixed"}
    assert saved["bootstrap"]["pinned_width"] == PINNED_WIDTH


def test_the_interval_with_the_base_law_held_is_no_wider_than_the_full_one(report):
    """Holding the base law at its fit removes its uncertainty from the efficiency's interval."""
    for name, key in (("a_fwd", "eff_n"), ("a_bwd", "eff_d"), ("b_fwd", "eff_n")):
        ints = report.intervals(name)
        full, fixed = ints["full"][key], ints["base_fixed"][key]
        assert fixed[1] - fixed[0] <= full[1] - full[0], (name, full, fixed)


def test_consistency_check_passes_agreeing_halves_and_flags_a_planted_violation(report):
    rows = {c["recipe"]: c for c in report.consistency}
    assert set(rows) == {"a", "b"}
    a, b = rows["a"], rows["b"]
    assert (a["forward_only"], a["backward_only"]) == ("a_fwd", "a_bwd") and a["cells"] == 16
    assert a["verdict"] == "not rejected" and a["interval"][0] <= 0.0 <= a["interval"][1]
    assert abs(a["discrepancy"]) < 0.01
    # b's combined runs were drawn at (0.45, 0.6), its halves at 0.9 and 0.95: they lose more than the halves predict
    assert b["verdict"] == "inconsistent" and b["discrepancy"] > 0.05 and b["interval"][0] > 0
    assert b["observed_gap"] > b["predicted_gap"]


def test_consistency_needs_the_bootstrap_for_a_verdict():
    rep = fit_all(planted_table(), forecasts=False)
    assert {c["verdict"] for c in rep.consistency} == {"no interval"}
    assert all(c["interval"] is None for c in rep.consistency)


def test_halves_pair_by_label_without_names_and_by_name_where_labels_repeat():
    """A table without precision names (the paper's grid) pairs by labels; where two forward-only precisions share
    the recipe's forward label, the one named <recipe>_fwd is its half."""
    t = planted_table(precisions={k: v for k, v in HALVES.items() if k in ("bf16", "a_fwd", "a_bwd", "a")})
    rep = fit_all(t.drop(columns="precision"), forecasts=False)
    (c,) = rep.consistency
    assert (c["recipe"], c["forward_only"], c["backward_only"]) == ("a4", "a4:bf16", "bf16:a4")
    twin = t[t["precision"] == "a_fwd"].assign(precision="other_fwd", run_id=lambda d: d["run_id"] + "x")
    rep = fit_all(pd.concat([t, twin]), forecasts=False)
    (c,) = rep.consistency
    assert c["forward_only"] == "a_fwd"


def test_half_suffixes_are_the_names_quartet_gives_the_variants():
    from quartet.quant.config import HALVES as QUANT_HALVES

    assert {half: suffix for suffix, half in QUANT_HALVES.items()} == HALF_SUFFIXES


def test_verdict_rules():
    assert pinned((0.6, 0.8)) and verdict((0.6, 0.8)) == "pinned"
    assert verdict((0.34, 3.63)) == f"wider than {PINNED_WIDTH:g}"  # off the bounds, and still no measurement
    assert verdict((0.5, 4.0)) == "at a bound" and at_bound((1e-5, 0.2)) and not pinned((1e-5, 0.2))
    assert verdict(None) == "no interval" and verdict((np.nan, 1.0)) == "no interval"
    assert verdict((0.6, 0.8), point=0.01) == "implausible point"
    assert pinned((0.2, 0.9), width=1.0) and not pinned((0.2, 0.9))


def test_rung_rule_drops_a_misfitting_smallest_rung_and_reports_the_fit_with_it():
    """A smallest rung 0.15 nats below the law (as the ladder's 1.0M rung) pulls the base fit off the planted law;
    the rule (default 2e6) leaves it out, names its runs among the dropped, and keeps the fit with it for comparison."""
    sizes = (1e6, *SIZES)
    t = planted_table(sizes=sizes, precisions={k: HALVES[k] for k in ("bf16", "a_fwd")})
    t.loc[t["n_params"] == 1e6, "loss"] -= 0.15
    rep = fit_all(t, forecasts=False)
    rule = rep.rung_rule
    assert rule["applied"] and rule["excluded_sizes"] == [1e6] and rule["excluded_runs"] == 8
    assert sum(d["reason"].startswith("rung rule:") for d in rep.dropped) == 8
    assert rep.base.n_points == 16 and rule["with_excluded"]["base"]["n_points"] == 20
    planted_e = PLANTED["E"]
    assert abs(rep.base.params["E"] - planted_e) < abs(rule["with_excluded"]["base"]["params"]["E"] - planted_e)
    assert abs(rep.eff("a_fwd").eff_n - 0.7) < 0.05
    assert rule["with_excluded"]["efficiencies"]["a_fwd"]["kind"] == "forward"
    off = fit_all(t, forecasts=False, min_params=0)
    assert not off.rung_rule["applied"] and off.base.n_points == 20 and "with_excluded" not in off.rung_rule
    saved = json.loads(rep.to_json())
    assert saved["rung_rule"]["excluded_sizes"] == [1e6] and saved["provenance"]["options"]["min_params"] == 2e6


def test_rung_rule_keeps_every_rung_where_too_few_sizes_would_remain():
    t = planted_table(sizes=(2e5, 4e5, 8e5, 3e6))
    kept, info = rung_rule(t)
    assert len(kept) == len(t) and not info["applied"] and "would leave 1 base size" in info["note"]
    assert rung_rule(t, 0)[1]["note"] == "off"


def test_quartet_fit_prints_both_interval_kinds_the_check_and_the_rule(tmp_path, capsys):
    from analysis.cli import fit_main

    t = planted_table(sizes=(1e6, *SIZES))
    src = tmp_path / "losses.csv"
    t.to_csv(src, index=False)
    out = tmp_path / "fit.json"
    assert fit_main([str(src), "--bootstrap", "12", "--json", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for phrase in ("effN 95% full", "base fixed", "Consistency", "rung rule (min_params 2e+06)", "every rung",
                   "by the rung rule"):
        assert phrase in text, phrase
    saved = json.loads(out.read_text())
    assert {c["recipe"] for c in saved["consistency"]} == {"a", "b"}
    assert fit_main([str(src), "--min-params", "-1"]) == 2
    assert "--min-params must be >= 0" in capsys.readouterr().err
