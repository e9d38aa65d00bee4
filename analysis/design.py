"""Which runs would pin an efficiency, and what do they cost? Simulate the fit before running it (``quartet design``).

Given the runs that exist (a loss table: the base law, its misfit, the seed noise), candidate cells (model sizes x
token budgets x seeds) for the precisions to measure, and measured step speeds, a design is a set of runs. It is
judged by the fit ``quartet fit`` will run on the existing runs plus the design's: :func:`analysis.report.fit_all`
(``bootstrap=N, resample="cells", min_params=..., pinned_width=...``) on tables whose new losses are drawn from a
planted law, and the verdicts of :mod:`analysis.verdict` on both interval kinds (``full`` and ``base_fixed``).

**Planted law.** The base law is the point fit of the existing runs under the same options (the rung rule
included); each precision's planted (effN, effD) is given (``--plant``, or a fit JSON's point estimates of the
recipe, a half variant taking its recipe's effN (forward-only, effD = 1) or effD (backward-only, effN = 1)).

**Noise model** (:class:`NoiseModel`, nats, per model size; a size without data takes the nearest measured size's).

- ``seed_sd``: the bf16 run-to-run sd, pooled over the size's replicated bf16 cells.
- ``gap_sd``: the sd over seeds of a precision's paired gap to bf16 (same seed: same initialisation and data order),
  the median over the precisions and replicated cells of the size, then bounded by the scatter of the size's gap
  residuals (a paired-gap sd from three seeds at one cell can exceed it; ``gap_misfit_sd`` takes the rest).
- ``misfit_sd``: the base law's lack of fit: the RMS over the size's bf16 cells of the seed-mean residual of the point
  fit, inflated by sqrt(n / (n - p)) for the p parameters spent on n cells (as the residual bootstrap does), less the
  seed noise of the means. One deviation per cell: seeds do not average it away.
- ``gap_misfit_sd``: the same for a precision's residual minus bf16's at the cell (the gap the law misses), RMS over
  the precisions and cells of the size.

A simulated run of precision p at cell c and seed s has loss L(N·effN, D·effD) + r(c, s) + g(c, p) + e(c, p, s):
r(c, s) is the bf16 run's deviation from the law at (c, s) — measured where the bf16 run exists (the pairing: the
run shares its bf16 run's seed deviation and the law's misfit at the cell), else the cell's misfit (one draw per
cell, or the mean of the cell's measured residuals) plus a seed deviation of ``seed_sd``; g ~ N(0, gap_misfit_sd)
once per (cell, precision); e ~ N(0, gap_sd) per run. A design's new bf16 runs (at cells without them, so that the
design stays paired) are drawn as L(N, D) + r(c, s).

**Cost** (:class:`StepSpeeds`): a run's GPU-seconds are its optimizer steps x the measured step time of its recipe
(a half variant costs like its recipe) plus the measured build-and-compile time. Step times are measured at two model
sizes on one GPU (by default the llama_7m and llama_200m rows of benchmarks/results/recipes/recipe_speed.json and
speed_200m.json, H200, fast paths, CUDA graphs); at another size the time is interpolated linearly in the FLOPs of
a step, 6 x N x tokens per step, through the recipe's two measured points. Each run is costed as if alone on the GPU.

**Search** (:func:`search`): greedy. A linearised width (the delta method on the log-loss fit, every cell weighed
alike as the fit weighs them, effN and effD of a joint target together; times sqrt(pi/2) for its near-L1 Huber
loss) ranks moves — add a cell with one seed, or
a seed to a chosen cell — by the reduction of the log width per GPU-hour (a move that widens it is never bought),
across every target until each target's linearised width is below its width x margin; then
the whole design is simulated with ``fit_all``; targets pinned in fewer than ``confidence`` of the draws get a smaller
margin and more cells, up to ``rounds`` times. Every target gets at least ``min_cells`` distinct cells: a bootstrap
over fewer cells has too few distinct resamples to give an interval.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.errors import AnalysisError
from analysis.fit import EFF_BOUNDS, scheme_kind
from analysis.laws import predict
from analysis.load import BASE_LABEL
from analysis.report import HALF_SUFFIXES, MIN_PARAMS, fit_all, rung_rule
from analysis.verdict import INTERVAL_KINDS, PINNED_WIDTH

#: the fewest distinct cells a target gets (a cell bootstrap over fewer has too few distinct resamples)
MIN_CELLS = 4
#: the share of simulated fits in which a target must be pinned for the design to call it pinned
CONFIDENCE = 0.8
#: the fewest optimizer updates of a candidate run (the ladders' convention: below, the loss is set by the updates)
MIN_STEPS = 500
#: a variance-inflation of the near-L1 (Huber, tiny delta) fit over least squares: the median's pi/2
L1_FACTOR = math.pi / 2
#: the key of each efficiency a precision kind fits
FITTED = {"forward": ("eff_n",), "backward": ("eff_d",), "joint": ("eff_n", "eff_d")}


# ------------------------------------------------------------------------------------------------ inputs
@dataclass(frozen=True)
class Cell:
    """One candidate (model size, budget): what a run there trains and what its steps cost."""

    model: str
    n_params: float
    tokens: float
    steps: int
    tokens_per_step: int
    budget: str = ""

    @property
    def key(self) -> tuple[float, float]:
        return (float(self.n_params), float(self.tokens))


@dataclass(frozen=True)
class Target:
    """A precision to measure: its labels (as ``losses.csv`` has them), the recipe whose speed it has, its planted
    efficiencies, and which of them the design must pin (``eff_n`` and/or ``eff_d``)."""

    precision: str
    forward: str
    backward: str
    recipe: str
    eff_n: float = 1.0
    eff_d: float = 1.0
    pin: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return scheme_kind(self.forward, self.backward, BASE_LABEL)

    def planted(self, key: str) -> float:
        return self.eff_n if key == "eff_n" else self.eff_d


def recipe_of(precision: str) -> str:
    """The recipe a precision's runs cost like: ``<recipe>_fwd`` / ``<recipe>_bwd`` -> ``<recipe>``."""
    for suffix in HALF_SUFFIXES.values():
        if precision.endswith(suffix):
            return precision[: -len(suffix)]
    return precision


