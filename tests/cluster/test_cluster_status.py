"""`quartet status` tells the truth (issue #14 item 3): dead standalone trainers, used-up requeues,
an unreachable squeue and requeued jobs waiting in the queue.

State files are written by the real writers (the trainer's ``RunRecorder.write_state``, the launcher's claim
calls, submitit's own signal handler); Slurm is a fake ``squeue``/``sacct``/``scontrol``/``sbatch``
on PATH printing what the real tools print, so the real parsing code runs.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cluster import runstate, slurm
from cluster.status import cli_main as status_main

REPO = Path(__file__).resolve().parents[2]
@pytest.fixture()
def fake_slurm(tmp_path, monkeypatch):
    """``fake_slurm(squeue=..., sacct=...)``: shell bodies of fake Slurm tools, first on PATH."""
    def make(squeue: str = "exit 0", sacct: str = "exit 1", scontrol: str = "exit 1") -> Path:
        bin_dir = tmp_path / "fakebin"
        bin_dir.mkdir(exist_ok=True)
        for name, body in {"squeue": squeue, "sacct": sacct, "scontrol": scontrol,
                           "sbatch": "echo 'sbatch: error: not in this test' >&2; exit 1"}.items():
            path = bin_dir / name
            path.write_text(f"#!/bin/bash\n{body}\n")
            path.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        return bin_dir

    return make


@pytest.fixture
def make_trainer(tiny_cfg):
    """``make_trainer(runs, group, *overrides)``: a Trainer of the tiny run in ``runs``' group ``group``, its run
    folder made."""
    from quartet.train import Trainer

    def make(runs: Path, group: str, *overrides: str):
        t = Trainer(tiny_cfg(f"run.out_dir={runs}", f"run.name={group}", *overrides))
        t.dir.mkdir(parents=True, exist_ok=True)
        return t

    return make


def claim_as_slurm(run_dir: Path, job_id: str, log: Path | None = None) -> None:
    """What ``cluster.launch`` does around ``sbatch``: claim, then record the job id (and its log)."""
    assert runstate.try_claim(run_dir, {"scheduler": "slurm"}, queue={})
    runstate.update_claim(run_dir, job_id=job_id, scheduler="slurm", log=str(log) if log else None)
    runstate.write_state(run_dir, job_id=job_id)


def status(runs: Path, group: str, capsys) -> tuple[int, str, str]:
    code = status_main([group, "--runs-dir", str(runs)])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------ a: standalone trainer gone


def test_killed_standalone_train_shows_lost_not_running(tmp_path, fake_slurm, capsys, tiny_overrides):
    """`quartet train` killed with SIGKILL used to show `running` forever: its pid is now checked."""
    from quartet.config import compose
    from quartet.runs import run_dir

    fake_slurm(squeue="exit 0")  # an empty queue: the run has no job anyway
    runs = tmp_path / "runs"
    over = [*tiny_overrides, "budget.tokens=1536000", f"run.out_dir={runs}", "run.name=solo"]  # 3000 steps: far from done
    d = run_dir(compose(over))
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            m = d / "metrics.jsonl"
            if m.is_file() and len(m.read_text().splitlines()) >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        state = json.loads((d / "state.json").read_text())
        assert state["pid"] == proc.pid and state["host"] == socket.gethostname() and state["pid_start"]
        code, out, _ = status(runs, "solo", capsys)
        assert code == 0 and "1 runs: 1 running" in out  # alive: no false alarm
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    code, out, _ = status(runs, "solo", capsys)
    assert code == 0 and "1 runs: 1 failed" in out and "running" not in out, out
    assert f"lost: process {proc.pid}" in out
    v = runstate.inspect(d)
    assert v.state == "failed" and "rerunning resumes from the last checkpoint" in v.error
    assert runstate.read_json(d / "state.json")["state"] == "failed"  # recorded: the next look agrees


def test_recycled_pid_and_foreign_host_and_stale_heartbeat(tmp_path, fake_slurm, capsys, monkeypatch, make_trainer):
    """A live pid that is another process (start time differs) is no proof of life; a trainer on another
    host cannot be checked (shown running with that note) until its files stop changing (stale)."""
    fake_slurm()
    runs = tmp_path / "runs"
    t = make_trainer(runs, "g")
    t.record.write_state("running", t.step)
    st = runstate.read_json(t.dir / "state.json")
    assert st["pid"] == os.getpid() and st["pid_start"]
    assert runstate.inspect(t.dir, reconcile_dead=False).state == "running"  # this very process: alive
    # the pid now names another process: the recorded start time does not match
    runstate.atomic_write_text(t.dir / "state.json", json.dumps({**st, "pid_start": st["pid_start"] - 1}))
    v = runstate.inspect(t.dir, reconcile_dead=False)
    assert v.state == "failed" and v.error.startswith(f"lost: process {os.getpid()}")
    # status from another machine: not checkable, running while the files move, stale when they stop
    t.record.write_state("running", t.step)
    monkeypatch.setattr(runstate.socket, "gethostname", lambda: "login-node")
    code, out, _ = status(runs, "g", capsys)
    assert code == 0 and "1 runs: 1 running" in out and f"running on {st['host']}"[:40] in out
    assert runstate.inspect(t.dir).note == f"running on {st['host']} (not checkable from here)"
    old = time.time() - 2 * runstate.STALE_AFTER_S
    os.utime(t.dir / "state.json", (old, old))
    code, out, _ = status(runs, "g", capsys)
    assert code == 0 and "1 runs: 1 stale" in out and "running" not in out, out
    v = runstate.inspect(t.dir)
    assert v.state == "stale" and v.error.startswith("stale: no update of state.json/metrics.jsonl for 2.0 h")
    assert runstate.read_json(t.dir / "state.json")["state"] == "running"  # unknowable: nothing recorded


# ------------------------------------------------------------------ b: requeues used up


def submitit_gives_up(run_dir: Path, log_out: Path) -> None:
    """Run submitit's real USR2 handler for this run's RunTask with no time-limit requeue left, its log
    lines going to ``log_out`` as they go to the job's stdout log on a node."""
    from submitit.core import utils as su
    from submitit.core.job_environment import SignalHandler

    from cluster.task import RunTask

    delayed = su.DelayedSubmission(RunTask(run_dir))
    delayed.set_timeout(1, 0)  # a 1-minute limit (every signal is then the time limit), 0 requeues left
    env = SimpleNamespace(global_rank=0, _requeue=lambda countdown: pytest.fail("requeued"))
    paths = SimpleNamespace(submitted_pickle=log_out.with_name(log_out.name.replace("_log.out", "_submitted.pkl")))
    logger = logging.getLogger("submitit")
    handler = logging.FileHandler(log_out)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s (%(asctime)s) - %(message)s"))
    logger.addHandler(handler)
    try:
        with pytest.raises(su.UncompletedJobError, match="timed-out too many times"):
            SignalHandler(env, paths, delayed).checkpoint_and_try_requeue(signal.SIGUSR2)
    finally:
        logger.removeHandler(handler)
        handler.close()


