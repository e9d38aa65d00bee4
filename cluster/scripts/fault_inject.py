"""Fault injection on tiny CPU runs: kill inside a checkpoint write, kill -9 of a sweep's launcher, a full disk, a
run directory moved while it trains, budget branches (a trunk killed after its branch point and relaunched together
with its branch, a branch killed mid-decay, a finished trunk whose ckpt/ was deleted) and metrics rows lost while a
run was stopped (a torn row, a deleted metrics.jsonl). Each interrupted run is recovered the documented way (the
same command again, a relaunch, `--config-file NEW/config.yaml`, or the command a one-line error gives) and compared
with an uninterrupted twin.

Prints one line per trial and a summary ``runs lost / trained twice / exact resume`` (target: 0 / 0 / all) and
``metrics rows missing without a word`` (target: 0):
- lost: a run that did not complete after its recovery, or a one-line-error check that failed;
- trained twice: a step logged twice (or more than one final row) in a run's metrics.jsonl, or a moved run's old path
  written again;
- exact resume: the recovered run's per-step losses and final validation loss equal its twin's, bit for bit (rows that
  its summary.json names as lost, ``metrics_gap``, left out of the comparison);
- missing without a word: a step of the twin's curve that the run's metrics.jsonl lacks and its summary does not name.

    python cluster/scripts/fault_inject.py [--repeats 2] [--steps 200] [--out DIR] [--keep]

Defaults take about 5-8 minutes on 2 cores. Exit status 1 unless the summary is 0 / 0 / all and 0.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from quartet import paths  # noqa: E402  (stdlib only: this script imports no torch)
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
        return [row for _, _, row in paths.metrics_lines(d) if isinstance(row, dict)]
    except OSError:
        return []


def _curve(d: Path) -> tuple[list[tuple[int, float]], float | None]:
    """(step, train loss) of every row and the final validation loss (None when the run did not complete)."""
    val = (paths.read_summary(d) or {}).get("val_loss")
    return [(r["step"], r.get("loss")) for r in _rows(d) if not r.get("final")], val


def _gap_steps(d: Path) -> set[int]:
    """The steps a completed run's summary.json names as lost rows (``metrics_gap``: "1-3,7")."""
    out: set[int] = set()
    for part in str(((paths.read_summary(d) or {}).get("metrics_gap") or {}).get("steps") or "").split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


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
        self.trials = self.lost = self.twice = self.exact = self.silent = 0

    def judge(self, name: str, d: Path, ref: tuple, ok: bool, why: str = "", also_twice: bool = False) -> None:
        curve, val = _curve(d)
        named = _gap_steps(d)
        unsaid = {s for s, _ in ref[0]} - {s for s, _ in curve} - named  # rows gone that nothing names
        lost = val is None or not ok
        twice = _twice(d) or also_twice
        exact = not lost and (curve, val) == ([r for r in ref[0] if r[0] not in named], ref[1])
        self.trials += 1
        self.lost += lost
        self.twice += twice
        self.exact += exact
        self.silent += bool(unsaid)
        verdict = "exact" if exact else ("LOST" if lost else "DIFFERENT")
        said = f"(lost rows named: {len(named)}) " if named else ""
        hole = f"ROWS MISSING WITHOUT A WORD: {len(unsaid)} " if unsaid else ""
        print(f"{name:<40} {verdict:<9} {'TRAINED TWICE ' if twice else ''}{hole}{said}{why}", flush=True)


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
        recorded = paths.outcome(d) == "failed" and (d / paths.ERROR).stat().st_size > 0
    except OSError:
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
    res = _cli("train", "--config-file", str(new / paths.CONFIG))
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
        refs.update({p.name: _curve(p) for p in (ref_root / "fi").iterdir() if paths.outcome(p) == "finished"})
    root = out / f"sweep-kill-{delay}"
    proc = subprocess.Popen([sys.executable, "-m", "quartet.cli", "sweep", str(spec), "--runs-dir", str(root)],
                            cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if delay == "mid":  # as soon as a worker has trained a few steps, whatever the machine's speed
        deadline = time.time() + 120
        while time.time() < deadline and not any(_line_count(m) >= 3 for m in root.glob(f"fi/*/{paths.METRICS}")):
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


def rows_lost_while_stopped(out: Path, base: list[str], ref: tuple, how: str, at: int, tally: Tally) -> None:
    """A run killed inside checkpoint write ``at`` loses metrics rows up to its last checkpoint while it is stopped
    (``torn``: the row of the checkpoint's step cut mid-write and the later ones gone, as a power loss can leave it;
    ``deleted``: metrics.jsonl removed), then runs again: it must complete and name the rows it lacks."""
    over = [*base, f"run.out_dir={out / f'rows-{how}-{at}'}"]
    d = _run_dir(over)
    res = _inject("kill", at, over)
    ok = res.returncode == -signal.SIGKILL
    step = int(paths.read_state(d).get("step") or 0)
    metrics = d / paths.METRICS
    note = ""
    if how == "deleted":
        metrics.unlink(missing_ok=True)  # a kill before the first row leaves none to delete: the trial still stands
    else:
        rows = [(r["step"], ln) for _, ln, r in paths.metrics_lines(d) if isinstance(r, dict)]
        cut = next((ln for s, ln in rows if s == step), "")
        if not cut:  # no row at the checkpoint's step (killed before it was written): drop from there, tear none
            note = f"(no row at step {step} to tear: the rows from it on dropped) "
        metrics.write_text("".join(ln + "\n" for s, ln in rows if s < step) + cut[:len(cut) // 2])
    res = _cli("train", *over)
    said = "metrics.jsonl lacks" in paths.tail(d / paths.TRAIN_LOG)
    tally.judge(f"rows {how} before checkpoint (step {step})", d, ref, ok and res.returncode == 0 and said,
                note + ("" if said else "(no warning line in train.log)"))


class Branches:
    """A budget branch of ``steps`` updates (WSD, decay over the last fifth) and its trunk, as quartet train
    overrides, with their uninterrupted curves."""

    def __init__(self, out: Path, steps: int, every: int) -> None:
        self.step = steps - int(0.2 * steps + 0.5)  # the decay start: where the branch leaves its trunk
        # the trunk's checkpoints fall beside its branch point, so a trunk killed after it resumes from before it
        self.trunk_every = next(e for e in range(every, every + self.step) if self.step % e)
        wsd = [*TINY, "optim.schedule=wsd", "optim.warmup_steps=3"]
        self.trunk_base = [*wsd, f"budget.tokens={self.step * TOKENS_PER_STEP}", "optim.decay_fraction=0",
                           f"branch.save_steps=[{self.step}]", f"logging.ckpt_every={self.trunk_every}"]
        self.branch_base = [*wsd, f"budget.tokens={steps * TOKENS_PER_STEP}", "optim.decay_fraction=0.2",
                            f"logging.ckpt_every={every}"]
        self.ref_trunk, self.ref_branch = self.train(out / "ref-branches")

    def overrides(self, where: Path) -> tuple[list[str], list[str]]:
        """(trunk, branch) overrides of the pair under ``where``."""
        trunk = [*self.trunk_base, f"run.out_dir={where}"]
        tid = _run_dir(trunk).name
        return trunk, [*self.branch_base, f"run.out_dir={where}", f"branch.trunk={tid}", f"branch.step={self.step}"]

    def train(self, where: Path) -> tuple[tuple, tuple]:
        trunk, branch = self.overrides(where)
        for over in (trunk, branch):
            res = _cli("train", *over)
            if res.returncode != 0:
                raise RuntimeError(f"reference budget branch failed: {res.stderr[-1000:]}")
        return _curve(_run_dir(trunk)), _curve(_run_dir(branch))


def trunk_killed_then_relaunched_with_its_branch(out: Path, br: Branches, i: int, tally: Tally) -> None:
    """The trunk is killed inside its last checkpoint write, after its branch point (its last.pt is older); then trunk
    and branch are started together: the branch's first rows are the trunk's up to the branch step, whatever the
    resuming trunk does to its own metrics.jsonl meanwhile."""
    trunk, branch = br.overrides(out / f"trunk-kill-{i}")
    res = _inject("kill", br.step // br.trunk_every + 2, trunk)  # its earlier last.pt writes, the branch point, the last
    ok = res.returncode == -signal.SIGKILL
    procs = [subprocess.Popen([sys.executable, "-m", "quartet.cli", "train", *over], cwd=REPO, env=_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for over in (trunk, branch)]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    ok = ok and all(p.returncode == 0 for p in procs)
    why = "" if ok else f"(rc {[p.returncode for p in procs]}: {' | '.join(e.strip()[-200:] for e in errs)!r})"
    tally.judge(f"trunk kill after branch point #{i}", _run_dir(trunk), br.ref_trunk, ok, why)
    tally.judge(f"  its branch, started with it #{i}", _run_dir(branch), br.ref_branch, ok, why)


def branch_killed_inside_checkpoint(out: Path, br: Branches, tally: Tally) -> None:
    trunk, branch = br.overrides(out / "branch-kill")
    ok = _cli("train", *trunk).returncode == 0
    res = _inject("kill", 1, branch)  # its first checkpoint: it restarts from the trunk's branch point
    ok = ok and res.returncode == -signal.SIGKILL
    res = _cli("train", *branch)
    tally.judge("branch kill inside checkpoint #1", _run_dir(branch), br.ref_branch, ok and res.returncode == 0,
                res.stderr.strip()[-200:])


def finished_trunk_without_ckpt(out: Path, br: Branches, tally: Tally) -> None:
    """The trunk finished and its ckpt/ was deleted to free disk: the branch says so in one line, and the way back it
    gives (this budget from scratch) ends equal to the branch."""
    trunk, branch = br.overrides(out / "trunk-ckpt-deleted")
    ok = _cli("train", *trunk).returncode == 0
    shutil.rmtree(_run_dir(trunk) / paths.CKPT)
    res = _cli("train", *branch)
    good, why = _one_line(res, "is finished but")
    back = "branch.trunk=null branch.step=null"
    good = good and back in res.stderr
    scratch = [*branch, *back.split()]
    res = _cli("train", *scratch)
    tally.judge("branch of a trunk without ckpt/", _run_dir(scratch), br.ref_branch,
                ok and good and res.returncode == 0, why)


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
        for how, at in (("torn", 2), ("deleted", min(3, writes))):
            rows_lost_while_stopped(out, base, ref, how, at, tally)
        br = Branches(out, args.steps, every)
        for i in range(args.repeats):
            trunk_killed_then_relaunched_with_its_branch(out, br, i, tally)
        branch_killed_inside_checkpoint(out, br, tally)
        finished_trunk_without_ckpt(out, br, tally)
        refs: dict = {}
        for delay in (x.strip() if x.strip() == "mid" else float(x) for x in args.sweep_kills.split(",") if x.strip()):
            launcher_kill(out, (2048, 4096), delay, tally, refs)
    finally:
        if not args.keep and args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    exact = "all" if tally.exact == tally.trials else f"{tally.exact}/{tally.trials}"
    print(f"fault injection: {tally.trials} interrupted runs in {time.time() - t0:.0f} s; "
          f"runs lost / trained twice / exact resume: {tally.lost} / {tally.twice} / {exact}; "
          f"metrics rows missing without a word: {tally.silent}")
    return 0 if tally.lost == 0 and tally.twice == 0 and tally.exact == tally.trials and tally.silent == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
