"""``quartet sweep --cluster local`` end to end with the real trainer on the tiniest models."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import runstate
from cluster.launch import cli_main as sweep_main
from cluster.launch import make_plan
from cluster.plan import calibrate
from cluster.status import cli_main as status_main

REPO = Path(__file__).resolve().parents[2]

@pytest.fixture()
def sweep_file(tiny_sweep) -> str:
    return tiny_sweep("tsmoke")


def summaries(group: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in group.glob("*/summary.json")}


def test_local_sweep_end_to_end_idempotent_and_rerun_one(tmp_path, sweep_file, capsys):
    root = tmp_path / "runs"
    assert sweep_main([sweep_file, "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "4 completed, 0 failed" in out
    group = root / "tsmoke"
    first = summaries(group)
    assert len(first) == 4
    for rid, summ in first.items():
        d = group / rid
        assert summ["run_id"] == rid and (d / "config.yaml").exists() and not (d / runstate.CLAIM).exists()
        assert runstate.read_json(d / "state.json")["state"] == "completed"
    # precision twins share seed and data order
    cfgs = [(group / rid / "config.yaml").read_text() for rid in first]
    assert len({c.split("data_seed:")[1].split()[0] for c in cfgs}) == 1

    # second launch: nothing to do, says so, trains nothing
    assert sweep_main([sweep_file, "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "nothing to submit" in out and "4 done" in out

    # delete one summary: only that run is trained again
    victim = sorted(first)[0]
    (group / victim / "summary.json").unlink()
    mtimes = {rid: (group / rid / "summary.json").stat().st_mtime_ns for rid in first if rid != victim}
    assert sweep_main([sweep_file, "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "1 completed, 0 failed" in out and "to submit: 1" in out
    again = summaries(group)
    assert set(again) == set(first)
    for rid, m in mtimes.items():
        assert (group / rid / "summary.json").stat().st_mtime_ns == m
    assert again[victim]["val_loss"] == pytest.approx(first[victim]["val_loss"], abs=1e-6)

    assert status_main(["tsmoke", "--runs-dir", str(root)]) == 0
    assert "4 runs: 4 completed" in capsys.readouterr().out

    # the plan measures the finished runs against the profile's estimate (a CPU pool: one worker per run)
    plan = make_plan(sweep_file, None, [], str(root))
    cal = calibrate(plan)
    assert cal.runs == 4
    assert cal.measured_h == pytest.approx(sum(s["wall_clock_s"] for s in again.values()) / 3600)
    assert cal.estimated_h == pytest.approx(sum(r.hours for r in plan.runs))
    for r in plan.runs:  # per precision where it has >= 3 measured runs, else sweep-wide
        mine = [again[q.run_id]["wall_clock_s"] / 3600 for q in plan.runs if q.precision == r.precision]
        ratio = sum(mine) / sum(q.hours for q in plan.runs if q.precision == r.precision) if len(mine) >= 3 else cal.ratio
        assert cal.hours(r) == pytest.approx(r.hours * ratio)
    assert sweep_main([sweep_file, "--runs-dir", str(root), "--dry-run"]) == 0
    assert f"measured: 4 completed run(s) took {cal.measured_h:.4g} CPU-hours" in capsys.readouterr().out


def test_crashing_run_is_failed_with_traceback_others_finish(tmp_path, sweep_file, capsys):
    """One run crashes inside the trainer: it is marked failed with its traceback; the rest complete;
    a relaunch submits only the failed one again."""
    root = tmp_path / "runs"
    extra = ["sweep.axes.budget.tokens=[2048]", "sweep.axes.precision=[bf16]",
             # passes validation, fails in the trainer: the data folder cannot be created
             "sweep.include=[{budget.tokens: 2048, precision: bf16, run.seed: 3, data.dir: /dev/null/nope}]"]
    assert sweep_main([sweep_file, "--runs-dir", str(root), *extra]) == 1
    out = capsys.readouterr().out
    assert "1 completed, 1 failed" in out
    group = root / "tsmoke"
    (bad,) = [p for p in group.iterdir() if p.name.endswith(tuple("0123456789abcdef")) and "-s3-" in p.name]
    state = runstate.read_json(bad / "state.json")
    assert state["state"] == "failed" and state["error"]
    assert "Traceback" in (bad / "error.txt").read_text()
    assert not (bad / "summary.json").exists() and not (bad / runstate.CLAIM).exists()
    assert status_main(["tsmoke", "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "1 completed, 1 failed" in out.replace("2 runs: ", "") or "1 failed, 1 completed" in out
    assert sweep_main([sweep_file, "--runs-dir", str(root), *extra, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "1 done, 1 failed" in out and "to submit: 1" in out


def test_two_concurrent_launches_train_each_run_once(tmp_path, sweep_file):
    """Two `quartet sweep` processes started together: every run is trained by exactly one of them."""
    root = tmp_path / "runs"
    cmd = [sys.executable, "-m", "cluster.launch", sweep_file, "--runs-dir", str(root)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
             for _ in range(2)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    group = root / "tsmoke"
    runs = [p for p in group.iterdir() if p.is_dir()]
    assert len(runs) == 4 and all((r / "summary.json").exists() for r in runs)
    for r in runs:  # one training start per run, whichever launcher got it
        assert (r / "train.log").read_text().count("INFO run ") == 1, r.name
    trained = sum(int(o.split(" completed,")[0].rsplit(": ", 1)[-1]) for o in outs if " completed," in o)
    assert trained == 4, outs


def test_cli_dispatch_dry_run_smoke(tmp_path):
    """`quartet sweep smoke --dry-run` through the console script: 27 runs, nothing written."""
    exe = Path(sys.executable).with_name("quartet")
    cmd = [str(exe) if exe.exists() else shutil.which("quartet") or "quartet", "sweep", "smoke", "--dry-run",
           "--runs-dir", str(tmp_path / "runs")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "27 runs" in out.stdout and "dry run" in out.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_smoke_sweep_local_acceptance(tmp_path, capsys):
    """The shipped `smoke` sweep: 27 runs to completion on this machine, losses ordered by N and by D."""
    root = tmp_path / "runs"
    assert sweep_main(["smoke", "--cluster", "local", "--runs-dir", str(root)]) == 0
    assert "27 completed, 0 failed" in capsys.readouterr().out
    rows = [json.loads(p.read_text()) for p in (root / "smoke").glob("*/summary.json")]
    loss = {(r["precision"], r["model"], r["tokens"]): r["val_loss"] for r in rows}
    models, budgets = ["llama_nano", "llama_micro", "llama_tiny"], [131072, 262144, 524288]
    for p in ("bf16", "fp8", "quartet"):
        for d in budgets:
            by_n = [loss[(p, m, d)] for m in models]
            assert by_n == sorted(by_n, reverse=True), (p, d, by_n)
        for m in models:
            by_d = [loss[(p, m, d)] for d in budgets]
            assert by_d == sorted(by_d, reverse=True), (p, m, by_d)
    assert sweep_main(["smoke", "--runs-dir", str(root)]) == 0
    assert "nothing to submit: all 27 runs are done" in capsys.readouterr().out
