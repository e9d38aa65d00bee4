"""`quartet demo` end to end on a test-sized grid: sweep → fit → figures → report, then reuse.

The shipped demo uses `sweeps/demo.yaml` (its full run is the slow test at the end); here a 3 × 2 × 2 grid of a
few steps each, with seeds 1 and 2 at one cell, keeps the tests short while going through exactly the same code
(local launcher, noise and gaps, fit, figures, report). The first call is one module fixture that the three
tests share (it trains and fits once: ~40 s on two idle cores).
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from quartet.cli_demo import cli_main

GRID = """\
name: tdemo
cluster: local
axes:
  model: [llama_nano, llama_micro, llama_tiny]
  budget.tokens: [4096, 8192]
  precision: [bf16, quartet]
fixed:
  budget: tokens
  data: shakespeare_small
  logging: quiet
  run.device: cpu
  model.seq_len: 64
  optim.batch_size: 8
include:
  - {model: llama_micro, budget.tokens: 8192, precision: bf16, run.seed: 1, run.data_seed: 1338}
  - {model: llama_micro, budget.tokens: 8192, precision: bf16, run.seed: 2, run.data_seed: 1339}
  - {model: llama_micro, budget.tokens: 8192, precision: quartet, run.seed: 1, run.data_seed: 1338}
  - {model: llama_micro, budget.tokens: 8192, precision: quartet, run.seed: 2, run.data_seed: 1339}
