"""`quartet demo` end to end on a test-sized grid: sweep → fit → figures → report, then reuse.

The shipped demo uses `sweeps/smoke.yaml`; here a 3 × 3 × 2 grid of a few steps each keeps the test
short while going through exactly the same code (local launcher, analysis, figures, report).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from quartet.demo import cli_main

GRID = """\
name: tdemo
cluster: local
axes:
  model: [llama_nano, llama_micro, llama_tiny]
  budget.tokens: [4096, 8192, 16384]
  precision: [bf16, quartet]
fixed:
  budget: tokens
  data: shakespeare_small
  logging: quiet
  run.device: cpu
  model.seq_len: 64
  optim.batch_size: 8
"""


@pytest.mark.slow
def test_demo_pipeline_then_reuse(tmp_path, capsys):
    sweep = tmp_path / "tdemo.yaml"
    sweep.write_text(GRID)
    runs, out = tmp_path / "runs", tmp_path / "results"
    args = ["--sweep", str(sweep), "--runs-dir", str(runs), "--out", str(out), "--bootstrap", "5"]

    assert cli_main(args) == 0
    first = capsys.readouterr().out
    assert "18 to train" in first and f"report: {out / 'report.md'}" in first
    summaries = sorted((runs / "tdemo").glob("*/summary.json"))
    assert len(summaries) == 18
    report = (out / "report.md").read_text()
    # the loss grid has one row per model size and a column per precision x budget
    assert report.count("| llama_") == 3 and "quartet @ 16k tok" in report and "bf16 @ 4k tok" in report
    # the paper reproduction sits beside the study, with the published numbers next to the refit
    assert "| alpha | 0.5886 |" in report and "0.6418 / 0.9435" in report
    for sub in ("study", "paper"):
        pngs = sorted(p.name for p in (out / sub).glob("*.png"))
        assert {"losses.png", "efficiencies.png", "optimal_precision.png"} <= set(pngs)
        assert all((out / sub / p).stat().st_size > 10_000 for p in pngs)
        fit = json.loads((out / sub / "fit.json").read_text())
        assert fit["base"]["status"] in {"converged", "hit_bound", "too_few_points"}
    study_fit = json.loads((out / "study" / "fit.json").read_text())
    assert {e["scheme"] for e in study_fit["efficiencies"]} == {"quartet"}
    for p in ("study/losses.png", "paper/optimal_precision.png"):
        assert f"]({p})" in report

    # Second call: nothing retrains, the unchanged report is reused.
    mtimes = {p: p.stat().st_mtime_ns for p in summaries}
    t0 = time.time()
    assert cli_main(args) == 0
    second = capsys.readouterr().out
    assert "0 to train" in second and "reusing" in second
    assert {p: p.stat().st_mtime_ns for p in summaries} == mtimes
    assert time.time() - t0 < 60

    # A run whose summary disappears is retrained, and the report is rebuilt.
    summaries[0].unlink()
    assert cli_main(args) == 0
    third = capsys.readouterr().out
    assert "1 to train" in third and "reusing" not in third
    assert Path(summaries[0]).exists()
