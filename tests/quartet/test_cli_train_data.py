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

from quartet.config import compose, load_config_file, to_yaml
from quartet.data import cli_main as data_main
from quartet.runs import run_dir
from quartet.train import Trainer, cli_main as train_main

REPO = Path(__file__).resolve().parents[2]


def _train_until_signal(over: list[str], sig: int, rows: int = 3):
    """``quartet train OVER`` in a child process, sent ``sig`` once its metrics.jsonl has ``rows`` rows: (proc, out, err)."""
    d = run_dir(compose(over))
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            m = d / "metrics.jsonl"
            if m.is_file() and len(m.read_text().splitlines()) >= rows:
                break
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc, out, err


def test_sigterm_checkpoints_and_the_same_config_resumes(tmp_path, tiny_overrides):
    over = [*tiny_overrides, "budget.tokens=1536000", f"run.out_dir={tmp_path}"]  # 3000 steps: far from done
    d = run_dir(compose(over))
    proc, out, err = _train_until_signal(over, signal.SIGTERM)
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
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\r" not in proc.stderr and "\r" not in proc.stdout
    steps = [ln for ln in proc.stdout.splitlines() if " step " in ln and " loss " in ln]
    total = run_dir(compose(over)).joinpath("summary.json")
    n_steps = json.loads(total.read_text())["steps"]
    assert len(steps) >= n_steps // 4 and f"step {n_steps}/{n_steps}" in steps[-1]
    assert any("precision quartet" in ln for ln in proc.stdout.splitlines())
    assert max(len(ln) for ln in proc.stdout.splitlines()) < 400



