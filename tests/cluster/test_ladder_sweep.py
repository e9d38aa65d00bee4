"""The one-GPU ladder sweep expands to what docs/ladder.md promises, and plans on the GPU pool."""
from __future__ import annotations

from pathlib import Path

from cluster.launch import make_plan
from cluster.spec import expand, load_sweep


def test_ladder_grid_sizes_budgets_precisions_and_replicates():
    spec = load_sweep("ladder_1gpu")
    runs = expand(spec)
    assert spec.cluster == "local_gpu" and len(runs) == 27 + 18
    grid = {(r.values["model"], r.values["budget"], r.values["precision"]) for r in runs}
    assert len(grid) == 27
    assert {p for _, _, p in grid} == {"bf16", "fp8", "quartet"}
    # three seeds (0, 1, 2) at three cells, for every precision, each replicate with its own data order
    reps = [r for r in runs if r.values.get("run.seed", 0) != 0]
    cells = {(r.values["model"], r.values["budget"]) for r in reps}
    assert len(cells) == 3 and len(reps) == 18
    for cell in cells:
        for prec in ("bf16", "fp8", "quartet"):
            seeds = {(r.values["run.seed"], r.values["run.data_seed"]) for r in reps
                     if (r.values["model"], r.values["budget"]) == cell and r.values["precision"] == prec}
            assert seeds == {(1, 1338), (2, 1339)}


def test_ladder_plan_spans_sizes_and_budgets_on_a_faked_gpu(tmp_path: Path):
    plan = make_plan("ladder_1gpu", None, ["cluster.gpus=1", "cluster.workers_per_gpu=6"], str(tmp_path),
                     with_state=False)
    sizes = sorted({r.n_params for r in plan.runs})
    ratios = sorted({round(r.tokens / r.n_params) for r in plan.runs})
    assert len(sizes) == 3 and 1e6 <= sizes[0] and sizes[-1] <= 5e7
    assert len(ratios) == 3 and ratios[-1] / ratios[0] >= 4
    # every run compiles on CUDA and reads the offline code corpus
    for r in plan.runs:
        assert r.cfg.run.compile and r.cfg.run.device == "cuda" and r.cfg.data.source == "code"
    assert "1 GPU x 6 runs at once" in plan.runs[0].resources.describe(plan.profile)
