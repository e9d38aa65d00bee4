"""A runs directory shared by two Unix users (issue #33 item 1), with real non-root processes (``setpriv``).

The permission model: a runs directory that is group-writable with the setgid bit (``chmod 2775``, what a lab's
shared ``runs/`` is) makes ``quartet train`` / ``quartet sweep`` create everything group-writable, so a second user
of the group can train beside the first; anywhere else a user who may not write gets one line naming the owner and
the path. ``quartet status`` only reads. Root bypasses permission bits, so the users are uids 60001 / 60002 of
group 60000; the test skips where it cannot switch users.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GROUP, ALICE, BOB = 60000, 60001, 60002


def _can_switch_users() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    res = subprocess.run(["setpriv", f"--reuid={ALICE}", f"--regid={GROUP}", "--clear-groups", sys.executable, "-c",
                          "import quartet"], capture_output=True, cwd="/", timeout=600)
    return res.returncode == 0


pytestmark = pytest.mark.skipif(not _can_switch_users(), reason="needs root, setpriv and a python other users can run")


@pytest.fixture
def shared():
    """A world-traversable temp folder (pytest's own tmp folders are 0700) holding ``runs/``, removed after."""
    base = Path(tempfile.mkdtemp(prefix="quartet-shared-"))
    base.chmod(0o755)
    home = base / "home"
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _as(uid: int, args: list[str], home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", f"--groups={GROUP}", sys.executable, "-m", "quartet.cli", *args]
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)


def test_group_shared_runs_dir_second_user_trains_beside_the_first_and_status_reads(shared, tiny_overrides):
    runs = shared / "runs"
    runs.mkdir()
    os.chown(runs, ALICE, GROUP)
    runs.chmod(0o2775)  # group-writable, setgid: the shared runs directory of a lab
    first = _as(ALICE, ["train", *tiny_overrides, f"run.out_dir={runs}", "run.name=team"], shared / "home")
    assert first.returncode == 0, first.stderr[-3000:]
    (d1,) = (runs / "team").iterdir()
    for p in [runs / "team", d1, d1 / "state.json", d1 / ".train.lock", d1 / "ckpt"]:
        mode = p.stat().st_mode
        assert mode & stat.S_IWGRP, f"{p} is {stat.filemode(mode)}: not group-writable"
    # the second user trains another run of the same group folder ...
    second = _as(BOB, ["train", *tiny_overrides, "run.seed=1", f"run.out_dir={runs}", "run.name=team"], shared / "home")
    assert second.returncode == 0, second.stderr[-3000:]
    assert len(list((runs / "team").iterdir())) == 2
    # ... and reads the status of both
    status = _as(BOB, ["status", "team", "--runs-dir", str(runs)], shared / "home")
    assert status.returncode == 0 and status.stderr == "", status.stderr[-3000:]
    assert "2 runs: 2 completed" in status.stdout


def test_private_runs_dir_second_user_gets_one_line_naming_the_owner_and_status_still_reads(shared, tiny_overrides):
    runs = shared / "runs"
    runs.mkdir()
    os.chown(runs, ALICE, ALICE)
    runs.chmod(0o755)  # private: only its owner writes
    first = _as(ALICE, ["train", *tiny_overrides, f"run.out_dir={runs}", "run.name=mine"], shared / "home")
    assert first.returncode == 0, first.stderr[-3000:]
    (d1,) = (runs / "mine").iterdir()
    # the first user's run looks alive-then-killed to status (a dead pid on this host): status would record it
    # as failed where it may write, and must still report where it may not
    st = json.loads((d1 / "state.json").read_text())
    (d1 / "summary.json").unlink()
    st.update(state="running", pid=2**22 - 1, pid_start=1)
    (d1 / "state.json").write_text(json.dumps(st))
    before = (d1 / "state.json").read_bytes()
    status = _as(BOB, ["status", "mine", "--runs-dir", str(runs)], shared / "home")
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr[-3000:]
    assert "failed" in status.stdout and (d1 / "state.json").read_bytes() == before
    # training into it: one line naming the owner and the path, exit 1, nothing written
    for args in (["train", *tiny_overrides, "run.seed=1", f"run.out_dir={runs}", "run.name=mine"],
                 ["train", *tiny_overrides, f"run.out_dir={runs}", "run.name=mine"]):
        res = _as(BOB, args, shared / "home")
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1, res.stderr[-3000:]
        assert "Permission denied" in lines[0] and f"belongs to {ALICE}" in lines[0] and str(runs / "mine") in lines[0]
    assert len(list((runs / "mine").iterdir())) == 1 and (d1 / "state.json").read_bytes() == before