def test_train_on_a_terminal_shows_a_live_bar(tmp_path, tiny_overrides):
    """stderr a terminal (a pseudo-terminal here): a live bar of the run's steps with its loss and learning rate
    (rich, redrawn in place), and the run completes."""
    import pty

    over = [*tiny_overrides, "logging.progress=true", f"run.out_dir={tmp_path}"]
    parent, child = pty.openpty()
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "COLUMNS": "160"}
    proc = subprocess.Popen([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=env,
                            stdin=child, stdout=child, stderr=child)
    os.close(child)
    out = b""
    with contextlib.suppress(OSError):  # EIO once the child closed its end
        while chunk := os.read(parent, 65536):
            out += chunk
    os.close(parent)
    assert proc.wait(timeout=600) == 0, out.decode(errors="replace")[-2000:]
    n_steps = json.loads(run_dir(compose(over)).joinpath("summary.json").read_text())["steps"]
    frames = [f for f in out.decode(errors="replace").replace("\r", "\n").splitlines() if " steps " in f]
    assert any(f"{n_steps}/{n_steps}" in f and "loss " in f and " lr " in f for f in frames), frames[-3:]

# ---------------------------------------------------------------- corrupt files: one line, exit 2, nothing lost


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("quartet: error: "), err
    return err


def test_corrupt_config_file_is_one_line_naming_it(tmp_path, tiny_overrides, capsys):
    """`quartet train --config-file` on a run config that is not UTF-8, not YAML, not a mapping or cut
    short: one line naming the file, exit 2 (was a 55-line yaml / UnicodeDecodeError traceback)."""
    good = to_yaml(compose([*tiny_overrides, f"run.out_dir={tmp_path}"]))
    cases = {
        "binary": b"\xff\xfe\x00model: x\n",
        "unclosed": b"model:\n  name: [oops\n  d_model: 8\n",
        "truncated_mid_line": good.encode()[: len(good) // 2 - 3] + b"\n  bad_key_with_no_colon\n",
        "truncated_sections": "\n".join(good.splitlines()[:15]).encode() + b"\n",
        "a_list": b"[1, 2]\n",
        "empty": b"",
    }
    for name, blob in cases.items():
        path = tmp_path / name / "config.yaml"
        path.parent.mkdir()
        path.write_bytes(blob)
        assert train_main(["--config-file", str(path), "--print-config"]) == 2, name
        err = _one_error_line(capsys)
        assert str(path) in err and "restore it" in err, (name, err)
        assert path.read_bytes() == blob  # nothing rewritten
        assert sorted(p.name for p in path.parent.iterdir()) == ["config.yaml"]
    assert "line 3, column" in train_main_err(tmp_path / "unclosed" / "config.yaml", capsys)
    assert "not UTF-8" in train_main_err(tmp_path / "binary" / "config.yaml", capsys)
    assert "lacks" in train_main_err(tmp_path / "truncated_sections" / "config.yaml", capsys)


def train_main_err(path: Path, capsys) -> str:
    assert train_main(["--config-file", str(path)]) == 2
    return _one_error_line(capsys)


def test_metrics_row_that_is_not_an_object_stops_resume_with_one_line(tiny_cfg, tiny_overrides, tmp_path, capsys):
    """A metrics.jsonl line that is valid JSON but not an object (`[1,2]`, `3`): resume used to crash with
    AttributeError; now one line naming file + line, exit 2, and metrics.jsonl / state.json untouched."""
    cfg = tiny_cfg()
    t = Trainer(cfg)
    t.callbacks.append(lambda tr, row: tr.request_stop() if row["step"] >= 3 else None)
    t.run()
    d = run_dir(cfg)
    for junk in ("[1,2]", "3"):
        metrics = (d / "metrics.jsonl").read_text()
        (d / "metrics.jsonl").write_text(metrics + junk + "\n")
        before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
        assert train_main([*tiny_overrides, f"run.out_dir={tmp_path / 'runs'}"]) == 2
        err = _one_error_line(capsys)
        assert str(d / "metrics.jsonl") in err and f"line {metrics.count(chr(10)) + 1} is '{junk}'" in err
        after = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
        assert after == before  # state.json still says preempted, nothing truncated
        assert json.loads(after["state.json"])["state"] == "preempted"
        (d / "metrics.jsonl").write_text(metrics)
    assert train_main([*tiny_overrides, f"run.out_dir={tmp_path / 'runs'}"]) == 0  # fixed file: resumes
    assert json.loads((d / "summary.json").read_text())["steps"] == 12


def test_corrupt_summary_is_not_retrained(tiny_cfg, tiny_overrides, tmp_path, capsys):
    """A finished run whose summary.json is corrupt used to be trained again (a duplicate final metrics row);
    now `quartet train` stops with one line naming the file and leaves the run directory as it is."""
    cfg = tiny_cfg()
    Trainer(cfg).run()
    d = run_dir(cfg)
    (d / "summary.json").write_text((d / "summary.json").read_text()[:40])
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    assert train_main([*tiny_overrides, f"run.out_dir={tmp_path / 'runs'}"]) == 2
    err = _one_error_line(capsys)
    assert f"{d / 'summary.json'} is corrupt" in err and "delete it to train the run again" in err
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before


def test_corrupt_shard_under_verify_size_names_it(tmp_path, tiny_overrides, capsys):
    """data.verify=size skips the sha256: a shard of the right size with garbage ids used to end in an
    IndexError inside the embedding; now one line naming the shard and `quartet data prepare ... --force`."""
    corpus = tmp_path / "texts"
    corpus.mkdir()
    for i in range(40):
        (corpus / f"{i}.txt").write_text(f"text number {i} about nothing much " * 30)
    data = ["data=files", f"data.paths=[{corpus}]", "data.vocab_size=300", "data.val_fraction=0.2",
            f"data.dir={tmp_path / 'data'}", "data.verify=size"]
    over = [*tiny_overrides, *data, f"run.out_dir={tmp_path / 'runs'}"]
    assert data_main(["prepare", *data]) == 0
    capsys.readouterr()
    shard = tmp_path / "data" / "train-00000.bin"
    shard.write_bytes(b"\xff" * shard.stat().st_size)  # same size, every id 65535 (uint16) >= 300
    assert train_main(over) == 2
    err = _one_error_line(capsys)
    assert f"shard {shard}" in err and "corrupt" in err and "quartet data prepare data=files --force" in err
    state = json.loads((run_dir(compose(over)) / "state.json").read_text())
    assert state["state"] == "failed" and state["error"].startswith("DataError: data: shard")
    assert data_main(["prepare", *data, "--force"]) == 0  # the suggested command repairs it
    assert train_main(over) == 0


def test_ctrl_c_checkpoints_and_exits_130(tmp_path, tiny_overrides):
    """Ctrl-C (SIGINT) stops at a step boundary with a checkpoint and exits 130, so `quartet train ... && quartet fit`
    stops there; a bad override is refused before torch is imported."""
    over = [*tiny_overrides, "budget.tokens=1536000", f"run.out_dir={tmp_path}"]
    d = run_dir(compose(over))
    proc, out, err = _train_until_signal(over, signal.SIGINT, rows=2)
    assert proc.returncode == 130, err[-2000:]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    assert "run the same command again to resume" in out and (d / "ckpt" / "last.pt").is_file()
    bad = subprocess.run([sys.executable, "-X", "importtime", "-m", "quartet.cli", "train", "run.sed=1"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=900)
    assert bad.returncode == 2 and "run.sed: unknown key" in bad.stderr
    assert not any(line.rstrip().endswith("| torch") for line in bad.stderr.splitlines())


def test_train_writes_nothing_into_the_home_folder(tmp_path, tiny_overrides):
    """wandb's debug logs (~/.cache/wandb/logs) and config go to the project cache: `quartet train` with wandb on
    (offline) leaves a fresh HOME empty."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MPLCONFIGDIR"))}
    env.update(HOME=str(home), QUARTET_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    over = [o for o in tiny_overrides if not o.startswith("logging")] + [
        "logging.wandb.mode=offline", "logging.progress=false", f"run.out_dir={tmp_path / 'runs'}"]
    proc = subprocess.run([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(home.rglob("*")) == []
    assert (run_dir(compose(over)) / "wandb").is_dir()
