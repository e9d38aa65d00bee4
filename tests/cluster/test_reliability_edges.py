"""Edges of issue #33 item 5: a launcher killed before its workers started, claims from another host, names that
escape the runs root, sweeps of 0 or duplicate runs, and a fast refusal of a run being trained."""
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

REPO = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _write(d: Path, name: str, obj: dict) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(json.dumps(obj))


def test_launcher_killed_before_any_worker_started_is_new_not_failed(tmp_path):
    d = tmp_path / "g" / "run-a"
    _write(d, "config.yaml", {})
    _write(d, runstate.STATE, {"state": "pending", "total_steps": 12, "job_id": None})
    _write(d, runstate.CLAIM, {"pid": _dead_pid(), "host": socket.gethostname(), "time": time.time(),
                               "job_id": None, "scheduler": "local", "sweep": "g"})
    before = (d / runstate.STATE).read_bytes()
    view = runstate.inspect(d, None)
    assert view.state == "new" and view.error is None, (view.state, view.error)
    assert (d / runstate.STATE).read_bytes() == before  # nothing recorded: nothing ran, nothing failed
    # with a checkpoint from an earlier attempt it is preempted (resumable), still not failed
    (d / "ckpt").mkdir()
    (d / "ckpt" / "last.pt").write_bytes(b"x")
    assert runstate.inspect(d, None).state == "preempted"


def test_another_hosts_claim_is_never_judged_failed_nor_written(tmp_path):
    d = tmp_path / "g" / "run-b"
    _write(d, "config.yaml", {})
    _write(d, runstate.STATE, {"state": "running", "step": 40, "total_steps": 600, "host": "far-away", "pid": 4242})
    # the other host's clock is 3 hours behind ours: its claim looks 3 hours old, its files changed just now
    _write(d, runstate.CLAIM, {"pid": 4242, "host": "far-away", "time": time.time() - 3 * 3600, "job_id": None,
                               "scheduler": "local", "sweep": "g"})
    before = (d / runstate.STATE).read_bytes()
    view = runstate.inspect(d, None)
    assert view.state == "running" and view.live, (view.state, view.error)
    # nothing changed for two hours: stale, shown, never written as failed
    old = time.time() - 2 * 3600
    for f in (runstate.STATE, runstate.CLAIM):
        os.utime(d / f, (old, old))
    view = runstate.inspect(d, None)
    assert view.state == "stale" and "far-away" in view.error, (view.state, view.error)
    assert (d / runstate.STATE).read_bytes() == before


@pytest.mark.parametrize("where", ["sweep-name", "run-name-override"])
def test_names_that_escape_the_runs_root_are_refused_in_one_line(tmp_path, tiny_sweep, capsys, where):
    path = Path(tiny_sweep("esc"))
    extra = []
    if where == "sweep-name":
        path.write_text(path.read_text().replace("name: esc", "name: ../escaped"))
    else:
        extra = ["run.name=../escaped"]
    assert sweep_main([str(path), "--runs-dir", str(tmp_path / "runs"), "--dry-run", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be one folder name" in err[0], err
    assert not (tmp_path / "escaped").exists() and not any((tmp_path / "runs").glob("**/config.yaml"))


def test_train_run_name_with_dotdot_is_refused(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    res = subprocess.run([sys.executable, "-m", "quartet.cli", "train", "model=llama_nano", "run.name=../up",
                          f"run.out_dir={tmp_path / 'runs'}", "--print-config"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "run.name='../up'" in res.stderr


def test_sweep_of_zero_runs_is_one_line_and_non_zero(tmp_path, tiny_sweep, capsys):
    path = Path(tiny_sweep("none"))
    path.write_text(path.read_text() + "exclude: [{precision: bf16}, {precision: fp8}]\n")
    assert sweep_main([str(path), "--runs-dir", str(tmp_path / "runs"), "--dry-run"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "0 runs" in err[0], captured


def test_duplicate_runs_are_deduped_with_one_note(tmp_path, tiny_sweep, capsys):
    path = Path(tiny_sweep("dups"))
    # logging is not part of a run's identity: two logging options make every run twice
    path.write_text(path.read_text().replace("  logging: quiet\n", "").replace(
        "  precision: [bf16, fp8]\n", "  precision: [bf16, fp8]\n  logging: [quiet, default]\n"))
    assert sweep_main([str(path), "--runs-dir", str(tmp_path / "runs"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "duplicate" in line]
    assert len(notes) == 1 and notes[0].startswith("note: 4 duplicate grid point(s) dropped"), out
    assert "4 runs" in out


def test_a_run_being_trained_is_refused_before_the_trainer_is_built(tmp_path, monkeypatch, capsys, tiny_overrides):
    from quartet import runlock
    from quartet import train as qtrain
    from quartet.config import compose
    from quartet.runs import run_dir

    over = [*tiny_overrides, f"run.out_dir={tmp_path}"]
    lock = runlock.acquire(run_dir(compose(over)), what="run x")
    built = []
    monkeypatch.setattr(qtrain.Trainer, "__init__", lambda self, cfg: built.append(cfg) or (_ for _ in ()).throw(
        AssertionError("the trainer was built for a run that is being trained")))
    try:
        assert qtrain.cli_main(over) == 2
    finally:
        lock.release()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is being trained by pid" in err[0] and not built, err
