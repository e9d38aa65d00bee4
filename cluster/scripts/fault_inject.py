"""Fault injection on tiny CPU runs: kill inside a checkpoint write, kill -9 of a sweep's launcher, a full disk, a
run directory moved while it trains. Each interrupted run is recovered the documented way (the same command again,
a relaunch, or `--config-file NEW/config.yaml`) and compared with an uninterrupted twin.

Prints one line per trial and a summary ``runs lost / trained twice / exact resume`` (target: 0 / 0 / all):
- lost: a run that did not complete after its recovery, or a one-line-error check that failed;
- trained twice: a step logged twice (or more than one final row) in a run's metrics.jsonl, or a moved run's old path
  written again;
- exact resume: the recovered run's per-step losses and final validation loss equal its twin's, bit for bit.

    python cluster/scripts/fault_inject.py [--repeats 2] [--steps 200] [--out DIR] [--keep]

Defaults take about 3-5 minutes on 2 cores. Exit status 1 unless the summary is 0 / 0 / all.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = ["model=llama_nano", "data=shakespeare_small", "logging=quiet", "logging.log_every=1", "run.threads=1",
        "budget=tokens", "run.device=cpu"]
TOKENS_PER_STEP = 512  # llama_nano: 8 x 64-token sequences

#: runs ``quartet.cli`` with one fault armed at the QFI_AT-th checkpoint write (QFI_MODE: kill | enospc)
INJECT = r"""
import errno, os, signal, sys
from quartet import checkpoint as C
mode, at, real, calls = os.environ["QFI_MODE"], int(os.environ["QFI_AT"]), C._serialize, [0]
def faulty(obj, fh):
    calls[0] += 1
    if calls[0] == at:
        if mode == "kill":  # half a checkpoint on disk, then death
            fh.write(b"PK\x03\x04partial-checkpoint")
            fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.ENOSPC, "No space left on device", "ckpt/last.pt.tmp")
    return real(obj, fh)
C._serialize = faulty
from quartet.cli import main
sys.exit(main(sys.argv[1:]))
"""

SWEEP = """
name: fi
cluster: local
axes:
  budget.tokens: [{a}, {b}]
  precision: [bf16, fp8]
fixed: {{model: llama_nano, budget: tokens, data: shakespeare_small, logging: quiet, logging.ckpt_every: 10,
        run.device: cpu}}