def make_target(precision: str, forward: str, backward: str, planted: dict, pin: tuple[str, ...] | None = None) -> Target:
    """A :class:`Target` with its planted efficiencies from ``planted`` ({name: (effN, effD)}): the precision's own
    entry, else its recipe's (a forward-only variant keeps the recipe's effN and effD = 1, a backward-only one the
    reverse). ``pin`` defaults to what the precision's kind fits. AnalysisError when nothing is planted for it."""
    kind = scheme_kind(forward, backward, BASE_LABEL)
    recipe = recipe_of(precision)
    if precision in planted:
        en, ed = planted[precision]
    elif recipe in planted:
        en, ed = planted[recipe]
    else:
        raise AnalysisError(f"no planted efficiency for {precision!r}: give --plant {precision}=EFFN,EFFD or a fit "
                            f"JSON with {recipe!r}")
    en, ed = (float(en), 1.0) if kind == "forward" else (1.0, float(ed)) if kind == "backward" else (float(en), float(ed))
    for name, v in (("effN", en), ("effD", ed)):
        if not (EFF_BOUNDS[0] < v < EFF_BOUNDS[1]):
            raise AnalysisError(f"planted {name} of {precision} is {v:g}, outside the fit's bounds {EFF_BOUNDS}")
    return Target(precision, forward, backward, recipe, en, ed, tuple(pin or FITTED[kind]))


def planted_from_fit(path: str | Path) -> dict:
    """``{precision: (effN, effD)}``: the point estimates of a fit JSON (``quartet fit --json``)."""
    from analysis.report import read_fit_json

    d = read_fit_json(path)
    return {e["scheme"]: (float(e["eff_n"]), float(e["eff_d"])) for e in d.get("efficiencies", ())
            if e.get("eff_n") is not None and e.get("eff_d") is not None}


# ------------------------------------------------------------------------------------------------ noise
@dataclass(frozen=True)
class NoiseModel:
    """Per model size (non-embedding N): the sds in nats that :func:`simulate_table` draws with (module docstring)."""

    seed_sd: dict
    gap_sd: dict
    misfit_sd: dict
    gap_misfit_sd: dict
    #: ``{precision: {"gap_sd": {n: sd}, "gap_misfit_sd": {n: sd}}}``: a precision's own gap noise where its runs
    #: measure it (the pooled tables above are the medians / RMS over precisions)
    by_precision: dict = field(default_factory=dict)

    @staticmethod
    def _at(table: dict, n: float) -> float:
        if not table:
            return 0.0
        # the nearest measured size in log N (misfit shrinks with N: a larger size inherits a smaller one's, the
        # conservative side, only when it has none of its own)
        near = min(table, key=lambda m: abs(math.log(m) - math.log(n)))
        return float(table[near])

    def sds(self, n: float, precision: str | None = None) -> dict:
        """``{seed_sd, gap_sd, misfit_sd, gap_misfit_sd}`` at size ``n``; the gap noise of ``precision`` (or of its
        recipe, for a half variant) where measured, else pooled over precisions."""
        out = {k: self._at(getattr(self, k), n) for k in ("seed_sd", "gap_sd", "misfit_sd", "gap_misfit_sd")}
        own = self.by_precision.get(precision) or self.by_precision.get(recipe_of(precision or "")) or {}
        out.update({k: self._at(v, n) for k, v in own.items() if v})
        return out

    def rows(self) -> list[dict]:
        sizes = sorted(set(self.seed_sd) | set(self.gap_sd) | set(self.misfit_sd) | set(self.gap_misfit_sd))
        return [{"n_params": n, **self.sds(n)} for n in sizes]


def _seed_column(df: pd.DataFrame) -> pd.Series:
    """Each run's seed; without a ``seed`` column, its order within its (cell, precision)."""
    if "seed" in df.columns and df["seed"].notna().all():
        return df["seed"].astype(int)
    return df.groupby(["n_params", "tokens", "precision"]).cumcount()


def noise_model(df: pd.DataFrame, report) -> NoiseModel:
    """The noise model of the existing runs ``df`` (one row per run: n_params, tokens, precision, forward, backward,
    loss, seed) under their point fit ``report`` (:func:`fit_all` on them, the same options)."""
    df = df.assign(seed=_seed_column(df))
    base = report.base.params
    is_base = (df["forward"] == BASE_LABEL) & (df["backward"] == BASE_LABEL)
    bf = df[is_base]
    seed_sd, gap_sd, misfit, gap_misfit = {}, {}, {}, {}
    # seed noise: bf16 sd over seeds, pooled per size
    for n, g in bf.groupby("n_params"):
        v = g.groupby("tokens")["loss"].var(ddof=1).dropna()
        if len(v):
            seed_sd[float(n)] = float(np.sqrt(v.mean()))
    # paired gaps: precision minus bf16 at the same (cell, seed)
    bf_at = bf.set_index(["n_params", "tokens", "seed"])["loss"]
    bf_at = bf_at[~bf_at.index.duplicated()]
    rest = df[~is_base]
    gaps = []
    for (n, d, p), g in rest.groupby(["n_params", "tokens", "precision"]):
        keys = list(zip(g["n_params"], g["tokens"], g["seed"]))
        have = [k in bf_at.index for k in keys]
        if sum(have) >= 2:
            gap = g["loss"].to_numpy()[have] - bf_at.loc[[k for k, h in zip(keys, have) if h]].to_numpy()
            gaps.append((float(n), str(p), float(np.std(gap, ddof=1))))
    for n in {n for n, _, _ in gaps}:
        gap_sd[n] = float(np.median([s for m, _, s in gaps if m == n]))
    own: dict = {}
    for n, p, s in gaps:
        own.setdefault(p, {}).setdefault("gap_sd", {}).setdefault(n, []).append(s ** 2)
    # misfit: seed-mean residuals of the point fit, inflated for the parameters spent, less the seed noise of means
    cells = bf.groupby(["n_params", "tokens"])["loss"].agg(["mean", "size"]).reset_index()
    res = cells["mean"].to_numpy() - predict(base, cells["n_params"].to_numpy(), cells["tokens"].to_numpy())
    inflate = len(cells) / max(len(cells) - len(report.base.free), 1)
    cells = cells.assign(res2=res ** 2 * inflate)
    for n, g in cells.groupby("n_params"):
        seed_part = NoiseModel._at(seed_sd, n) ** 2 * float(np.mean(1.0 / g["size"]))
        misfit[float(n)] = float(np.sqrt(max(g["res2"].mean() - seed_part, 0.0)))
    bf_mean = cells.set_index(["n_params", "tokens"])["mean"]
    gres = []
    effs = {e.scheme: e for e in report.efficiencies if np.isfinite(e.eff_n) and np.isfinite(e.eff_d)}
    for p, g in rest.groupby("precision"):
        if p not in effs:
            continue
        e = effs[p]
        m = g.groupby(["n_params", "tokens"])["loss"].agg(["mean", "size"]).reset_index()
        m = m[[k in bf_mean.index for k in zip(m["n_params"], m["tokens"])]]
        if m.empty:
            continue
        nn, dd = m["n_params"].to_numpy(), m["tokens"].to_numpy()
        r = (m["mean"].to_numpy() - predict(base, nn, dd, e.eff_n, e.eff_d)) - (
            bf_mean.loc[list(zip(nn, dd))].to_numpy() - predict(base, nn, dd))
        k = int(e.fits_n) + int(e.fits_d)
        r2 = r ** 2 * len(m) / max(len(m) - k, 1)
        gres += [(float(n), str(p), v, int(s)) for n, v, s in zip(nn, r2, m["size"])]
    def split(vals, seed_sd_n):
        """(seed sd, misfit sd) of one size from [(residual², seeds)]: the seed part bounded by the scatter the
        residuals show (a paired-gap sd from three seeds at one cell can exceed it), the misfit the rest."""
        rms2, invk = float(np.mean([v for v, _ in vals])), float(np.mean([1.0 / s for _, s in vals]))
        seed = min(seed_sd_n, math.sqrt(rms2 / invk))
        return seed, math.sqrt(max(rms2 - seed ** 2 * invk, 0.0))

    for n in {n for n, _, _, _ in gres}:
        gap_sd[n], gap_misfit[n] = split([(v, s) for m, _, v, s in gres if m == n], NoiseModel._at(gap_sd, n))
    by_precision = {p: {"gap_sd": {n: float(np.sqrt(np.mean(v))) for n, v in d.get("gap_sd", {}).items()}}
                    for p, d in own.items()}
    for p in {p for _, p, _, _ in gres}:
        mine = by_precision.setdefault(p, {})
        seeds, table = dict(mine.get("gap_sd", {})), {}
        for n in {n for n, q, _, _ in gres if q == p}:
            seeds[n], table[n] = split([(v, s) for m, q, v, s in gres if m == n and q == p],
                                       NoiseModel._at(mine.get("gap_sd") or gap_sd, n))
        mine.update(gap_sd=seeds, gap_misfit_sd=table)
    return NoiseModel(seed_sd, gap_sd, misfit, gap_misfit, by_precision)


