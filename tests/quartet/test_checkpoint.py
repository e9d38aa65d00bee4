"""Checkpoints: checksum header, previous generation kept, fallback to prev.pt, one-line errors, crash safety."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from quartet import checkpoint as ckpt_io
from quartet.config import compose
from quartet.errors import QuartetError
from quartet.runs import run_dir
from quartet.train import Trainer

REPO = Path(__file__).resolve().parents[2]
#: like the exact-resume test, with a checkpoint every 2 steps (12 steps in all)
OVER = ["optim.micro_batch_size=4", "logging.val_every=4", "logging.val_batches=2", "logging.ckpt_every=2"]


def rows(d):
    return [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]


def stop_at(step):
    def cb(trainer, row):
        if row["step"] == step:
            trainer.request_stop()
    return cb


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def preempted_at_5(tiny_cfg, tmp_path):
    """(reference rows and val_loss of an uninterrupted run, cut config, its run dir) with last.pt=5, prev.pt=4."""
    ref_cfg = tiny_cfg(*OVER, f"run.out_dir={tmp_path / 'ref'}")
    Trainer(ref_cfg).run()
    ref = run_dir(ref_cfg)
    cfg = tiny_cfg(*OVER)
    t = Trainer(cfg)
    t.callbacks.append(stop_at(5))
    assert t.run()["state"] == "preempted"
    d = run_dir(cfg)
    assert ckpt_io.load(d / "ckpt" / "last.pt")["step"] == 5 and ckpt_io.load(d / "ckpt" / "prev.pt")["step"] == 4
    return (rows(ref), json.loads((ref / "summary.json").read_text())["val_loss"]), cfg, d


def resume_and_check(cfg, d, ref, first_step: int) -> None:
    """Resume ``cfg``: it must restart at ``first_step`` and end equal (bit-exact on CPU) to the reference run."""
    seen = []
    t = Trainer(cfg)
    t.callbacks.append(lambda tr, row: seen.append(row["step"]))
    assert t.run()["state"] == "completed"
    assert seen[0] == first_step  # progress kept, not reset to step 0
    ref_rows, ref_val = ref
    got = rows(d)
    assert [r["step"] for r in got] == [r["step"] for r in ref_rows]  # rows newer than prev.pt dropped, recomputed
    for a, b in zip(ref_rows, got):
        for key in ("loss", "grad_norm", "lr", "val_loss"):
            assert a.get(key) == b.get(key), (a["step"], key)
    assert json.loads((d / "summary.json").read_text())["val_loss"] == ref_val


def warnings_in_log(d: Path) -> list[str]:
    return [ln for ln in (d / "train.log").read_text().splitlines() if " WARNING " in ln]


# -- the file format, without training -------------------------------------------------------


def test_save_keeps_previous_generation_and_verifies(tmp_path):
    last = tmp_path / "ckpt" / "last.pt"
    for step in (1, 2, 3):
        ckpt_io.save_atomic({"step": step, "w": torch.full((64,), float(step))}, last)
    assert ckpt_io.load(last)["step"] == 3 and ckpt_io.load(tmp_path / "ckpt" / "prev.pt")["step"] == 2
    assert not last.with_name("last.pt.tmp").exists()
    assert last.read_bytes().startswith(b"quartet-checkpoint v1 sha256=")
    last.write_bytes(b"")
    with pytest.raises(ckpt_io.CheckpointError, match=r"last\.pt: empty"):
        ckpt_io.load(last)
    last.write_bytes(b"quartet-checkpoint v1 sha")
    with pytest.raises(ckpt_io.CheckpointError, match=r"last\.pt: truncated or damaged header"):
        ckpt_io.load(last)


def test_old_checkpoint_without_checksum_loads_with_one_warning(tmp_path):
    path = tmp_path / "last.pt"
    torch.save({"step": 7}, path)  # what runs wrote before checksums
    with pytest.warns(UserWarning, match=r"last\.pt: no checksum .*loaded unverified"):
        assert ckpt_io.load(path)["step"] == 7


# -- the trainer ------------------------------------------------------------------------------


def test_truncated_last_resumes_from_prev_like_an_uninterrupted_run(tiny_cfg, tmp_path):
    ref, cfg, d = preempted_at_5(tiny_cfg, tmp_path)
    truncate(d / "ckpt" / "last.pt")
    resume_and_check(cfg, d, ref, first_step=5)
    warn = warnings_in_log(d)
    assert len(warn) == 1 and "last.pt: truncated" in warn[0] and "resuming from prev.pt at step 4" in warn[0]
    assert (d / "ckpt" / "last.pt.bad").is_file()  # kept for inspection, out of the rotation


def test_flipped_byte_is_caught_by_the_checksum_and_prev_is_used(tiny_cfg, tmp_path):
    ref, cfg, d = preempted_at_5(tiny_cfg, tmp_path)
    flip_byte(d / "ckpt" / "last.pt")
    with pytest.raises(ckpt_io.CheckpointError, match="checksum mismatch"):
        ckpt_io.load(d / "ckpt" / "last.pt")
    resume_and_check(cfg, d, ref, first_step=5)
    warn = warnings_in_log(d)
    assert len(warn) == 1 and "last.pt: checksum mismatch" in warn[0] and "prev.pt at step 4" in warn[0]


def test_both_checkpoints_bad_is_one_line_error_and_keeps_the_recorded_step(tiny_cfg, tmp_path, tiny_overrides):
    cfg = tiny_cfg(*OVER)
    t = Trainer(cfg)
    t.callbacks.append(stop_at(5))
    t.run()
    d = run_dir(cfg)
    truncate(d / "ckpt" / "last.pt")
    flip_byte(d / "ckpt" / "prev.pt")
    with pytest.raises(QuartetError) as info:
        Trainer(cfg).run()
    msg = str(info.value)
    assert "\n" not in msg and "last.pt: truncated" in msg and "prev.pt: checksum mismatch" in msg
    assert f"delete {d / 'ckpt'} to restart" in msg
    state = json.loads((d / "state.json").read_text())
    assert state["state"] == "failed" and state["step"] == 5  # not reset to 0
    assert not (d / "ckpt" / "last.pt.bad").exists()  # nothing moved when there is nothing to fall back to
    # the command line: exit 2 and one line on stderr
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "quartet.cli", "train", *tiny_overrides, *OVER,
                           f"run.out_dir={tmp_path / 'runs'}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert run_dir(compose([*tiny_overrides, *OVER, f"run.out_dir={tmp_path / 'runs'}"])) == d
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert err.startswith("quartet: error: no usable checkpoint: ") and "\n" not in err and "last.pt" in err


@pytest.mark.parametrize("moment", ["mid-write", "between-renames"])
def test_crash_while_saving_leaves_a_loadable_checkpoint(tiny_cfg, tmp_path, monkeypatch, moment):
    ref_cfg = tiny_cfg(*OVER, f"run.out_dir={tmp_path / 'ref'}")
    Trainer(ref_cfg).run()
    ref = (rows(run_dir(ref_cfg)), json.loads((run_dir(ref_cfg) / "summary.json").read_text())["val_loss"])
    real_replace = os.replace

    def half_written(obj, fh):  # a kill mid-write: part of a file, then death
        fh.write(b"PK\x03\x04partial-checkpoint-bytes")
        raise OSError("simulated crash during checkpoint write")

    def replace(src, dst):  # a kill after last.pt -> prev.pt, before the new file is moved in
        if Path(dst).name == "last.pt":
            raise OSError("simulated crash between the renames")
        return real_replace(src, dst)

    def crash_at_6(trainer, row):  # the periodic save right after this step crashes
        if row["step"] == 6:
            if moment == "mid-write":
                monkeypatch.setattr(ckpt_io, "_serialize", half_written)
            else:
                monkeypatch.setattr(os, "replace", replace)

    cfg = tiny_cfg(*OVER)
    t = Trainer(cfg)
    t.callbacks.append(crash_at_6)
    with pytest.raises(OSError, match="simulated crash"):
        t.run()
    monkeypatch.undo()
    d = run_dir(cfg)
    last, prev = d / "ckpt" / "last.pt", d / "ckpt" / "prev.pt"
    if moment == "mid-write":  # both generations untouched and verifiable
        assert ckpt_io.load(last)["step"] == 4 and ckpt_io.load(prev)["step"] == 2
    else:  # last.pt already rotated away: prev.pt holds step 4, complete
        assert not last.exists() and ckpt_io.load(prev)["step"] == 4
    resume_and_check(cfg, d, ref, first_step=5)
    if moment == "between-renames":
        assert any("last.pt: missing; resuming from prev.pt at step 4" in w for w in warnings_in_log(d))