def test_requeues_used_up_is_failed_not_preempted_forever(tmp_path, fake_slurm, capsys, make_trainer):
    runs = tmp_path / "runs"
    t = make_trainer(runs, "tl")
    t.callbacks.append(lambda tr, row: tr.request_stop() if row["step"] >= 2 else None)
    assert t.run()["state"] == "preempted"  # the trainer's own record of a time-limit stop
    slurm_dir = runs / "tl" / "slurm"
    slurm_dir.mkdir()
    log = slurm_dir / "77_0_0_log.out"
    claim_as_slurm(t.dir, "77_0", log)
    submitit_gives_up(t.dir, log)
    # the job left the queue (another job is still there); accounting says how it ended
    fake_slurm(squeue="echo '80|80|RUNNING'", sacct="echo '77_0|FAILED'")
    code, out, _ = status(runs, "tl", capsys)
    assert code == 0 and "1 runs: 1 failed" in out and "77_0 (FAILED)" in out and "preempted" not in out, out
    v = runstate.inspect(t.dir, slurm.queue())  # now from the recorded state
    assert v.state == "failed"
    assert v.error == ("not requeued: timed-out too many times (the cluster.max_num_timeout time-limit requeues are "
                       "used up); job 77_0 ended FAILED at step 2; relaunch resumes from the last checkpoint")
    assert runstate.read_json(t.dir / "state.json")["state"] == "failed"