# ------------------------------------------------------------------------------------------------ cost
def _shown(path) -> str:
    """A path as a plan shows it: relative to the working directory where it lies under it (a plan written in one
    checkout reads the same in another)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class StepSpeeds:
    """Measured step times: ``{recipe: [(n_params, tokens_per_step, step_ms, compile_s), ...]}`` and where from."""

    rows: dict
    device: str = ""
    sources: tuple = ()

    @classmethod
    def from_json(cls, paths) -> "StepSpeeds":
        """The rows of ``benchmarks/ladder_speed.py`` JSON files (``rows``: model, config ``<recipe>:<mode>``,
        n_params, tokens_per_step, step_ms_median, build_and_compile_s); rows without a median are skipped."""
        rows: dict = {}
        devices = set()
        for path in paths:
            try:
                d = json.loads(Path(path).read_text())
            except (OSError, ValueError) as exc:
                raise AnalysisError(f"speed file {path}: {exc.__class__.__name__}: {str(exc)[:120]}") from None
            try:
                devices.add(str(d.get("device", "")))
                for r in d.get("rows", ()):
                    if r.get("step_ms_median") is None:
                        continue
                    recipe = str(r["config"]).split(":")[0]
                    key = (float(r["n_params"]), int(r["tokens_per_step"]))
                    rows.setdefault(recipe, {}).setdefault(key, []).append(
                        (float(r["step_ms_median"]), float(r.get("build_and_compile_s") or 0)))
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise AnalysisError(f"speed file {path}: not benchmarks/ladder_speed.py rows ({exc.__class__.__name__}: "
                                    f"{str(exc)[:80]})") from None
        if not rows:
            raise AnalysisError(f"no step times in {', '.join(map(str, paths))}")
        # one point per size (a size timed twice, or in two modes, would make the interpolating line 0/0): the median
        # step time, the smallest compile time
        merged = {k: sorted((n, t, float(np.median([m for m, _ in v])), min(c for _, c in v))
                            for (n, t), v in pts.items()) for k, pts in rows.items()}
        return cls(merged, " / ".join(sorted(devices - {""})), tuple(_shown(p) for p in paths))

    def step_ms(self, recipe: str, n_params: float, tokens_per_step: int) -> float:
        """Step time of ``recipe`` at a size: linear in the FLOPs of a step (6 N T) through its measured points."""
        pts = self.rows.get(recipe)
        if not pts:
            raise AnalysisError(f"no measured step time for {recipe!r}; measured: {', '.join(sorted(self.rows))}")
        flops = 6.0 * n_params * tokens_per_step
        xs = np.array([6.0 * n * t for n, t, _, _ in pts])
        ys = np.array([ms for _, _, ms, _ in pts])
        if len(pts) == 1:
            return float(ys[0] * flops / xs[0])
        # the two measured sizes nearest in FLOPs bracket (or, outside them, extend) the line
        i = np.argsort(np.abs(np.log(xs / flops)))[:2]
        (x0, x1), (y0, y1) = xs[i], ys[i]
        t = y0 + (y1 - y0) * (flops - x0) / (x1 - x0)
        small = int(np.argmin(xs))
        if flops < xs[small]:  # below the smallest measured size the line may run to zero: no less than FLOP-scaled
            t = max(t, ys[small] * flops / xs[small])
        return float(t)

    def compile_s(self, recipe: str) -> float:
        pts = self.rows.get(recipe) or [(0, 0, 0, 0.0)]
        return float(min(p[3] for p in pts))

    def run_hours(self, recipe: str, cell: Cell) -> float:
        """GPU-hours of one run: steps x step time + build and compile, alone on one GPU."""
        return (cell.steps * self.step_ms(recipe, cell.n_params, cell.tokens_per_step) / 1e3
                + self.compile_s(recipe)) / 3600.0


# ------------------------------------------------------------------------------------------------ designs
@dataclass
class Design:
    """The runs a design adds: ``{precision: {cell key: seeds}}`` (seeds 0..k-1 at the cell) and the bf16 runs added
    at cells the existing runs lack, so the design stays paired."""

    cells: dict = field(default_factory=dict)  # cell key -> Cell
    runs: dict = field(default_factory=dict)  # precision -> {cell key: seeds}

    def copy(self) -> "Design":
        return Design(dict(self.cells), {p: dict(v) for p, v in self.runs.items()})

    def add(self, precision: str, cell: Cell, seeds: int) -> None:
        self.cells[cell.key] = cell
        self.runs.setdefault(precision, {})[cell.key] = seeds

    def seeds(self, precision: str, key) -> int:
        return self.runs.get(precision, {}).get(key, 0)


def bf16_needed(design: Design, existing: pd.DataFrame) -> dict:
    """``{cell key: seeds}`` of bf16 runs a paired design must add: at each cell, as many seeds as its most-seeded
    precision, less the bf16 seeds that exist there."""
    have = _bf16_seeds(existing)
    need: dict = {}
    for prec, cells in design.runs.items():
        if prec == BASE_LABEL:
            continue
        for key, k in cells.items():
            need[key] = max(need.get(key, 0), k)
    return {key: k for key, k in need.items() if any(s not in have.get(key, set()) for s in range(k))}


def _bf16_seeds(existing: pd.DataFrame) -> dict:
    bf = existing[(existing["forward"] == BASE_LABEL) & (existing["backward"] == BASE_LABEL)]
    out: dict = {}
    for n, d, s in zip(bf["n_params"], bf["tokens"], _seed_column(bf)):
        out.setdefault((float(n), float(d)), set()).add(int(s))
    return out


def design_runs(design: Design, existing: pd.DataFrame, targets: dict, pair: bool = True) -> list[dict]:
    """Every run a design adds: ``{precision, recipe, cell, seed}``; bf16 runs at cells without one where ``pair``."""
    out = []
    have = _bf16_seeds(existing)
    if pair:
        for key, k in sorted(bf16_needed(design, existing).items()):
            out += [{"precision": BASE_LABEL, "recipe": BASE_LABEL, "cell": design.cells[key], "seed": s}
                    for s in range(k) if s not in have.get(key, set())]
    for prec, cells in design.runs.items():
        for key, k in sorted(cells.items()):
            out += [{"precision": prec, "recipe": targets[prec].recipe, "cell": design.cells[key], "seed": s}
                    for s in range(k)]
    return out


def design_hours(design: Design, existing: pd.DataFrame, targets: dict, speeds: StepSpeeds, pair: bool = True) -> float:
    return float(sum(speeds.run_hours(r["recipe"], r["cell"]) for r in design_runs(design, existing, targets, pair)))


# ------------------------------------------------------------------------------------------------ simulation
def simulate_table(existing: pd.DataFrame, design: Design, targets: dict, base: dict, noise: NoiseModel,
                   rng: np.random.Generator, pair: bool = True) -> pd.DataFrame:
    """The existing runs as measured plus one draw of the design's runs (module docstring: the noise model). A
    precision the design runs is simulated afresh: its measured runs are left out (the design holds its whole set of
    cells; read too, a cell would average a measured run with its simulated twin as two seeds)."""
    ex = existing.assign(seed=_seed_column(existing))
    ex = ex[~ex["precision"].isin([p for p, cells in design.runs.items() if cells and p != BASE_LABEL])]
    is_base = (ex["forward"] == BASE_LABEL) & (ex["backward"] == BASE_LABEL)
    bf = ex[is_base]
    law0 = predict(base, bf["n_params"].to_numpy(float), bf["tokens"].to_numpy(float))
    measured: dict = {}
    for n, d, s, r in zip(bf["n_params"], bf["tokens"], bf["seed"], bf["loss"].to_numpy() - law0):
        measured.setdefault((float(n), float(d)), {})[int(s)] = float(r)
    rows = []
    dev: dict = {}  # (cell, seed) -> the bf16 deviation from the law

    def bf_dev(key, s):
        if (key, s) not in dev:
            got = measured.get(key, {})
            sd = noise.sds(key[0])
            if s in got:
                dev[(key, s)] = got[s]
            else:
                if (key, "misfit") not in dev:
                    dev[(key, "misfit")] = (float(np.mean(list(got.values()))) if got
                                            else rng.normal(0.0, sd["misfit_sd"]))
                dev[(key, s)] = dev[(key, "misfit")] + rng.normal(0.0, sd["seed_sd"])
        return dev[(key, s)]

    for r in design_runs(design, existing, targets, pair):
        c, s, p = r["cell"], r["seed"], r["precision"]
        key = c.key
        sd = noise.sds(c.n_params, p)
        if p == BASE_LABEL:
            loss = float(predict(base, c.n_params, c.tokens)) + bf_dev(key, s)
            fw = bw = BASE_LABEL
        else:
            t = targets[p]
            if (key, p) not in dev:
                dev[(key, p)] = rng.normal(0.0, sd["gap_misfit_sd"])
            loss = (float(predict(base, c.n_params, c.tokens, t.eff_n, t.eff_d)) + bf_dev(key, s) + dev[(key, p)]
                    + rng.normal(0.0, sd["gap_sd"]))
            fw, bw = t.forward, t.backward
        rows.append({"n_params": float(c.n_params), "tokens": float(c.tokens), "forward": fw, "backward": bw,
                     "precision": p, "loss": loss, "seed": s, "model": c.model, "steps": c.steps,
                     "run_id": f"{c.model}-{c.budget or int(c.tokens)}-{p}-s{s}-sim"})
    out = pd.concat([ex, pd.DataFrame(rows)], ignore_index=True) if rows else ex
    return out


@dataclass(frozen=True)
class FitOptions:
    """The options of the fit ``quartet fit`` will run (:func:`analysis.report.fit_all`)."""

    law: str = "busbridge"
    bootstrap: int = 100
    min_params: float | None = MIN_PARAMS
    width: float = PINNED_WIDTH
    resample: str = "cells"

    def fit(self, table: pd.DataFrame, seed: int):
        return fit_all(table, self.law, bootstrap=self.bootstrap, seed=seed, selections=None, forecasts=False,
                       resample=self.resample, min_params=self.min_params, pinned_width=self.width)


def simulate(existing: pd.DataFrame, design: Design, targets: dict, base: dict, noise: NoiseModel, *, reps: int,
             options: FitOptions, seed: int = 0, pair: bool = True) -> pd.DataFrame:
    """Fit ``reps`` simulated tables of the existing runs plus the design; one row per (rep, target precision,
    efficiency it pins): the point estimate, both interval kinds (lo, hi, width, verdict, pinned)."""
    out = []
    for rep in range(reps):
        rng = np.random.default_rng([seed, rep])
        table = simulate_table(existing, design, targets, base, noise, rng, pair)
        report = options.fit(table, seed=seed * 1000 + rep)
        fitted = {e.scheme for e in report.efficiencies}
        for name, t in targets.items():
            if not design.runs.get(name) or name not in fitted:
                continue
            e = report.eff(name)
            ints, verdicts = report.intervals(name), report.verdicts(name)
            for key in t.pin:
                row = {"rep": rep, "precision": name, "efficiency": key, "planted": t.planted(key),
                       "point": getattr(e, key)}
                for kind in INTERVAL_KINDS:
                    iv = ints[kind][key] or (np.nan, np.nan)
                    v = verdicts.get(key, {}).get(kind, "no interval")
                    row.update({f"{kind}_lo": iv[0], f"{kind}_hi": iv[1], f"{kind}_width": iv[1] - iv[0],
                                f"{kind}_verdict": v, f"{kind}_pinned": v == "pinned",
                                f"{kind}_covers": bool(iv[0] <= t.planted(key) <= iv[1])})
                out.append(row)
    return pd.DataFrame(out)


def summarise(sims: pd.DataFrame) -> pd.DataFrame:
    """Per (precision, efficiency): median widths and bounds of both kinds, the share pinned, the share covering the
    planted value."""
    rows = []
    for (p, key), g in sims.groupby(["precision", "efficiency"], sort=False):
        row = {"precision": p, "efficiency": key, "planted": g["planted"].iloc[0], "draws": len(g)}
        for kind in INTERVAL_KINDS:
            row.update({f"{kind}_width": float(g[f"{kind}_width"].median()),
                        f"{kind}_lo": float(g[f"{kind}_lo"].median()), f"{kind}_hi": float(g[f"{kind}_hi"].median()),
                        f"{kind}_pinned": float(g[f"{kind}_pinned"].mean()),
                        f"{kind}_covers": float(g[f"{kind}_covers"].mean())})
        rows.append(row)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------ search
def _sensitivity(base: dict, t: Target, key: str, c: Cell) -> float:
    """d ln L / d ln eff at a cell: how much the log loss moves per e-fold of the efficiency."""
    h = 1e-4
    up = dict(eff_n=t.eff_n * (math.exp(h) if key == "eff_n" else 1), eff_d=t.eff_d * (math.exp(h) if key == "eff_d" else 1))
    lo = dict(eff_n=t.eff_n * (math.exp(-h) if key == "eff_n" else 1), eff_d=t.eff_d * (math.exp(-h) if key == "eff_d" else 1))
    return float((math.log(predict(base, c.n_params, c.tokens, **up)) - math.log(predict(base, c.n_params, c.tokens, **lo)))
                 / (2 * h))


def _cell_terms(base: dict, noise: NoiseModel, t: Target, c: Cell, k: int) -> tuple[tuple[float, ...], float]:
    """One cell's terms of the linearised variance: ``(s, v)``, s the sensitivities of its log loss to the log of
    each efficiency the target pins (``t.pin`` order), v the log-noise variance of its k-seed mean (misfit not
    averaged by seeds)."""
    sd = noise.sds(c.n_params, t.precision)
    var = sd["misfit_sd"] ** 2 + sd["gap_misfit_sd"] ** 2 + (sd["seed_sd"] ** 2 + sd["gap_sd"] ** 2) / k
    loss = float(predict(base, c.n_params, c.tokens, t.eff_n, t.eff_d))
    return tuple(_sensitivity(base, t, key, c) for key in t.pin), var / loss ** 2


def _widths_of(terms, t: Target) -> dict[str, float]:
    """3.92 x eff x sd(ln eff) per pinned efficiency from cells' ``(s, v)`` terms: the sandwich variance
    (SᵀS)⁻¹ SᵀVS (SᵀS)⁻¹ of the equal-weight least squares. ``quartet fit`` weighs every cell alike (replicates
    averaged, one point per cell), so with one efficiency sd² = Σ s²v / (Σ s²)², not the inverse-variance
    1 / Σ(s²/v): a precise cell (20.5M: misfit 0.005) cannot carry noisy ones (3.4M: 0.03-0.05) the way an optimal
    weighting would. A joint target fits effN and effD together, and their errors correlate (strongly negatively
    where N and D grow together): each one's width is read off the 2x2 matrix, not as if the other were known.
    Inflated for the near-L1 fit; infinite where the cells cannot separate the parameters."""
    if not terms:
        return {key: math.inf for key in t.pin}
    S = np.array([sens for sens, _ in terms], dtype=float)
    v = np.array([var for _, var in terms], dtype=float)
    A = S.T @ S
    if np.linalg.matrix_rank(A) < len(t.pin):
        return {key: math.inf for key in t.pin}
    Ai = np.linalg.inv(A)
    cov = Ai @ (S.T * v) @ S @ Ai
    return {key: 3.92 * t.planted(key) * math.sqrt(L1_FACTOR * max(float(cov[i, i]), 0.0))
            for i, key in enumerate(t.pin)}


@dataclass
class SearchResult:
    design: Design
    summary: pd.DataFrame
    hours: float
    rounds: int
    log: list = field(default_factory=list)


def greedy(design: Design, targets: dict, candidates: list, existing: pd.DataFrame, base: dict, noise: NoiseModel,
           speeds: StepSpeeds, goal: dict, *, max_seeds: int, min_cells: int, budget_h: float | None,
           pair: bool = True) -> Design:
    """Add runs to ``design`` by the largest drop of log linearised width per GPU-hour until every target's
    linearised width is at most its ``goal`` ({precision: width}) and it has ``min_cells`` cells, or ``budget_h``
    (None: no limit) or the candidates run out."""
    design = design.copy()
    hours = design_hours(design, existing, targets, speeds, pair)
    have_bf = _bf16_seeds(existing)
    for c in candidates:
        design.cells.setdefault(c.key, c)
    terms_memo: dict = {}

    def terms(p: str, c: Cell, k: int) -> tuple[tuple[float, ...], float]:
        """One cell's terms of the linearised variance (:func:`_cell_terms`), memoised."""
        if (p, c.key, k) not in terms_memo:
            terms_memo[(p, c.key, k)] = _cell_terms(base, noise, targets[p], c, k)
        return terms_memo[(p, c.key, k)]

    def width(p: str, change=None) -> float:
        cells = dict(design.runs.get(p, {}))
        if change:
            cells[change[0]] = change[1]
        return max(_widths_of([terms(p, design.cells[ck], k) for ck, k in cells.items()], targets[p]).values())

    def bf_seeds(ck) -> int:
        """bf16 seeds 0..j-1 present at a cell (existing or added for pairing)."""
        added = max([v.get(ck, 0) for q, v in design.runs.items() if q != BASE_LABEL] + [0])
        got = have_bf.get(ck, set())
        j = 0
        while j in got or j < added:
            j += 1
        return j

    while True:
        unmet = [p for p in goal if width(p) > goal[p] or len(design.runs.get(p, {})) < min_cells]
        if not unmet:
            return design
        best = None
        for p in unmet:
            w0 = width(p)
            few = len(design.runs.get(p, {})) < min_cells
            for c in candidates:
                k = design.seeds(p, c.key)
                if k >= max_seeds or (few and k):
                    continue
                cost = speeds.run_hours(targets[p].recipe, c)
                if pair and bf_seeds(c.key) < k + 1:
                    cost += speeds.run_hours(BASE_LABEL, c)
                if budget_h is not None and hours + cost > budget_h + 1e-12:
                    continue  # a cheaper move may still fit: the search stops only when none does
                w1 = width(p, (c.key, k + 1))
                gain = (math.log(w0) - math.log(w1)) if math.isfinite(w0) else 1e6 - w1
                if gain <= 0 and not few:
                    continue  # under equal weights a noisy cell can widen the interval: never buy one
                # below min_cells a new cell is needed whatever it gains: pick the cheapest informative one
                score = (gain + (1e3 if few else 0.0)) / max(cost, 1e-9)
                if best is None or score > best[0]:
                    best = (score, p, c, k + 1, cost)
        if best is None:
            return design
        _, p, c, k, cost = best
        design.add(p, c, k)
        hours += cost


