"""Forecasts from a fitted law: the loss at (N, D) for each precision, with a 95% interval from the bootstrap.

The point estimate is the fitted law, L(N·effN, D·effD) with the base parameters and the precision's efficiencies
(effN = effD = 1 for the base). The interval is the 2.5–97.5 percentile range of the same prediction over the
bootstrap's refits (each refit's base parameters and that precision's efficiencies), so it carries the uncertainty of
the base law and of the efficiencies together. A fit JSON written by ``quartet fit --bootstrap N --json OUT`` keeps
those refits (``bootstrap.draws``); a fit without them gives point estimates only.

``quartet predict`` is the command (:func:`cli_main`): the fit comes from a fit JSON or from any source ``quartet
fit`` reads (fitted on the spot, with ``--bootstrap N`` for intervals); sizes from model names (``--model
llama_50m``: the exact non-embedding N of the model's config) or ``--n``; budgets as D/N (``--dn``) or tokens
(``--tokens``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analysis.errors import AnalysisError
from analysis.laws import predict
from analysis.load import BASE_LABEL

#: fewest usable bootstrap refits for an interval
MIN_DRAWS = 10


@dataclass(frozen=True)
class LawFit:
    """What a forecast needs of a fit: base parameters, each precision's efficiencies, the bootstrap refits."""

    params: dict
    #: precision label -> (effN, effD, status, message)
    effs: dict
    base_status: str = "converged"
    base_message: str = "ok"
    #: one (base params, {label: (effN, effD)}) per bootstrap refit
    draws: tuple = ()
    #: the fitted range of the base runs: n_min, n_max, ratio_min, ratio_max (empty if unknown)
    base_range: dict = field(default_factory=dict)
    source: str = ""

    @classmethod
    def from_report(cls, report, source: str = "") -> "LawFit":
        effs = {e.scheme: (e.eff_n, e.eff_d, e.status, e.message) for e in report.efficiencies}
        return cls(params=dict(report.base.params), effs=effs, base_status=report.base.status,
                   base_message=report.base.message, draws=tuple(report.samples),
                   base_range=dict(report.provenance.get("base_range", {})), source=source)

    @classmethod
    def from_json(cls, path: str | Path) -> "LawFit":
        """The fit of a fit JSON (``quartet fit --json``); AnalysisError (one line) saying what is wrong with it."""
        from analysis.report import read_fit_json

        return cls.from_dict(read_fit_json(path), path)

    @classmethod
    def from_dict(cls, d: dict, path: str | Path) -> "LawFit":
        """The fit of a fit JSON already read (:func:`analysis.report.read_fit_json`) from ``path``."""
        from analysis.report import draws_from_dict

        try:
            base = d["base"]
            effs = {e["scheme"]: (_num(e["eff_n"]), _num(e["eff_d"]), e["status"], e.get("message", ""))
                    for e in d.get("efficiencies", [])}
            draws = draws_from_dict(d["bootstrap"]["draws"]) if d.get("bootstrap", {}).get("draws") else ()
            return cls(params={k: _num(v) for k, v in base["params"].items()}, effs=effs, base_status=base["status"],
                       base_message=base.get("message", ""), draws=draws,
                       base_range=dict(d.get("provenance", {}).get("base_range", {})), source=str(path))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise AnalysisError(f"{path}: not a fit JSON of `quartet fit --json` ({type(exc).__name__}: {exc})") from None

    @property
    def precisions(self) -> list[str]:
        """The base and every precision with finite efficiencies, in fit order."""
        return [BASE_LABEL] + [k for k, (en, ed, *_) in self.effs.items() if np.isfinite(en) and np.isfinite(ed)]


def _num(x) -> float:
    return float("nan") if x is None else float(x)


def is_fit_json(path: str) -> bool:
    """Whether ``path`` names a fit JSON (``quartet fit --json``), as opposed to a table or runs a fit reads: any
    ``.json`` (no other source is one), so that a missing, unreadable or corrupt one is named as such by
    :meth:`LawFit.from_json`."""
    return Path(path).suffix.lower() == ".json"


@dataclass(frozen=True)
class Point:
    """Where to forecast: a size (with its model name, if given) and a token budget."""

    n_params: float
    tokens: float
    model: str = ""

    @property
    def ratio(self) -> float:
        return self.tokens / self.n_params


