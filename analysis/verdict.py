"""When an efficiency is measured: the verdict rules on its 95% interval, stated once.

An efficiency interval is **pinned** when it is

1. finite and **off the bounds** the efficiencies are fitted in (:data:`analysis.fit.EFF_BOUNDS`, within 1%): an
   interval that reaches a bound says the data do not confine the efficiency (the fit is flagged ``hit_bound``), and
2. **narrower than** :data:`PINNED_WIDTH` (hi − lo, in the efficiency's own units): an interval such as
   [0.34, 3.63] stays off the bounds and still says nothing a reader could use.

A point estimate, where given, must also be plausible (at least :data:`analysis.fit.EFF_IMPLAUSIBLE` and below the
upper bound). :func:`verdict` names which rule an interval fails. ``quartet fit`` prints the verdict of every
fitted efficiency under both interval kinds (:data:`INTERVAL_KINDS`) and stores it in fit.json; design simulations
count a design's pinned efficiencies with :func:`pinned`.
"""
from __future__ import annotations

import math

from analysis.fit import EFF_BOUNDS, EFF_IMPLAUSIBLE

#: The widest 95% interval (hi − lo) that counts as a measurement of an efficiency.
PINNED_WIDTH = 0.3
#: The two interval kinds ``quartet fit --bootstrap N`` reports, and what each conditions on.
INTERVAL_KINDS = {
    "full": "bootstrap with the base law refitted on every resample (the base law's uncertainty included)",
    "base_fixed": "bootstrap with the base law held at its fit (conditional on the base law, as the Quartet and "
                  "QuEST papers report theirs)",
}


def at_bound(interval) -> bool:
    """Whether an efficiency's interval ``(lo, hi)`` reaches :data:`~analysis.fit.EFF_BOUNDS` (within 1%): the data do
    not confine it, and the fit is flagged ``hit_bound``."""
    lo, hi = interval
    return lo <= EFF_BOUNDS[0] * 1.01 or hi >= EFF_BOUNDS[1] * 0.99


def verdict(interval, width: float = PINNED_WIDTH, point: float | None = None) -> str:
    """``pinned``, or the first rule the interval fails: ``no interval``, ``implausible point``, ``at a bound``,
    ``wider than <width>`` (see the module docstring)."""
    if interval is None or not all(math.isfinite(float(v)) for v in interval):
        return "no interval"
    if point is not None and not (EFF_IMPLAUSIBLE <= point < EFF_BOUNDS[1] * 0.99):
        return "implausible point"
    if at_bound(interval):
        return "at a bound"
    if float(interval[1]) - float(interval[0]) >= width:
        return f"wider than {width:g}"
    return "pinned"


def pinned(interval, width: float = PINNED_WIDTH, point: float | None = None) -> bool:
    """Whether :func:`verdict` calls the interval pinned."""
    return verdict(interval, width, point) == "pinned"


__all__ = ["INTERVAL_KINDS", "PINNED_WIDTH", "at_bound", "pinned", "verdict"]
