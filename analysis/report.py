"""One call from a tidy DataFrame to everything a user asks of a fit: :func:`fit_all` → :class:`FitReport`.

The report holds the stage-1 base fit, a stage-2 efficiency fit per precision, bootstrap intervals of two kinds
(resampling runs — whole cells, every precision together, when the design is paired — and refitting base
and efficiencies together so the base's uncertainty propagates; and the efficiencies refitted on the same resamples
with the base law held at its fit: :data:`analysis.verdict.INTERVAL_KINDS`) with their verdicts
(:mod:`analysis.verdict`), the consistency check of every combined recipe against its forward-only effN and
backward-only effD (:func:`half_pairs`), the rung rule (:func:`rung_rule`) with the fit it changes,
leave-largest-model-out and leave-largest-budget-out forecast errors, the headline per precision,
the dropped runs with reasons and the provenance (inputs, code version, law, options).
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.errors import AnalysisError
import dataclasses

from analysis.fit import (E_FLOOR_FRACTION, EFF_BOUNDS, EXPONENT_BOX, BaseFit, EffFit, HUBER_DELTA, fit_base,
                          fit_efficiency, identification, scheme_kind)
from analysis.laws import PARAM_NAMES, Law, get_law, predict
from analysis.load import BASE_LABEL
from analysis.speed import headline
from analysis.verdict import INTERVAL_KINDS, PINNED_WIDTH, at_bound, verdict

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

#: The row selections of the paper's notebook (init commit 6ddd368) that reproduce its published
#: efficiencies; applied with ``selections="paper"`` (the default for the bundled paper grid).
#: Key (forward, backward) -> pandas query over the table's columns.
PAPER_SELECTIONS = {
    ("bf16", "sr_absmax"): "n_params == 30482560 and steps == 91552",
    # the notebook's QuEST-backward effD uses its single 30M point at 11444 steps (D/N ~ 100)
    ("bf16", "quest"): "n_params == 30482560 and steps == 11444",
    ("bf16", "rtn_absmax"): "n_params == 30482560 and steps == 91552",
    ("quest", "sr_absmax"): "(n_params == 30482560 and steps < 90000) or (n_params == 49556736 and steps < 30000)",
}


def code_version() -> dict:
    """quartet's version and, when run from a git checkout, the commit (and whether it is dirty)."""
    from quartet import __version__

    out = {"quartet": __version__, "git_commit": None, "git_dirty": None}
    repo = Path(__file__).resolve().parents[1]
    try:
        out["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                           timeout=5).stdout.strip() or None
        status = subprocess.run(["git", "status", "--porcelain", "--", "analysis"], cwd=repo, capture_output=True,
                                text=True, timeout=5).stdout
        out["git_dirty"] = bool(status.strip()) if out["git_commit"] else None
    except (OSError, subprocess.SubprocessError):
        pass
    return out


@dataclass(frozen=True)
class Forecast:
    """Refit without the held-out rows, then the relative error of the forecast on them."""

    name: str
    held_out: tuple[str, ...]
    n_train: int
    mean_abs_rel_error: float
    max_abs_rel_error: float
    status: str
    message: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "held_out": list(self.held_out), "n_train": self.n_train,
                "mean_abs_rel_error": self.mean_abs_rel_error, "max_abs_rel_error": self.max_abs_rel_error,
                "status": self.status, "message": self.message}


