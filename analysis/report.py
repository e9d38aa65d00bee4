"""One call from a tidy DataFrame to everything a user asks of a fit: :func:`fit_all` → :class:`FitReport`.

The report holds the stage-1 base fit, a stage-2 efficiency fit per precision, bootstrap intervals
(resampling runs, refitting base and efficiencies together so the base's uncertainty propagates),
leave-largest-model-out and leave-largest-budget-out forecast errors, the headline per precision,
the dropped runs with reasons and the provenance (inputs, code version, law, options).
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.errors import AnalysisError
from analysis.fit import BaseFit, EffFit, HUBER_DELTA, fit_base, fit_efficiency, scheme_kind
from analysis.laws import PARAM_NAMES, get_law, predict
from analysis.load import BASE_LABEL
from analysis.speed import headline

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

#: The row selections of the paper's notebook (init commit 6ddd368) that reproduce its published
#: efficiencies; applied with ``selections="paper"`` (the default for the bundled paper grid).
#: Key (forward, backward) -> pandas query over the table's columns.
PAPER_SELECTIONS = {
    ("bf16", "sr_absmax"): "n_params == 30482560 and steps == 91552",
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
    bootstrap: dict  # {"requested", "used", "seed"}
    forecasts: tuple[Forecast, ...]
    headlines: tuple[dict, ...]
    dropped: tuple[dict, ...]
    provenance: dict
    seconds: float = 0.0

    def eff(self, scheme: str) -> EffFit:
        """The efficiency fit of a scheme by its label (or ``forward:backward``)."""
        for e in self.efficiencies:
            if scheme in (e.scheme, f"{e.forward}:{e.backward}"):
                return e
        raise AnalysisError(f"no efficiency fit for {scheme!r}; have: {', '.join(e.scheme for e in self.efficiencies)}")

    def to_dict(self) -> dict:
        def iv(x):
            return None if x is None else [float(x[0]), float(x[1])]

        effs = []
        for e in self.efficiencies:
            d = e.to_dict()
            ints = self.eff_intervals.get(e.scheme, {})
            d["eff_n_interval"] = iv(ints.get("eff_n")) if e.fits_n else None
            d["eff_d_interval"] = iv(ints.get("eff_d")) if e.fits_d else None
            effs.append(d)
        base = self.base.to_dict()
        base["intervals"] = {k: iv(v) for k, v in self.base_intervals.items()}
        return {"schema_version": SCHEMA_VERSION, "base": base, "efficiencies": effs, "bootstrap": dict(self.bootstrap),
                "forecasts": [f.to_dict() for f in self.forecasts], "headlines": list(self.headlines),
                "dropped": list(self.dropped), "provenance": dict(self.provenance), "seconds": self.seconds}

    def to_json(self, path: str | Path | None = None) -> str:
        """Serialise (inf/NaN written as null) and optionally write to ``path``."""
        text = json.dumps(_clean(self.to_dict()), indent=2)
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text + "\n")
        return text


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


def _forecast(name: str, base: pd.DataFrame, held_mask: np.ndarray, law, delta: float) -> Forecast:
    train, test = base[~held_mask], base[held_mask]
    ids = tuple(test["run_id"].astype(str))
    # A forecast needs an over-determined training fit (at least two points more than parameters).
    if test.empty or len(train) < law.n_free + 2 or train["n_params"].nunique() < 2 or train["tokens"].nunique() < 2:
        return Forecast(name, ids, len(train), float("nan"), float("nan"), "too_few_points",
                        f"{len(train)} training rows left after holding out {len(test)}")
    try:
        fit = fit_base(train["n_params"], train["tokens"], train["loss"], law, delta=delta, n_polish=3)
    except AnalysisError as exc:
        return Forecast(name, ids, len(train), float("nan"), float("nan"), "failed", str(exc))
    pred = predict(fit.params, test["n_params"].to_numpy(), test["tokens"].to_numpy())
    rel = np.abs(pred / test["loss"].to_numpy() - 1.0)
    return Forecast(name, ids, len(train), float(rel.mean()), float(rel.max()), fit.status, fit.message)


def fit_all(df: pd.DataFrame, law: str = "busbridge", *, bootstrap: int = 0, seed: int = 0,
            selections: dict | str | None = "auto", base_label: str = BASE_LABEL, delta: float = HUBER_DELTA,
            at_n: float | None = None, at_ratio: float | None = None, forecasts: bool = True,
            progress: bool = False) -> FitReport:
    """Fit the base law and every precision's efficiencies; bootstrap, forecasts, headlines, provenance.

    ``selections``: ``"auto"`` applies :data:`PAPER_SELECTIONS` to the bundled paper grid only,
    ``"paper"`` always, ``None`` never, or a dict (forward, backward) -> query string.
    ``at_n`` / ``at_ratio``: where the headline's break-even speedup is evaluated (default: the largest
    base model at the median D/N of the base runs, rounded to 2 significant digits — 100 for the
    paper's grid — so the headline stays inside the data's budget range).
    """
    t0 = time.perf_counter()
    lw = get_law(law)
    missing = [c for c in ("n_params", "tokens", "forward", "backward", "loss") if c not in df.columns]
    if missing:
        raise AnalysisError(f"data frame lacks column(s) {', '.join(missing)}")
    if df.empty:
        raise AnalysisError("no runs to fit (the data frame is empty)")
    if "run_id" not in df.columns:
        df = df.assign(run_id=[f"row{i}" for i in range(len(df))])
    if "precision" not in df.columns:
        df = df.assign(precision=np.nan)
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
                    run_ids=base_df["run_id"].astype(str))
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

    # ---- bootstrap over runs: resample base rows and each scheme's rows, refit everything.
    rng = np.random.default_rng(seed)
    boot_base, boot_eff = [], {e.scheme: [] for e in effs}
    used = 0
    it = range(bootstrap)
    if progress and bootstrap:
        from tqdm import tqdm

        it = tqdm(it, desc="bootstrap", unit="fit")
    warm = np.array(base.basins)
    for _ in it:
        idx = rng.integers(0, len(base_df), len(base_df))
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
        for e, (label, fw, bw, kind, rows) in zip(effs, groups):
            if not np.isfinite(e.eff_n) or len(rows) == 0:
                continue
            r = rows.iloc[rng.integers(0, len(rows), len(rows))]
            try:
                be = fit_efficiency(b, r["n_params"], r["tokens"], r["loss"], kind, delta=delta,
                                    starts=[(e.eff_n, e.eff_d)])
            except AnalysisError:
                continue
            boot_eff[label].append((be.eff_n, be.eff_d))
    base_int, eff_int = {}, {}
    if boot_base:
        arr = np.array(boot_base)
        for i, p in enumerate(PARAM_NAMES):
            base_int[p] = tuple(np.percentile(arr[:, i], [2.5, 97.5]))
        for label, vals in boot_eff.items():
            if vals:
                v = np.array(vals)
                eff_int[label] = {"eff_n": tuple(np.percentile(v[:, 0], [2.5, 97.5])),
                                  "eff_d": tuple(np.percentile(v[:, 1], [2.5, 97.5]))}
    if bootstrap and used < bootstrap:
        log.info("bootstrap: %d of %d resamples were usable (others had too few distinct points)", used, bootstrap)

    # ---- leave-one-out forecasts on the base law.
    fc: list[Forecast] = []
    if forecasts:
        n_vals = base_df["n_params"].to_numpy()
        fc.append(_forecast("leave_largest_model_out", base_df, n_vals >= n_vals.max() * 0.999, lw, delta))
        ratio = (base_df["tokens"] / base_df["n_params"]).to_numpy()
        fc.append(_forecast("leave_largest_budget_out", base_df, ratio >= ratio.max() * 0.95, lw, delta))

    # ---- headlines.
    ref_n = float(at_n) if at_n else float(base_df["n_params"].max())
    if not at_ratio:
        med = float(np.median(base_df["tokens"] / base_df["n_params"]))
        at_ratio = float(f"{med:.2g}")
    heads = tuple(headline(e.scheme, base.params, e.eff_n, e.eff_d, ref_n, at_ratio,
                           caveat=None if e.status == "converged" else f"{e.status}: {e.message}")
                  for e in effs if np.isfinite(e.eff_n) and np.isfinite(e.eff_d))
    provenance = {
        "input": prov_in or {"kind": "dataframe", "run_ids": sorted(df["run_id"].astype(str))},
        "code": code_version(), "law": lw.name, "law_form": lw.description,
        "options": {"huber_delta": delta, "bootstrap": bootstrap, "seed": seed, "base_label": base_label,
                    "selections": {f"{k[0]}:{k[1]}": v for k, v in (selections or {}).items()},
                    "starts": int(base.multistart.n_starts), "headline_at": {"n": ref_n, "ratio": at_ratio}},
        "base_range": {"n_min": float(base_df["n_params"].min()), "n_max": float(base_df["n_params"].max()),
                       "ratio_min": float((base_df["tokens"] / base_df["n_params"]).min()),
                       "ratio_max": float((base_df["tokens"] / base_df["n_params"]).max())},
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    return FitReport(base=base, efficiencies=tuple(effs), base_intervals=base_int, eff_intervals=eff_int,
                     bootstrap={"requested": bootstrap, "used": used, "seed": seed}, forecasts=tuple(fc),
                     headlines=heads, dropped=tuple(df.attrs.get("dropped", ())), provenance=provenance,
                     seconds=time.perf_counter() - t0)
