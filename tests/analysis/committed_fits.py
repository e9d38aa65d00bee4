"""Refits of the committed fits (benchmarks/results/*/fit*.json), judged by docs/analysis.md's "Reproducibility of
refits": the one place the tests spell that policy out.

- The refit runs in a fresh process under one BLAS thread, as the committed fits were made: OpenBLAS splits its sums
  differently over 1 and 2 threads (a 2-thread refit of the branch fit differs in the last bits, and in a flat
  valley the bootstrap refits then land elsewhere), so the same data, seed and machine give identical numbers
  whatever threads the calling test process has.
- Another CPU rounds differently. What holds there was measured by refitting every committed fit under OpenBLAS's
  kernels for six CPU families (``OPENBLAS_CORETYPE`` = Prescott, Nehalem, Sandybridge, Haswell, SkylakeX, Zen):
  the statuses; in a converged fit, every quantity the data pin down (a 95% interval with both ends > 0, under 10x
  wide) to 6e-9 (the fixed-shape branch fits); anything else only as far as its interval says. There, interval ends
  moved by up to 12% of the interval's width in decades (the branch fit's A: 8.5e278 -> 3.8e294 in [3.9e7,
  8.5e278]), and a flagged fit's point estimates anywhere inside their intervals (the independent branch fit's
  alpha: 11.7 -> 36.3 in [10.0, 59.6]).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Set before the fit process imports numpy: BLAS libraries read them once, at load.
ONE_THREAD = {var: "1" for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
CONVERGED_REL = 1e-6  # a converged fit's pinned point estimate or interval end (measured: <= 6e-9)
WIDTH_FRACTION = 0.25  # anything else: this fraction of its committed interval's width in decades (measured: 12%)
REFIT_HANG_GUARD_S = 1800  # idle: 7-27 s each on 2 cores


def refit(table: Path, out: Path, saved: dict, *options: str) -> dict:
    """``quartet fit TABLE --json OUT [options]`` in a fresh process under one BLAS thread, with the rung rule the
    committed fit ``saved`` records (none for a fit older than the rule); the JSON it wrote."""
    rule = str((saved.get("provenance") or {}).get("options", {}).get("min_params", 0))
    options = ("--min-params", rule, *options)
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "quartet.cli", "fit", str(table), "--json", str(out), *options],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=REFIT_HANG_GUARD_S)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return json.loads(out.read_text())


def _decades(x: float | None, overflow: float) -> float:
    """``log10(x)``; an end at or below 0 is -inf, an overflowed end (null in the JSON) is ``overflow``."""
    return overflow if x is None else (math.log10(x) if x > 0 else -math.inf)


def _pinned(interval: list) -> bool:
    lo, hi = interval
    return lo is not None and hi is not None and lo > 0 and hi / lo < 10


def _agrees(new: float | None, old: float | None, interval: list, *, point: bool, converged: bool) -> bool:
    """``new`` (a refit's point estimate or interval end) against ``old`` (the committed one) by the policy above,
    judged by the committed 95% ``interval`` of that quantity and whether its fit ``converged``."""
    if new == old:
        return True
    if converged and _pinned(interval):
        return new is not None and old is not None and math.isclose(new, old, rel_tol=CONVERGED_REL)
    # In decades: an overflowed end makes the interval unbounded, and is at least the largest float as a value.
    lo, hi = (_decades(x, math.inf) for x in interval)
    slack = max(WIDTH_FRACTION * (hi - lo), math.log10(1 + CONVERGED_REL))
    big = math.log10(sys.float_info.max)
    if point and not converged:  # a flat valley: anywhere inside the interval
        return lo - slack <= _decades(new, big) <= hi + slack
    a, b = _decades(new, big), _decades(old, big)
    return a == b or abs(a - b) <= slack


def assert_refit_agrees(got: dict, saved: dict, what: str) -> None:
    """``got`` (a bootstrapped refit's fit JSON) reproduces the committed ``saved`` one by the policy above: the same
    base and efficiency statuses, every point estimate and every interval end."""

    def check(new, old, new_interval: list, interval: list, converged: bool, where: tuple) -> None:
        assert _agrees(new, old, interval, point=True, converged=converged), (*where, new, old, interval)
        for n, o in zip(new_interval, interval):
            assert _agrees(n, o, interval, point=False, converged=converged), (*where, new_interval, interval)

    base, saved_base = got["base"], saved["base"]
    assert base["status"] == saved_base["status"], (what, base["message"])
    for name, value in saved_base["params"].items():
        check(base["params"][name], value, base["intervals"][name], saved_base["intervals"][name],
              saved_base["status"] == "converged", (what, name))
    assert [e["scheme"] for e in got["efficiencies"]] == [e["scheme"] for e in saved["efficiencies"]], what
    for g, s in zip(got["efficiencies"], saved["efficiencies"]):
        assert g["status"] == s["status"], (what, s["scheme"], g["message"])
        for key in ("eff_n", "eff_d"):
            if s[f"{key}_interval"] is None:  # held at 1 by the half's design (a forward-only run's effD): not fitted
                assert g[f"{key}_interval"] is None and g[key] == s[key], (what, s["scheme"], key)
                continue
            check(g[key], s[key], g[f"{key}_interval"], s[f"{key}_interval"], s["status"] == "converged",
                  (what, s["scheme"], key))