def search(existing: pd.DataFrame, targets: dict, candidates: list, base: dict, noise: NoiseModel,
           speeds: StepSpeeds, *, budget_h: float, options: FitOptions, kind: str = "base_fixed", reps: int = 8,
           seed: int = 0, max_seeds: int = 3, min_cells: int = MIN_CELLS, confidence: float = CONFIDENCE,
           rounds: int = 3, margin: float = 0.8, pair: bool = True, progress=None) -> SearchResult:
    """Greedy search (module docstring), each round's design simulated with ``fit_all``: the cheapest design found
    whose targets are pinned (``kind`` interval) in at least ``confidence`` of ``reps`` simulated fits, or the best
    the budget allows."""
    margins = {p: margin for p in targets}
    # when the budget cannot pin every target, pin the most: each target's own greedy design (no budget) prices it,
    # and targets join cheapest first while their summed prices fit (the rest: what_it_takes)
    price = {p: design_hours(greedy(Design(), targets, candidates, existing, base, noise, speeds,
                                    {p: options.width * margin}, max_seeds=max_seeds, min_cells=min_cells,
                                    budget_h=None, pair=pair), existing, targets, speeds, pair) for p in targets}
    chosen, total = [], 0.0
    for p in sorted(targets, key=price.get):
        if total + price[p] <= budget_h:
            chosen.append(p)
            total += price[p]
    if not chosen and targets:  # no target pins within the budget: spend it on the cheapest, the best it allows
        chosen = [min(targets, key=price.get)]
    log = [f"linearised price per target alone (GPU-h): " + ", ".join(f"{p} {price[p]:.2f}" for p in
                                                                     sorted(targets, key=price.get))]
    if progress:
        progress(log[-1])
    design = Design()
    sims = pd.DataFrame(columns=["precision", f"{kind}_pinned"])
    for r in range(1, rounds + 1):
        goal = {p: options.width * margins[p] for p in chosen}
        before = {p: dict(v) for p, v in design.runs.items()}
        design = greedy(design, targets, candidates, existing, base, noise, speeds, goal, max_seeds=max_seeds,
                        min_cells=min_cells, budget_h=budget_h, pair=pair)
        if r > 1 and design.runs == before:
            log.append(f"round {r}: the budget allows no more runs")
            break
        if not design.runs:
            break
        sims = summarise(simulate(existing, design, targets, base, noise, reps=reps, options=options, seed=seed,
                                  pair=pair))
        hours = design_hours(design, existing, targets, speeds, pair)
        short = sorted(row.precision for row in sims.itertuples() if getattr(row, f"{kind}_pinned") < confidence)
        log.append(f"round {r}: {sum(len(v) for v in design.runs.values())} (precision, cell) pairs, {hours:.2f} GPU-h, "
                   f"short of pinned: {', '.join(short) or 'none'}")
        if progress:
            progress(log[-1])
        if not short:
            break
        for p in short:
            margins[p] *= 0.7
    return SearchResult(design, sims, design_hours(design, existing, targets, speeds, pair), r, log)


