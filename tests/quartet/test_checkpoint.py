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
                          timeout=900)
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


# -- sharded checkpoints (run.parallel=fsdp): a DCP folder per generation --------------------------------------


def _model_and_optimizer(value: float):
    model = torch.nn.Linear(8, 4, bias=False)
    with torch.no_grad():
        model.weight.fill_(value)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.0)
    model(torch.ones(2, 8)).sum().backward()
    opt.step()  # Adam states exist
    return model, opt


def test_sharded_save_rotates_verifies_and_falls_back(tmp_path):
    """Two generations as folders; a stale last.tmp is replaced; a damaged shard or a missing meta.pt is refused
    (one line) and prev/ loads, the bad folder kept as last.bad/; with neither usable, one line naming both."""
    last = tmp_path / "ckpt" / "last"
    (tmp_path / "ckpt" / "last.tmp").mkdir(parents=True)
    (tmp_path / "ckpt" / "last.tmp" / "junk").write_text("a crashed save")
    for step in (1, 2):
        model, opt = _model_and_optimizer(float(step))
        ckpt_io.save_sharded(model, opt, {"step": step}, last)
    assert ckpt_io.sharded_exists(last) and not (tmp_path / "ckpt" / "last.tmp").exists()
    assert ckpt_io.load(last / "meta.pt")["step"] == 2 and ckpt_io.load(last.with_name("prev") / "meta.pt")["step"] == 1
    assert set(ckpt_io.load(last / "meta.pt")["files"]) == {".metadata", "__0_0.distcp"}

    model, opt = _model_and_optimizer(0.0)
    meta, used = ckpt_io.load_sharded_latest(model, opt, last)
    assert meta["step"] == 2 and used == last and float(model.weight.detach()[0, 0]) == pytest.approx(2.0 - 0.1, abs=1e-3)

    flip_byte(last / "__0_0.distcp")
    seen: list[str] = []
    meta, used = ckpt_io.load_sharded_latest(model, opt, last, warn=seen.append)
    assert meta["step"] == 1 and used.name == "prev" and (tmp_path / "ckpt" / "last.bad").is_dir()
    assert len(seen) == 1 and "__0_0.distcp" in seen[0] and "resuming from prev at step 1" in seen[0]
    assert float(model.weight.detach()[0, 0]) == pytest.approx(1.0 - 0.1, abs=1e-3)

    (last.with_name("prev") / "meta.pt").unlink()  # a folder whose save never finished
    with pytest.raises(ckpt_io.CheckpointError) as err:
        ckpt_io.load_sharded_latest(model, opt, last)
    assert "\n" not in str(err.value) and "prev/meta.pt: missing" in str(err.value).replace("\\", "/")


def test_sharded_crash_between_renames_leaves_prev(tmp_path, monkeypatch):
    last = tmp_path / "ckpt" / "last"
    for step in (1, 2):
        ckpt_io.save_sharded(*_model_and_optimizer(float(step)), {"step": step}, last)
    real_replace = os.replace

    def replace(src, dst):  # killed after last/ -> prev/, before last.tmp/ -> last/
        if Path(dst).name == "last":
            raise OSError("simulated crash between the renames")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="simulated crash"):
        ckpt_io.save_sharded(*_model_and_optimizer(3.0), {"step": 3}, last)
    monkeypatch.undo()
    assert not last.exists() and ckpt_io.sharded_exists(last)
    seen: list[str] = []
    meta, _ = ckpt_io.load_sharded_latest(*_model_and_optimizer(0.0), last, warn=seen.append)
    assert meta["step"] == 2 and "last: missing; resuming from prev at step 2" in seen[0]


