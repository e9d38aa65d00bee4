"""A killed local launcher leaves no worker behind, and no run is ever trained by two processes at once.

The launcher runs in its own session so that whatever it leaves behind (on the old code: workers that
trained on forever) is killed with its process group when the test ends.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster import runstate, task
from cluster.launch import cli_main as sweep_main
from cluster.launch import make_plan
from cluster.status import cli_main as status_main
from quartet import runlock

REPO = Path(__file__).resolve().parents[2]

# 2 runs of the nano model, long enough (~500-600 steps of ~10 ms) to kill the launcher mid-run
SWEEP = """
name: {name}
cluster: local
axes:
  budget.tokens: [256000, 307200]
fixed:
  model: llama_nano
  budget: tokens
  data: shakespeare_small
  logging: quiet
  logging.log_every: 1
  run.device: cpu
"""


def _sweep(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(SWEEP.format(name=name))
    return str(path)


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _pool_workers(launcher: int) -> list[int]:
    """Pids of the launcher's pool processes (its spawned children, not the resource tracker), from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == launcher and b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            out.append(int(stat.parent.name))
    return sorted(out)


#: By then every orphaned worker has exited, whatever the load: one that stopped on request (a fraction of a second
#: when idle), or one that did not, after its grace, leaving its threads' stacks in stdout.log (task._watch_launcher,
#: task._arm_exit_timer). Which of the two it was is read from stdout.log, not from the clock.
STACKS_WITHIN_S = task.ORPHAN_GRACE_S + task.EXIT_TIMER_SLACK_S + 20.0
#: the first line of the stack dump faulthandler writes for each thread
STACK_DUMP = "most recent call first"


def _where(workers: list[int], runs: list[Path]) -> str:
    """What the surviving workers and their runs were doing: process state and kernel wait channel, and the last
    lines of each run's train.log and state.json (for a failure message)."""
    parts = []
    for pid in workers:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
            parts.append(f"pid {pid} state {state} waiting in {wchan}")
        except OSError:
            parts.append(f"pid {pid} gone")
    for d in runs:
        log = d / "train.log"
        tail = log.read_text().splitlines()[-2:] if log.is_file() else []
        state = (d / "state.json").read_text().strip() if (d / "state.json").is_file() else "no state.json"
        parts.append(f"{d.name}: {state}; train.log ends {tail}")
        out = d / "stdout.log"  # a worker still stuck after its grace leaves every thread's stack here
        if out.is_file() and out.read_text().strip():
            parts.append(f"{d.name} stdout.log ends:\n" + "\n".join(out.read_text().splitlines()[-60:]))
    return "; ".join(parts)


def _start_launcher(sweep: str, root: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    return subprocess.Popen([sys.executable, "-m", "cluster.launch", sweep, "--runs-dir", str(root)], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _kill_group(proc: subprocess.Popen, pids: list[int]) -> None:
    """Leave nothing behind: the launcher's process group and any worker we saw."""
    for pid in [proc.pid, *pids]:
        try:
            os.killpg(proc.pid, signal.SIGKILL) if pid == proc.pid else os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if proc.poll() is None:
        proc.wait(timeout=120)


def _kill_launcher_mid_run(sweep: str, root: Path) -> tuple[list[Path], list[int]]:
    """Start the launcher, wait until both runs are training, kill -9 it; returns (run dirs, worker pids)
    after asserting that every worker exited on the stop request (not at the end of its grace) and checkpointed."""
    runs = [r.run_dir for r in make_plan(sweep, None, [], str(root), with_state=False).runs]
    assert len(runs) == 2
    proc = _start_launcher(sweep, root)
    workers: list[int] = []
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            assert proc.poll() is None, "the launcher exited before the runs were under way"
            if all((d / "metrics.jsonl").is_file() and len((d / "metrics.jsonl").read_text().splitlines()) >= 10
                   for d in runs):
                workers = _pool_workers(proc.pid)
                holders = [runlock.holder(d) for d in runs]
                break
            time.sleep(0.05)
        assert len(workers) == 2, f"the runs never started (pool processes: {workers})"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=120)
        t0 = time.time()
        while any(_alive(p) for p in workers) and time.time() - t0 < STACKS_WITHIN_S:
            time.sleep(0.1)
        stuck = [d for d in runs if (d / "stdout.log").is_file() and STACK_DUMP in (d / "stdout.log").read_text()]
        if stuck or any(_alive(p) for p in workers):
            raise AssertionError(f"workers {workers} did not stop on request (alive after {time.time() - t0:.0f} s: "
                                 f"{[p for p in workers if _alive(p)]}; stacks dumped by {[d.name for d in stuck]}): "
                                 f"{_where(workers, runs)}")
    finally:
        _kill_group(proc, workers)
    # each run was held by the pool process training it (not by the launcher), naming the launch
    assert sorted(h.get("pid") for h in holders if h) == workers, holders
    assert all(h["job_id"] == f"local-{proc.pid}" for h in holders)
    for d in runs:
        assert runlock.holder(d) is None
        # they checkpointed on their way out (the launcher's death is a preemption, not a failure)
        assert runstate.read_json(d / "state.json")["state"] == "preempted", d.name
        assert (d / "ckpt" / "last.pt").is_file() and not (d / "summary.json").exists()
    return runs, workers


def _check_trained_once(d: Path) -> list[float]:
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if not r.get("final")]
    total = runstate.read_json(d / "summary.json")["steps"]
    assert steps == list(range(1, total + 1)), d.name  # no duplicates, no gap, no interleaving
    assert sum(1 for r in rows if r.get("final")) == 1
    assert not (d / "error.txt").exists()
    assert runstate.read_json(d / "state.json")["state"] == "completed"
    return [r["loss"] for r in rows if not r.get("final")]