def test_preempted_run_still_queued_stays_preempted(tmp_path, fake_slurm, capsys, make_trainer):
    """The guard of the test above: a preempted run whose job was requeued (still in squeue) is not failed."""
    runs = tmp_path / "runs"
    t = make_trainer(runs, "pq")
    t.record.write_state("preempted", t.step)
    claim_as_slurm(t.dir, "78_1")
    fake_slurm(squeue="echo '79|78_1|PENDING'")
    code, out, _ = status(runs, "pq", capsys)
    assert code == 0 and "1 runs: 1 preempted" in out and "78_1 (PENDING)" in out


# ------------------------------------------------------------------ c: squeue unreachable


@pytest.mark.parametrize("squeue, why", [
    ("echo 'squeue: error: slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1",
     "squeue exited 1: squeue: error: slurm_load_jobs error: Unable to contact slurm controller (connect failure)"),
    ("exec sleep 30", "squeue timed out after 0.5 s"),
])
def test_unreachable_squeue_warns_once_and_asserts_nothing(tmp_path, fake_slurm, capsys, monkeypatch, squeue, why,
                                                            make_trainer):
    monkeypatch.setattr(slurm, "SQUEUE_TIMEOUT_S", 0.5, raising=False)
    runs = tmp_path / "runs"
    crashed = make_trainer(runs, "c", "run.seed=1")  # its job died long ago while state.json said running
    monkeypatch.setenv("SLURM_JOB_ID", "61")
    crashed.record.write_state("running", crashed.step)
    monkeypatch.delenv("SLURM_JOB_ID")
    claim_as_slurm(crashed.dir, "61")
    failed = make_trainer(runs, "c", "run.seed=2")
    failed.record.write_state("failed", failed.step, error="ValueError: boom")
    claim_as_slurm(failed.dir, "62")
    never = make_trainer(runs, "c", "run.seed=3").dir  # submitted; its job never started (or is long gone)
    claim_as_slurm(never, "63")
    fake_slurm(squeue=squeue)
    t0 = time.time()
    code, out, err = status(runs, "c", capsys)
    assert time.time() - t0 < 10
    assert code == 0 and "pending" not in out, out
    assert "3 runs: 2 unknown, 1 failed" in out and out.count("(UNKNOWN)") == 3 and "ValueError: boom" in out
    lines = err.strip().splitlines()
    assert lines == [f"quartet status: warning: could not query the Slurm scheduler ({why}); the job states of 3 "
                     f"run(s) are unverified (shown as UNKNOWN: queued, running or over)"]
    v = runstate.inspect(crashed.dir, None)
    assert v.state == "unknown" and v.live  # the claim is trusted: a launch does not submit it twice
    assert runstate.read_json(crashed.dir / "state.json")["state"] == "running"  # nothing recorded blindly


# ------------------------------------------------------------------ d: requeued, waiting


def test_requeued_job_waiting_in_queue_is_pending_not_running(tmp_path, fake_slurm, capsys, monkeypatch,
                                                              make_trainer):
    runs = tmp_path / "runs"
    t = make_trainer(runs, "rq")
    claim_as_slurm(t.dir, "55")
    monkeypatch.setenv("SLURM_JOB_ID", "55")
    t.record.write_state("running", t.step)  # the previous attempt's last word (e.g. killed by `scontrol requeue`)
    fake_slurm(squeue="printf '55|55|PENDING\\n56|56|RUNNING\\n'")
    code, out, _ = status(runs, "rq", capsys)
    assert code == 0 and "1 runs: 1 pending" in out and "55 (PENDING)" in out and "running" not in out, out
    v = runstate.inspect(t.dir, slurm.queue())
    assert v.state == "pending" and v.note.startswith("requeued: job 55 waits in the queue")
    fake_slurm(squeue="printf '55|55|RUNNING\\n'")  # started again: running
    assert runstate.inspect(t.dir, slurm.queue()).state == "running"