@dataclass(frozen=True)
class FitReport:
    """Everything :func:`fit_all` produced (frozen); ``to_dict()`` is the ``quartet fit --json`` schema."""

    base: BaseFit
    efficiencies: tuple[EffFit, ...]
    base_intervals: dict  # param -> (lo, hi) 95 % bootstrap percentile interval
    eff_intervals: dict  # scheme -> {"eff_n": (lo, hi), "eff_d": (lo, hi)}
    bootstrap: dict  # {"requested", "used", "seed", "resample"}
    forecasts: tuple[Forecast, ...]
    headlines: tuple[dict, ...]
    dropped: tuple[dict, ...]
    provenance: dict
    seconds: float = 0.0
    #: the bootstrap's refits, one (base params, {scheme: (effN, effD)}) per usable resample: intervals of any
    #: derived quantity (e.g. :meth:`compute_optimal`, ``quartet predict``) come from them; serialised compactly as
    #: ``bootstrap.draws`` (:func:`draws_to_dict`)
    samples: tuple = ()
    #: scheme -> {"eff_n": (lo, hi), "eff_d": (lo, hi)}: 95% intervals with the base law held at its fit (the
    #: ``base_fixed`` kind of :data:`~analysis.verdict.INTERVAL_KINDS`; ``eff_intervals`` is the ``full`` kind)
    eff_intervals_base_fixed: dict = field(default_factory=dict)
    #: one row per combined recipe whose forward-only and backward-only halves were fitted (:func:`consistency`)
    consistency: tuple = ()
    #: what the rung rule did (:func:`rung_rule`) and, where it excluded rungs, the fit with them
    rung_rule: dict = field(default_factory=dict)
    #: the widest interval the verdicts call pinned (:data:`analysis.verdict.PINNED_WIDTH`)
    pinned_width: float = PINNED_WIDTH

    def eff(self, scheme: str) -> EffFit:
        """The efficiency fit of a scheme by its label (or ``forward:backward``)."""
        for e in self.efficiencies:
            if scheme in (e.scheme, f"{e.forward}:{e.backward}"):
                return e
        raise AnalysisError(f"no efficiency fit for {scheme!r}; have: {', '.join(e.scheme for e in self.efficiencies)}")

    def intervals(self, scheme: str) -> dict:
        """``{kind: {"eff_n": (lo, hi) | None, "eff_d": (lo, hi) | None}}`` for both interval kinds of a fitted
        precision (None for the efficiency it does not fit, or without a bootstrap)."""
        e = self.eff(scheme)
        out = {}
        for kind, ints in (("full", self.eff_intervals), ("base_fixed", self.eff_intervals_base_fixed)):
            got = ints.get(e.scheme, {})
            out[kind] = {"eff_n": got.get("eff_n") if e.fits_n else None,
                         "eff_d": got.get("eff_d") if e.fits_d else None}
        return out

    def verdicts(self, scheme: str) -> dict:
        """``{"eff_n": {kind: verdict}, "eff_d": {...}}`` (:func:`analysis.verdict.verdict`) for the efficiencies the
        precision fits, under both interval kinds."""
        e = self.eff(scheme)
        ints = self.intervals(scheme)
        return {key: {kind: verdict(ints[kind][key], self.pinned_width, point) for kind in ints}
                for key, point, fits in (("eff_n", e.eff_n, e.fits_n), ("eff_d", e.eff_d, e.fits_d)) if fits}

    def compute_optimal(self, flops, speedups: dict | None = None) -> list[dict]:
        """Per precision (the base included) and budget: the compute-optimal N, D, D/N and loss from the fitted law
        (:func:`analysis.speed.compute_optimal`), with 95% intervals from the bootstrap refits when there are any.
        ``speedups`` maps a precision to its training speedup over the base (default 1: equal FLOPs)."""
        from analysis.speed import compute_optimal

        speedups = speedups or {}
        schemes = [(BASE_LABEL, 1.0, 1.0, "converged")] + [
            (e.scheme, e.eff_n, e.eff_d, e.status) for e in self.efficiencies if np.isfinite(e.eff_n)]
        rows = []
        for c in np.atleast_1d(np.asarray(flops, float)):
            for label, en, ed, status in schemes:
                s = float(speedups.get(label, 1.0))
                est = compute_optimal(self.base.params, c, en, ed, s)
                row = {"precision": label, "flops": float(c), "speedup": s, "status": status,
                       **{k: float(v) for k, v in est.items()}}
                draws = []
                for params, effs in self.samples:
                    if label == BASE_LABEL:
                        draws.append(compute_optimal(params, c, 1.0, 1.0, s))
                    elif label in effs:
                        draws.append(compute_optimal(params, c, *effs[label], s))
                for k in ("n_opt", "d_opt", "ratio", "loss"):
                    vals = np.array([float(d[k]) for d in draws])
                    vals = vals[np.isfinite(vals)]
                    row[f"{k}_interval"] = tuple(np.percentile(vals, [2.5, 97.5])) if len(vals) >= 10 else None
                rows.append(row)
        return rows

    def to_dict(self) -> dict:
        def iv(x):
            return None if x is None else [float(x[0]), float(x[1])]

        effs = []
        for e in self.efficiencies:
            d = e.to_dict()
            ints = self.intervals(e.scheme)
            for key in ("eff_n", "eff_d"):
                d[f"{key}_interval"] = iv(ints["full"][key])
                d[f"{key}_interval_base_fixed"] = iv(ints["base_fixed"][key])
            d["verdicts"] = self.verdicts(e.scheme)
            effs.append(d)
        base = self.base.to_dict()
        base["intervals"] = {k: iv(v) for k, v in self.base_intervals.items()}
        boot = dict(self.bootstrap, interval_kinds=dict(INTERVAL_KINDS), pinned_width=self.pinned_width)
        if self.samples:
            boot["draws"] = draws_to_dict(self.samples)
        return {"schema_version": SCHEMA_VERSION, "base": base, "efficiencies": effs, "bootstrap": boot,
                "consistency": [dict(c) for c in self.consistency], "rung_rule": dict(self.rung_rule),
                "forecasts": [f.to_dict() for f in self.forecasts], "headlines": list(self.headlines),
                "dropped": list(self.dropped), "provenance": dict(self.provenance), "seconds": self.seconds}

    def to_json(self, path: str | Path | None = None) -> str:
        """Serialise (inf/NaN written as null) and optionally write to ``path``. Lists of numbers stay on one line
        (the bootstrap draws: one line per refit)."""
        text = _NUMBER_LIST.sub(lambda m: "[" + ", ".join(m.group(0)[1:-1].split()).replace(",,", ",") + "]",
                                json.dumps(_clean(self.to_dict()), indent=2))
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text + "\n")
        return text


def update_marked_block(page: str | Path, name: str, text: str) -> bool:
    """Put ``text`` between the page's ``<!-- NAME: begin -->`` and ``<!-- NAME: end -->`` markers (a table a
    script writes into a docs page); False, the page unchanged, when the page or a marker is missing."""
    page = Path(page)
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    if not page.is_file():
        return False
    body = page.read_text()
    i, j = body.find(begin), body.find(end)
    if i < 0 or j < i:
        return False
    page.write_text(body[: i + len(begin)] + "\n" + text + body[j:])
    return True


def read_fit_json(path: str | Path) -> dict:
    """A fit JSON written by :meth:`FitReport.to_json` (``quartet fit --json``), as a dict; AnalysisError (one line
    saying what is wrong) when it cannot be read, is not JSON, is not a fit JSON, or has no or another
    ``schema_version`` than :data:`SCHEMA_VERSION` (its fields may mean something else: refit instead)."""
    path = Path(path)
    refit = "refit it with this version: quartet fit SOURCE --bootstrap N --json OUT"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AnalysisError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    except UnicodeDecodeError as exc:
        raise AnalysisError(f"{path}: not UTF-8 text (bad byte at offset {exc.start}); the file is corrupt") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise AnalysisError(f"{path}: not valid JSON ({exc.msg}: line {exc.lineno}, column {exc.colno}); the file "
                            f"is corrupt or truncated") from None
    if not isinstance(data, dict) or "base" not in data or "efficiencies" not in data:
        raise AnalysisError(f"{path}: not a fit JSON of `quartet fit --json` (no 'base' and 'efficiencies')")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        what = "has no schema_version" if version is None else f"has schema_version {version!r}"
        raise AnalysisError(f"{path}: {what}; this quartet reads fit JSONs of schema_version {SCHEMA_VERSION}; "
                            f"{refit}")
    return data


#: a JSON list of numbers / nulls spread over lines by ``indent``
_NUMBER_LIST = re.compile(r"\[(?:\s*(?:-?[0-9][0-9.eE+-]*|null)\s*,)*\s*(?:-?[0-9][0-9.eE+-]*|null)\s*\]")

#: significant digits of the stored bootstrap draws (what ``quartet predict`` reads back from a fit JSON)
DRAW_DIGITS = 7


def draws_to_dict(samples) -> dict:
    """The bootstrap refits, compactly: ``params`` one row (A, alpha, B, beta, E, gamma) per resample, ``eff`` per
    precision one (effN, effD) row per resample (null where that resample's refit of the precision failed)."""
    def r(x):
        return float(f"{float(x):.{DRAW_DIGITS}g}")

    labels = sorted({label for _, effs in samples for label in effs})
    return {"columns": list(PARAM_NAMES),
            "params": [[r(params[p]) for p in PARAM_NAMES] for params, _ in samples],
            "eff": {label: [[r(v) for v in effs[label]] if label in effs else None for _, effs in samples]
                    for label in labels}}


