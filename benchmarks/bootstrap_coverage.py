"""How often do the fit's 95% bootstrap intervals cover a planted efficiency? Cells vs residual resampling.

Plants the paper's law (Table 6 parameters) on a 16-cell grid (30M-200M x D/N 25-200), bf16 plus a paired
scheme with planted (effN, effD) = (0.6, 0.95) and a no-cost one (1, 1), log-normal run noise ``--noise``; fits
each replicate with ``fit_all(..., bootstrap=B, resample=mode)`` and counts how often effN's interval holds the
planted value. Prints one line per mode.

    .venv/bin/python benchmarks/bootstrap_coverage.py                 # 20 replicates, 40 resamples: ~4 min on 2 cores
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "analysis"))

from test_fit_honesty import PAPER_CELLS, _table  # noqa: E402  (the tests' synthetic ladder)

from analysis.report import fit_all  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--noise", type=float, default=0.002)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--bootstrap", type=int, default=40)
    args = p.parse_args(argv)
    out = {}
    for mode in ("residuals", "cells"):
        hits = {0.6: 0, 1.0: 0}
        for seed in range(args.reps):
            for planted in hits:
                table = _table(PAPER_CELLS, args.noise, seed, eff=(planted, 0.95 if planted < 1 else 1.0))
                rep = fit_all(table, "busbridge", bootstrap=args.bootstrap, seed=0, resample=mode, forecasts=False)
                lo, hi = rep.eff_intervals["q"]["eff_n"]
                hits[planted] += int(lo <= planted <= hi)
        out[mode] = hits
        print(f"{mode}: effN interval covers planted 0.6 in {hits[0.6]}/{args.reps}, planted 1.0 in "
              f"{hits[1.0]}/{args.reps} (noise {args.noise}, {args.bootstrap} resamples)", flush=True)
    return out


if __name__ == "__main__":
    main()