# ------------------------------------------------------------------------------------------------ planting
def plant(existing: pd.DataFrame, options: FitOptions):
    """The point fit of the existing runs under the design's options (rung rule applied first, so the fit makes no
    second fit with the excluded rungs): ``(rows kept, report)``."""
    kept, _info = rung_rule(existing, options.min_params)
    report = fit_all(kept, options.law, bootstrap=0, selections=None, forecasts=False, min_params=options.min_params,
                     pinned_width=options.width)
    return kept, report


def eligible(cells: list, min_params: float | None, min_steps: int) -> tuple[list, list[str]]:
    """Candidates the fit keeps and that train long enough: ``(kept, one line per left-out cell with the reason)``."""
    kept, notes = [], []
    for c in cells:
        if min_params and c.n_params < min_params:
            notes.append(f"{c.model} {c.budget}: left out, the rung rule drops N = {c.n_params:.3g} < {min_params:.3g}")
        elif c.steps < min_steps:
            notes.append(f"{c.model} {c.budget}: left out, {c.steps} updates < {min_steps}")
        else:
            kept.append(c)
    return kept, notes


__all__ = ["CONFIDENCE", "Cell", "Design", "check_committed", "committed_design", "FitOptions", "MIN_CELLS", "MIN_STEPS", "NoiseModel", "SearchResult",
           "StepSpeeds", "Target", "bf16_needed", "design_hours", "design_runs", "eligible", "greedy",
           "make_target", "noise_model", "plant", "planted_from_fit", "recipe_of", "search", "simulate",
           "simulate_table", "summarise"]


