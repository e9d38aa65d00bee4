"""Against the real single-node Slurm that ``.ci/run`` starts (``cluster/slurm_local/up.sh``).

Skipped (by tests/conftest.py) when no Slurm answers ``sinfo``; these tests never start Slurm
themselves. Each one trains tiny CPU runs through submitit job arrays and checks the run dirs.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import submitit

from cluster import runstate
from cluster.launch import cli_main as sweep_main
from cluster.status import cli_main as status_main

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]

SWEEP = """
name: {name}
cluster: slurm_local
axes:
  budget.tokens: {budgets}
  precision: [bf16]
fixed:
  model: {model}
  model.seq_len: 64
  optim.batch_size: 8
  budget: tokens
  data: shakespeare_small
  logging: quiet
  logging.ckpt_every: {ckpt_every}
  run.device: cpu
"""


def write_sweep(tmp_path: Path, name: str, budgets: list[int], ckpt_every: int = 0, model: str = "llama_nano") -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(SWEEP.format(name=name, budgets=json.dumps(budgets), ckpt_every=ckpt_every, model=model))
    return str(path)


def wait_for(pred, timeout: float, what: str, poll: float = 0.5):
    t0 = time.time()
    while time.time() - t0 < timeout:
        value = pred()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def run_dirs(root: Path, name: str) -> list[Path]:
    return sorted(p for p in (root / name).iterdir() if p.is_dir() and p.name != "slurm")


def job_of(run: Path) -> str:
    return str(runstate.read_claim(run)["job_id"])


def step_of(run: Path) -> int:
    return runstate.inspect(run, None, reconcile_dead=False).step or 0


def in_queue(job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True).stdout.split()
    return job in out


def summary(run: Path) -> dict | None:
    return runstate.read_json(run / "summary.json")


def test_sweep_goes_out_as_job_array_and_relaunch_is_idempotent(tmp_path, capsys):
    root = tmp_path / "runs"
    path = write_sweep(tmp_path, "arr", [4096, 8192, 12288])
    t0 = time.time()
    assert sweep_main([path, "--runs-dir", str(root)]) == 0
    assert time.time() - t0 < 30, "launching must not wait for the jobs"
    out = capsys.readouterr().out
    assert "submitted 3 run(s) as 1 job array(s)" in out
    runs = run_dirs(root, "arr")
    jobs = [job_of(r) for r in runs]
    array_ids = {j.split("_")[0] for j in jobs}
    assert len(array_ids) == 1 and sorted(j.split("_")[1] for j in jobs) == ["0", "1", "2"]
    script = root / "arr" / "slurm" / f"{array_ids.pop()}_submission.sh"
    text = script.read_text()
    assert "#SBATCH --array=0-2%2" in text and "#SBATCH --partition=debug" in text
    for r in runs:  # config written before submission, replayable
        assert (r / "config.yaml").exists()
    wait_for(lambda: all(summary(r) for r in runs), 600, "the 3 array tasks to finish")
    assert sweep_main([path, "--runs-dir", str(root)]) == 0
    assert "nothing to submit" in capsys.readouterr().out


def test_preemption_checkpoints_requeues_and_matches_uninterrupted(tmp_path, capsys):
    budget = [512 * 600]
    ref_root, root = tmp_path / "ref", tmp_path / "runs"
    path = write_sweep(tmp_path, "pre", budget)
    assert sweep_main([path, "--runs-dir", str(root)]) == 0
    assert sweep_main([path, "--runs-dir", str(ref_root)]) == 0  # the uninterrupted twin
    (run,) = run_dirs(root, "pre")
    (ref,) = run_dirs(ref_root, "pre")
    assert run.name == ref.name  # same config -> same id
    job = job_of(run)
    wait_for(lambda: step_of(run) >= 40, 300, "the run to pass step 40")
    assert not summary(run), "run finished before it could be preempted; make it longer"
    submitit.SlurmJob(folder=root / "pre" / "slurm", job_id=job)._interrupt(timeout=False)  # SIGTERM, then USR2
    wait_for(lambda: (runstate.read_json(run / "state.json") or {}).get("state") == "preempted", 30,
             "the run to checkpoint and mark itself preempted")
    stopped_at = runstate.read_json(run / "state.json")["step"]
    assert (run / "ckpt" / "last.pt").exists() and stopped_at >= 40
    done = wait_for(lambda: summary(run), 750, "the requeued job to finish")
    ref_done = wait_for(lambda: summary(ref), 300, "the reference run to finish")
    log = (run / "train.log").read_text()
    assert f"from step {stopped_at}/" in log, "the requeued job must resume from the checkpoint"
    assert done["steps"] == ref_done["steps"] == 600
    assert abs(done["val_loss"] - ref_done["val_loss"]) <= 1e-6, (done["val_loss"], ref_done["val_loss"])


def test_scancel_marks_cancelled_and_relaunch_resumes(tmp_path, capsys):
    root = tmp_path / "runs"
    # scancel sends SIGTERM, which submitit ignores, and SIGKILL KillWait (5 s) later: the run must
    # still have well over 5 s to go when it is cancelled, hence the slower tiny model and 1200 steps (400 were
    # not enough on an idle 2-core machine: ~70 steps/s finished the run inside KillWait)
    path = write_sweep(tmp_path, "can", [512 * 1200], ckpt_every=20, model="llama_tiny")
    assert sweep_main([path, "--runs-dir", str(root)]) == 0
    (run,) = run_dirs(root, "can")
    job = job_of(run)
    wait_for(lambda: (run / "ckpt" / "last.pt").exists() and step_of(run) >= 40, 300, "a checkpoint past step 40")
    subprocess.run(["scancel", job], check=True)
    wait_for(lambda: not in_queue(job), 150, "the cancelled job to leave the queue")
    capsys.readouterr()
    assert status_main(["can", "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "cancelled" in out and "1 cancelled" in out
    state = runstate.read_json(run / "state.json")
    assert state["state"] == "failed" and state["error"].startswith("cancelled")
    # relaunch: only this run goes out again and resumes from its checkpoint
    assert sweep_main([path, "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "1 cancelled" in out and "submitted 1 run(s)" in out
    assert job_of(run) != job
    done = wait_for(lambda: summary(run), 1500, "the relaunched run to finish")
    assert done["steps"] == 1200
    assert "resuming" in (run / "train.log").read_text()
