"""The trainer's run lock (quartet.runlock): one process trains a run at a time; a killed holder frees it."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from quartet import runlock
from quartet.config import compose
from quartet.runs import run_dir
from quartet.train import cli_main as train_main

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _start_train(over: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_holding(proc: subprocess.Popen, d: Path, ready, timeout: float = 600) -> None:
    """Wait until ``proc`` holds the lock of ``d`` and ``ready()`` is true."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        h = runlock.holder(d)
        if h and h.get("pid") == proc.pid and ready():
            return
        time.sleep(0.05)
    raise AssertionError(f"{proc.pid} never held {d}'s lock: {runlock.holder(d)}")


def _rows(d: Path) -> list[dict]:
    return [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def test_two_trains_of_one_config_one_refuses_naming_the_holder(tmp_path, tiny_overrides):
    """Two identical `quartet train` commands used to train the run together; the second now refuses with
    one line naming the first (pid, host), exits non-zero and changes nothing; the first completes."""
    over = [*tiny_overrides, "budget.tokens=307200", f"run.out_dir={tmp_path}"]  # 600 steps
    d = run_dir(compose(over))
    first = _start_train(over)
    try:
        _wait_holding(first, d, lambda: (d / "metrics.jsonl").is_file() and len(_rows(d)) >= 3)
        # freeze the holder: the run directory cannot change except by the second command
        first.send_signal(signal.SIGSTOP)
        before = _files(d)
        # the holder is stopped: a second command that waited for the lock would hang here, not refuse
        second = subprocess.run([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=ENV,
                                capture_output=True, text=True, timeout=600)
        assert second.returncode != 0
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert f"pid {first.pid} on host {socket.gethostname()}" in lines[0] and "being trained by" in lines[0]
        assert second.stdout.strip() == ""
        assert _files(d) == before
        first.send_signal(signal.SIGCONT)
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
            first.wait()
    assert first.returncode == 0, err[-2000:]
    assert "val_loss" in out and (d / "summary.json").is_file()
    rows = _rows(d)
    steps = [r["step"] for r in rows if not r.get("final")]
    assert steps == list(range(1, 601)) and sum(1 for r in rows if r.get("final")) == 1
    assert runlock.holder(d) is None  # released at the end
    assert not (d / "error.txt").exists()


def test_sigkilled_trainer_releases_lock_and_next_train_resumes(tmp_path, tiny_overrides, capsys):
    """kill -9 of a training `quartet train`: the kernel drops its lock, the next command resumes the run."""
    over = [*tiny_overrides, "budget.tokens=307200", "logging.ckpt_every=20", f"run.out_dir={tmp_path}"]  # 600 steps
    d = run_dir(compose(over))
    first = _start_train(over)

    def checkpointed() -> bool:
        st = runlock.holder(d) and (d / "state.json").is_file() and json.loads((d / "state.json").read_text())
        return bool(st) and st.get("step", 0) >= 20

    try:
        _wait_holding(first, d, checkpointed)
        first.kill()
        first.wait(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert runlock.holder(d) is None  # no stale lock to clean up
    state = json.loads((d / "state.json").read_text())
    assert state["state"] == "running" and state["pid"] == first.pid  # it died without a word
    capsys.readouterr()
    assert train_main(over) == 0  # the same command again: resumes and completes
    assert "val_loss" in capsys.readouterr().out
    log = (d / "train.log").read_text()
    assert "resuming" in log and "from step 0/" not in log
    rows = _rows(d)
    steps = [r["step"] for r in rows if not r.get("final")]
    assert steps == list(range(1, 601)) and sum(1 for r in rows if r.get("final")) == 1
    assert runlock.holder(d) is None and not (d / "error.txt").exists()