# ------------------------------------------------------------------------------------------------ beyond the budget
def what_it_takes(result: SearchResult, existing: pd.DataFrame, targets: dict, candidates: list, base: dict,
                  noise: NoiseModel, speeds: StepSpeeds, *, options: FitOptions, kind: str = "base_fixed",
                  reps: int = 4, seed: int = 0, max_seeds: int = 3, min_cells: int = MIN_CELLS,
                  confidence: float = CONFIDENCE, pair: bool = True) -> tuple[pd.DataFrame, float, Design]:
    """For the targets the budget left unpinned: the greedy without a budget (every candidate allowed), simulated.
    Returns ``(summary of those targets, GPU-hours of the whole extended design, the extended design)``."""
    short = [p for p in targets if p not in set(result.summary["precision"])
             or (result.summary.loc[result.summary["precision"] == p, f"{kind}_pinned"] < confidence).any()]
    if not short:
        return pd.DataFrame(), result.hours, result.design
    goal = {p: options.width * 0.5 for p in short}  # half the width: the linearised width runs below the simulated one
    more = greedy(result.design, targets, candidates, existing, base, noise, speeds, goal, max_seeds=max_seeds,
                  min_cells=min_cells, budget_h=None, pair=pair)
    only = Design(dict(more.cells), {p: dict(more.runs[p]) for p in short if p in more.runs})
    sims = summarise(simulate(existing, only, {p: targets[p] for p in short}, base, noise, reps=reps,
                              options=options, seed=seed + 7919, pair=pair))
    return sims, design_hours(more, existing, targets, speeds, pair), more


