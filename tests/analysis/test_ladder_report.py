"""analysis.ladder: seed noise, paired gaps judged against it, the report files; and the committed GPU ladder."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from committed_fits import assert_refit_agrees, refit

from analysis.errors import AnalysisError
from analysis.ladder import cell_gaps, loss_table, orders, paired_gaps, seed_noise, write_report
from analysis.load import frame_from_table, load_table

REPO = Path(__file__).resolve().parents[2]
LADDER = REPO / "benchmarks" / "results" / "ladder"


def planted(gap_q=0.1, seed_sd=0.02, reps=((1e6, 10),), seed=0) -> pd.DataFrame:
    """A 2x2 ladder: loss = 10 N^-0.1 D^-0.05 + per-seed noise shared by every precision of that seed (paired)
    + a small independent part; quartet adds ``gap_q``; replicated cells get seeds 1 and 2."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in (1e6, 4e6):
        for r in (10, 40):
            seeds = (0, 1, 2) if (n, r) in reps else (0,)
            for s in seeds:
                shared = rng.normal(0, seed_sd)
                for prec, fw, bw, extra in (("bf16", "bf16", "bf16", 0.0), ("fp8", "fp8", "fp8", 0.0),
                                            ("quartet", "quest", "rtn_absmax", gap_q)):
                    loss = 10 * n ** -0.1 * (n * r) ** -0.05 + shared + extra + rng.normal(0, seed_sd / 4)
                    rows.append({"n_params": n, "tokens": n * r, "forward": fw, "backward": bw, "loss": loss,
                                 "seed": s, "model": f"m{int(n / 1e6)}", "precision": prec, "steps": 1000})
    return frame_from_table(pd.DataFrame(rows))


def test_paired_gaps_use_only_matching_seeds():
    df = planted()
    gaps = paired_gaps(df)
    assert set(gaps["precision"]) == {"fp8", "quartet"}
    rep = gaps[(gaps["model"] == "m1") & (gaps["tokens"] == 1e7) & (gaps["precision"] == "quartet")]
    assert sorted(rep["seed"]) == [0, 1, 2]
    # the shared per-seed noise cancels in a paired gap: it is close to the planted 0.1
    assert rep["gap"].mean() == pytest.approx(0.1, abs=0.03)


def test_noise_and_verdicts_follow_the_planted_gap():
    df = planted(gap_q=0.1, seed_sd=0.02)
    noise = seed_noise(df)
    q = noise[noise["precision"] == "quartet"].iloc[0]
    assert q["seeds"] == 3 and q["loss_sd"] > q["gap_sd"]  # pairing removes the shared seed noise
    gaps = cell_gaps(df, noise=noise)
    qg = gaps[gaps["precision"] == "quartet"]
    assert (qg["verdict"] == "above noise").all() and (qg["margin"] > 0).all()
    # m4 has no replicated cell: judged against the largest noise measured at any size
    assert set(qg[qg["model"] == "m4"]["noise_from"]) == {"largest of all sizes"}
    assert set(qg[qg["model"] == "m1"]["noise_from"]) == {"this size, D/N 10"}
    none = cell_gaps(planted(gap_q=0.0, seed_sd=0.02))
    assert not (none[none["precision"] == "quartet"]["verdict"] == "above noise").all()


def test_orders_and_errors():
    df = planted()
    assert orders(df) == {"falls_with_n": True, "falls_with_d": True}
    flipped = df.copy()
    flipped.loc[(flipped["precision"] == "bf16") & (flipped["n_params"] == 4e6), "loss"] += 5
    assert orders(flipped)["falls_with_n"] is False
    with pytest.raises(AnalysisError, match="2 or more seeds"):
        seed_noise(df[df["seed"] == 0])
    with pytest.raises(AnalysisError, match="no 'bf16' runs"):
        seed_noise(df[df["precision"] != "bf16"])