def draws_from_dict(d: dict) -> tuple:
    """Inverse of :func:`draws_to_dict`: the ``FitReport.samples`` tuple."""
    cols = d.get("columns", list(PARAM_NAMES))
    out = []
    for i, row in enumerate(d.get("params", [])):
        effs = {label: tuple(rows[i]) for label, rows in d.get("eff", {}).items() if rows[i] is not None}
        out.append((dict(zip(cols, row)), effs))
    return tuple(out)


def _clean(x):
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def base_rows(df: pd.DataFrame, base_label: str = BASE_LABEL) -> pd.DataFrame:
    """Rows of the unquantized baseline (forward == backward == base_label)."""
    return df[(df["forward"] == base_label) & (df["backward"] == base_label)]


def scheme_groups(df: pd.DataFrame, base_label: str = BASE_LABEL, selections: dict | None = None):
    """Yield (label, forward, backward, kind, rows) for every non-base precision, selections applied."""
    rest = df[~((df["forward"] == base_label) & (df["backward"] == base_label))]
    # Group by the scheme name too: two schemes may share forward/backward labels (e.g. the same
    # quantizers with another rounding seed policy) and must not be pooled into one fit.
    names = rest["precision"] if "precision" in rest else pd.Series(np.nan, index=rest.index)
    rest = rest.assign(_scheme=[p if isinstance(p, str) and p else (f if f == b else f"{f}:{b}")
                                for p, f, b in zip(names, rest["forward"], rest["backward"])])
    for (fw, bw, label), rows in rest.groupby(["forward", "backward", "_scheme"], sort=True):
        if selections and (fw, bw) in selections:
            rows = rows.query(selections[(fw, bw)])
        yield str(label), str(fw), str(bw), scheme_kind(fw, bw, base_label), rows.drop(columns="_scheme")


def _forecast(name: str, base: pd.DataFrame, held_mask: np.ndarray, law, delta: float,
              warm: np.ndarray | None = None) -> Forecast:
    train, test = base[~held_mask], base[held_mask]
    ids = tuple(test["run_id"].astype(str))
    # A forecast needs an over-determined training fit (at least two points more than parameters).
    if test.empty or len(train) < law.n_free + 2 or train["n_params"].nunique() < 2 or train["tokens"].nunique() < 2:
        return Forecast(name, ids, len(train), float("nan"), float("nan"), "too_few_points",
                        f"{len(train)} training rows left after holding out {len(test)}")
    try:
        # the reduced data's optimum lies near the full fit's basins: start there, plus a coarse corner of the grid
        starts = None if warm is None else np.vstack([warm, law.start_grid()[::27]])
        fit = fit_base(train["n_params"], train["tokens"], train["loss"], law, delta=delta, n_polish=3, starts=starts)
    except AnalysisError as exc:
        return Forecast(name, ids, len(train), float("nan"), float("nan"), "failed", str(exc))
    pred = predict(fit.params, test["n_params"].to_numpy(), test["tokens"].to_numpy())
    rel = np.abs(pred / test["loss"].to_numpy() - 1.0)
    return Forecast(name, ids, len(train), float(rel.mean()), float(rel.max()), fit.status, fit.message)


#: the columns that name one cell of one precision: rows sharing them are replicates (seeds)
CELL_KEYS = ("n_params", "tokens", "forward", "backward", "precision")
REPLICATE_MODES = ("mean", "all")