# ------------------------------------------------------------------------------------------------ output
def _cells_text(design: Design, precision: str) -> str:
    cells = sorted(design.runs.get(precision, {}).items(), key=lambda kv: kv[0])
    return ", ".join(f"{design.cells[k].model} {design.cells[k].budget}" + (f" x{s}" if s > 1 else "") for k, s in cells)


def plan_rows(design: Design, existing: pd.DataFrame, targets: dict, speeds: StepSpeeds,
              pair: bool = True) -> pd.DataFrame:
    """One row per run the design adds (model, budget, precision, seed, N, tokens, steps, GPU-hours), bf16 first."""
    rows = []
    for r in design_runs(design, existing, targets, pair):
        c = r["cell"]
        rows.append({"model": c.model, "budget": c.budget, "precision": r["precision"], "seed": r["seed"],
                     "n_params": c.n_params, "tokens": c.tokens, "steps": c.steps,
                     "step_ms": speeds.step_ms(r["recipe"], c.n_params, c.tokens_per_step),
                     "gpu_hours": speeds.run_hours(r["recipe"], c)})
    return pd.DataFrame(rows)


def _iv(lo, hi) -> str:
    return "—" if not (np.isfinite(lo) and np.isfinite(hi)) else f"[{lo:.3f}, {hi:.3f}]"


def summary_table(design: Design, summary: pd.DataFrame, runs: pd.DataFrame, kind: str) -> list[str]:
    """Markdown lines: per target, its cells, planted value, both kinds' median intervals / widths, shares pinned."""
    lines = ["| precision | pins | cells (model budget x seeds) | planted | full: median 95% interval (width) | "
             "base fixed: median 95% interval (width) | pinned full / base fixed | GPU-h |",
             "|---|---|---|---|---|---|---|---|"]
    hours = runs.groupby("precision")["gpu_hours"].sum() if len(runs) else pd.Series(dtype=float)
    for r in summary.itertuples():
        name = {"eff_n": "effN", "eff_d": "effD"}[r.efficiency]
        lines.append(f"| `{r.precision}` | {name} | {_cells_text(design, r.precision)} | {r.planted:.3f} | "
                     f"{_iv(r.full_lo, r.full_hi)} ({r.full_width:.3f}) | "
                     f"{_iv(r.base_fixed_lo, r.base_fixed_hi)} ({r.base_fixed_width:.3f}) | "
                     f"{r.full_pinned:.0%} / {r.base_fixed_pinned:.0%} | {hours.get(r.precision, 0.0):.3f} |")
    return lines


def sweep_yaml(runs: pd.DataFrame, name: str, description: str, header: list[str]) -> str:
    """A sweep file (``sweeps/<name>.yaml``) of the design's runs, the conventions of ``sweeps/recipes.yaml``: every
    run an ``include`` entry; seed s > 0 with ``run.data_seed`` 1337 + s, as the ladders' seed replicates."""
    if runs.empty:
        raise AnalysisError(f"--sweep {name}: the design adds no run (every target already has what it asks, or no "
                            f"candidate fits the budget): no sweep written")
    out = [f"# {line}".rstrip() for line in header]
    out += [f"name: {name}", f"description: {description}", "cluster: local_gpu", "fixed:", "  data: pycode",
            "  logging: ladder", "  run.device: cuda", "  run.compile: true", "  run.compile_mode: reduce-overhead",
            "  run.seed: 0"]
    # a sweep without axes expands to one default run: the first run is the grid, and not listed again below
    first = runs[runs["seed"] == 0].iloc[0]
    at = out.index("cluster: local_gpu") + 1
    # a conf/budget/ name (dn*), else a key of the budget group (tokens_per_param=30 -> budget.tokens_per_param)
    key, _, value = first.budget.partition("=")
    axis = f"  budget: [{first.budget}]" if not value else f"  budget.{key}: [{value}]"
    out[at:at] = ["axes:", f"  model: [{first.model}]", axis, f"  precision: [{first.precision}]"]
    out.append("include:")
    for r in runs.itertuples():
        if (r.model, r.budget, r.precision, r.seed) == (first.model, first.budget, first.precision, 0):
            continue
        budget = f"budget: {r.budget}" if r.budget.startswith("dn") else f"budget.{r.budget.replace('=', ': ')}"
        seed = f", run.seed: {r.seed}, run.data_seed: {1337 + r.seed}" if r.seed else ""
        out.append(f"  - {{model: {r.model}, {budget}, precision: {r.precision}{seed}}}")
    return "\n".join(out) + "\n"


