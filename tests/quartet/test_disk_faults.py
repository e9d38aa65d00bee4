"""Full and read-only disks (issue #33 item 3): one line from `quartet train`, the reason in error.txt, `failed` in
state.json where it can still be written; and a crash between the final metrics row and summary.json leaves no
duplicate final row after the resume."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quartet import recorder as rec
from quartet.config import compose
from quartet.runs import run_dir
from quartet.train import Trainer
from quartet.train import cli_main as train_main

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _rows(d: Path) -> list[dict]:
    return [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MiB tmpfs mounted at ``<tmp>/fs`` (root only; skipped where it cannot be mounted); unmounted after."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(mnt)], capture_output=True)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte; returns the filler file."""
    filler = folder / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (65536, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def _train_until(over: list[str], d: Path, step: int) -> subprocess.Popen:
    """``quartet train`` in a subprocess, returned once its state.json records ``step`` (a checkpoint)."""
    proc = subprocess.Popen([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(proc.communicate()[1][-2000:])
        try:
            st = json.loads((d / "state.json").read_text())
        except (OSError, ValueError):
            st = None
        if st and st.get("step", 0) >= step:
            return proc
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise AssertionError("the run never reached its checkpoint")


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def _resume_completes(over: list[str], d: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=ENV,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming" in (d / "train.log").read_text()
    rows = _rows(d)
    steps = [r["step"] for r in rows if not r.get("final")]
    assert steps == list(range(1, 601)) and sum(1 for r in rows if r.get("final")) == 1


def _one_line(err: str, what: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("quartet: error: ") and what in lines[0], lines[0]


def test_disk_full_while_training_is_one_line_failed_and_resumes(small_fs, tiny_overrides):
    """The disk fills up mid-run: exit 1 with one line (it used to be 2-3 chained tracebacks), error.txt holds the
    reason (it used to be empty) and state.json says failed (it used to say running); with room again the same
    command resumes from the last checkpoint, each step logged once."""
    over = [*tiny_overrides, "budget.tokens=307200", "logging.ckpt_every=20", f"run.out_dir={small_fs}"]  # 600 steps
    d = run_dir(compose(over))
    proc = _train_until(over, d, 40)
    try:
        filler = _fill(small_fs)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err[-3000:]
    _one_line(err, "No space left on device")
    assert "Traceback" not in err
    assert "No space left" in (d / "error.txt").read_text()
    state = json.loads((d / "state.json").read_text())
    assert state["state"] == "failed" and "No space left" in state["error"]
    filler.unlink()
    _resume_completes(over, d)


def test_read_only_disk_is_one_line_and_changes_nothing(small_fs, tiny_overrides):
    """A run resumed on a disk that is read-only: one line naming the file system's error, exit 1, every file as
    it was; remounted read-write, the same command resumes."""
    over = [*tiny_overrides, "budget.tokens=307200", "logging.ckpt_every=20", f"run.out_dir={small_fs}"]
    d = run_dir(compose(over))
    proc = _train_until(over, d, 40)
    proc.send_signal(signal.SIGTERM)  # checkpoint and stop: preempted
    assert proc.wait(timeout=600) == 0
    before = _files(d)
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    res = subprocess.run([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=ENV,
                         capture_output=True, text=True, timeout=900)
    subprocess.run(["mount", "-o", "remount,rw", str(small_fs)], check=True)
    assert res.returncode == 1, res.stderr[-3000:]
    _one_line(res.stderr, "Read-only file system")
    assert _files(d) == before
    _resume_completes(over, d)


def test_crash_between_final_row_and_summary_leaves_one_final_row(tiny_cfg, monkeypatch, capsys):
    """The final metrics row was written, summary.json not (a crash, a full disk): the resume must not append a
    second final row."""
    cfg = tiny_cfg("logging.ckpt_every=4")
    d = run_dir(cfg)
    real = rec.write_json_atomic

    def no_summary(path, obj, **kw):
        if Path(path).name == "summary.json":
            raise OSError(28, "No space left on device", str(path))
        return real(path, obj, **kw)

    monkeypatch.setattr(rec, "write_json_atomic", no_summary)
    with pytest.raises(OSError):
        Trainer(cfg).run()
    monkeypatch.undo()
    assert sum(1 for r in _rows(d) if r.get("final")) == 1 and not (d / "summary.json").exists()
    Trainer(cfg).run()
    rows = _rows(d)
    assert sum(1 for r in rows if r.get("final")) == 1
    steps = [r["step"] for r in rows if not r.get("final")]
    assert len(steps) == len(set(steps))
    assert (d / "summary.json").is_file()


def test_enospc_from_the_cli_is_one_line_and_records_failed(tiny_overrides, tmp_path, monkeypatch, capsys):
    """Without a mount: every metrics write raising ENOSPC after step 3 -> one line, error.txt, state failed."""
    over = [*tiny_overrides, f"run.out_dir={tmp_path}"]
    d = run_dir(compose(over))
    real = rec.RunRecorder.progress

    def progress(self, step, show):
        cm = real(self, step, show)

        class Wrap:
            def __enter__(inner):
                record = cm.__enter__()

                def failing(row, s, loss, lr):
                    if s > 3:
                        raise OSError(28, "No space left on device", str(d / "metrics.jsonl"))
                    record(row, s, loss, lr)
                return failing

            def __exit__(inner, *exc):
                return cm.__exit__(*exc)
        return Wrap()

    monkeypatch.setattr(rec.RunRecorder, "progress", progress)
    assert train_main(over) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0], err
    assert "No space left" in (d / "error.txt").read_text()
    assert json.loads((d / "state.json").read_text())["state"] == "failed"


def test_the_completion_marker_is_fsynced_after_every_row(tiny_cfg, monkeypatch):
    """A power loss must not leave summary.json empty (it blocks a sweep as corrupt) nor keep it without its rows:
    the metrics file is fsynced before the final checkpoint and again after the final row, then summary.json's
    temporary file before its rename, then the folder."""
    from quartet.train import Trainer

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("names the fsynced files through /proc (Linux)")
    synced, real_fsync = [], os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    cfg = tiny_cfg()
    t = Trainer(cfg)
    monkeypatch.setattr(os, "fsync", fsync)
    t.run()
    names = [Path(s).name for s in synced]
    d = run_dir(cfg)
    marker = next(i for i, n in enumerate(names) if n.startswith(".summary.json."))
    assert "metrics.jsonl" in names[:marker]  # the rows, then the marker
    assert names[marker + 1] == d.name  # the rename made durable
