"""Trainer: run files, exact resume on CPU, atomic checkpoints, wandb id reuse, non-finite detection."""
from __future__ import annotations

import json
import time

import pytest
import torch

from quartet import checkpoint as ckpt_io
from quartet.errors import DataError, NonFiniteError
from quartet.runs import run_dir
from quartet.train import Trainer


def rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def stop_at(step):
    def cb(trainer, row):
        if row["step"] == step:
            trainer.request_stop()
    return cb


def test_run_writes_contract_files_and_loss_falls(tiny_cfg):
    cfg = tiny_cfg("budget.tokens=20480")  # 40 steps
    out = Trainer(cfg).run()
    d = run_dir(cfg)
    for name in ("config.yaml", "state.json", "metrics.jsonl", "summary.json", "ckpt/last.pt", "env.json",
                 "quant_map.json", "train.log"):
        assert (d / name).is_file(), name
    summary = json.loads((d / "summary.json").read_text())
    for key in ("run_id", "name", "model", "n_params", "n_params_total", "tokens", "steps", "precision", "forward",
                "backward", "seed", "val_loss", "train_loss", "wall_clock_s", "tokens_per_s", "finished_at",
                "config_hash"):
        assert key in summary, key
    assert summary["steps"] == 40 and summary["tokens"] == 40 * 512 and summary["n_params"] == 13408
    assert out["state"] == "completed" and out["val_loss"] == summary["val_loss"]
    state = json.loads((d / "state.json").read_text())
    assert state["state"] == "completed" and state["step"] == state["total_steps"] == 40
    r = [x for x in rows(d) if "loss" in x]
    assert [x["step"] for x in r] == list(range(1, 41))
    assert set(r[0]) >= {"step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s"}
    assert r[-1]["loss"] < r[0]["loss"] - 0.5  # it learns
    env = json.loads((d / "env.json").read_text())
    assert env["torch"] == torch.__version__ and "git_commit" in env and "triton" in env and "cuda" in env
    # a completed run is not retrained: its metrics and summary stay as they were
    files = {name: (d / name).read_bytes() for name in ("metrics.jsonl", "summary.json")}
    again = Trainer(cfg).run()
    assert again["val_loss"] == summary["val_loss"]
    assert {name: (d / name).read_bytes() for name in files} == files


@pytest.mark.parametrize("precision", ["bf16", "quartet", "quartet2"])  # quartet2: MS-EDEN's scale draws resume too
def test_resume_equals_uninterrupted_run_exactly(tiny_cfg, tmp_path, precision):
    over = ["optim.micro_batch_size=4", "logging.val_every=4", "logging.val_batches=2", f"precision={precision}"]
    full_cfg = tiny_cfg(*over)
    Trainer(full_cfg).run()
    full = rows(run_dir(full_cfg))

    cut_cfg = tiny_cfg(*over, f"run.out_dir={tmp_path / 'cut'}")
    t = Trainer(cut_cfg)
    t.callbacks.append(stop_at(5))
    out = t.run()
    d = run_dir(cut_cfg)
    assert out["state"] == "preempted" and out["step"] == 5
    assert json.loads((d / "state.json").read_text())["state"] == "preempted"
    assert not (d / "summary.json").exists()
    resumed = Trainer(cut_cfg)
    resumed.run()
    cut = rows(d)
    assert [x["step"] for x in cut] == [x["step"] for x in full]
    for a, b in zip(full, cut):
        for key in ("loss", "grad_norm", "lr", "val_loss"):
            assert a.get(key) == b.get(key), (a["step"], key)  # bit-exact on CPU
    assert json.loads((d / "summary.json").read_text())["val_loss"] == json.loads(
        (run_dir(full_cfg) / "summary.json").read_text())["val_loss"]


def test_checkpoint_write_is_atomic(tiny_cfg, monkeypatch):
    cfg = tiny_cfg()
    t = Trainer(cfg)
    t.callbacks.append(stop_at(3))
    t.run()
    path = run_dir(cfg) / "ckpt" / "last.pt"
    before = ckpt_io.load(path)
    assert before["step"] == 3

    def crash(obj, fh):  # a kill mid-write: half a file, then death
        fh.write(b"PK\x03\x04partial-checkpoint-bytes")
        raise OSError("simulated crash during checkpoint write")

    t2 = Trainer(cfg)
    t2._load_checkpoint()
    t2.step = 4
    monkeypatch.setattr(ckpt_io, "_serialize", crash)
    with pytest.raises(OSError, match="simulated crash"):
        t2.save_checkpoint()
    monkeypatch.undo()
    assert not path.with_name("last.pt.tmp").exists()  # the partial file was the tmp, removed on the failure
    after = ckpt_io.load(path)
    assert after["step"] == 3
    assert all(torch.equal(before["model"][k], after["model"][k]) for k in before["model"])
    # and the run resumes from it and completes
    out = Trainer(cfg).run()
    assert out["state"] == "completed"