def test_write_report_files(tmp_path):
    paths = write_report(planted(), tmp_path, curves=False)
    names = {p.name for p in paths}
    assert {"losses.csv", "noise.csv", "gaps.csv", "ladder.md", "ladder_losses.png", "ladder_gaps.png"} <= names
    table = pd.read_csv(tmp_path / "losses.csv")
    assert list(table.columns[:8]) == ["n_params", "tokens", "forward", "backward", "loss", "seed", "model",
                                       "precision"]
    assert "above noise" in (tmp_path / "ladder.md").read_text()


def test_committed_ladder_tables_agree_with_its_loss_table(tmp_path):
    """The GPU ladder's committed files are one consistent result: losses.csv -> gaps.csv, and
    `quartet fit benchmarks/results/ladder/losses.csv --bootstrap 200` reproduces the committed fit.json."""
    table = pd.read_csv(LADDER / "losses.csv")
    assert len(table) == 75 and set(table["precision"]) == {"bf16", "fp8", "quartet"}
    assert (table["steps"] >= 500).all()
    gaps = cell_gaps(loss_table(load_table(LADDER / "losses.csv")))
    committed = pd.read_csv(LADDER / "gaps.csv")
    assert np.allclose(gaps["gap"], committed["gap"]) and list(gaps["verdict"]) == list(committed["verdict"])
    fit = json.loads((LADDER / "fit.json").read_text())
    boot = fit["bootstrap"]
    got = refit(LADDER / "losses.csv", tmp_path / "fit.json", fit, "--bootstrap", str(boot["requested"]),
                "--seed", str(boot["seed"]))
    assert_refit_agrees(got, fit, "ladder")


def test_committed_e_profile_agrees_with_its_loss_table():
    """e_profile.csv (the fit refitted at fixed E) is what analysis.report.e_profile computes from losses.csv."""
    from analysis.report import e_profile

    committed = pd.read_csv(LADDER / "e_profile.csv")
    prof = e_profile(load_table(LADDER / "losses.csv"))
    assert list(prof["admissible"]) == list(committed["admissible"])
    for col in ("E", "rms_log_residual", "quartet_effN", "quartet_effD", "fp8_effN"):
        assert np.allclose(prof[col], committed[col], rtol=1e-3), col


def test_noise_is_taken_at_the_nearest_replicated_budget_of_the_size():
    """Noise shrinks with training: a cell is judged by the replicated budget of its size nearest in log D."""
    df = planted(reps=((1e6, 10), (1e6, 40)), seed_sd=0.02)
    # make the long budget's seeds agree closely: its paired-gap noise becomes small
    long = (df["n_params"] == 1e6) & (df["tokens"] == 4e7)
    df.loc[long & (df["precision"] == "quartet"), "loss"] = df.loc[long & (df["precision"] == "bf16"), "loss"].values + 0.1
    gaps = cell_gaps(df)
    q = gaps[(gaps["precision"] == "quartet") & (gaps["model"] == "m1")].set_index("tokens")
    assert q.loc[4e7, "noise_from"] == "this size, D/N 40" and q.loc[1e7, "noise_from"] == "this size, D/N 10"
    assert q.loc[4e7, "noise_sd"] < 1e-9 < q.loc[1e7, "noise_sd"]


def test_sign_test_counts_cells_and_gives_the_binomial_p_value():
    from analysis.ladder import sign_test

    gaps = pd.DataFrame({"precision": ["q"] * 12 + ["f"] * 12,
                         "gap": [0.1] * 12 + [0.01] * 9 + [-0.01] * 3})
    t = sign_test(gaps).set_index("precision")
    assert t.loc["q", "worse_than_base"] == 12 and t.loc["q", "p_two_sided"] == pytest.approx(2 / 4096)
    assert t.loc["f", "worse_than_base"] == 9 and t.loc["f", "p_two_sided"] == pytest.approx(2 * 299 / 4096)
