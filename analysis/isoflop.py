"""IsoFLOP estimation of the compute-optimal model size (Chinchilla "Approach 2"), beside the parametric law.

Runs that spend (about) the same training compute C = 6·N·D at several model sizes form an IsoFLOP slice. Along
a slice the final loss is close to a parabola in ln N; its vertex is that budget's compute-optimal size:

    L ≈ a·(ln N)² + b·ln N + c   ⇒   N_opt(C) = exp(−b / 2a)   (a > 0; no minimum otherwise)

and across slices N_opt ∝ C^a_N, D_opt ∝ C^(1 − a_N) by least squares on ln N_opt vs ln C. The estimate needs
no law form and no E — a check on :func:`analysis.speed.compute_optimal` — but it needs the runs to be laid out
for it: three or more sizes per budget, with the optimum inside them (a vertex outside a slice's N range is
flagged as extrapolated).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

#: two runs belong to one slice when their budgets differ by less than this factor
SLICE_TOLERANCE = 1.10
#: sizes a slice needs for a parabola with a check
MIN_SIZES = 3


def isoflop_slices(df: pd.DataFrame, tolerance: float = SLICE_TOLERANCE) -> pd.DataFrame:
    """Group runs into IsoFLOP slices; one row per slice with at least :data:`MIN_SIZES` distinct N.

    Columns: ``flops`` (the slice's geometric-mean C), ``sizes``, ``n_min``, ``n_max``, ``curvature`` (a),
    ``n_opt``, ``d_opt``, ``loss_opt`` (the parabola at its vertex), ``status`` (``ok``, ``extrapolated``: the
    vertex lies outside the slice's sizes, or ``no minimum``: the parabola opens downwards).
    """
    t = df.assign(flops=6.0 * df["n_params"] * df["tokens"]).sort_values("flops")
    groups, current = [], []
    for idx, c in zip(t.index, t["flops"]):
        if current and c > t.loc[current[0], "flops"] * tolerance:
            groups.append(current)
            current = []
        current.append(idx)
    if current:
        groups.append(current)
    rows = []
    for g in groups:
        s = t.loc[g].groupby("n_params", as_index=False).agg(loss=("loss", "mean"), flops=("flops", "mean"))
        if len(s) < MIN_SIZES:
            continue
        x = np.log(s["n_params"].to_numpy())
        a, b, c = np.polyfit(x, s["loss"].to_numpy(), 2)
        flops = float(np.exp(np.log(s["flops"]).mean()))
        row = {"flops": flops, "sizes": len(s), "n_min": float(s["n_params"].min()), "n_max": float(s["n_params"].max()),
               "curvature": float(a), "n_opt": np.nan, "d_opt": np.nan, "loss_opt": np.nan, "status": "no minimum"}
        if a > 0:
            x0 = -b / (2 * a)
            n_opt = float(np.exp(x0))
            row.update(n_opt=n_opt, d_opt=flops / (6 * n_opt), loss_opt=float(c - b * b / (4 * a)),
                       status="ok" if x.min() <= x0 <= x.max() else "extrapolated")
        rows.append(row)
    return pd.DataFrame(rows, columns=["flops", "sizes", "n_min", "n_max", "curvature", "n_opt", "d_opt", "loss_opt",
                                       "status"])


def isoflop_exponent(slices: pd.DataFrame) -> dict | None:
    """N_opt ∝ C^a_N from the slices whose vertex lies inside their sizes (None with fewer than two):
    ``{"a_n": …, "a_d": 1 − a_N, "slices": k, "prefactor": …}``."""
    ok = slices[slices["status"] == "ok"]
    if len(ok) < 2:
        return None
    slope, icpt = np.polyfit(np.log(ok["flops"].to_numpy()), np.log(ok["n_opt"].to_numpy()), 1)
    return {"a_n": float(slope), "a_d": float(1.0 - slope), "slices": int(len(ok)), "prefactor": float(np.exp(icpt))}
