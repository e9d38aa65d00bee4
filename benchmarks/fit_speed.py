"""Benchmark: stage-1 fit of the paper's 23 baseline points, fast multi-start vs the straightforward way.

Straightforward = the paper notebook's procedure: one ``scipy.optimize.least_squares(loss="huber",
f_scale=1e-4)`` per start with finite-difference Jacobians, over the whole start grid, best cost wins.
Fast = :func:`analysis.fit.fit_base` (batched analytic-Jacobian first pass over the same grid, then
polishing the best distinct end points with the exact objective).

    .venv/bin/python benchmarks/fit_speed.py [--repeats 5] [--full] [--robustness K] [--json OUT]

By default the straightforward search runs every 4th start and its time is scaled to the whole grid
(marked ``extrapolated`` in the JSON) so the script stays within ~1 minute; ``--full`` runs every
start (≈ 3–4 minutes on 2 cores). ``--robustness K`` (with ``--full``) also compares the best costs
on K bootstrap resamples of the 23 points: the fast fit must be no worse than the full search.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from analysis.fit import fit_base
from analysis.laws import BUSBRIDGE, raw_to_params, residuals_and_jac
from analysis.load import load_paper
from analysis.report import base_rows


def straightforward(n, d, loss, starts):
    """One finite-difference least_squares per start (the paper notebook's loop)."""
    ln, ld, lo = np.log(n), np.log(d), np.log(loss)

    def fun(x):
        return residuals_and_jac(x, ln, ld, lo, jac=False)[0]

    best = None
    for x0 in starts:
        try:
            res = least_squares(fun, x0, loss="huber", f_scale=1e-4)
        except ValueError:
            continue
        if best is None or res.cost < best.cost:
            best = res
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-straightforward", action="store_true")
    ap.add_argument("--full", action="store_true", help="run the straightforward search over every start")
    ap.add_argument("--robustness", type=int, default=0, help="bootstrap resamples compared against the slow way")
    ap.add_argument("--json", type=Path, default=Path(__file__).with_name("fit_speed.json"))
    args = ap.parse_args()
    b = base_rows(load_paper())
    n, d, loss = (b[c].to_numpy(float) for c in ("n_params", "tokens", "loss"))
    starts = BUSBRIDGE.start_grid()
    fit_base(n, d, loss)  # warm-up (imports, caches)
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        fast = fit_base(n, d, loss)
        times.append(time.perf_counter() - t)
    out = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "processor": platform.processor()},
        "points": int(len(b)), "starts": int(len(starts)),
        "fast": {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
                 "cost": fast.cost, "params": fast.params, "n_converged": fast.multistart.n_converged,
                 "status": fast.status},
    }
    print(f"fast: median {out['fast']['median_s']:.3f} s over {args.repeats} runs "
          f"(min {min(times):.3f}, max {max(times):.3f}); cost {fast.cost:.6e}; "
          f"{fast.multistart.n_converged}/{len(starts)} starts in the best basin")
    if not args.skip_straightforward:
        sub = starts if args.full else starts[::4]
        t = time.perf_counter()
        slow = straightforward(n, d, loss, sub)
        slow_s = (time.perf_counter() - t) * len(starts) / len(sub)
        out["straightforward"] = {"seconds": slow_s, "extrapolated": not args.full, "starts_run": int(len(sub)),
                                  "cost": float(slow.cost), "params": raw_to_params(slow.x)}
        print(f"straightforward: {slow_s:.1f} s for {len(starts)} starts"
              f"{' (extrapolated from ' + str(len(sub)) + ')' if not args.full else ''}; cost {slow.cost:.6e}; "
              f"speed-up {slow_s / out['fast']['median_s']:.0f}x")
        rng = np.random.default_rng(0)
        rob = []
        for k in range(args.robustness if args.full else 0):
            idx = rng.integers(0, len(n), len(n))
            f = fit_base(n[idx], d[idx], loss[idx])
            s = straightforward(n[idx], d[idx], loss[idx], starts)
            rob.append({"resample": k, "fast_cost": f.cost, "straightforward_cost": float(s.cost),
                        "fast_not_worse": bool(f.cost <= s.cost * (1 + 1e-6))})
            print(f"resample {k}: fast {f.cost:.6e} vs straightforward {s.cost:.6e}")
        out["robustness"] = rob
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