def test_wandb_offline_id_is_reused_on_resume(tiny_cfg):
    cfg = tiny_cfg("logging.wandb.mode=offline")
    t = Trainer(cfg)
    t.callbacks.append(stop_at(2))
    t.run()
    d = run_dir(cfg)
    wid = (d / "wandb_id").read_text().strip()
    assert len(wid) == 8
    time.sleep(1.1)  # wandb names offline folders by the second: keep the two sessions apart
    Trainer(cfg).run()
    assert (d / "wandb_id").read_text().strip() == wid
    runs = sorted((d / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(wid) for r in runs)
    assert all((r / f"run-{wid}.wandb").is_file() for r in runs)


def test_unreachable_wandb_does_not_stop_the_run(tiny_cfg, monkeypatch):
    import wandb

    def boom(*a, **k):
        raise ConnectionError("wandb.ai unreachable")

    monkeypatch.setattr(wandb, "init", boom)
    cfg = tiny_cfg("logging.wandb.mode=online")
    out = Trainer(cfg).run()
    assert out["state"] == "completed"
    assert "wandb disabled for this run: ConnectionError" in (run_dir(cfg) / "train.log").read_text()


def test_non_finite_forward_names_step_and_module(tiny_cfg):
    cfg = tiny_cfg()
    t = Trainer(cfg)
    with torch.no_grad():
        t.model.blocks[0].mlp.w12.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError) as info:
        t.run()
    msg = str(info.value)
    assert "non-finite loss at step 1" in msg and "'blocks.0.mlp.w12'" in msg
    d = run_dir(cfg)
    state = json.loads((d / "state.json").read_text())
    assert state["state"] == "failed" and "blocks.0.mlp.w12" in state["error"]
    assert "blocks.0.mlp.w12" in (d / "error.txt").read_text().splitlines()[0]
    assert not (d / "summary.json").exists()


def test_non_finite_gradient_names_the_parameter(tiny_cfg):
    cfg = tiny_cfg()
    t = Trainer(cfg)
    t.callbacks.append(lambda tr, row: row["step"] == 2 and tr.model.blocks[0].attn.proj.weight.register_hook(
        lambda g: g * float("nan")))
    with pytest.raises(NonFiniteError) as info:
        t.run()
    msg = str(info.value)
    assert "non-finite gradient norm at step 3" in msg and "blocks.0.attn.proj.weight" in msg


def test_corrupt_data_fails_before_anything_is_written(tiny_cfg, tmp_path):
    from quartet.data import prepare

    cfg = tiny_cfg(f"data.dir={tmp_path / 'data'}")
    folder = prepare(cfg.data, progress=False)
    shard = folder / "val-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-4])
    with pytest.raises(DataError, match="val-00000.bin has"):
        Trainer(cfg)
    assert not run_dir(cfg).exists()


def test_crash_then_rerun_resumes_from_last_checkpoint_without_duplicate_rows(tiny_cfg, tmp_path):
    cfg = tiny_cfg("logging.ckpt_every=4")
    ref_cfg = tiny_cfg("logging.ckpt_every=4", f"run.out_dir={tmp_path / 'ref'}")
    Trainer(ref_cfg).run()

    def crash(trainer, row):
        if row["step"] == 6:
            raise RuntimeError("node died")

    t = Trainer(cfg)
    t.callbacks.append(crash)
    with pytest.raises(RuntimeError, match="node died"):
        t.run()
    d = run_dir(cfg)
    assert json.loads((d / "state.json").read_text())["state"] == "failed"
    assert "node died" in (d / "error.txt").read_text()
    assert ckpt_io.load(d / "ckpt" / "last.pt")["step"] == 4
    Trainer(cfg).run()
    got, ref = rows(d), rows(run_dir(ref_cfg))
    assert [r["step"] for r in got] == [r["step"] for r in ref]  # rows 5, 6 were dropped and recomputed
    assert [r.get("loss") for r in got] == [r.get("loss") for r in ref]


def _stopped_at_5(cfg):
    t = Trainer(cfg)
    t.callbacks.append(stop_at(5))
    assert t.run()["state"] == "preempted"
    return run_dir(cfg)


def test_resume_records_a_torn_row_before_the_checkpoint_as_a_gap(tiny_cfg):
    """R3: power lost after the checkpoint of step 5 but before row 5 reached the disk (a torn last line): the
    resume drops the torn line, warns, and the completed run says which rows its curve lacks."""
    cfg = tiny_cfg()
    d = _stopped_at_5(cfg)
    path = d / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:17])  # row 5 cut mid-write, no newline
    out = Trainer(cfg).run()
    assert out["state"] == "completed"
    got = [r["step"] for r in rows(d) if not r.get("final")]
    assert got == [1, 2, 3, 4, *range(6, 13)]  # the torn line is gone, rows 6.. appended after row 4
    gap = {"rows": 1, "steps": "5"}
    assert json.loads((d / "summary.json").read_text())["metrics_gap"] == gap == out["metrics_gap"]
    assert json.loads((d / "state.json").read_text())["metrics_gap"] == gap
    log = (d / "train.log").read_text()
    assert "dropped 1 torn line" in log and "lacks 1 row(s) of steps 1..5 (steps 5)" in log


def test_resume_records_a_deleted_metrics_file_and_a_whole_curve_says_nothing(tiny_cfg, tmp_path):
    """R3: metrics.jsonl deleted while the run was stopped: rows 1..5 cannot come back; the run says so. A resume
    whose rows are all there (also under another logging.log_every) records no gap."""
    cfg = tiny_cfg()
    d = _stopped_at_5(cfg)
    (d / "metrics.jsonl").unlink()
    Trainer(cfg).run()
    assert json.loads((d / "summary.json").read_text())["metrics_gap"] == {"rows": 5, "steps": "1-5"}
    assert [r["step"] for r in rows(d) if not r.get("final")] == list(range(6, 13))

    whole = tiny_cfg(f"run.out_dir={tmp_path / 'whole'}")
    d = _stopped_at_5(whole)
    Trainer(tiny_cfg(f"run.out_dir={tmp_path / 'whole'}", "logging.log_every=4")).run()
    assert "metrics_gap" not in json.loads((d / "summary.json").read_text())
    assert "metrics_gap" not in json.loads((d / "state.json").read_text())
    assert [r["step"] for r in rows(d) if not r.get("final")] == [1, 2, 3, 4, 5, 8, 12]