def plan_markdown(*, args, result: SearchResult, runs: pd.DataFrame, noise: NoiseModel, report, speeds: StepSpeeds,
                  notes: list[str], beyond: pd.DataFrame, beyond_h: float, more: Design, existing: pd.DataFrame,
                  targets: dict, pair: bool = True) -> str:
    """The plan as Markdown: what went in (runs, law, noise, speeds), the chosen runs per precision with predicted
    intervals of both kinds and GPU-hours, and for what the budget leaves unpinned, what the design says it takes."""
    b = report.base
    kind = args.kind
    lines = [f"# Design: {args.precisions}", "", "```", args.command, "```", "",
             f"Existing runs: {len(existing)} (after the rung rule, min_params {report.rung_rule.get('min_params', 0):.3g})."
             f" Planted base law ({b.law}, point fit of the existing bf16 runs, {b.status}): "
             + ", ".join(f"{k} {v:.4g}" for k, v in b.params.items()) + ".",
             "", "Noise model (nats; module docstring of `analysis/design.py`), per size:", "",
             "| N | bf16 seed sd | paired-gap sd | law misfit sd | gap misfit sd |", "|---|---|---|---|---|"]
    lines += [f"| {r['n_params']:.3g} | {r['seed_sd']:.4f} | {r['gap_sd']:.4f} | {r['misfit_sd']:.4f} | "
              f"{r['gap_misfit_sd']:.4f} |" for r in noise.rows()]
    lines += ["", f"Step times: {', '.join(speeds.sources)} ({speeds.device}); other sizes linear in 6·N·tokens per step "
              "between a recipe's two measured sizes, plus its measured build-and-compile time; a half variant costs "
              "like its recipe; each run alone on one GPU.", ""]
    if notes:
        lines += ["Candidates left out: " + "; ".join(notes) + ".", ""]
    lines += [f"Search: greedy on the linearised width per GPU-hour, each round simulated with `fit_all` ({args.reps} "
              f"draws x {args.bootstrap} bootstrap resamples); pinned = the `{kind}` 95% interval off the bounds and "
              f"narrower than {args.width:g} in at least {args.confidence:.0%} of the draws.", ""]
    lines += [f"- {line}" for line in result.log]
    n_bf = int((runs["precision"] == BASE_LABEL).sum()) if len(runs) else 0
    lines += ["", f"## Chosen runs: {len(runs)} ({n_bf} of them bf16, pairing new cells), "
                  f"{result.hours:.2f} GPU-hours of the {args.gpu_hours:g} allowed", ""]
    lines += summary_table(result.design, result.summary, runs, kind)
    if len(runs):
        by = runs.groupby(["model", "budget"], sort=False).agg(runs=("precision", "size"),
                                                                gpu_hours=("gpu_hours", "sum")).reset_index()
        lines += ["", "GPU-hours per cell: " + ", ".join(f"{r.model} {r.budget} {r.runs} runs {r.gpu_hours:.3f}"
                                                         for r in by.itertuples()) + "."]
    pinned = result.summary[result.summary[f"{kind}_pinned"] >= args.confidence]["precision"].tolist()
    short = [p for p in result.summary["precision"].unique() if p not in pinned]
    lines += ["", f"Pinned ({kind}) within the budget: {', '.join(pinned) or 'none'}."]
    if short:
        lines += [f"Not pinned within the budget: {', '.join(short)}."]
    if len(beyond):
        lines += ["", f"## Beyond the budget: what the design predicts it takes ({beyond_h:.2f} GPU-hours in all)", ""]
        lines += summary_table(more, beyond, plan_rows(more, existing, targets, speeds, pair), kind)
        still = beyond[beyond[f"{kind}_pinned"] < args.confidence]["precision"].tolist()
        lines += ["", f"Still not pinned with every candidate cell: {', '.join(still) or 'none'}."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ checking the model
def committed_design(df: pd.DataFrame) -> tuple[pd.DataFrame, Design, dict]:
    """A finished table read as a design: ``(its bf16 runs, the design of its other runs, their targets)`` — each
    precision's cells with the seeds they have, so :func:`simulate` predicts what the table's own fit gave."""
    is_base = (df["forward"] == BASE_LABEL) & (df["backward"] == BASE_LABEL)
    design, labels = Design(), {}
    for p, g in df[~is_base].groupby("precision"):
        labels[p] = (str(g["forward"].iloc[0]), str(g["backward"].iloc[0]))
        for (n, d), gg in g.groupby(["n_params", "tokens"]):
            model = str(gg["model"].iloc[0]) if "model" in gg else f"N{n:.3g}"
            steps = int(gg["steps"].iloc[0]) if "steps" in gg else 0
            design.add(p, Cell(model, float(n), float(d), steps, 0, f"dn{d / n:.0f}"), len(gg))
    return df[is_base], design, labels


def check_committed(df: pd.DataFrame, fit: dict, *, reps: int, bootstrap: int, seed: int = 0,
                    min_params: float | None = 0) -> pd.DataFrame:
    """Predict a committed table's own fit: plant its fit JSON ``fit`` (point estimates), take its noise model, treat
    its non-bf16 runs as a design and simulate it; one row per (precision, efficiency) with the predicted median
    widths of both kinds, the realised widths of ``fit`` (``full``; ``base_fixed`` where the JSON has it) and their
    ratios. ``min_params`` as the committed fit was made (0: no rung rule)."""
    options = FitOptions(bootstrap=bootstrap, min_params=min_params)
    kept, report = plant(df, options)
    noise = noise_model(kept, report)
    planted = {e["scheme"]: (float(e["eff_n"]), float(e["eff_d"])) for e in fit["efficiencies"]}
    bf, design, labels = committed_design(kept)
    targets = {p: make_target(p, fw, bw, planted) for p, (fw, bw) in labels.items() if p in planted}
    sims = simulate(bf, design, targets, report.base.params, noise, reps=reps, options=options, seed=seed)
    out = summarise(sims)
    real = {e["scheme"]: e for e in fit["efficiencies"]}
    for kind, suffix in (("full", "_interval"), ("base_fixed", "_interval_base_fixed")):
        got = [real[p].get(f"{k}{suffix}") for p, k in zip(out["precision"], out["efficiency"])]
        out[f"{kind}_realised"] = [iv[1] - iv[0] if iv else np.nan for iv in got]
        out[f"{kind}_ratio"] = out[f"{kind}_width"] / out[f"{kind}_realised"]
    return out