def average_replicates(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (N, D, precision) cell: the mean loss of its replicates (seeds), ``seeds`` = how many,
    ``run_id`` = their ids joined by ``+``. Each design point then weighs once in the fit, as in a grid of
    single runs, and a bootstrap resamples cells rather than counting one cell's seeds as independent points."""
    if not df.duplicated(list(CELL_KEYS)).any():
        return df
    keys = list(CELL_KEYS)
    out = (df.groupby(keys, sort=False, dropna=False)
           .agg(loss=("loss", "mean"), seeds=("loss", "size"), run_id=("run_id", lambda r: "+".join(map(str, r))),
                **{c: (c, "first") for c in df.columns if c not in keys + ["loss", "run_id", "seed", "seeds"]})
           .reset_index())
    out.attrs = dict(df.attrs)
    return out


def _paired_cells(base_df: pd.DataFrame, groups) -> list | None:
    """The base's (N, D) cells if every precision was run on a subset of them once per cell (a paired
    design), else None."""
    cells = list(dict.fromkeys(zip(base_df["n_params"], base_df["tokens"])))
    if len(cells) != len(base_df):
        return None
    known = set(cells)
    for _label, _fw, _bw, _kind, rows in groups:
        own = list(zip(rows["n_params"], rows["tokens"]))
        if len(set(own)) != len(own) or not set(own) <= known:
            return None
    return cells


def _interval_checks(base: BaseFit, effs: list, base_int: dict, eff_int: dict, min_loss: float):
    """Flag what the bootstrap shows the point estimates hide: E's interval reaching its bound 0, an exponent's
    interval leaving the plausible box, an efficiency's interval reaching its bounds. Efficiencies fitted on a
    flagged base inherit its status."""
    if base.status == "converged" and base_int:
        lo_box, hi_box = EXPONENT_BOX
        reasons = []
        if "e" in base.free and "E" in base_int and base_int["E"][0] < E_FLOOR_FRACTION * min_loss:
            reasons.append(f"E's 95% bootstrap interval [{base_int['E'][0]:.3g}, {base_int['E'][1]:.3g}] reaches its "
                           f"lower bound 0: the data do not pin the irreducible loss down")
        for name in ("alpha", "beta", "gamma"):
            if name in base.free and name in base_int:
                lo, hi = base_int[name]
                if lo < lo_box or hi > hi_box:
                    reasons.append(f"{name}'s 95% bootstrap interval [{lo:.3g}, {hi:.3g}] leaves the plausible "
                                   f"range [{lo_box}, {hi_box}]")
        if reasons:
            base = dataclasses.replace(base, status="hit_bound", message="; ".join(reasons))
    out = []
    for e in effs:
        ints = eff_int.get(e.scheme, {})
        if e.status == "converged":
            touching = [k for k, fits in (("eff_n", e.fits_n), ("eff_d", e.fits_d)) if fits and k in ints
                        and at_bound(ints[k])]
            if touching:
                e = dataclasses.replace(e, status="hit_bound", message=(
                    f"the 95% bootstrap interval of {' and '.join(touching)} reaches its bound {EFF_BOUNDS}"))
            elif base.status != "converged":
                e = dataclasses.replace(e, status=base.status, message=(
                    f"inherited from the base fit ({base.status}: {base.message})"))
        out.append(e)
    return base, out


def _terms_including_one(e: EffFit, ints: dict) -> list[str]:
    """The fitted efficiencies ("effN", "effD") whose 95% interval includes 1."""
    return [name for k, name, fits in (("eff_n", "effN", e.fits_n), ("eff_d", "effD", e.fits_d))
            if fits and k in ints and ints[k][0] <= 1.0 <= ints[k][1]]


def _includes_one(e: EffFit, ints: dict) -> str | None:
    """The headline's note when a fitted efficiency's 95% interval includes 1: that cost is not measurable here."""
    names = _terms_including_one(e, ints)
    if not names:
        return None
    key = {"effN": "eff_n", "effD": "eff_d"}
    parts = [f"{n}'s 95% interval [{ints[key[n]][0]:.3g}, {ints[key[n]][1]:.3g}] includes 1" for n in names]
    return "; ".join(parts) + " (no measurable cost at this scale" + (")" if len(parts) == int(e.fits_n) + int(e.fits_d)
                                                                       else " in that term)")


#: what :func:`fit_all`'s bootstrap resamples
RESAMPLE_MODES = ("cells", "residuals")


def _resample_label(resample: str, paired: bool) -> str:
    """How the provenance names what the bootstrap redrew."""
    if resample == "residuals":
        return "residuals, design fixed " + ("(paired)" if paired else "(per precision)")
    return "cells (paired)" if paired else "runs per precision"


def _residuals(base: BaseFit, effs: list, base_df: pd.DataFrame, groups) -> tuple:
    """The fitted log-losses and log-residuals the residual bootstrap redraws: ``((pred, res) of the base,
    {scheme: (pred, res)})``, each array in its table's row order (precisions without a fitted efficiency left out)."""
    def split(n, d, loss, n_free, *eff):
        pred = np.log(predict(base.params, np.asarray(n, float), np.asarray(d, float), *eff))
        res = np.log(np.asarray(loss, float)) - pred
        # fitted residuals are smaller than the noise by the parameters the fit spent on them: inflate them by
        # sqrt(n / (n - p)) (Davison & Hinkley 1997, §6.2) so the redrawn noise is not too small
        return pred, res * np.sqrt(len(res) / max(len(res) - n_free, 1))

    out = {}
    for e, (label, _fw, _bw, _kind, rows) in zip(effs, groups):
        if np.isfinite(e.eff_n) and len(rows):
            out[label] = split(rows["n_params"], rows["tokens"], rows["loss"], int(e.fits_n) + int(e.fits_d),
                               e.eff_n, e.eff_d)
    return split(base_df["n_params"], base_df["tokens"], base_df["loss"], len(base.free)), out


#: The rung rule's default: model sizes (rungs) below this many non-embedding parameters are left out of the fit.
#: On the project's ladders the 1.0M rung does not follow the law (its runs end inside a sharp drop of the loss; bf16
#: residual -0.22 nats at D/N 20, RMS 0.12 against 0.07 / 0.02 / 0.008 at 3.4M / 7.1M / 20.5M): docs/analysis.md.
MIN_PARAMS = 2e6
#: The rung rule applies only where it leaves at least this many base model sizes (the law needs them to separate N
#: from D); with fewer (a run of tiny models, the demo) every rung is kept and the report says why.
RUNG_RULE_MIN_SIZES = 3


def rung_rule(df: pd.DataFrame, min_params: float | None = MIN_PARAMS,
              base_label: str = BASE_LABEL) -> tuple[pd.DataFrame, dict]:
    """The rows the fit keeps under the rung rule, and what the rule did: every run (any precision) of a model size
    below ``min_params`` non-embedding parameters is left out, listed among the dropped runs with the rule as the
    reason, provided at least :data:`RUNG_RULE_MIN_SIZES` base sizes remain. ``min_params`` 0 or None: no rule.

    Returns ``(rows, info)`` with ``info = {"min_params", "applied", "excluded_sizes", "excluded_runs", "note"}``."""
    min_params = float(min_params or 0.0)
    info = {"min_params": min_params, "applied": False, "excluded_sizes": [], "excluded_runs": 0, "note": ""}
    sizes = sorted(set(base_rows(df, base_label)["n_params"].astype(float)))
    below = [n for n in sizes if n < min_params]
    if not min_params:
        info["note"] = "off"
        return df, info
    if not below:
        info["note"] = f"no base model size below {min_params:.3g}"
        return df, info
    left = len(sizes) - len(below)
    if left < RUNG_RULE_MIN_SIZES:
        info["note"] = (f"not applied: excluding the {len(below)} size(s) below {min_params:.3g} would leave {left} base "
                        f"size(s) (< {RUNG_RULE_MIN_SIZES})")
        return df, info
    hit = df[df["n_params"].astype(float) < min_params]
    attrs = dict(df.attrs)
    kept = df.drop(index=hit.index)
    kept.attrs = {**attrs, "dropped": list(attrs.get("dropped", ())) + [
        {"run_id": str(r), "reason": f"rung rule: N = {n:.3g} < min_params {min_params:.3g} (the law does not fit "
                                     f"the smallest rungs: docs/analysis.md)"}
        for r, n in zip(hit["run_id"], hit["n_params"])]}
    info.update(applied=True, excluded_sizes=below, excluded_runs=int(len(hit)),
                note=f"excluded {len(below)} size(s) below {min_params:.3g}: {', '.join(f'{n:.3g}' for n in below)}")
    return kept, info


#: The names quartet gives a recipe's forward-only and backward-only variants (``quartet.quant.config.HALVES``;
#: analysis/ imports no quartet.quant, a test checks that the two agree).
HALF_SUFFIXES = {"forward": "_fwd", "backward": "_bwd"}


def half_pairs(groups) -> list[tuple[str, str, str]]:
    """``(combined, forward-only, backward-only)`` precision labels for every combined (joint) precision whose two
    halves were run: the forward-only precision with its forward label and the backward-only one with its backward
    label. Where several share the label, the one named ``<combined>_fwd`` (``_bwd``) is taken, else none (ambiguous)."""
    kinds = {kind: [(label, fw, bw) for label, fw, bw, k, _ in groups if k == kind]
             for kind in ("joint", "forward", "backward")}

    def match(name: str, want: str, half: str) -> str | None:
        idx = 1 if half == "forward" else 2
        found = [c[0] for c in kinds[half] if c[idx] == want]
        named = [c for c in found if c == name + HALF_SUFFIXES[half]]
        return named[0] if named else (found[0] if len(found) == 1 else None)

    out = []
    for name, fw, bw in kinds["joint"]:
        f, b = match(name, fw, "forward"), match(name, bw, "backward")
        if f and b:
            out.append((name, f, b))
    return out


def half_discrepancy(params: dict, rows: pd.DataFrame, eff_n: float, eff_d: float) -> float:
    """Mean over the combined recipe's ``rows`` of the observed loss minus the law's prediction from the halves'
    efficiencies, L(N·effN, D·effD) (nats): 0 when the two halves' costs add up to the recipe's."""
    n, d = rows["n_params"].to_numpy(float), rows["tokens"].to_numpy(float)
    return float(np.mean(rows["loss"].to_numpy(float) - predict(params, n, d, eff_n, eff_d)))


def consistency(base: BaseFit, effs: list, groups, pairs, draws: dict | None = None) -> list[dict]:
    """The Quartet paper's consistency check: each combined recipe's gap to the base law against the gap that its
    forward-only effN and backward-only effD predict together. One row per pair of :func:`half_pairs`: ``eff_n``
    (from the forward-only runs), ``eff_d`` (backward-only), ``cells``, ``observed_gap`` and ``predicted_gap`` (mean
    over the recipe's cells of L_obs − L(N, D) and L(N·effN, D·effD) − L(N, D), nats), ``discrepancy`` (their
    difference) with its 95% bootstrap ``interval`` (``draws``: pair -> per-resample discrepancies, base and halves
    refitted on each) and ``verdict``: ``not rejected`` (the interval holds 0: the data cannot tell the costs from
    multiplying, which is weaker than showing they do), ``inconsistent``, or ``no interval``."""
    by_label = {e.scheme: e for e in effs}
    rows_of = {label: rows for label, *_, rows in groups}
    out = []
    for name, f, b in pairs:
        en, ed = by_label[f].eff_n, by_label[b].eff_d
        if not (np.isfinite(en) and np.isfinite(ed)):
            continue
        rows = rows_of[name]
        n, d = rows["n_params"].to_numpy(float), rows["tokens"].to_numpy(float)
        base_loss = predict(base.params, n, d)
        observed = float(np.mean(rows["loss"].to_numpy(float) - base_loss))
        predicted = float(np.mean(predict(base.params, n, d, en, ed) - base_loss))
        vals = np.array([v for v in (draws or {}).get(name, []) if np.isfinite(v)])
        iv = tuple(float(x) for x in np.percentile(vals, [2.5, 97.5])) if len(vals) >= 10 else None
        verdict_ = "no interval" if iv is None else ("not rejected" if iv[0] <= 0.0 <= iv[1] else "inconsistent")
        out.append({"recipe": name, "forward_only": f, "backward_only": b, "eff_n": float(en), "eff_d": float(ed),
                    "cells": int(len(rows)), "observed_gap": observed, "predicted_gap": predicted,
                    "discrepancy": observed - predicted, "interval": iv, "verdict": verdict_})
    return out


def fit_all(df: pd.DataFrame, law: str = "busbridge", *, bootstrap: int = 0, seed: int = 0,
            selections: dict | str | None = "auto", base_label: str = BASE_LABEL, delta: float = HUBER_DELTA,
            at_n: float | None = None, at_ratio: float | None = None, forecasts: bool = True,
            progress: bool = False, replicates: str = "mean", exclude: str | None = None,
            start_grid: str = "paper", resample: str = "cells", min_params: float | None = MIN_PARAMS,
            pinned_width: float = PINNED_WIDTH) -> FitReport:
    """Fit the base law and every precision's efficiencies; bootstrap, forecasts, headlines, provenance.

    ``selections``: ``"auto"`` applies :data:`PAPER_SELECTIONS` to the bundled paper grid only,
    ``"paper"`` always, ``None`` never, or a dict (forward, backward) -> query string.
    ``at_n`` / ``at_ratio``: where the headline's break-even speedup is evaluated (default: the largest
    base model at the median D/N of the base runs, rounded to 1 significant digit — 100 for the
    paper's grid — so the headline stays inside the data's budget range).
    ``exclude``: a pandas query over the runs' columns; matching runs are left out and listed among the
    dropped runs with the rule as the reason (outlier exclusion by a stated rule, never silently).
    ``start_grid``: ``"paper"`` (486 starts for the full law) or ``"wide"`` (:meth:`Law.start_grid`).
    ``replicates``: ``"mean"`` fits one point per (N, D, precision) cell, the mean over its seeds
    (:func:`average_replicates`); ``"all"`` fits every run as its own point.
    ``resample``: what the bootstrap draws. ``"cells"`` (default) resamples whole cells — the base run and every
    precision's run of a cell together — when the design is paired (every precision run once on the base's
    cells), else each precision's runs apart: it asks "what if other cells had been run", and on a small
    designed grid a resample can miss a whole model size. ``"residuals"`` keeps the design fixed (every (N, D)
    as run) and redraws each point's log-residual from the fit's residuals — the bootstrap of a designed
    experiment (Efron & Tibshirani 1993, §9.5) — with a cell's base and precision residuals drawn together on a
    paired design; it assumes the law's form is right and the log-noise is alike across cells.
    ``min_params``: the rung rule (:func:`rung_rule`; 0 or None: off). Where it excludes rungs, the report's
    ``rung_rule["with_excluded"]`` holds the point fit with them kept (no bootstrap), for comparison.
    ``pinned_width``: the widest interval the verdicts call pinned (:mod:`analysis.verdict`).
    With ``bootstrap``, every efficiency gets two intervals from the same resamples (``eff_intervals``: base law
    refitted; ``eff_intervals_base_fixed``: base law held at its fit), and every combined recipe whose halves were
    run its consistency check (:func:`consistency`).
    """
    t0 = time.perf_counter()
    asked = {"selections": selections, "replicates": replicates, "start_grid": start_grid}  # for the rung comparison
    if replicates not in REPLICATE_MODES:
        raise AnalysisError(f"replicates must be one of {', '.join(REPLICATE_MODES)} (got {replicates!r})")
    lw = law if isinstance(law, Law) else get_law(law)
    missing = [c for c in ("n_params", "tokens", "forward", "backward", "loss") if c not in df.columns]
    if missing:
        raise AnalysisError(f"data frame lacks column(s) {', '.join(missing)}")
    if df.empty:
        raise AnalysisError("no runs to fit (the data frame is empty)")
    if "run_id" not in df.columns:
        df = df.assign(run_id=[f"row{i}" for i in range(len(df))])
    if "precision" not in df.columns:
        df = df.assign(precision=np.nan)
    if start_grid not in ("paper", "wide"):
        raise AnalysisError(f"start_grid must be paper or wide (got {start_grid!r})")
    if resample not in RESAMPLE_MODES:
        raise AnalysisError(f"resample must be one of {', '.join(RESAMPLE_MODES)} (got {resample!r})")
    if exclude:
        try:
            hit = df.query(exclude)
        except Exception as exc:  # noqa: BLE001 - pandas raises many kinds for a bad expression
            raise AnalysisError(f"--exclude {exclude!r} is not a valid query over the columns "
                                f"{', '.join(map(str, df.columns))}: {str(exc).splitlines()[0][:120]}") from None
        attrs = dict(df.attrs)
        df = df.drop(index=hit.index)
        df.attrs = {**attrs, "dropped": list(attrs.get("dropped", ())) + [
            {"run_id": str(r), "reason": f"excluded by the rule {exclude!r}"} for r in hit["run_id"]]}
    before_rule = df
    df, rule = rung_rule(df, min_params, base_label)
    n_runs = len(df)
    if replicates == "mean":
        df = average_replicates(df.assign(precision=df["precision"].fillna("")))
    prov_in = dict(df.attrs.get("provenance", {}))
    if selections == "auto":
        selections = PAPER_SELECTIONS if prov_in.get("kind") == "paper" else None
    elif selections == "paper":
        selections = PAPER_SELECTIONS
    base_df = base_rows(df, base_label)
    if base_df.empty:
        have = sorted({f if f == b else f"{f}:{b}" for f, b in zip(df["forward"], df["backward"])})
        raise AnalysisError(f"no baseline rows (forward == backward == {base_label!r}); precisions present: "
                            f"{', '.join(have)}")
    base = fit_base(base_df["n_params"], base_df["tokens"], base_df["loss"], lw, delta=delta,
                    starts=lw.start_grid(wide=start_grid == "wide"), run_ids=base_df["run_id"].astype(str))
    if base.status == "converged" and not bootstrap:
        # without resamples the linearized covariance is the only check that the data pin the law down (with them,
        # the intervals ask the same without linearizing: _interval_checks)
        why = identification(base, base_df["n_params"], base_df["tokens"], base_df["loss"], lw)
        if why:
            base = dataclasses.replace(base, status="not_identified", message=why)
    log.info("base fit (%s): %s; %d/%d starts reached the best basin", lw.name, base.status,
             base.multistart.n_converged, base.multistart.n_starts)
    groups = list(scheme_groups(df, base_label, selections))
    effs: list[EffFit] = []
    for label, fw, bw, kind, rows in groups:
        try:
            effs.append(fit_efficiency(base, rows["n_params"], rows["tokens"], rows["loss"], kind, scheme=label,
                                       forward=fw, backward=bw, delta=delta, run_ids=rows["run_id"].astype(str)))
        except AnalysisError as exc:
            effs.append(EffFit(label, fw, bw, kind, float("nan"), float("nan"), float("nan"), len(rows),
                               "too_few_points", str(exc), tuple(rows["run_id"].astype(str))))

    # ---- bootstrap: resample cells (paired design) or each precision's runs apart, refit everything.
    rng = np.random.default_rng(seed)
    boot_base, boot_eff = [], {e.scheme: [] for e in effs}
    boot_fixed = {e.scheme: [] for e in effs}  # the same resamples, the base law held at its fit
    pairs = half_pairs(groups)
    boot_disc: dict = {name: [] for name, _, _ in pairs}
    full_base = base
    samples: list = []
    used = 0
    it = range(bootstrap)
    if progress and bootstrap and sys.stderr.isatty():  # no frames when stderr is not a terminal (a log)
        from rich.console import Console
        from rich.progress import track

        it = track(it, description="bootstrap", transient=True, console=Console(stderr=True))
    warm = np.array(base.basins)
    cells = _paired_cells(base_df, groups)
    by_cell = [{c: i for i, c in enumerate(zip(rows["n_params"], rows["tokens"]))} for *_, rows in groups]
    by_residual = resample == "residuals"
    if by_residual:
        (base_pred, base_res), eff_resid = _residuals(base, effs, base_df, groups)
    cell_at = {c: k for k, c in enumerate(cells)} if cells is not None else {}
    for _ in it:
        idx = rng.integers(0, len(base_df), len(base_df))
        if by_residual:
            sample = base_df.assign(loss=np.exp(base_pred + base_res[idx]))
        else:
            sample = base_df.iloc[idx]
        if sample[["n_params", "tokens"]].drop_duplicates().shape[0] < lw.n_free:
            continue
        try:
            b = fit_base(sample["n_params"], sample["tokens"], sample["loss"], lw, delta=delta,
                         starts=warm, n_polish=2)
        except AnalysisError:
            continue
        used += 1
        boot_base.append([b.params[p] for p in PARAM_NAMES])
        samples.append((dict(b.params), {}))
        drawn = {}
        for e, (label, fw, bw, kind, rows), pos in zip(effs, groups, by_cell):
            if not np.isfinite(e.eff_n) or len(rows) == 0:
                continue
            if by_residual:  # the design as run; residuals drawn with the base's where paired
                pred, res = eff_resid[label]
                if cells is not None:
                    src = [pos.get(cells[i]) for i in idx]  # the group's residual at the base's drawn cell
                    draw = [src[cell_at[c]] for c in zip(rows["n_params"], rows["tokens"])]
                    draw = np.array([j if j is not None else rng.integers(0, len(rows)) for j in draw])
                else:
                    draw = rng.integers(0, len(rows), len(rows))
                r = rows.assign(loss=np.exp(pred + res[draw]))
            elif cells is not None:  # the same cells as the base sample: gaps stay paired
                pick = [pos[cells[i]] for i in idx if cells[i] in pos]
                if not pick:
                    continue
                r = rows.iloc[pick]
            else:
                r = rows.iloc[rng.integers(0, len(rows), len(rows))]
            try:
                be = fit_efficiency(b, r["n_params"], r["tokens"], r["loss"], kind, delta=delta,
                                    starts=[(e.eff_n, e.eff_d)])
                bf = fit_efficiency(full_base, r["n_params"], r["tokens"], r["loss"], kind, delta=delta,
                                    starts=[(e.eff_n, e.eff_d)])
            except AnalysisError:
                continue
            boot_eff[label].append((be.eff_n, be.eff_d))
            boot_fixed[label].append((bf.eff_n, bf.eff_d))
            samples[-1][1][label] = (be.eff_n, be.eff_d)
            drawn[label] = r
        for name, f, bw_label in pairs:  # the halves' prediction of the combined recipe, all refitted on this resample
            got = samples[-1][1]
            if name in drawn and f in got and bw_label in got:
                boot_disc[name].append(half_discrepancy(b.params, drawn[name], got[f][0], got[bw_label][1]))

    def percentiles(draws: dict) -> dict:
        out = {}
        for label, vals in draws.items():
            if vals:
                v = np.array(vals)
                out[label] = {"eff_n": tuple(np.percentile(v[:, 0], [2.5, 97.5])),
                              "eff_d": tuple(np.percentile(v[:, 1], [2.5, 97.5]))}
        return out

    base_int = {}
    if boot_base:
        arr = np.array(boot_base)
        for i, p in enumerate(PARAM_NAMES):
            base_int[p] = tuple(np.percentile(arr[:, i], [2.5, 97.5]))
    eff_int, eff_fixed = percentiles(boot_eff), percentiles(boot_fixed)
    checks = consistency(full_base, effs, groups, pairs, boot_disc)
    base, effs = _interval_checks(base, effs, base_int, eff_int, float(base_df["loss"].min()))
    if bootstrap and used < bootstrap:
        log.info("bootstrap: %d of %d resamples were usable (others had too few distinct points)", used, bootstrap)

    # ---- leave-one-out forecasts on the base law.
    fc: list[Forecast] = []
    if forecasts:
        n_vals = base_df["n_params"].to_numpy()
        warm = np.array(base.basins)
        fc.append(_forecast("leave_largest_model_out", base_df, n_vals >= n_vals.max() * 0.999, lw, delta, warm))
        ratio = (base_df["tokens"] / base_df["n_params"]).to_numpy()
        fc.append(_forecast("leave_largest_budget_out", base_df, ratio >= ratio.max() * 0.95, lw, delta, warm))
        # every other size held out in turn (the largest is the first forecast): does the law interpolate?
        for n in sorted(set(n_vals))[:-1]:
            fc.append(_forecast(f"leave_size_out_{n:.3g}", base_df, np.isclose(n_vals, n, rtol=1e-3), lw, delta, warm))

    # ---- headlines.
    ref_n = float(at_n) if at_n else float(base_df["n_params"].max())
    if not at_ratio:
        med = float(np.median(base_df["tokens"] / base_df["n_params"]))
        at_ratio = float(f"{med:.1g}")  # a round number inside the data (the paper's grid: 98 -> 100)
    heads = tuple(headline(e.scheme, base.params, e.eff_n, e.eff_d, ref_n, at_ratio,
                           caveat=None if e.status == "converged" else f"{e.status}: {e.message}",
                           note=_includes_one(e, eff_int.get(e.scheme, {})),
                           includes_one=_terms_including_one(e, eff_int.get(e.scheme, {})))
                  for e in effs if np.isfinite(e.eff_n) and np.isfinite(e.eff_d))
    provenance = {
        "input": prov_in or {"kind": "dataframe", "run_ids": sorted(df["run_id"].astype(str))},
        "code": code_version(), "law": lw.name, "law_form": lw.description,
        "options": {"huber_delta": delta, "bootstrap": bootstrap, "seed": seed, "base_label": base_label,
                    "replicates": replicates, "runs": n_runs, "points": len(df), "exclude": exclude,
                    "start_grid": start_grid, "min_params": rule["min_params"], "pinned_width": pinned_width,
                    "bootstrap_resamples": _resample_label(resample, paired=cells is not None),
                    "selections": {f"{k[0]}:{k[1]}": v for k, v in (selections or {}).items()},
                    "starts": int(base.multistart.n_starts), "headline_at": {"n": ref_n, "ratio": at_ratio}},
        "base_range": {"n_min": float(base_df["n_params"].min()), "n_max": float(base_df["n_params"].max()),
                       "ratio_min": float((base_df["tokens"] / base_df["n_params"]).min()),
                       "ratio_max": float((base_df["tokens"] / base_df["n_params"]).max())},
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if rule["applied"]:  # the same fit with the excluded rungs kept (points only): what the rule changes
        kept = fit_all(before_rule, lw, selections=asked["selections"], base_label=base_label, delta=delta,
                       forecasts=False, replicates=asked["replicates"], start_grid=asked["start_grid"], min_params=0)
        rule["with_excluded"] = {
            "base": {"params": dict(kept.base.params), "status": kept.base.status, "n_points": kept.base.n_points},
            "efficiencies": {e.scheme: {"kind": e.kind, "eff_n": e.eff_n, "eff_d": e.eff_d, "status": e.status}
                             for e in kept.efficiencies}}
    return FitReport(base=base, efficiencies=tuple(effs), base_intervals=base_int, eff_intervals=eff_int,
                     bootstrap={"requested": bootstrap, "used": used, "seed": seed, "resample": resample}, forecasts=tuple(fc),
                     headlines=heads, dropped=tuple(df.attrs.get("dropped", ())), provenance=provenance,
                     seconds=time.perf_counter() - t0, samples=tuple(samples), eff_intervals_base_fixed=eff_fixed,
                     consistency=tuple(checks), rung_rule=rule, pinned_width=pinned_width)


def seed_noise_log(df: pd.DataFrame, base_label: str = BASE_LABEL) -> float:
    """The base's run-to-run noise in log loss, pooled over its replicated cells: sqrt(mean(sd²/mean²)) over
    cells with 2+ runs (NaN without replicates) — the scale below which a law's residuals are not evidence."""
    b = base_rows(df, base_label)
    g = b.groupby(["n_params", "tokens"])["loss"]
    stats = pd.DataFrame({"n": g.size(), "sd": g.std(ddof=1), "mean": g.mean()})
    stats = stats[stats["n"] >= 2]
    if stats.empty:
        return float("nan")
    return float(np.sqrt(np.mean((stats["sd"] / stats["mean"]) ** 2)))


def e_profile(df: pd.DataFrame, law: str = "busbridge", *, points: int = 16, base_label: str = BASE_LABEL,
              delta: float = HUBER_DELTA, replicates: str = "mean", bootstrap: int = 0, seed: int = 0,
              resample: str = "cells") -> pd.DataFrame:
    """The profile of the fit over the irreducible loss: E fixed on a grid from 0 to 0.95 × the lowest base loss,
    every other base parameter and each precision's efficiencies refitted at each E.

    When the data do not identify E (its interval reaches 0), this is the honest question: does the answer
    depend on E? One row per E: the base fit's cost, RMS log residual, status and exponents, ``admissible``
    (its RMS residual is within the base's pooled seed noise, :func:`seed_noise_log`, i.e. the data cannot
    reject that E; NaN without replicates) and ``<scheme>_effN`` / ``<scheme>_effD``. The efficiencies'
    range over the admissible rows is what the data say whatever E is (point estimates).

    ``bootstrap > 0`` adds, at every admissible E (every E when admissibility is unknown), the 95% bootstrap
    interval of each efficiency with E held at that value (:func:`fit_all`'s bootstrap, ``resample`` as there):
    ``<scheme>_effN_lo`` / ``_effN_hi`` / ``_effD_lo`` / ``_effD_hi``. E is a nuisance parameter the data do
    not pin down; an efficiency whose interval excludes 1 at *every* admissible E is a cost whatever E is
    (:func:`profile_ranges` gives the envelope).
    """
    lw = get_law(law)
    raw = df
    noise = seed_noise_log(df, base_label)
    if "run_id" not in df.columns:
        df = df.assign(run_id=[f"row{i}" for i in range(len(df))])
    if "precision" not in df.columns:
        df = df.assign(precision=np.nan)
    if replicates == "mean":
        df = average_replicates(df.assign(precision=df["precision"].fillna("")))
    base_df = base_rows(df, base_label)
    if base_df.empty:
        raise AnalysisError(f"no baseline rows (forward == backward == {base_label!r}) to profile")
    groups = list(scheme_groups(df, base_label, None))
    lmin = float(base_df["loss"].min())
    grid = np.concatenate([[1e-6 * lmin], np.linspace(0.0, 0.95 * lmin, points)[1:]])
    rows = []
    for e_val in grid:
        fixed = Law(f"{lw.name}@E", {**lw.fixed, "e": float(np.log(e_val))}, lw.description)
        b = fit_base(base_df["n_params"], base_df["tokens"], base_df["loss"], fixed, delta=delta)
        pred = predict(b.params, base_df["n_params"].to_numpy(), base_df["tokens"].to_numpy())
        rms = float(np.sqrt(np.mean(np.log(base_df["loss"].to_numpy() / pred) ** 2)))
        row = {"E": float(e_val), "cost": b.cost, "rms_log_residual": rms, "status": b.status,
               "alpha": b.params["alpha"], "beta": b.params["beta"], "gamma": b.params["gamma"],
               "admissible": bool(rms <= noise) if np.isfinite(noise) else np.nan}
        for label, fw, bw, kind, r in groups:
            try:
                e = fit_efficiency(b, r["n_params"], r["tokens"], r["loss"], kind, delta=delta)
                row[f"{label}_effN"], row[f"{label}_effD"] = e.eff_n, e.eff_d
            except AnalysisError:
                row[f"{label}_effN"] = row[f"{label}_effD"] = np.nan
        if bootstrap > 0 and row["admissible"] is not False:
            rep = fit_all(raw, fixed, bootstrap=bootstrap, seed=seed, selections=None, base_label=base_label,
                          delta=delta, forecasts=False, replicates=replicates, resample=resample)
            for label, ints in rep.eff_intervals.items():
                for key, name in (("eff_n", "effN"), ("eff_d", "effD")):
                    row[f"{label}_{name}_lo"], row[f"{label}_{name}_hi"] = (float(v) for v in ints[key])
        rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs["seed_noise_log"] = noise
    return out


def profile_ranges(profile: pd.DataFrame) -> dict:
    """Each precision's effN / effD range over the admissible rows of :func:`e_profile`, with the E range they
    span: ``{scheme: {"eff_n": (lo, hi), "eff_d": (lo, hi)}, "E": (lo, hi)}``; empty when admissibility is unknown
    (no seed replicates to measure noise with) or no E is admissible. Precisions without estimates are left out."""
    if not profile["admissible"].notna().any():
        return {}
    ok = profile[profile["admissible"] == True]  # noqa: E712
    if ok.empty:
        return {}
    out: dict = {"E": (float(ok["E"].min()), float(ok["E"].max()))}
    for col in ok.columns:
        if col.endswith("_effN") and ok[col].notna().all():
            label = col[: -len("_effN")]
            out[label] = {"eff_n": (float(ok[col].min()), float(ok[col].max())),
                          "eff_d": (float(ok[f"{label}_effD"].min()), float(ok[f"{label}_effD"].max()))}
            for key, name in (("eff_n", "effN"), ("eff_d", "effD")):
                lo, hi = f"{label}_{name}_lo", f"{label}_{name}_hi"
                if lo in ok.columns and ok[lo].notna().all():
                    # the envelope of the per-E 95% intervals, and the E where an interval reaches past 1
                    out[label][f"{key}_interval"] = (float(ok[lo].min()), float(ok[hi].max()))
                    out[label][f"{key}_includes_1_at_E"] = [float(e) for e, a, b in zip(ok["E"], ok[lo], ok[hi])
                                                            if a <= 1.0 <= b]
    return out
