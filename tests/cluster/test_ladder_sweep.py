"""The one-GPU ladder sweep expands to what docs/ladder.md promises, and plans on the GPU pool."""
from __future__ import annotations

from pathlib import Path

from cluster.launch import make_plan
from cluster.spec import expand, load_sweep
from repo_scripts import load_script

#: the staircase of docs/ladder.md: D/N per size
STAIRCASE = {"llama_1m": {"dn10", "dn20", "dn40", "dn80", "dn160"}, "llama_3m": {"dn10", "dn20", "dn40", "dn80"},
             "llama_7m": {"dn5", "dn10", "dn20"}, "llama_20m": {"dn5", "dn10", "dn20"}}


def test_ladder_grid_sizes_budgets_precisions_and_replicates():
    spec = load_sweep("ladder_1gpu")
    runs = expand(spec)
    assert spec.cluster == "local_gpu" and len(runs) == 45 + 30
    grid = {(r.values["model"], r.values["budget"], r.values["precision"]) for r in runs}
    assert {(m, b) for m, b, _ in grid} == {(m, b) for m, bs in STAIRCASE.items() for b in bs}
    assert len(grid) == 45 and {p for _, _, p in grid} == {"bf16", "fp8", "quartet"}
    # three seeds (0, 1, 2) at five cells -- one at every size, and a long budget at the smallest -- for every
    # precision, each replicate with its own data order
    reps = [r for r in runs if r.values.get("run.seed", 0) != 0]
    cells = {(r.values["model"], r.values["budget"]) for r in reps}
    assert cells == {("llama_1m", "dn10"), ("llama_1m", "dn40"), ("llama_3m", "dn10"), ("llama_7m", "dn5"),
                     ("llama_20m", "dn5")}
    assert len(reps) == 30
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
    assert len(sizes) == 4 and 1e6 <= sizes[0] and sizes[-1] <= 5e7
    assert ratios == [5, 10, 20, 40, 80, 160]
    # every run has >= 500 optimizer updates, is compiled and replayed as CUDA graphs on CUDA, and reads the
    # offline code corpus
    for r in plan.runs:
        assert r.steps >= 500, (r.run_id, r.steps)
        assert r.cfg.run.compile and r.cfg.run.compile_mode == "reduce-overhead" and r.cfg.run.device == "cuda"
        assert r.cfg.data.source == "code"
    assert "1 GPU x 6 runs at once" in plan.runs[0].resources.describe(plan.profile)


def test_first_ladder_runs_keep_their_ids():
    """The committed runs of the first ladder (D/N 5-20, compiled without CUDA graphs) are runs of this sweep:
    the compile mode is not part of a run's identity, so a relaunch finds them finished instead of retraining."""
    import csv

    from cluster.launch import make_plan as plan_of

    committed = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "ladder" / "losses.csv"
    with committed.open() as f:
        first = {row["run_id"] for row in csv.DictReader(f)}
    plan = plan_of("ladder_1gpu", None, ["cluster.gpus=1"], "/nonexistent-runs-dir", with_state=False)
    ids = {r.run_id for r in plan.runs}
    kept = {i for i in first if "-dn5-" not in i or i.startswith("llama_7m")}
    assert kept and kept <= ids


