"""The `quartet train` / `quartet data` commands: stop by signal + resume, replay from config.yaml, data CLI."""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from quartet.config import compose, load_config_file
from quartet.data import cli_main as data_main
from quartet.runs import run_dir
from quartet.train import Trainer, cli_main as train_main

REPO = Path(__file__).resolve().parents[2]


def test_sigterm_checkpoints_and_the_same_config_resumes(tmp_path, tiny_overrides):
    over = [*tiny_overrides, "budget.tokens=1536000", f"run.out_dir={tmp_path}"]  # 3000 steps: far from done
    d = run_dir(compose(over))
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            m = d / "metrics.jsonl"
            if m.is_file() and len(m.read_text().splitlines()) >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "run the same command again to resume" in out
    state = json.loads((d / "state.json").read_text())
    assert state["state"] == "preempted" and 3 <= state["step"] < 3000
    assert (d / "ckpt" / "last.pt").is_file() and not (d / "summary.json").exists()
    # same config -> same directory -> resumes at the next step
    t = Trainer(compose(over))
    seen = []
    t.callbacks.append(lambda tr, row: (seen.append(row["step"]), tr.request_stop()))
    t.run()
    assert seen == [state["step"] + 1]


def test_config_file_replays_a_finished_run(tmp_path, tiny_overrides):
    over = [*tiny_overrides, f"run.out_dir={tmp_path}"]
    cfg = compose(over)
    Trainer(cfg).run()
    d = run_dir(cfg)
    again = load_config_file(d / "config.yaml")
    assert run_dir(again) == d
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert train_main(["--config-file", str(d / "config.yaml"), "--print-config"]) == 0
    assert f"# run_dir: {d}" in buf.getvalue()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert train_main(["--config-file", str(d)]) == 0  # completed: not retrained
    assert "already completed" in buf.getvalue()


def test_data_cli_prepare_verify_and_errors(tmp_path, capsys):
    corpus = tmp_path / "texts"
    corpus.mkdir()
    for i in range(30):
        (corpus / f"{i}.txt").write_text(f"text number {i} " * 40)
    over = ["data=files", f"data.paths=[{corpus}]", "data.vocab_size=300", "data.val_fraction=0.2",
            f"data.dir={tmp_path / 'out'}"]
    assert data_main(["prepare", *over]) == 0
    assert "train" in capsys.readouterr().out and (tmp_path / "out" / "manifest.json").is_file()
    assert data_main(["verify", *over]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    (tmp_path / "out" / "val-00000.bin").write_bytes(b"\x00\x01")
    assert data_main(["verify", *over]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("quartet: error: data: shard") and "\n" not in err
    assert data_main(["prepare", "data=nope"]) == 2
    assert "data=nope: unknown data; allowed: c4, files, pycode, shakespeare" in capsys.readouterr().err


def test_train_into_a_file_writes_clean_lines_not_bar_frames(tmp_path, tiny_overrides):
    """stdout/stderr piped to files: no progress-bar frames ('\\r'), one plain line per metrics row, and the
    quantization plan in a few short lines (the whole map lives in quant_map.json)."""
    over = [*tiny_overrides, "logging.progress=true", "logging.log_every=4", "precision=quartet", f"run.out_dir={tmp_path}"]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\r" not in proc.stderr and "\r" not in proc.stdout
    steps = [ln for ln in proc.stdout.splitlines() if " step " in ln and " loss " in ln]
    total = run_dir(compose(over)).joinpath("summary.json")
    n_steps = json.loads(total.read_text())["steps"]
    assert len(steps) >= n_steps // 4 and f"step {n_steps}/{n_steps}" in steps[-1]
    assert any("precision quartet" in ln for ln in proc.stdout.splitlines())
    assert max(len(ln) for ln in proc.stdout.splitlines()) < 400
