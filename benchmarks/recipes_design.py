"""How well does ``quartet design`` predict a fit? Its predicted interval widths on the committed designs, against
the widths their own fits gave (benchmarks/results/ladder/ and recipes/ fit.json).

Each committed table is read as a design (:func:`analysis.design.committed_design`: its non-bf16 runs, cells and
seeds as run; its bf16 runs as the existing runs), its fit JSON's point estimates planted, its own noise model
taken, and the design simulated as ``quartet design`` does (``fit_all`` with the committed fits' options: no rung
rule, cell bootstrap). One row per (table, precision, efficiency): predicted median widths of both interval kinds,
the realised full-bootstrap width, their ratio, the share of simulated fits pinned. The search itself is
``quartet design`` (docs/analysis.md, "Designing runs").

    python benchmarks/recipes_design.py                       # -> benchmarks/results/recipes/design_sim.csv
    python benchmarks/recipes_design.py --reps 4 --bootstrap 40 --out /tmp/d.csv
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.design import check_committed  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
OUT = RESULTS / "recipes" / "design_sim.csv"


def main(argv=None) -> pd.DataFrame:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=10, help="simulated fits per table")
    p.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples per simulated fit")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    logging.getLogger("analysis").setLevel(logging.ERROR)
    frames = []
    for tag in ("ladder", "recipes"):
        df = pd.read_csv(RESULTS / tag / "losses.csv")
        fit = json.loads((RESULTS / tag / "fit.json").read_text())
        out = check_committed(df, fit, reps=args.reps, bootstrap=args.bootstrap, seed=0)
        frames.append(out.assign(table=tag, reps=args.reps, bootstrap=args.bootstrap))
    out = pd.concat(frames, ignore_index=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out, index=False, float_format="%.4g")
    cols = ["table", "precision", "efficiency", "full_width", "full_realised", "full_ratio", "base_fixed_width",
            "full_pinned"]
    print(out[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return out


if __name__ == "__main__":
    main()
