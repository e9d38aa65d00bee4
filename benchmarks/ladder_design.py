"""Would a ladder design identify the law? Simulate it before spending GPU time on it.

Plants two laws that fit round 1 of the one-GPU ladder about equally well (Hoffmann form with E fixed at 0.6 and
at 1.2; their other parameters fitted to round 1's cells with >= 500 updates, docs/ladder.md), draws losses for
every cell of a design with log-normal run noise (``--noise``, default 1.2%: the round-1 seed noise), a quartet
run per cell with planted effN 0.6 / effD 0.95 whose noise is mostly shared with its bf16 run (paired), fits each
replicate as ``quartet fit`` does (one point per cell, Busbridge form), and reports how often the base's point
estimate is converged, the spread of E, and the spread of quartet's effN / effD. No bootstrap: a converged point
estimate is necessary, not sufficient (the committed fit shows a converged point with an unidentified interval).

    .venv/bin/python benchmarks/ladder_design.py            # -> benchmarks/results/ladder/design_sim.csv
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.fit import fit_base, fit_efficiency

OUT = Path(__file__).resolve().parent / "results" / "ladder" / "design_sim.csv"
N = {"1m": 1_049_728, "3m": 3_410_176, "7m": 7_081_344, "10m": 10_621_824, "20m": 20_453_888}
#: Hoffmann laws fitted to round 1 with E fixed (A, alpha, B, beta, E)
TRUTHS = {"E=1.2": (14.0, 0.304, 1.34e4, 0.553, 1.2), "E=0.6": (3.71, 0.132, 1.14e3, 0.398, 0.6)}
ROUND1 = [("1m", 20), ("3m", 10), ("3m", 20), ("7m", 5), ("7m", 10), ("7m", 20)]
DESIGNS = {
    "round 1 (>= 500 updates)": ROUND1,
    "round 2 (sweeps/ladder_1gpu.yaml)": [("1m", r) for r in (10, 20, 40, 80, 160)]
    + [("3m", r) for r in (10, 20, 40, 80)] + [("7m", r) for r in (5, 10, 20)],
}
ROUND2 = DESIGNS["round 2 (sweeps/ladder_1gpu.yaml)"]
DESIGNS.update({
    "round 2 + 10m D/N 5-20": ROUND2 + [("10m", r) for r in (5, 10, 20)],
    "round 2 + 20m D/N 5,10": ROUND2 + [("20m", r) for r in (5, 10)],
    "round 2 + 20m D/N 5-20": ROUND2 + [("20m", r) for r in (5, 10, 20)],
})


def law(t, n, d, eff_n=1.0, eff_d=1.0):
    a, alpha, b, beta, e = t
    return a / (n * eff_n) ** alpha + b / (d * eff_d) ** beta + e


def main(argv=None) -> pd.DataFrame:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--noise", type=float, default=0.012)
    p.add_argument("--reps", type=int, default=24)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    for tname, truth in TRUTHS.items():
        for dname, cells in DESIGNS.items():
            n = np.array([N[s] for s, _ in cells], float)
            d = n * np.array([r for _, r in cells], float)
            status, e_hat, eff_n, eff_d = [], [], [], []
            for _ in range(args.reps):
                z = rng.normal(0, args.noise, n.size)
                base = fit_base(n, d, law(truth, n, d) * np.exp(z))
                q = law(truth, n, d, 0.6, 0.95) * np.exp(0.9 * z + rng.normal(0, 0.45 * args.noise, n.size))
                eff = fit_efficiency(base, n, d, q, "joint")
                status.append(base.status)
                e_hat.append(base.params["E"])
                eff_n.append(eff.eff_n)
                eff_d.append(eff.eff_d)
            rows.append({"truth": tname, "design": dname, "cells": len(cells), "noise": args.noise, "reps": args.reps,
                         "converged": status.count("converged") / args.reps,
                         "E_p10": np.percentile(e_hat, 10), "E_p50": np.median(e_hat), "E_p90": np.percentile(e_hat, 90),
                         "effN_p10": np.percentile(eff_n, 10), "effN_p50": np.median(eff_n),
                         "effN_p90": np.percentile(eff_n, 90), "effD_p50": np.median(eff_d)})
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    out = pd.DataFrame(rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(OUT, index=False, float_format="%.4g")
    return out


if __name__ == "__main__":
    main()