"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One `quartet demo` call on the test grid, shared by the tests below (each would otherwise train the same
    16 runs and fit them again); they run in this order on one xdist worker (the group mark), and the last one
    changes the runs folder."""
    root = tmp_path_factory.mktemp("tdemo")
    sweep = root / "tdemo.yaml"
    sweep.write_text(GRID)
    runs, out = root / "runs", root / "results"
    args = ["--sweep", str(sweep), "--runs-dir", str(runs), "--out", str(out), "--bootstrap", "3"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli_main(args)
    return SimpleNamespace(code=code, first=buf.getvalue(), args=args, runs=runs, out=out,
                           summaries=sorted((runs / "tdemo").glob("*/summary.json")))


@pytest.mark.xdist_group("demo_pipeline")
def test_demo_pipeline_trains_fits_and_reports(demo):
    first, out = demo.first, demo.out
    assert demo.code == 0, first[-2000:]
    assert "16 to train" in first and f"report: {out / 'report.md'}" in first
    assert "quartet: gap to bf16 above seed noise in" in first
    assert len(demo.summaries) == 16
    report = (out / "report.md").read_text()
    # the verdict comes first, then what ran (data, grid, seeds, time per precision)
    assert report.index("What this tiny study can and cannot tell you") < report.index("## 1. What ran")
    assert "**quartet** is worse than bf16 in" in report and "sign test p =" in report
    assert "vocabulary 512" in report or "vocabulary" in report
    assert "llama_micro @ 8,192 tokens" in report and "| quartet | 8 |" in report
    # loss grid (one row per model size and budget), noise at the replicated cell, gaps with verdicts
    assert report.count("| llama_") >= 6 and "## 3. Seed noise" in report and "verdict" in report
    assert any(v in report for v in ("above noise", "within noise", "below noise"))
    # the paper reproduction sits beside the study, with the published numbers next to the refit
    assert "| alpha | 0.5886 |" in report and "0.6418 / 0.9435" in report
    study_pngs = {p.name for p in (out / "study").glob("*.png")}
    assert {"losses.png", "efficiencies.png", "ladder_gaps.png", "ladder_seed_curves.png"} <= study_pngs
    # no panel extrapolates the tiny law to 1e7-1e11 parameters; the paper refit keeps them
    assert "optimal_precision.png" not in study_pngs and "breakeven.png" not in study_pngs
    assert {"losses.png", "optimal_precision.png"} <= {p.name for p in (out / "paper").glob("*.png")}
    for sub in ("study", "paper"):
        assert all(p.stat().st_size > 10_000 for p in (out / sub).glob("*.png"))
        fit = json.loads((out / sub / "fit.json").read_text())
        assert fit["base"]["status"] in {"converged", "hit_bound", "too_few_points"}
    study_fit = json.loads((out / "study" / "fit.json").read_text())
    assert {e["scheme"] for e in study_fit["efficiencies"]} == {"quartet"}
    for p in ("study/losses.png", "study/ladder_gaps.png", "paper/optimal_precision.png"):
        assert f"]({p})" in report


@pytest.mark.xdist_group("demo_pipeline")
def test_demo_second_call_reuses_everything(demo, capsys):
    """Second call: nothing retrains, the unchanged report is reused."""
    assert demo.code == 0 and len(demo.summaries) == 16
    mtimes = {p: p.stat().st_mtime_ns for p in demo.summaries}
    assert cli_main(demo.args) == 0
    second = capsys.readouterr().out
    assert "0 to train" in second and "reusing" in second
    assert {p: p.stat().st_mtime_ns for p in demo.summaries} == mtimes


@pytest.mark.xdist_group("demo_pipeline")
def test_demo_retrains_a_lost_run_and_leaves_out_stale_ones(demo, capsys):
    """A run whose summary disappears is retrained, and the report is rebuilt; a run the sweep no longer plans
    (left by an earlier version of it) stays out of the study. (Runs last: it changes the shared runs folder.)"""
    import shutil

    assert demo.code == 0 and len(demo.summaries) == 16
    summaries, runs, out = demo.summaries, demo.runs, demo.out
    stale = runs / "tdemo" / "llama_nano-t99k-bf16-s0-deadbeef"
    shutil.copytree(summaries[1].parent, stale)
    meta = json.loads((stale / "summary.json").read_text())
    (stale / "summary.json").write_text(json.dumps({**meta, "run_id": stale.name, "tokens": 99_000}))
    summaries[0].unlink()
    assert cli_main(demo.args) == 0
    third = capsys.readouterr().out
    assert "1 to train" in third and "reusing" not in third
    assert "leaving out 1 run(s)" in third and "99,000" not in (out / "report.md").read_text()
    assert Path(summaries[0]).exists()


@pytest.mark.slow
@pytest.mark.timeout(7200)  # a hang guard: ~7 min idle
def test_the_shipped_demo_measures_a_cost_above_noise(tmp_path, capsys):
    """The full `quartet demo` (sweeps/demo.yaml, 52 runs, ~7 min on 2 cores): its report names a precision whose
    cost exceeds the measured seed noise with the right sign (LUQ-INT4), says for every other precision whether its
    gap is within noise, and calls nothing converged that sits at a bound. A second call reuses everything."""
    runs, out = tmp_path / "runs", tmp_path / "results"
    args = ["--runs-dir", str(runs), "--out", str(out)]
    assert cli_main(args) == 0
    capsys.readouterr()
    report = (out / "report.md").read_text()
    verdicts = report.split("## What this tiny study can and cannot tell you")[1].split("## 1. What ran")[0]
    assert "**luq_int4** is worse than bf16 in" in verdicts
    luq = next(ln for ln in verdicts.splitlines() if ln.startswith("- **luq_int4**"))
    assert luq.endswith("A cost this study measures.")
    for prec in ("fp8", "quartet"):
        line = next(ln for ln in verdicts.splitlines() if ln.startswith(f"- **{prec}**"))
        assert "within noise" in line or "No consistent effect" in line or "clear the noise" in line
    fit = json.loads((out / "study" / "fit.json").read_text())
    if fit["base"]["status"] != "converged":
        assert all(e["status"] != "converged" for e in fit["efficiencies"])
        assert f"**{fit['base']['status']}**" in verdicts
    summaries = {p: p.stat().st_mtime_ns for p in runs.rglob("summary.json")}
    assert cli_main(args) == 0
    assert "reusing" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in runs.rglob("summary.json")} == summaries  # nothing retrained