"""


def _env() -> dict:
    return {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quartet.cli", *args], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=timeout)


def _rows(d: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _curve(d: Path) -> tuple[list[tuple[int, float]], float | None]:
    """(step, train loss) of every row and the final validation loss (None when the run did not complete)."""
    try:
        val = json.loads((d / "summary.json").read_text())["val_loss"]
    except (OSError, ValueError, KeyError):
        val = None
    return [(r["step"], r.get("loss")) for r in _rows(d) if not r.get("final")], val


def _twice(d: Path) -> bool:
    rows = _rows(d)
    steps = [r["step"] for r in rows if not r.get("final")]
    return len(steps) != len(set(steps)) or sum(1 for r in rows if r.get("final")) > 1


def _run_dir(over: list[str]) -> Path:
    res = _cli("train", *over, "--print-config", timeout=120)
    for line in res.stdout.splitlines():
        if line.startswith("# run_dir: "):
            return Path(line.split(": ", 1)[1])
    raise RuntimeError(f"no run_dir in --print-config: {res.stderr[-500:]}")


class Tally:
    def __init__(self) -> None:
        self.trials = self.lost = self.twice = self.exact = 0

    def judge(self, name: str, d: Path, ref: tuple, ok: bool, why: str = "", also_twice: bool = False) -> None:
        curve, val = _curve(d)
        lost = val is None or not ok
        twice = _twice(d) or also_twice
        exact = not lost and (curve, val) == ref
        self.trials += 1
        self.lost += lost
        self.twice += twice
        self.exact += exact
        verdict = "exact" if exact else ("LOST" if lost else "DIFFERENT")
        print(f"{name:<34} {verdict:<9} {'TRAINED TWICE ' if twice else ''}{why}", flush=True)


def _one_line(res: subprocess.CompletedProcess, what: str) -> tuple[bool, str]:
    lines = res.stderr.strip().splitlines()
    ok = len(lines) == 1 and what in lines[0] and "Traceback" not in res.stderr
    return ok, "" if ok else f"(expected one line with {what!r}, rc {res.returncode}: {res.stderr.strip()[-300:]!r})"


def _inject(mode: str, at: int, over: list[str]) -> subprocess.CompletedProcess:
    env = {**_env(), "QFI_MODE": mode, "QFI_AT": str(at)}
    return subprocess.run([sys.executable, "-c", INJECT, "train", *over], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


def kill_inside_checkpoint(out: Path, base: list[str], ref: tuple, at: int, tally: Tally) -> None:
    over = [*base, f"run.out_dir={out / f'kill-ckpt-{at}'}"]
    d = _run_dir(over)
    res = _inject("kill", at, over)
    ok = res.returncode == -signal.SIGKILL
    res = _cli("train", *over)
    tally.judge(f"kill inside checkpoint #{at}", d, ref, ok and res.returncode == 0, res.stderr.strip()[-200:])


def full_disk(out: Path, base: list[str], ref: tuple, at: int, tally: Tally) -> None:
    over = [*base, f"run.out_dir={out / f'full-disk-{at}'}"]
    d = _run_dir(over)
    res = _inject("enospc", at, over)
    ok, why = _one_line(res, "No space left on device")
    try:
        state = json.loads((d / "state.json").read_text())
        recorded = state.get("state") == "failed" and (d / "error.txt").stat().st_size > 0
    except (OSError, ValueError):
        recorded = False
    if not recorded:
        ok, why = False, why + " (state.json not failed or error.txt empty)"
    res = _cli("train", *over)
    tally.judge(f"full disk at checkpoint #{at}", d, ref, ok and res.returncode == 0 and res.returncode == 0, why)


def moved_while_training(out: Path, base: list[str], ref: tuple, step: int, tally: Tally) -> None:
    over = [*base, f"run.out_dir={out / f'moved-{step}'}"]
    d = _run_dir(over)
    new = out / f"moved-{step}" / "elsewhere" / d.name
    proc = subprocess.Popen([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if len(_rows(d)) >= step:
                break
            time.sleep(0.02)
        new.parent.mkdir(parents=True, exist_ok=True)
        os.rename(d, new)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ok, why = _one_line(subprocess.CompletedProcess(proc.args, proc.returncode, "", err), "was moved to")
    res = _cli("train", "--config-file", str(new / "config.yaml"))
    split = d.exists()  # anything written at the old path again
    tally.judge(f"moved while training at step ~{step}", new, ref, ok and res.returncode == 0, why, also_twice=split)


def _holders(root: Path) -> list[Path]:
    from quartet.runlock import holder

    return [p for p in root.glob("fi/*") if p.is_dir() and holder(p) is not None]


def _line_count(path: Path) -> int:
    try:
        return sum(1 for _ in path.open())
    except OSError:
        return 0


def launcher_kill(out: Path, tokens: tuple[int, int], delay: float | str, tally: Tally, refs: dict) -> None:
    """kill -9 of a local sweep's launcher ``delay`` s after it starts (0.3: before any worker trained), or once a
    worker has logged three steps (``"mid"``: mid-training on any machine), then relaunch until it returns 0; every
    run against the uninterrupted sweep's."""
    spec = out / "fi.yaml"
    spec.write_text(SWEEP.format(a=tokens[0], b=tokens[1]))
    if not refs:
        ref_root = out / "sweep-ref"
        res = _cli("sweep", str(spec), "--runs-dir", str(ref_root))
        if res.returncode != 0:
            raise RuntimeError(f"reference sweep failed: {res.stderr[-1000:]}")
        refs.update({p.name: _curve(p) for p in (ref_root / "fi").iterdir() if (p / "summary.json").is_file()})
    root = out / f"sweep-kill-{delay}"
    proc = subprocess.Popen([sys.executable, "-m", "quartet.cli", "sweep", str(spec), "--runs-dir", str(root)],
                            cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if delay == "mid":  # as soon as a worker has trained a few steps, whatever the machine's speed
        deadline = time.time() + 120
        while time.time() < deadline and not any(_line_count(m) >= 3 for m in root.glob("fi/*/metrics.jsonl")):
            time.sleep(0.05)
    else:
        time.sleep(float(delay))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 180  # its workers checkpoint and exit by themselves
    while time.time() < deadline and (root / "fi").is_dir() and _holders(root):
        time.sleep(0.2)
    states = {}
    if (root / "fi").is_dir():
        st = _cli("status", "fi", "--runs-dir", str(root), timeout=120)
        states = {line.split()[1]: line.split()[3] for line in st.stdout.splitlines() if line.startswith("│ llama")}
    for _ in range(3):
        res = _cli("sweep", str(spec), "--runs-dir", str(root))
        if res.returncode == 0 and "nothing to submit" in res.stdout:
            break
    for name, ref in sorted(refs.items()):
        d = root / "fi" / name
        when = "mid-training" if delay == "mid" else f"{float(delay):g}s"
        tally.judge(f"launcher kill -9 at {when}: {name[:22]}", d, ref, True,
                    f"(status after the kill: {states.get(name, '-')})" if states else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2, help="trials per single-run scenario (default 2)")
    p.add_argument("--steps", type=int, default=200, help="steps of the single-run scenarios (default 200)")
    p.add_argument("--sweep-kills", default="0.3,mid",
                   help="when the launcher is killed: seconds after launch, or 'mid' (once a worker has trained 3 steps)")
    p.add_argument("--out", type=Path, default=None, help="working folder (default: a temporary one, removed)")
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    args = p.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="quartet-fault-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tally = Tally()
    try:
        every = max(2, args.steps // 10)
        base = [*TINY, f"budget.tokens={args.steps * TOKENS_PER_STEP}", f"logging.ckpt_every={every}"]
        ref_over = [*base, f"run.out_dir={out / 'ref'}"]
        res = _cli("train", *ref_over)
        if res.returncode != 0:
            print(f"fault_inject: the reference run failed: {res.stderr[-1000:]}", file=sys.stderr)
            return 1
        ref = _curve(_run_dir(ref_over))
        writes = (args.steps - 1) // every + 1  # checkpoint writes of a run: every `every` steps, and the last
        for i in range(args.repeats):  # a fault armed past the last write would never fire: clamp it
            kill_inside_checkpoint(out, base, ref, min(2 + 3 * i, writes), tally)
            full_disk(out, base, ref, min(3 + 2 * i, writes), tally)
            moved_while_training(out, base, ref, max(3, int(args.steps * (0.3 + 0.4 * i / max(1, args.repeats)))),
                                 tally)
        refs: dict = {}
        for delay in (x.strip() if x.strip() == "mid" else float(x) for x in args.sweep_kills.split(",") if x.strip()):
            launcher_kill(out, (2048, 4096), delay, tally, refs)
    finally:
        if not args.keep and args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    exact = "all" if tally.exact == tally.trials else f"{tally.exact}/{tally.trials}"
    print(f"fault injection: {tally.trials} interrupted runs in {time.time() - t0:.0f} s; "
          f"runs lost / trained twice / exact resume: {tally.lost} / {tally.twice} / {exact}")
    return 0 if tally.lost == 0 and tally.twice == 0 and tally.exact == tally.trials else 1


if __name__ == "__main__":
    sys.exit(main())
