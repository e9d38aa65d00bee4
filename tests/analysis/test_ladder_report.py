"""analysis.ladder: seed noise, paired gaps judged against it, the report files; and the committed GPU ladder."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.errors import AnalysisError
from analysis.ladder import cell_gaps, loss_table, orders, paired_gaps, seed_noise, write_report
from analysis.load import frame_from_table, load_table
from analysis.report import fit_all

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


def test_committed_ladder_tables_agree_with_its_loss_table():
    """The GPU ladder's committed files are one consistent result: losses.csv -> gaps.csv, and
    `quartet fit benchmarks/results/ladder/losses.csv` reproduces the committed fit.json (point estimates)."""
    table = pd.read_csv(LADDER / "losses.csv")
    assert len(table) == 45 and set(table["precision"]) == {"bf16", "fp8", "quartet"}
    gaps = cell_gaps(loss_table(load_table(LADDER / "losses.csv")))
    committed = pd.read_csv(LADDER / "gaps.csv")
    assert np.allclose(gaps["gap"], committed["gap"]) and list(gaps["verdict"]) == list(committed["verdict"])
    fit = json.loads((LADDER / "fit.json").read_text())
    report = fit_all(load_table(LADDER / "losses.csv"), "busbridge")
    assert report.base.status == fit["base"]["status"]
    for name, value in fit["base"]["params"].items():
        assert report.base.params[name] == pytest.approx(value, rel=1e-6), name
    for e in report.efficiencies:
        saved = next(x for x in fit["efficiencies"] if x["scheme"] == e.scheme)
        assert (e.eff_n, e.eff_d, e.status) == (pytest.approx(saved["eff_n"], rel=1e-6),
                                                pytest.approx(saved["eff_d"], rel=1e-6), saved["status"])
