"""What status can tell from a run directory's records: a copy made while the original trains is not running, and
file times from the future are no sign of life."""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from cluster import runstate
from quartet import paths, proc, runlock


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


@pytest.fixture(params=[True, False], ids=["local-launch", "standalone-train"])
def training(tmp_path, request):
    """A run directory being trained by this process (it holds the train lock and wrote state.json), claimed first
    by this process as a local launcher would, or not (a standalone ``quartet train``); releases the lock after."""
    d = tmp_path / "runs" / "g" / "run-a"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("x: 1\n")
    if request.param:
        assert runstate.try_claim(d, {"scheduler": "local", "sweep": "g"}, None)
    lock = runlock.acquire(d, what="run-a")
    (d / runstate.STATE).write_text(json.dumps({
        "state": "running", "step": 5, "total_steps": 50, "pid": os.getpid(),
        "pid_start": proc.process_start(os.getpid()), "host": socket.gethostname()}))
    (d / runstate.METRICS).write_text(json.dumps({"step": 5, "loss": 4.0}) + "\n")
    yield d
    lock.release()


def test_a_copy_made_while_the_original_trains_is_not_running(training, tmp_path):
    copy = tmp_path / "backup" / "g" / "run-a"
    shutil.copytree(training, copy)
    before = _files(copy)
    assert runstate.inspect(training).state == "running"
    view = runstate.inspect(copy)
    assert view.state == "stale" and not view.live, (view.state, view.error)
    assert f"a copy of {training}" in view.error and f"pid {os.getpid()}" in view.error, view.error
    assert "\n" not in view.error
    assert _files(copy) == before  # nothing written
    # a launch may take the copy (its claim is the original's), never the original
    assert runstate.try_claim(copy, {"scheduler": "local", "sweep": "g"}, None)
    assert not runstate.try_claim(training, {"scheduler": "local", "sweep": "g"}, None)


def test_a_moved_run_of_a_dead_trainer_is_still_lost(tmp_path):
    """The copy rule needs a live holder and an existing original: a folder moved after its trainer died is lost."""
    import subprocess
    import sys

    d = tmp_path / "old" / "run-b"
    d.mkdir(parents=True)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    (d / paths.TRAIN_LOCK).write_text(json.dumps({"pid": child.pid, "host": socket.gethostname(), "dir": str(d)}))
    (d / runstate.STATE).write_text(json.dumps({"state": "running", "step": 2, "total_steps": 9, "pid": child.pid,
                                                "pid_start": 1.0, "host": socket.gethostname()}))
    moved = tmp_path / "new" / "run-b"
    moved.parent.mkdir()
    os.rename(d, moved)
    view = runstate.inspect(moved, reconcile_dead=False)
    assert view.state == "failed" and view.error.startswith("lost:"), (view.state, view.error)


def _future(d: Path, seconds: float) -> None:
    t = time.time() + seconds
    for f in d.iterdir():
        os.utime(f, (t, t))


def test_a_foreign_claim_with_files_from_the_future_is_stale_not_running(tmp_path):
    d = tmp_path / "g" / "run-c"
    d.mkdir(parents=True)
    (d / runstate.STATE).write_text(json.dumps({"state": "running", "step": 4, "total_steps": 90, "host": "far-away",
                                                "pid": 4242}))
    (d / runstate.CLAIM).write_text(json.dumps({"pid": 4242, "host": "far-away", "time": time.time(), "job_id": None,
                                                "scheduler": "local", "sweep": "g"}))
    _future(d, 3 * 86400)
    before = _files(d)
    view = runstate.inspect(d)
    assert view.state == "stale" and not view.live, (view.state, view.error)
    assert "in the future" in view.error and "far-away" in view.error and "\n" not in view.error
    assert _files(d) == before
    # a few seconds ahead (clocks a little apart) is still a sign of life
    _future(d, 5)
    assert runstate.inspect(d).state == "running"


def test_a_standalone_train_elsewhere_with_files_from_the_future_is_stale(tmp_path):
    d = tmp_path / "g" / "run-d"
    d.mkdir(parents=True)
    (d / runstate.STATE).write_text(json.dumps({"state": "running", "step": 4, "total_steps": 90, "host": "far-away",
                                                "pid": 4242}))
    (d / runstate.METRICS).write_text(json.dumps({"step": 4, "loss": 4.0, "elapsed_s": 8.0}) + "\n")
    _future(d, 86400)
    view = runstate.inspect(d)
    assert view.state == "stale" and "in the future" in view.error, (view.state, view.error)