def test_fsdp_preempted_run_resumes_exactly(tiny_cfg, tmp_path):
    """run.parallel=fsdp on one process: stopped at step 5 (sharded checkpoint), resumed, equal to a plain run."""
    ref_cfg = tiny_cfg(*OVER, f"run.out_dir={tmp_path / 'ref'}")
    Trainer(ref_cfg).run()
    ref = (rows(run_dir(ref_cfg)), json.loads((run_dir(ref_cfg) / "summary.json").read_text())["val_loss"])
    cfg = tiny_cfg(*OVER, "run.parallel=fsdp")
    t = Trainer(cfg)
    t.callbacks.append(stop_at(5))
    assert t.run()["state"] == "preempted"
    d = run_dir(cfg)
    assert ckpt_io.load(d / "ckpt" / "last" / "meta.pt")["step"] == 5
    assert ckpt_io.load(d / "ckpt" / "prev" / "meta.pt")["step"] == 4
    resume_and_check(cfg, d, ref, first_step=6)
    # the other kind of checkpoint is never taken for none: one line saying how to resume
    cfg_ddp = tiny_cfg(*OVER, "run.parallel=ddp", "budget.tokens=12288")
    ddp_dir = run_dir(cfg_ddp)
    (ddp_dir / "ckpt").mkdir(parents=True)
    os.rename(d / "ckpt" / "last", ddp_dir / "ckpt" / "last")
    with pytest.raises(QuartetError, match=r"holds a run.parallel=fsdp checkpoint; resume with run.parallel=fsdp"):
        Trainer(cfg_ddp).run()


def test_resume_where_fewer_gpus_are_visible_restores_the_cuda_rng_states_it_can(tiny_cfg, monkeypatch):
    """A checkpoint of 2 ranks that each saw 2 GPUs holds 2 CUDA RNG states; resumed with 1 GPU visible, the
    trainer restores the first (torch.cuda.set_rng_state_all would index a second device and raise IndexError)."""
    cfg = tiny_cfg("optim.micro_batch_size=4", "budget.tokens=2048")
    t = Trainer(cfg)
    t.callbacks.append(stop_at(2))
    assert t.run()["state"] == "preempted"
    path = run_dir(cfg) / "ckpt" / "last.pt"
    state = ckpt_io.load(path)
    state["rng"]["cuda"] = [torch.full((16,), 1, dtype=torch.uint8), torch.full((16,), 2, dtype=torch.uint8)]
    ckpt_io.save_atomic(state, path)
    resumed = Trainer(cfg)  # built on the CPU; from here on the process "sees" one GPU
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: restored.append(list(states)))
    resumed._load_checkpoint()
    assert resumed.step == 2
    assert len(restored) == 1 and len(restored[0]) == 1 and restored[0][0].tolist() == [1] * 16


def test_killed_between_the_final_checkpoint_and_the_summary_resumes_to_a_full_summary(tiny_cfg):
    """The resume runs no step (the checkpoint is at the last one): the summary's train_loss is the last logged
    training loss, not NaN (which is not JSON)."""
    cfg = tiny_cfg()
    t = Trainer(cfg)

    def killed(summary):
        raise KeyboardInterrupt("killed before summary.json")

    t.record.complete = killed
    with pytest.raises(KeyboardInterrupt):
        t.run()
    d = run_dir(cfg)
    assert not (d / "summary.json").exists()
    summary = Trainer(cfg).run()
    logged = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last_loss = [r["loss"] for r in logged if "loss" in r][-1]
    on_disk = json.loads((d / "summary.json").read_text())
    assert summary["train_loss"] == on_disk["train_loss"] == pytest.approx(last_loss)


def test_a_hard_stop_between_checkpoints_names_the_checkpoint_it_resumes_from(tiny_cfg):
    """Ctrl-C at step 7 with checkpoints every 5 steps: state.json says preempted at step 5, where it resumes."""
    cfg = tiny_cfg("logging.ckpt_every=5")
    t = Trainer(cfg)

    def stop(trainer, row):
        if row["step"] == 7:
            raise KeyboardInterrupt("hard stop")

    t.callbacks.append(stop)
    with pytest.raises(KeyboardInterrupt):
        t.run()
    state = json.loads((run_dir(cfg) / "state.json").read_text())
    assert (state["state"], state["step"]) == ("preempted", 5)
    assert ckpt_io.load(run_dir(cfg) / "ckpt" / "last.pt")["step"] == 5  # where a resume starts
