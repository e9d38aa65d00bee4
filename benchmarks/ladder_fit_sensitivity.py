"""How much the one-GPU ladder's fit depends on the law form and on the step-starved cells.

Fits the committed loss table (benchmarks/results/ladder/losses.csv) with each law form of ``analysis.laws``
(busbridge, hoffmann = gamma 1, kaplan = beta 1), on all runs and on the runs with at least 500 optimizer
updates (a post-hoc cut, stated as such in docs/ladder.md: below it the losses order by updates, not by N),
and writes base status, E, exponents and each precision's effN/effD (point estimates, no bootstrap):

    .venv/bin/python benchmarks/ladder_fit_sensitivity.py   # -> benchmarks/results/ladder/fit_sensitivity.csv
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.load import frame_from_table
from analysis.report import fit_all

HERE = Path(__file__).resolve().parent / "results" / "ladder"


def main() -> pd.DataFrame:
    raw = pd.read_csv(HERE / "losses.csv")
    rows = []
    for subset, table in (("all runs", raw), (">= 500 updates", raw[raw["steps"] >= 500])):
        df = frame_from_table(table, name=subset)
        for law in ("busbridge", "hoffmann", "kaplan"):
            report = fit_all(df, law)
            p = report.base.params
            row = {"data": subset, "law": law, "points": report.base.n_points, "base_status": report.base.status,
                   "E": p["E"], "alpha": p["alpha"], "beta": p["beta"], "gamma": p["gamma"]}
            for e in report.efficiencies:
                row[f"{e.scheme}_effN"], row[f"{e.scheme}_effD"] = e.eff_n, e.eff_d
            rows.append(row)
    out = pd.DataFrame(rows)
    out.to_csv(HERE / "fit_sensitivity.csv", index=False, float_format="%.4g")
    print(out.round(4).to_string(index=False))
    return out


if __name__ == "__main__":
    main()