def points(models=(), ns=(), dns=(), tokens=(), model_point=None) -> list[Point]:
    """Every size (``models`` by name, ``ns`` as N) at every budget (``dns`` as D/N, ``tokens`` as D).

    ``model_point(name, dn=None, tokens=None) -> Point`` turns a model name into its size and a run's tokens; it
    reads the training configs, which this torch-free package does not import, so the CLI passes it in
    (:func:`quartet.cli_predict.model_point`)."""
    if models and model_point is None:
        raise AnalysisError("model names need the training configs: give --n N, or run `quartet predict`")
    if not (models or ns):
        raise AnalysisError("give a size: --model NAME (e.g. llama_50m) or --n N (e.g. 5e7)")
    if not (dns or tokens):
        raise AnalysisError("give a budget: --dn D/N (e.g. 5) or --tokens D (e.g. 2.5e8)")
    for name, values in (("--n", ns), ("--dn", dns), ("--tokens", tokens)):
        bad = [v for v in values if not (math.isfinite(v) and v > 0)]
        if bad:
            raise AnalysisError(f"{name} must be positive (got {bad[0]:g})")
    out = []
    for m in models:
        out += [model_point(m, dn=r) for r in dns] + [model_point(m, tokens=t) for t in tokens]
    for n in ns:
        out += [Point(n, n * r) for r in dns] + [Point(n, t) for t in tokens]
    return out


def forecast(fit: LawFit, pts: list[Point], precisions: list[str] | None = None, level: float = 0.95) -> list[dict]:
    """One row per (point, precision): the fitted law's loss and its bootstrap interval (None without enough
    refits), the gap to the base and its interval (:func:`gap_forecast`), the efficiencies used, the fit's status for
    that precision and whether the point extrapolates."""
    precisions = list(precisions or fit.precisions)
    unknown = [p for p in precisions if p != BASE_LABEL and p not in fit.effs]
    if unknown:
        raise AnalysisError(f"precision {unknown[0]!r} is not in the fit; have: {', '.join(fit.precisions)}")
    rows = []
    for pt in pts:
        for prec in precisions:
            if prec == BASE_LABEL:
                en, ed, status, message = 1.0, 1.0, fit.base_status, fit.base_message
            else:
                en, ed, status, message = fit.effs[prec]
            refit_loss, refit_base = _refit_losses(fit, pt, prec)
            loss = float(predict(fit.params, pt.n_params, pt.tokens, en, ed))
            gap = loss - float(predict(fit.params, pt.n_params, pt.tokens))
            vals = refit_loss[np.isfinite(refit_loss)]
            rows.append({"precision": prec, "model": pt.model, "n_params": pt.n_params, "tokens": pt.tokens,
                         "ratio": pt.ratio, "loss": loss, "interval": _percentiles(vals, level), "level": level,
                         "draws": int(len(vals)), "gap": gap,
                         "gap_interval": _percentiles(refit_loss - refit_base, level),
                         "eff_n": en, "eff_d": ed, "status": status, "message": message,
                         "extrapolation": extrapolation(fit.base_range, pt)})
    return rows


def _refit_losses(fit: LawFit, pt: Point, precision: str) -> tuple[np.ndarray, np.ndarray]:
    """The loss of ``precision`` and of the base at ``pt`` under each bootstrap refit that has the precision
    (aligned: the same refit's base law for both)."""
    pairs = [(float(predict(p, pt.n_params, pt.tokens, *((1.0, 1.0) if precision == BASE_LABEL else e[precision]))),
              float(predict(p, pt.n_params, pt.tokens)))
             for p, e in fit.draws if precision == BASE_LABEL or precision in e]
    arr = np.array(pairs, dtype=float).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def _percentiles(vals: np.ndarray, level: float):
    """The central ``level`` range of the finite ``vals``; None with fewer than :data:`MIN_DRAWS` of them."""
    vals = vals[np.isfinite(vals)]
    q = (100 * (1 - level) / 2, 100 * (1 + level) / 2)
    return tuple(float(v) for v in np.percentile(vals, q)) if len(vals) >= MIN_DRAWS else None


def gap_forecast(fit: LawFit, pt: Point, precision: str, level: float = 0.95) -> dict:
    """The gap L(precision) − L(base) the law forecasts at ``pt``, with the 2.5–97.5 percentile range of the same
    difference over the bootstrap's refits (each refit's base law and efficiencies: the paired quantity a same-seed
    pair of runs measures, so the base law's shared uncertainty cancels out of it as it does out of the pair)."""
    row = forecast(fit, [pt], [precision], level)[0]
    return {"precision": precision, "gap": row["gap"], "interval": row["gap_interval"], "draws": row["draws"],
            "level": level}


def extrapolation(base_range: dict, pt: Point) -> str:
    """'' inside the base runs' N and D/N ranges, else what lies outside (e.g. 'N 2.4x above the largest fitted')."""
    notes = []
    for what, value, lo, hi in (("N", pt.n_params, base_range.get("n_min"), base_range.get("n_max")),
                                ("D/N", pt.ratio, base_range.get("ratio_min"), base_range.get("ratio_max"))):
        if lo is None or hi is None:
            continue
        if value > hi * 1.001:
            notes.append(f"{what} {value / hi:.3g}x above the largest fitted")
        elif value < lo * 0.999:
            notes.append(f"{what} {lo / value:.3g}x below the smallest fitted")
    return "; ".join(notes)
