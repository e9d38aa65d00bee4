"""Robustness of the fast multi-start fit against the paper's straightforward search.

For K bootstrap resamples of the paper's 23 baseline points and K synthetic grids (the paper's law
with 0.5 % log-noise, random sizes / budgets), fit the base law twice:
- fast: :func:`analysis.fit.fit_base`;
- straightforward: one finite-difference ``least_squares(loss="huber", f_scale=1e-4)`` per start of
  the same grid (the paper notebook's loop), best cost wins.
The fast fit passes a case when its best cost is no worse than the straightforward one (1e-6 rel.).
Each case runs in its own process; the straightforward search takes minutes per case, so run it on
a many-core machine:

    python benchmarks/fit_robustness.py --cases 8 --workers 16 --json benchmarks/fit_robustness.json
"""
from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

PAPER = {"A": 152374.8, "alpha": 0.588576, "B": 525459.0, "beta": 0.544039, "E": 1.348141, "gamma": 0.273929}


def _case(args):
    kind, seed = args
    from scipy.optimize import least_squares

    from analysis.fit import fit_base
    from analysis.laws import BUSBRIDGE, predict, residuals_and_jac
    from analysis.load import load_paper
    from analysis.report import base_rows

    rng = np.random.default_rng(seed)
    if kind == "bootstrap":
        b = base_rows(load_paper())
        idx = rng.integers(0, len(b), len(b))
        n, d, loss = (b[c].to_numpy(float)[idx] for c in ("n_params", "tokens", "loss"))
    else:
        sizes = np.exp(rng.uniform(np.log(2e7), np.log(5e8), 5))
        ratios = np.exp(rng.uniform(np.log(20), np.log(800), 5))
        nn, rr = np.meshgrid(sizes, ratios)
        n, d = nn.ravel(), (nn * rr).ravel()
        loss = predict(PAPER, n, d) * np.exp(rng.normal(0, 0.005, n.size))
    t = time.perf_counter()
    fast = fit_base(n, d, loss)
    t_fast = time.perf_counter() - t
    ln, ld, lo = np.log(n), np.log(d), np.log(loss)

    def fun(x):
        return residuals_and_jac(x, ln, ld, lo, jac=False)[0]

    t = time.perf_counter()
    best = None
    for x0 in BUSBRIDGE.start_grid():
        try:
            res = least_squares(fun, x0, loss="huber", f_scale=1e-4)
        except ValueError:
            continue
        if best is None or res.cost < best.cost:
            best = res
    t_slow = time.perf_counter() - t
    return {"kind": kind, "seed": seed, "points": int(n.size), "fast_cost": fast.cost, "fast_s": t_fast,
            "fast_status": fast.status, "straightforward_cost": float(best.cost), "straightforward_s": t_slow,
            "fast_not_worse": bool(fast.cost <= best.cost * (1 + 1e-6))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=4, help="cases per kind (bootstrap, synthetic)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=Path(__file__).with_name("fit_robustness.json"))
    args = ap.parse_args()
    jobs = [(k, s) for k in ("bootstrap", "synthetic") for s in range(args.cases)]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(_case, jobs))
    for r in results:
        print(f"{r['kind']:9s} seed {r['seed']}: fast {r['fast_cost']:.6e} ({r['fast_s']:.2f} s) vs "
              f"straightforward {r['straightforward_cost']:.6e} ({r['straightforward_s']:.0f} s) "
              f"-> {'ok' if r['fast_not_worse'] else 'WORSE'}")
    ok = sum(r["fast_not_worse"] for r in results)
    print(f"fast fit no worse in {ok}/{len(results)} cases")
    args.json.write_text(json.dumps({"cases": results, "not_worse": ok, "total": len(results)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
