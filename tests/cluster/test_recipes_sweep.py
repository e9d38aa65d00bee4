"""The recipe-table sweep (sweeps/recipes.yaml) gives every training recipe enough cells to fit its effN and effD,
on the ladder's corpus and conventions, and reuses the ladder's own bf16 / fp8 / quartet runs."""
from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

from cluster.launch import make_plan
from cluster.spec import expand, load_sweep
from quartet.quant.schemes import RECIPES

REPO = Path(__file__).resolve().parents[2]


def test_every_recipe_gets_three_sizes_two_budgets_and_three_seeds_at_one_cell_per_size():
    spec = load_sweep("recipes")
    runs = expand(spec)
    assert spec.cluster == "local_gpu"
    by_recipe = defaultdict(list)
    for r in runs:
        by_recipe[r.values["precision"]].append(r.values)
    assert set(by_recipe) == set(RECIPES)
    for recipe, cells in by_recipe.items():
        seed0 = {(v["model"], v["budget"]) for v in cells if v.get("run.seed", 0) == 0}
        sizes = {m for m, _ in seed0}
        assert len(sizes) >= 3 and all(len({b for m2, b in seed0 if m2 == m}) >= 2 for m in sizes), recipe
        for size in sizes:  # seeds 0-2 at one cell of every size, each replicate with its own data order
            reps = {(v["budget"], v["run.seed"], v["run.data_seed"]) for v in cells
                    if v["model"] == size and v.get("run.seed", 0) != 0}
            assert {(s, d) for _, s, d in reps} == {(1, 1338), (2, 1339)} and len({b for b, _, _ in reps}) == 1, recipe
            assert next(iter(reps))[0] in {b for m, b in seed0 if m == size}
    assert len(runs) == len(RECIPES) * 12


def test_the_ladders_runs_are_the_tables_runs(tmp_path):
    """Same configuration, same run id: the committed ladder's bf16 / fp8 / quartet runs of these cells are found
    finished instead of retrained, and every other recipe trains on the ladder's corpus and compile mode."""
    plan = make_plan("recipes", None, ["cluster.gpus=1"], str(tmp_path), with_state=False)
    with (REPO / "benchmarks" / "results" / "ladder" / "losses.csv").open() as f:
        ladder = {row["run_id"] for row in csv.DictReader(f)}
    ours = {r.run_id for r in plan.runs}
    reused = ours & ladder
    assert len(reused) == 36 and {i.split("-")[2] for i in reused} == {"bf16", "fp8", "quartet"}
    for r in plan.runs:
        assert r.steps >= 500, (r.run_id, r.steps)
        assert r.cfg.data.source == "code" and r.cfg.run.device == "cuda" and r.cfg.run.compile