def test_killed_launcher_workers_checkpoint_and_exit(tmp_path, capsys):
    """kill -9 of `quartet sweep --cluster local` mid-run: its workers checkpoint and exit on the stop request
    (they used to train on forever while `quartet status` called the runs lost, and a relaunch trained
    each run a second time alongside them). The runs are then preempted, not lost, and free to resume."""
    sweep = _sweep(tmp_path, "orphans")
    root = tmp_path / "runs"
    _kill_launcher_mid_run(sweep, root)
    assert status_main(["orphans", "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "lost" not in out and "preempted" in out
    assert sweep_main([sweep, "--runs-dir", str(root), "--dry-run"]) == 0
    assert "to submit: 2" in capsys.readouterr().out


@pytest.mark.slow
def test_killed_and_relaunched_sweep_equals_an_uninterrupted_one(tmp_path, capsys):
    """The whole story, against a reference: kill -9 of the launcher, relaunch; every loss of every step and
    the final validation loss are bit-identical to those of the same sweep run without interruption."""
    sweep = _sweep(tmp_path, "orphans")
    ref_root, root = tmp_path / "ref", tmp_path / "runs"
    assert sweep_main([sweep, "--runs-dir", str(ref_root)]) == 0
    assert "2 completed, 0 failed" in capsys.readouterr().out
    runs, _ = _kill_launcher_mid_run(sweep, root)
    assert sweep_main([sweep, "--runs-dir", str(root)]) == 0
    assert "2 completed, 0 failed" in capsys.readouterr().out
    for d in runs:
        assert "resuming" in (d / "train.log").read_text()
        ref = ref_root / "orphans" / d.name
        assert _check_trained_once(d) == _check_trained_once(ref), d.name
        assert runstate.read_json(d / "summary.json")["val_loss"] == runstate.read_json(ref / "summary.json")["val_loss"]


def test_relaunch_skips_a_run_whose_trainer_holds_the_lock(tmp_path, capsys):
    """A run whose lock is held (its trainer outlived a launcher, or a `quartet train` is on it) is shown as
    running, not lost, and a relaunch says it skips it and trains only the others; once free, it is trained."""
    sweep = _sweep(tmp_path, "busy")
    root = tmp_path / "runs"
    over = ["sweep.axes.budget.tokens=[2048, 4096]"]
    busy, free = [r.run_dir for r in make_plan(sweep, None, over, str(root), with_state=False).runs]
    with runlock.acquire(busy):
        # what a trainer whose launcher was killed leaves: a stale claim and state "running"
        runstate.write_state(busy, state="running", total_steps=4, job_id="local-1")
        (busy / runstate.CLAIM).write_text(json.dumps({"pid": 2 ** 22 + 7, "host": os.uname().nodename,
                                                       "scheduler": "local", "time": time.time()}))
        assert status_main(["busy", "--runs-dir", str(root)]) == 0
        out = capsys.readouterr().out
        assert "lost" not in out and "running" in out
        assert sweep_main([sweep, "--runs-dir", str(root), *over]) == 0
        out = capsys.readouterr().out
        assert f"skipped {busy.name}: being trained by pid {os.getpid()}" in out
        assert "1 completed, 0 failed" in out
        assert (free / "summary.json").is_file() and not (busy / "summary.json").exists()
        assert runstate.read_json(busy / "state.json")["state"] == "running"  # untouched
    assert sweep_main([sweep, "--runs-dir", str(root), *over]) == 0
    assert "1 completed, 0 failed" in capsys.readouterr().out
    assert (busy / "summary.json").is_file()


def test_a_worker_refused_by_the_train_lock_leaves_the_run_folder_as_it_was(tmp_path, monkeypatch):
    """The lock is taken between the launcher's claim and its pool worker's start (a `quartet train` started in
    between): the worker is refused and reports the run skipped. It used to leave an empty stdout.log behind."""
    from cluster.launch import claim_and_prepare
    from cluster.task import local_worker
    from quartet.runlock import JOB_ENV

    monkeypatch.setenv(JOB_ENV, "")  # local_worker sets it for its trainer; restored after the test
    plan = make_plan(_sweep(tmp_path, "raced"), None, ["sweep.axes.budget.tokens=[2048]"], str(tmp_path / "runs"))
    claimed, taken = claim_and_prepare(plan, plan.pending())
    assert len(claimed) == 1 and not taken
    d = claimed[0].run_dir
    with runlock.acquire(d):
        before = {p.name: p.read_bytes() for p in d.iterdir()}
        result = local_worker(str(d), "local-9")
        after = {p.name: p.read_bytes() for p in d.iterdir()}
    assert result.state == "skipped" and f"pid {os.getpid()}" in result.error
    assert after == before  # no stdout.log, state.json and the holder's lock record untouched



def test_sigint_stops_a_background_launcher_and_unstarted_runs_stay_new(tmp_path, capsys):
    """A launcher started with `&` from a script inherits SIGINT ignored (bash does that for background jobs):
    `kill -INT` used to do nothing. Now it takes the Ctrl-C path: the runs under way checkpoint and are recorded
    preempted, and the run no worker started is `new` in status — it used to show as "running on an unrecorded
    host" (its state.json kept the `pending` of its released claim)."""
    sweep = _sweep(tmp_path, "bg")
    root = tmp_path / "runs"
    over = ["sweep.axes.budget.tokens=[256000, 307200, 204800, 153600, 102400]"]  # 2 workers: 3 wait
    runs = [r.run_dir for r in make_plan(sweep, None, over, str(root), with_state=False).runs]
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "cluster.launch", sweep, "--runs-dir", str(root), *over], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    workers: list[int] = []
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            assert proc.poll() is None, "the launcher exited before the runs were under way"
            started = [d for d in runs if (d / "metrics.jsonl").is_file()
                       and len((d / "metrics.jsonl").read_text().splitlines()) >= 10]
            if len(started) == 2:
                workers = _pool_workers(proc.pid)
                break
            time.sleep(0.05)
        assert len(started) == 2, "the runs never started"
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=STACKS_WITHIN_S)
    finally:
        _kill_group(proc, workers)
    for d in started:
        assert runstate.read_json(d / "state.json")["state"] == "preempted", d.name
    # the pool may hand one more run to a worker before the stop (it then checkpoints at once): preempted too
    unstarted = [d for d in runs if not (d / "ckpt").is_dir()]
    assert len(unstarted) >= 2
    for d in unstarted:
        view = runstate.inspect(d, None)
        assert view.state == "new" and "unrecorded host" not in (view.note or ""), (view.state, view.note)
    assert status_main(["bg", "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "unrecorded host" not in out and f"{len(unstarted)} new" in out and "running" not in out


WEDGED_WORKER = """
import ctypes, threading, time
from cluster import task

class NeverStops:  # a trainer that never reaches its next step boundary
    def request_stop(self):
        pass

task.ORPHAN_GRACE_S, task.EXIT_TIMER_SLACK_S = 3.0, 1.0
task._current_trainer = NeverStops()
task._run_finished.clear()
threading.Thread(target=task._watch_launcher, args=(-1,), daemon=True).start()  # launcher -1: already gone
while not task._orphaned.is_set():
    time.sleep(0.01)
time.sleep(0.5)  # the watchdog arms its timer right after it sees the launcher gone

def wedged_in_c_holding_the_gil():
    ctypes.PyDLL(None).pause()  # PyDLL keeps the GIL: no Python thread runs again, os._exit included

wedged_in_c_holding_the_gil()
"""


def test_an_orphaned_worker_wedged_holding_the_gil_still_exits_and_leaves_its_stacks():
    """The watchdog's os._exit needs the interpreter; a worker whose main thread blocks in C while holding the GIL
    is ended by the C-level timer armed when its launcher died, and its stderr (the run's stdout.log in a pool)
    says where it hung."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", WEDGED_WORKER], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)  # a hang guard: ~5 s idle
    took = time.time() - t0
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert took >= 3.0, took  # not before the grace: a stop that comes in time is never cut short
    assert "wedged_in_c_holding_the_gil" in proc.stderr and "Timeout" in proc.stderr, proc.stderr
