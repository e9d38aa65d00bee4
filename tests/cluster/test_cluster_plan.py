"""Grid expansion, run ids, plans, profiles, claims and the dry-run CLI: no trainer, no Slurm."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster import runstate
from cluster.launch import cli_main as sweep_main
from cluster.launch import make_plan, split_overrides
from cluster.plan import build_plan
from cluster.profiles import available_profiles, gpu_hours, load_profile, resources_for
from cluster.spec import expand, load_sweep
from cluster.status import cli_main as status_main
from quartet.errors import ConfigError, QuartetError

TINY = """
name: {name}
cluster: local
axes:
  budget.tokens_per_param: [1, 2]
  precision: [bf16]
  run.seed: [0, 1]
fixed:
  model: llama_nano
  budget: demo
  data: shakespeare_small
  logging: quiet
  run.device: cpu
exclude:
  - {{budget.tokens_per_param: 2, run.seed: 1}}
include:
  - {{budget.tokens_per_param: 3, precision: bf16, run.seed: 0}}
"""


def write_sweep(tmp_path: Path, name: str = "tiny", body: str = TINY) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(body.format(name=name))
    return path


def test_expand_grid_exclude_include(tmp_path):
    spec = load_sweep(str(write_sweep(tmp_path)))
    runs = expand(spec)
    labels = [r.label for r in runs]
    assert labels == [
        "budget.tokens_per_param=1 precision=bf16 run.seed=0",
        "budget.tokens_per_param=1 precision=bf16 run.seed=1",
        "budget.tokens_per_param=2 precision=bf16 run.seed=0",
        "budget.tokens_per_param=3 precision=bf16 run.seed=0",
    ]
    # fixed overrides come first so group selections apply before key edits
    assert runs[0].overrides[:2] == ("model=llama_nano", "budget=demo")


def test_shipped_sweeps_load_and_sizes():
    sizes = {name: len(expand(load_sweep(name))) for name in ("paper_grid", "paper_baselines", "paper_7b", "smoke")}
    assert sizes["paper_grid"] == 4 * 6 * 5
    assert sizes["smoke"] >= 27  # >= 3 sizes x 3 budgets x 3 precisions
    assert sizes["paper_7b"] == 2


def test_docs_list_every_shipped_sweep_with_its_size():
    """docs/cluster.md's table of shipped sweeps: every file of sweeps/ once, with its number of runs (a sweep of
    budget branches adds one trunk per group to its grid, which the plan builds)."""
    import re

    from cluster.spec import available_sweeps, branch_mode

    text = (Path(__file__).resolve().parents[2] / "docs" / "cluster.md").read_text()
    table = dict(re.findall(r"^\| `(\w+)` \| (\d+) \|", text.split("Shipped sweeps:")[1].split("\n\n")[1], re.M))
    assert sorted(table) == available_sweeps()
    for name, runs in table.items():
        spec = load_sweep(name)
        if branch_mode(spec.branches) != "trunk":
            assert len(expand(spec)) == int(runs), name


def test_sweep_errors_are_one_line(tmp_path):
    bad = write_sweep(tmp_path, "bad", "name: bad\naxes:\n  precision: bf16\n")
    with pytest.raises(ConfigError, match=r"axes.precision must be a non-empty list"):
        load_sweep(str(bad))
    typo = write_sweep(tmp_path, "typo", "name: typo\naxis:\n  precision: [bf16]\n")
    with pytest.raises(ConfigError) as err:
        load_sweep(str(typo))
    assert "axis" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="not found"):
        load_sweep("no_such_sweep")


def test_only_stages_a_sweep_with_the_full_sweeps_run_ids(tmp_path, capsys):
    path = str(write_sweep(tmp_path))
    full = make_plan(path, "local", [], str(tmp_path / "runs"), with_state=False)
    ids = {r.point.values["budget.tokens_per_param"]: [] for r in full.runs}
    for r in full.runs:
        ids[r.point.values["budget.tokens_per_param"]].append((r.point.values["run.seed"], r.run_id))
    # the include (tokens_per_param 3) is filtered as the grid is; run.seed 0 of that include comes from its point
    stage = make_plan(path, "local", ["sweep.only.budget.tokens_per_param=[2,3]"], str(tmp_path / "runs"),
                      with_state=False)
    assert sorted(r.run_id for r in stage.runs) == sorted(i for _, i in ids[2] + ids[3])
    # a key that only `fixed` sets is matched against fixed's value
    with pytest.raises(ConfigError, match="only model=llama_tiny matches no run"):
        expand(load_sweep(path, ["only.model=[llama_tiny]"]))
    assert len(expand(load_sweep(path, ["only.model=[llama_nano]"]))) == len(full.runs)
    seed1 = make_plan(path, "local", ["sweep.only.run.seed=[1]"], str(tmp_path / "runs"), with_state=False)
    assert [r.run_id for r in seed1.runs] == [i for s, i in ids[1] + ids[2] if s == 1]
    # the CLI's --only, and its one line for a malformed item
    assert sweep_main([path, "--cluster", "local", "--runs-dir", str(tmp_path / "runs"), "--dry-run",
                       "--only", "budget.tokens_per_param=3"]) == 0
    assert "1 runs: 1 new" in capsys.readouterr().out
    assert sweep_main([path, "--cluster", "local", "--dry-run", "--only", "run.seed"]) == 2
    assert "--only 'run.seed': expected KEY=V1,V2" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="only.model must be a non-empty list"):
        load_sweep(path, ["only.model=llama_nano"])
    # a value that matches no run is a typo, not an empty stage; branches' trunks would change under a stage
    with pytest.raises(ConfigError, match="only run.seed=7 matches no run"):
        expand(load_sweep(path, ["only.run.seed=[1,7]"]))
    with pytest.raises(ConfigError, match="cannot be used with branches"):
        load_sweep(path, ["only.run.seed=[1]", "branches=true"])


def test_sweep_overrides_and_routing(tmp_path):
    sweep, cluster, run = split_overrides(["sweep.axes.run.seed=[5]", "cluster.partition=gpu", "optim.lr=0.01"])
    assert sweep == ["axes.run.seed=[5]"] and cluster == ["partition=gpu"] and run == ["optim.lr=0.01"]
    with pytest.raises(QuartetError):
        split_overrides(["oops"])


def test_plan_ids_stable_and_dirs(tmp_path):
    path = str(write_sweep(tmp_path))
    a = make_plan(path, "local", [], str(tmp_path / "runs"))
    b = make_plan(path, "local", [], str(tmp_path / "runs"))
    assert [r.run_id for r in a.runs] == [r.run_id for r in b.runs]
    assert len({r.run_id for r in a.runs}) == len(a.runs) == 4
    for r in a.runs:
        assert r.run_dir == tmp_path / "runs" / "tiny" / r.run_id
        assert r.run_id.startswith("llama_nano-dn") and r.state == "new"
        assert r.flops == 6 * r.n_params * r.tokens
    # a run-level override changes the id (different experiment) ...
    c = make_plan(path, "local", ["optim.lr=0.01"], str(tmp_path / "runs"))
    assert {r.run_id for r in c.runs}.isdisjoint({r.run_id for r in a.runs})
    # ... a cluster-only change does not
    d = make_plan(path, "slurm_local", ["cluster.partition=other"], str(tmp_path / "runs"))
    assert [r.run_id for r in d.runs] == [r.run_id for r in a.runs]


def test_precision_variants_share_seeds(tmp_path):
    body = TINY.replace("precision: [bf16]", "precision: [bf16, fp8]")
    spec = load_sweep(str(write_sweep(tmp_path, "p", body)))
    plan = build_plan(spec, load_profile("local"), tmp_path / "runs")
    by_budget = {}
    for r in plan.runs:
        by_budget.setdefault((r.point.values["budget.tokens_per_param"], r.cfg.run.seed), []).append(r)
    for runs in by_budget.values():
        assert len({(r.cfg.run.seed, r.cfg.run.data_seed) for r in runs}) == 1


def test_bad_run_names_run_and_key_and_nothing_written(tmp_path, capsys):
    body = TINY.replace("precision: [bf16]", "precision: [bf16, no_such_precision]")
    path = write_sweep(tmp_path, "badrun", body)
    runs = tmp_path / "runs"
    code = sweep_main([str(path), "--cluster", "local", "--runs-dir", str(runs)])
    err = capsys.readouterr().err
    assert code == 2
    assert "no_such_precision" in err and "precision" in err and "nothing was submitted" in err
    assert "run [" in err
    assert not runs.exists()
    # a bad key in one run only
    code = sweep_main([str(write_sweep(tmp_path)), "--runs-dir", str(runs), "optim.no_such_key=1"])
    assert code == 2 and "no_such_key" in capsys.readouterr().err and not runs.exists()


def test_profiles_and_resources():
    assert {"local", "slurm_blackwell", "slurm_hopper"} <= set(available_profiles())
    bw = load_profile("slurm_blackwell", ["partition=gpu", "account=abc", "time_min=60"])
    assert bw.partition == "gpu" and bw.account == "abc" and bw.gpu_type == "b200"
    small, big = resources_for(bw, 3.0e7), resources_for(bw, 6.5e9)
    assert small.gpus == 1 and small.time_min == 240
    assert big.nodes == 4 and big.tasks_per_node == 8 and big.gpus == 32
    # the documented estimate: 6ND / (peak * mfu) seconds
    assert gpu_hours(bw, 1e8, 1e10, "bf16") == pytest.approx(6e18 / (2.25e15 * 0.35) / 3600)
    with pytest.raises(ConfigError, match="kind"):
        load_profile("local", ["kind=k8s"])
    with pytest.raises(ConfigError, match="not found"):
        load_profile("nope")


def test_site_profile_by_path(tmp_path):
    site = tmp_path / "mysite.yaml"
    site.write_text("kind: slurm\npartition: big\ngpu_type: gb200\ngpus_per_node: 4\n"
                    "resources:\n  - {max_params: .inf, gpus: 8, nodes: 2}\n")
    prof = load_profile(str(site))
    res = resources_for(prof, 1e9)
    assert prof.name == "mysite" and res.nodes == 2 and res.gpus_per_node == 4


def test_arrays_split_by_shape_and_max_array_size(tmp_path):
    spec = load_sweep(str(write_sweep(tmp_path)))
    prof = load_profile("slurm_local", ["max_array_size=3"])
    plan = build_plan(spec, prof, tmp_path / "runs", with_state=False)
    arrays = plan.arrays(plan.runs)
    assert [len(m) for _, m in arrays] == [3, 1]


def test_claims_are_exclusive_and_stale_ones_break(tmp_path):
    d = tmp_path / "run"
    assert runstate.try_claim(d, {"scheduler": "local"}, None)
    assert not runstate.try_claim(d, {"scheduler": "local"}, None)  # we are alive: held
    # a claim of a dead local process is stale
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    runstate.atomic_write_text(d / runstate.CLAIM, json.dumps(
        {"pid": dead.pid, "host": socket.gethostname(), "time": time.time(), "scheduler": "local"}))
    assert runstate.try_claim(d, {"scheduler": "local"}, None)
    # Slurm claims: alive while the job is in the queue, stale once it left
    runstate.atomic_write_text(d / runstate.CLAIM, json.dumps(
        {"pid": 1, "host": "elsewhere", "time": time.time(), "scheduler": "slurm", "job_id": "7_1"}))
    assert not runstate.try_claim(d, {}, {"7_1": "RUNNING"})
    assert not runstate.try_claim(d, {}, None)  # cannot ask squeue: trust the claim
    assert runstate.try_claim(d, {}, {"8": "RUNNING"})
    assert not list(d.glob(".claim.stale.*"))


def test_concurrent_claims_one_winner(tmp_path):
    """Many processes race for the same stale claim: exactly one wins."""
    d = tmp_path / "run"
    d.mkdir()
    runstate.atomic_write_text(d / runstate.CLAIM, json.dumps(
        {"pid": 2**22 + 12345, "host": socket.gethostname(), "time": time.time(), "scheduler": "local"}))
    code = ("import sys, time; from cluster import runstate; time.sleep(0.3 - time.time() % 0.3); "
            f"won = runstate.try_claim({str(d)!r}, {{}}, None); print(int(won), flush=True); "
            # a winner stays alive past the race: a claim whose process has exited is rightly stale
            "time.sleep(3 if won else 0)")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env) for _ in range(6)]
    wins = [int(p.communicate()[0].strip() or 0) for p in procs]
    assert sum(wins) == 1


def test_inspect_states_and_reconcile(tmp_path):
    d = tmp_path / "sweep" / "r1"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("x: 1\n")
    assert runstate.inspect(d).state == "new"
    runstate.write_state(d, state="running", step=3, total_steps=10, job_id="42")
    (d / "metrics.jsonl").write_text(json.dumps({"step": 4, "loss": 2.5, "tokens_per_s": 100.0}) + "\n{partial")
    # no claim: somebody ran it by hand; we do not touch it
    v = runstate.inspect(d)
    assert v.state == "running" and v.step == 4 and v.loss == 2.5
    # a claim whose holder is gone: recorded as failed, resumable
    runstate.atomic_write_text(d / runstate.CLAIM, json.dumps(
        {"pid": 2**22 + 4321, "host": socket.gethostname(), "time": time.time(), "scheduler": "local"}))
    v = runstate.inspect(d)
    assert v.state == "failed" and "relaunch resumes" in v.error
    assert runstate.read_json(d / "state.json")["state"] == "failed"
    (d / "summary.json").write_text(json.dumps({"val_loss": 1.5, "steps": 10}))
    v = runstate.inspect(d)
    assert v.state == "completed" and v.loss == 1.5


def test_dry_run_paper_grid_blackwell(tmp_path, capsys):
    runs = tmp_path / "runs"
    code = sweep_main(["paper_grid", "--cluster", "slurm_blackwell", "--dry-run", "--runs-dir", str(runs),
                       "cluster.max_array_size=1001"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "120 runs" in out and "GPU-hours" in out and "job arrays" in out
    assert "gpu:b200:4" in out and "gpu:b200:1" in out  # two resource shapes
    assert "llama_200m-dn800-quartet-s0-" in out
    assert "dry run: nothing written" in out
    assert not runs.exists()


def test_status_cli(tmp_path, capsys):
    group = tmp_path / "runs" / "s"
    (group / "a").mkdir(parents=True)
    runstate.write_state(group / "a", state="failed", error="ValueError: boom", step=3, total_steps=9)
    (group / "a" / "config.yaml").write_text("x: 1\n")
    (group / "b").mkdir()
    (group / "b" / "config.yaml").write_text("x: 1\n")
    (group / "b" / "summary.json").write_text(json.dumps({"val_loss": 3.25, "steps": 9, "tokens_per_s": 1000}))
    assert status_main(["s", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "2 runs: 1 failed, 1 completed" in out and "ValueError: boom" in out and "3.2500" in out
    assert status_main(["nope", "--runs-dir", str(tmp_path / "runs")]) == 1


def test_slurm_profile_without_slurm_submits_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch / squeue
    runs = tmp_path / "runs"
    assert sweep_main([str(write_sweep(tmp_path)), "--cluster", "slurm_local", "--runs-dir", str(runs)]) == 2
    assert "needs Slurm" in capsys.readouterr().err
    assert not runs.exists()


# ------------------------------------------------------------------ corrupt run files, misspelled sweeps


def _planned_dirs(tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    sweep, runs = write_sweep(tmp_path), tmp_path / "runs"
    plan = make_plan(str(sweep), None, [], str(runs), with_state=False)
    return sweep, runs, [r.run_dir for r in plan.runs]


def test_corrupt_summary_is_reported_and_not_relaunched(tmp_path, capsys):
    """summary.json that is not JSON: status used to show the run as `new` and a launch retrained it; now
    status names the file (exit 1) and the launch submits nothing (exit 2), the run directory untouched."""
    sweep, runs, dirs = _planned_dirs(tmp_path)
    d = dirs[0]
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("x: 1\n")
    runstate.write_state(d, state="completed", step=9, total_steps=9)
    (d / "summary.json").write_text('{"val_loss": 3.2')
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    assert runstate.inspect(d).state == "corrupt"

    assert status_main(["tiny", "--runs-dir", str(runs)]) == 1
    out, err = capsys.readouterr()
    assert "1 runs: 1 corrupt" in out and " new" not in out
    assert err.strip() == (f"quartet status: error: run {d.name}: {d / 'summary.json'} is corrupt (not a JSON "
                           f"object); restore it, or delete it to train the run again")

    for extra in (["--dry-run"], []):
        assert sweep_main([str(sweep), "--runs-dir", str(runs), *extra]) == 2
        out, err = capsys.readouterr()
        assert "corrupt" in out  # the plan table shows it
        assert err.count("\n") == 1 and f"{d / 'summary.json'} is corrupt" in err and "nothing was submitted" in err
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # no claim, state still completed
    assert all(not p.exists() for p in dirs[1:])



def test_summary_with_a_negative_val_loss_is_invalid_not_completed(tmp_path, capsys):
    """summary.json whose val_loss is negative (no cross-entropy can be): status listed the run as completed while
    `quartet fit` drops it; now status shows it `invalid` with the reason (exit 1, named on stderr), and the plan
    neither counts it done nor submits it again."""
    sweep, runs, dirs = _planned_dirs(tmp_path)
    d = dirs[0]
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("x: 1\n")
    runstate.write_state(d, state="completed", step=9, total_steps=9)
    (d / "summary.json").write_text(json.dumps({"val_loss": -0.5, "steps": 9}))
    view = runstate.inspect(d)
    assert view.state == "invalid" and "val_loss is -0.5" in view.error

    assert status_main(["tiny", "--runs-dir", str(runs)]) == 1
    out, err = capsys.readouterr()
    assert "1 runs: 1 invalid" in out and "completed" not in out
    assert err.startswith(f"quartet status: error: run {d.name}: ") and "val_loss is -0.5" in err
    plan = make_plan(str(sweep), None, [], str(runs))
    run = next(r for r in plan.runs if r.run_dir == d)
    assert run.state == "invalid" and not run.to_submit

def test_a_train_that_cannot_be_checked_from_here_is_running_not_new(tmp_path, capsys):
    """state.json says running, written by a standalone `quartet train` (no claim) on another host: its process
    and lock cannot be checked from here. The plan used to call it `new`, so a launch claimed it, rewrote its
    state.json to pending and submitted it (the train lock then refused it at train time, at best); now the plan
    shows it running and submits only the others."""
    sweep, runs, dirs = _planned_dirs(tmp_path)
    d = dirs[0]
    d.mkdir(parents=True)
    runstate.write_state(d, state="running", step=3, total_steps=9, host="gpu-node-7", pid=4242, pid_start=1,
                         run_id=d.name, job_id=None)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    plan = make_plan(str(sweep), None, [], str(runs))
    run = next(r for r in plan.runs if r.run_dir == d)
    assert run.view.state == "running" and not run.view.live
    assert run.state == "running" and not run.to_submit and run not in plan.pending()
    assert sweep_main([str(sweep), "--runs-dir", str(runs), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "1 running" in out and f"{len(dirs) - 1} new" in out
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # no claim, state.json untouched


def test_job_entry_on_corrupt_files_names_them(tmp_path):
    """The Slurm / local job entry (cluster.task.execute_run): a config.yaml that is not UTF-8 or not YAML
    used to fail as a bare UnicodeDecodeError / yaml ParserError; a corrupt summary.json got retrained."""
    from cluster.task import execute_run

    _, _, dirs = _planned_dirs(tmp_path)
    for d, blob, what in ((dirs[0], b"\xff\xfe model: x\n", "not UTF-8"), (dirs[1], b"model: [x\n", "not valid YAML")):
        d.mkdir(parents=True)
        (d / "config.yaml").write_bytes(blob)
        with pytest.raises(QuartetError, match=what) as info:
            execute_run(d, "123")
        assert str(d / "config.yaml") in str(info.value) and "\n" not in str(info.value)
        state = runstate.read_json(d / "state.json")
        assert state["state"] == "failed" and state["error"].startswith(f"ConfigError: {d / 'config.yaml'}: {what}")
        assert (d / "config.yaml").read_bytes() == blob
    d = dirs[2]
    d.mkdir(parents=True)
    runstate.write_state(d, state="completed", step=9)
    (d / "summary.json").write_text("[1, 2]")
    state_before = (d / "state.json").read_bytes()
    with pytest.raises(QuartetError, match="summary.json is corrupt"):
        execute_run(d, "124")
    assert (d / "state.json").read_bytes() == state_before and not (d / "error.txt").exists()


def test_status_of_a_misspelled_sweep_suggests_commands_that_work(tmp_path, capsys):
    """`quartet status <typo>` used to suggest `quartet sweep <typo>`, which fails too."""
    runs = tmp_path / "runs"
    (runs / "s" / "a").mkdir(parents=True)
    (runs / "s" / "a" / "config.yaml").write_text("x: 1\n")
    assert status_main(["ss", "--runs-dir", str(runs)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no sweep 'ss'" in err
    assert f"`quartet status NAME --runs-dir {runs}` shows one of: s;" in err
    assert "launches one of: branches_ladder, branches_ladder_independent, demo, " in err and "smoke" in err
    assert status_main(["s", "--runs-dir", str(runs)]) == 0  # the suggested status works
    capsys.readouterr()
    # a real sweep without runs yet: the suggested launch names the same runs folder
    assert status_main(["smoke", "--runs-dir", str(runs)]) == 1
    assert capsys.readouterr().err.strip() == (f"quartet status: no runs of sweep 'smoke' under {runs} yet (launch it "
                                               f"with: quartet sweep smoke --runs-dir {runs})")
    assert sweep_main(["smoke", "--runs-dir", str(runs), "--dry-run"]) == 0  # which works


def test_device_share_of_a_finished_run():
    """Device-hours per wall-clock hour: the world size on Slurm, 1/k of a GPU in a local pool packing k runs per GPU
    (recorded, else the profile's), one worker in a CPU pool."""
    from cluster.plan import _device_share

    gpu_pool = load_profile("local_gpu")
    assert _device_share({"world_size": 1}, {"job_id": "local-7", "gpu": 0, "runs_per_gpu": 2}, gpu_pool) == 0.5
    assert _device_share({"world_size": 1}, {"job_id": "local-7", "gpu": 3}, gpu_pool) == 1 / gpu_pool.workers_per_gpu
    assert _device_share({"world_size": 1}, {"job_id": "local-7"}, load_profile("local")) == 1.0
    assert _device_share({"world_size": 8}, {"job_id": "123_4", "gpu": None}, load_profile("slurm_hopper")) == 8.0


def test_a_run_that_ended_since_the_plan_is_not_claimed(tmp_path):
    """Another launcher finished the run after this one planned it: the claim is refused and nothing is rewritten
    (a corrupt summary is refused too: maybe finished, never retrained blindly)."""
    d = tmp_path / "run"
    d.mkdir()
    runstate.write_state(d, state="completed", step=10)
    (d / runstate.SUMMARY).write_text(json.dumps({"val_loss": 3.0, "steps": 10}))
    assert not runstate.try_claim(d, {"scheduler": "local"}, None)
    assert not (d / runstate.CLAIM).exists() and json.loads((d / runstate.STATE).read_text())["state"] == "completed"
    (d / runstate.SUMMARY).write_text("{torn")
    assert not runstate.try_claim(d, {"scheduler": "local"}, None)