def test_lr_probe_sweep_and_its_rule(tmp_path: Path):
    """sweeps/ladder_1m_lr.yaml: llama_1m in bf16 only, 4 LRs x 2 budgets x 3 seeds (each with its data order); the
    rule of benchmarks/ladder_lr_probe.py picks the lowest mean over seeds and budgets, refuses an unfinished
    probe, and rewrites only the model YAML's lr line."""
    import json

    import pytest

    runs = expand(load_sweep("ladder_1m_lr"))
    assert len(runs) == 24 and {r.values["model"] for r in runs} == {"llama_1m"}
    assert {r.values["precision"] for r in runs} == {"bf16"}
    keys = {(r.values["optim.lr"], r.values["budget"], r.values.get("run.seed", 0), r.values.get("run.data_seed"))
            for r in runs}
    assert len(keys) == 24 and {k[0] for k in keys} == {0.003, 0.006, 0.012, 0.024}

    probe = load_script("benchmarks/ladder_lr_probe.py")
    folder = tmp_path / "probe"
    # lr 0.006 is best on average although 0.003 wins at D/N 10
    losses = {(0.003, 10): 3.30, (0.003, 40): 2.40, (0.006, 10): 3.35, (0.006, 40): 2.25}
    for (lr, dn), loss in losses.items():
        for seed in (0, 1, 2):
            run = folder / f"r-{lr}-{dn}-{seed}"
            run.mkdir(parents=True)
            (run / "summary.json").write_text(json.dumps({
                "lr": lr, "tokens_per_param": dn - 0.01, "seed": seed, "val_loss": loss + 0.01 * seed,
                "run_id": run.name, "model": "llama_1m", "precision": "bf16"}))
    lr, table = probe.choose(probe.load_probe(folder))
    assert lr == 0.006 and list(table["seeds_dn10"]) == [3, 3]
    model_yaml = tmp_path / "m.yaml"
    model_yaml.write_text("name: x\nlr: 0.003   # old\nbatch_size: 32\n")
    probe.apply_lr(model_yaml, lr, "probe")
    assert model_yaml.read_text() == "name: x\nlr: 0.006    # probe\nbatch_size: 32\n"
    (folder / "unfinished").mkdir()
    with pytest.raises(SystemExit, match="no summary.json"):
        probe.load_probe(folder)


def test_ladder_takes_the_round_2_recipes_as_extra_precisions(tmp_path: Path):
    """`sweep.axes.precision=[...,quartet2,mxfp8]` expands every ladder cell to the two new schemes too; each run
    composes to its scheme (quartet2 with the paper's 128-Hadamard) under its own run id."""
    from quartet.quant import build_scheme

    extra = ["cluster.gpus=1", "sweep.axes.precision=[bf16,fp8,quartet,quartet2,mxfp8]"]
    plan = make_plan("ladder_1gpu", None, extra, str(tmp_path), with_state=False)
    grid = [r for r in plan.runs if r.cfg.run.seed == 0]
    assert len(grid) == 15 * 5 and len(plan.runs) == 15 * 5 + 30
    for name, fwd, bwd in (("quartet2", "nvfp4_4o6", "ms_eden"), ("mxfp8", "mxfp8", "mxfp8")):
        runs = [r for r in grid if r.precision == name]
        assert len(runs) == 15 and len({r.run_id for r in runs}) == 15
        for r in runs:
            p = r.cfg.precision
            assert (p.name, p.forward, p.backward) == (name, fwd, bwd) and f"-{name}-" in r.run_id
            assert build_scheme(p).name == name
        assert {r.cfg.precision.hadamard_block for r in runs} == ({128} if name == "quartet2" else {32})
    # the three original precisions keep their run ids: adding precisions does not rename finished runs
    base = make_plan("ladder_1gpu", None, ["cluster.gpus=1"], str(tmp_path), with_state=False)
    assert {r.run_id for r in base.runs} <= {r.run_id for r in plan.runs}


def test_ladder_accepts_the_round_2_recipes_as_extra_precisions():
    """nvfp4_recipe and fp8_deepseek join the ladder's precision axis: every run resolves (keep_bf16 checked against
    each size), gets its own id, and the recipe's default BF16 layers travel with its runs."""
    plan = make_plan("ladder_1gpu", None, ["cluster.gpus=1", "sweep.axes.precision=[bf16,nvfp4_recipe,fp8_deepseek]"],
                     "/nonexistent-runs-dir", with_state=False)
    precs = {r.cfg.precision.name for r in plan.runs}
    assert precs >= {"bf16", "nvfp4_recipe", "fp8_deepseek"}  # (+ the seed replicates' include list)
    assert sum(r.cfg.precision.name == "nvfp4_recipe" for r in plan.runs) == 15
    assert len({r.run_id for r in plan.runs}) == len(plan.runs)
    for r in plan.runs:
        assert list(r.cfg.precision.keep_bf16) == (["blocks.-1.*"] if r.cfg.precision.name == "nvfp4_recipe" else [])
        assert f"-{r.cfg.precision.name}-" in r.run_id
