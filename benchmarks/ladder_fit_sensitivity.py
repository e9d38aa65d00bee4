"""How much the one-GPU ladder's fit depends on the law form, on how seed replicates enter, and on the smallest size.

Fits the committed loss table (benchmarks/results/ladder/losses.csv) with each law form of ``analysis.laws``
(busbridge, hoffmann = gamma 1, kaplan = beta 1) on: one point per cell, the mean over its seeds (what
``quartet fit`` does by default); every run as its own point (``--replicates all``); and the cell means without
the 1.0M size, whose losses move with the seed-dependent end of a plateau (docs/ladder.md). Writes base status,
E, exponents and each precision's effN/effD (point estimates, no bootstrap):

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
    subsets = (("cell means", raw, "mean"), ("every run", raw, "all"),
               ("cell means without 1.0M", raw[raw["model"] != "llama_1m"], "mean"))
    rows = []
    for subset, table, replicates in subsets:
        df = frame_from_table(table, name=subset)
        for law in ("busbridge", "hoffmann", "kaplan"):
            report = fit_all(df, law, replicates=replicates, forecasts=False)
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
