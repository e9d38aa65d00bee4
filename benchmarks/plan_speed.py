"""Benchmark: how fast the front door answers — planning, status, relaunch and refusing a bad override.

Each case runs the ``quartet`` CLI in a fresh process (as a user would) and records its CPU seconds (user + system of
the child) and wall seconds; nothing is submitted or trained. Cases:

* ``paper_grid dry run``: ``quartet sweep paper_grid --cluster slurm_blackwell --dry-run`` (120 runs)
* ``1,080-run grid``: the same with ``sweep.axes.run.seed=[0..8]`` (9 seeds)
* ``10,080-run grid``: 84 seeds, with ``--max-rows 50`` (the planning, not printing 10^4 table rows)
* ``status (120 runs)``: ``quartet status paper_grid`` on a runs folder whose 120 runs were claimed (config.yaml,
  state.json written as a launch writes them), and ``relaunch dry run``: the sweep again on that folder
* ``bad train override``: ``quartet train run.sed=1`` (refused; exit 2), next to ``python -c pass`` (Python's
  start) and whether the refusal imported torch (``-X importtime``)

    .venv/bin/python benchmarks/plan_speed.py [--checkout DIR] [--skip-10k] [--json benchmarks/results/plan_speed.json]

``--checkout DIR`` measures another checkout of the project (e.g. ``git archive main | tar -x -C /tmp/before``) with
this interpreter, for before/after tables; the JSON keeps one entry per label (``--label``), so a second run adds
its column. Numbers depend on the machine and its load: compare columns measured on the same machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env(checkout: Path, cache: Path) -> dict:
    env = dict(os.environ)
    env.update(WANDB_MODE="offline", QUARTET_CACHE=str(cache), MPLCONFIGDIR=str(cache / "matplotlib"),
               PYTHONPATH=str(checkout), QUARTET_ROOT=str(checkout))
    for key in ("QUARTET_RUNS", "QUARTET_CONF", "QUARTET_SWEEPS"):
        env.pop(key, None)
    return env


def timed(args: list[str], checkout: Path, env: dict, expect: int = 0) -> dict:
    """Run ``python -m quartet.cli ARGS`` (or ``python ARGS`` when args[0] starts with '-'); CPU and wall seconds."""
    cmd = [sys.executable, *args] if args[0].startswith("-") else [sys.executable, "-m", "quartet.cli", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != expect:
        raise SystemExit(f"{' '.join(args)}: exit {proc.returncode} (expected {expect})\n{proc.stderr[-2000:]}")
    return {"cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "stderr": proc.stderr}


def claim_runs(checkout: Path, env: dict, runs: Path) -> None:
    """Write every paper_grid run's config.yaml and a pending state.json under ``runs`` (what a launch writes
    before it submits), in a child process of ``checkout``."""
    code = ("import sys; from cluster.launch import make_plan; from cluster.plan import write_run_config; "
            "from cluster import runstate; "
            "plan = make_plan('paper_grid', 'slurm_blackwell', [], sys.argv[1], with_state=False)\n"
            "for r in plan.runs:\n"
            "    write_run_config(r, plan.profile); runstate.write_state(r.run_dir, state='pending', total_steps=r.steps)")
    subprocess.run([sys.executable, "-c", code, str(runs)], cwd=checkout, env=env, check=True, capture_output=True)


def measure(checkout: Path, skip_10k: bool) -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="plan_speed_") as tmp:
        tmp = Path(tmp)
        env = _env(checkout, tmp / "cache")
        sweep = ["sweep", "paper_grid", "--cluster", "slurm_blackwell", "--dry-run", "--runs-dir", str(tmp / "empty")]
        out["python -c pass"] = timed(["-c", "pass"], checkout, env)
        out["paper_grid dry run (120 runs)"] = timed(sweep, checkout, env)
        seeds = ",".join(str(i) for i in range(9))
        out["1,080-run grid dry run"] = timed([*sweep, f"sweep.axes.run.seed=[{seeds}]"], checkout, env)
        if not skip_10k:
            seeds = ",".join(str(i) for i in range(84))
            out["10,080-run grid dry run (--max-rows 50)"] = timed([*sweep, "--max-rows", "50",
                                                                    f"sweep.axes.run.seed=[{seeds}]"], checkout, env)
        claim_runs(checkout, env, tmp / "runs")
        out["status (120 claimed runs)"] = timed(["status", "paper_grid", "--runs-dir", str(tmp / "runs")], checkout, env)
        out["relaunch dry run (120 claimed runs)"] = timed(
            ["sweep", "paper_grid", "--cluster", "slurm_blackwell", "--dry-run", "--runs-dir", str(tmp / "runs")],
            checkout, env)
        out["bad train override (run.sed=1)"] = timed(["train", "run.sed=1"], checkout, env, expect=2)
        imp = timed(["-X", "importtime", "-m", "quartet.cli", "train", "run.sed=1"], checkout, env, expect=2)
        out["bad train override (run.sed=1)"]["imports_torch"] = any(
            line.rstrip().endswith("| torch") for line in imp["stderr"].splitlines())
        for row in out.values():
            progress = [ln for ln in row.pop("stderr").splitlines() if "runs composed and resolved" in ln]
            if progress:
                row["progress_lines"] = len(progress)
    return out


def table(results: dict) -> str:
    labels = list(results)
    cases = list(dict.fromkeys(c for lab in labels for c in results[lab]["cases"]))
    width = max(len(c) for c in cases)
    head = f"{'case':<{width}}  " + "  ".join(f"{lab + ' CPU s':>14} {lab + ' wall s':>14}" for lab in labels)
    lines = [head, "-" * len(head)]
    for c in cases:
        cells = []
        for lab in labels:
            row = results[lab]["cases"].get(c)
            cells.append(f"{row['cpu_s']:>14.2f} {row['wall_s']:>14.2f}" if row else f"{'-':>14} {'-':>14}")
        lines.append(f"{c:<{width}}  " + "  ".join(cells))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkout", type=Path, default=ROOT, help="checkout to measure (default: this one)")
    p.add_argument("--label", default="after", help="column name in the JSON (default: after)")
    p.add_argument("--skip-10k", action="store_true", help="leave out the 10,080-run grid (~2-3 min)")
    p.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/plan_speed.json")
    args = p.parse_args()
    cases = measure(args.checkout.resolve(), args.skip_10k)
    results = json.loads(args.json.read_text())["results"] if args.json.is_file() else {}
    results[args.label] = {"cases": cases, "checkout": str(args.checkout), "machine": platform.platform(),
                           "python": platform.python_version(), "cpus": os.cpu_count(),
                           "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
                           "date": time.strftime("%Y-%m-%d %H:%M")}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "benchmarks/plan_speed.py", "results": results}, indent=2) + "\n")
    print(table(results))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
