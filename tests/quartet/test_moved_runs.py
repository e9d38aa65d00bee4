"""Copied and moved run directories (issue #33 item 2): a run directory trains where it is, or refuses with one line.

- ``quartet train --config-file <copy>/config.yaml`` trains in the copy (it used to train the original path);
- a moved run resumes from its checkpoint at its new place (it used to restart from step 0 at the old path);
- a run directory moved while it trains stops its trainer with one line at the next step, nothing is written at
  the old path again, and the run resumes at the new place (it used to go on and split in two).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from quartet.config import compose
from quartet.runs import run_dir
from quartet.train import Trainer
from quartet.train import cli_main as train_main

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _rows(d: Path) -> list[dict]:
    return [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def _stopped_at(cfg, step: int) -> Path:
    """Train ``cfg`` until ``step``, checkpoint and stop (preempted); its run directory."""
    t = Trainer(cfg)
    t.callbacks.append(lambda tr, row: tr.request_stop() if row["step"] == step else None)
    assert t.run()["state"] == "preempted"
    return run_dir(cfg)


def test_copied_run_trains_in_the_copy_and_leaves_the_original(tiny_cfg, tmp_path, capsys):
    cfg = tiny_cfg()
    src = _stopped_at(cfg, 6)
    before = _files(src)
    copy = tmp_path / "elsewhere" / "mine" / src.name
    shutil.copytree(src, copy)
    assert train_main(["--config-file", str(copy / "config.yaml")]) == 0
    assert f"run_dir {copy}" in capsys.readouterr().out
    assert (copy / "summary.json").is_file() and "resuming" in (copy / "train.log").read_text()
    assert _files(src) == before and not (src / "summary.json").exists()
    steps = [r["step"] for r in _rows(copy) if not r.get("final")]
    assert steps == list(range(1, 13))
    # --print-config says so too
    assert train_main(["--config-file", str(copy), "--print-config"]) == 0
    assert f"# run_dir: {copy}" in capsys.readouterr().out


def test_moved_run_resumes_from_its_checkpoint_at_the_new_place(tiny_cfg, tmp_path, capsys):
    ref_cfg = tiny_cfg(f"run.out_dir={tmp_path / 'ref'}")
    Trainer(ref_cfg).run()
    ref = json.loads((run_dir(ref_cfg) / "summary.json").read_text())["val_loss"]
    cfg = tiny_cfg()
    src = _stopped_at(cfg, 6)
    moved = tmp_path / "moved" / "group" / src.name
    moved.parent.mkdir(parents=True)
    os.rename(src, moved)
    assert train_main(["--config-file", str(moved / "config.yaml")]) == 0
    assert not src.exists()  # nothing trained at the old path
    assert "resuming llama_nano" in (moved / "train.log").read_text()
    assert json.loads((moved / "summary.json").read_text())["val_loss"] == ref  # exactly the uninterrupted run


def test_renamed_run_directory_is_refused_in_one_line(tiny_cfg, tmp_path, capsys):
    cfg = tiny_cfg()
    src = _stopped_at(cfg, 6)
    renamed = src.with_name("my-favourite-run")
    os.rename(src, renamed)
    before = _files(renamed)
    capsys.readouterr()
    assert train_main(["--config-file", str(renamed / "config.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rename the folder to " + src.name in err[0], err
    assert _files(renamed) == before and not src.exists()


def test_run_directory_moved_while_training_stops_in_one_line(tmp_path, tiny_overrides):
    over = [*tiny_overrides, "budget.tokens=307200", "logging.ckpt_every=20", f"run.out_dir={tmp_path / 'runs'}"]
    d = run_dir(compose(over))
    proc = subprocess.Popen([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    new = tmp_path / "runs" / "moved" / d.name
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            try:
                if json.loads((d / "state.json").read_text()).get("step", 0) >= 40:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        new.parent.mkdir(parents=True)
        os.rename(d, new)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"was moved to {new}" in lines[0], err[-3000:]
    assert not d.exists()  # the old path was not written again (it is not split in two)
    state = json.loads((new / "state.json").read_text())
    assert state["state"] == "failed" and "was moved" in state["error"]
    res = subprocess.run([sys.executable, "-m", "quartet.cli", "train", "--config-file", str(new / "config.yaml")],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not d.exists() and (new / "summary.json").is_file()
    rows = _rows(new)
    steps = [r["step"] for r in rows if not r.get("final")]
    assert steps == list(range(1, 601)) and sum(1 for r in rows if r.get("final")) == 1
