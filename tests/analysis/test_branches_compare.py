"""benchmarks/branches_compare.py: the paired branch / independent / cosine comparison behind docs/branches.md."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from committed_fits import assert_refit_agrees, refit

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "branches"


def _table(shift_q: float = 0.0, noise: float = 0.01) -> pd.DataFrame:
    """Two budgets of one size, bf16 and quartet; three seeds at the first budget."""
    rows = []
    for tokens, base in ((1e7, 3.0), (4e7, 2.5)):
        for seed in ((0, 1, 2) if tokens == 1e7 else (0,)):
            for prec, gap in (("bf16", 0.0), ("quartet", 0.1 + shift_q)):
                rows.append({"n_params": 1e6, "tokens": tokens, "model": "m", "precision": prec, "seed": seed,
                             "loss": base + gap + noise * (seed - 1), "run_id": f"m-{tokens:.0f}-{prec}-s{seed}"})
    df = pd.DataFrame(rows)
    df["dn"] = (df["tokens"] / df["n_params"]).round().astype(int)
    return df


def test_identical_sets_compare_at_zero_and_a_shift_is_measured_in_noise_units(branches_compare):
    bc = branches_compare
    same = bc.compare({"branches": _table(), "independent": _table(), "cosine": _table(shift_q=0.05)})
    loss = same[same["quantity"] == "loss"]
    assert (loss["diff_bi"] == 0).all() and (loss["verdict_bi"] == "within noise").all()
    q = loss[(loss["precision"] == "quartet")]
    # sd over seeds 0, 1, 2 of loss + 0.01 * (seed - 1) is 0.01 in every set: a difference's noise is sqrt(2) * 0.01
    assert q["noise_bc"].tolist() == pytest.approx([math.sqrt(2) * 0.01] * len(q))
    assert q["z_bc"].tolist() == pytest.approx([-0.05 / (math.sqrt(2) * 0.01)] * len(q))
    assert set(q["verdict_bc"]) == {"outside noise"}
    gap = same[same["quantity"] == "gap"]
    assert len(gap) == 4 and gap["diff_bc"].tolist() == pytest.approx([-0.05] * 4)
    assert (gap["noise_bc"] == 0).all() and gap["verdict_bc"].eq("noise not measured").all()  # gaps without spread


def test_the_cosine_cut_keeps_the_same_runs_and_refuses_a_missing_one(branches_compare, tmp_path):
    bc = branches_compare
    ladder = _table(shift_q=0.05)
    extra = ladder.assign(model="other")
    pd.concat([ladder, extra]).drop(columns="dn").to_csv(tmp_path / "ladder.csv", index=False)
    _table().drop(columns="dn").to_csv(tmp_path / "like.csv", index=False)
    cut = bc.cut_cosine(tmp_path / "ladder.csv", tmp_path / "like.csv", tmp_path / "cut.csv")
    assert len(cut) == len(_table()) and set(cut["model"]) == {"m"}
    ladder.drop(index=0).drop(columns="dn").to_csv(tmp_path / "short.csv", index=False)
    with pytest.raises(SystemExit, match="have no row"):
        bc.cut_cosine(tmp_path / "short.csv", tmp_path / "like.csv", tmp_path / "cut2.csv")


def test_gpu_time_counts_a_branch_only_for_its_decay(branches_compare, tmp_path):
    bc = branches_compare
    runs = {"trunk": {"role": "trunk", "save_steps": [80]}, "b": {"role": "branch", "trunk": "trunk", "step": 80},
            "plain": None}
    for rid, branch in runs.items():
        (tmp_path / "g" / rid).mkdir(parents=True)
        (tmp_path / "g" / rid / "summary.json").write_text(json.dumps(
            {"run_id": rid, "tokens": 1000, "steps": 100, "wall_clock_s": 10.0, "branch": branch}))
    out = bc.gpu_time([tmp_path / "g"], None).iloc[0]
    assert (out["runs"], out["trunks"], out["branches"]) == (3, 1, 1)
    assert out["tokens_trained"] == pytest.approx(1000 + 200 + 1000)
    assert out["wall_clock_s"] == 30.0 and out["branch_wall_clock_s"] == 10.0


@pytest.mark.skipif(not (RESULTS / "comparison.csv").is_file(), reason="the committed branch results")
def test_committed_comparison_reproduces_from_the_committed_tables(branches_compare):
    """`python benchmarks/branches_compare.py compare --csv ...` on the three committed tables = comparison.csv."""
    bc = branches_compare
    tables = {name: bc.read_table(RESULTS / f"losses_{name}.csv") for name in bc.SETS}
    ours = bc.compare(tables)
    committed = pd.read_csv(RESULTS / "comparison.csv")
    assert len(ours) == len(committed) == 39  # 26 runs + 13 paired gaps
    for col in ("branches", "independent", "cosine", "diff_bi", "z_bi", "diff_bc", "z_bc", "diff_ic", "z_ic"):
        assert ours[col].tolist() == pytest.approx(committed[col].tolist(), rel=1e-5, abs=1e-6), col
    assert ours["verdict_bi"].tolist() == committed["verdict_bi"].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["branches", "independent", "cosine"])
def test_quartet_fit_reproduces_the_committed_branch_fits(name, tmp_path):
    """Each set's `quartet fit losses_<set>.csv --bootstrap 200` gives its committed fit_<set>.json again (seeded
    bootstrap), as far as docs/analysis.md's "Reproducibility of refits" says a refit on any machine does."""
    saved = json.loads((RESULTS / f"fit_{name}.json").read_text())
    got = refit(RESULTS / f"losses_{name}.csv", tmp_path / "fit.json", saved, "--bootstrap", "200")
    assert_refit_agrees(got, saved, name)
