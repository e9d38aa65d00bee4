"""Fitting the law: the paper's procedure, made fast.

Objective (Quartet paper App. A.3 and its notebook, following Busbridge et al.): residuals
r_i = ln L_obs,i − ln L_model,i (1000 where the model is not positive), minimised under a Huber
loss with δ = 1e-4, i.e. ``scipy.optimize.least_squares(loss="huber", f_scale=1e-4)``, whose cost is

    C(θ) = ½ δ² Σ ρ((r_i/δ)²),   ρ(z) = z if z ≤ 1 else 2√z − 1.

With δ this small the fit is close to a least-absolute-deviation fit in log space, whose landscape
has many flat valleys; hence the paper's multi-start grid (best cost wins).

Speed: the paper runs one finite-difference ``least_squares`` per start (~100 s). Here every start
is advanced at once by a batched, damped Gauss-Newton (Levenberg-Marquardt) iteration on the same
Huber cost — iteratively re-weighted (w_i = min(1, δ/|r_i|)) with the analytic Jacobian of
:mod:`analysis.laws` — and the few best distinct end points are then polished with the exact paper
objective in scipy. Every start of the grid is explored — the full product of the paper's per-parameter
values, 486 starts, a superset of the 324 its text mentions — so the search is at least as broad.

Stage 1 (:func:`fit_base`) fits the base law on unquantized rows; stage 2 (:func:`fit_efficiency`)
keeps the base fixed and fits effN and/or effD (in log space, bounded to [1e-5, 4]) for one precision.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from analysis.errors import AnalysisError
from analysis.laws import BUSBRIDGE, PARAM_NAMES, RAW_NAMES, Law, raw_to_params, residuals_and_jac

log = logging.getLogger(__name__)

#: The paper's Huber threshold on log-loss residuals.
HUBER_DELTA = 1e-4
#: Exponents outside this box mean the law degenerated (a flat direction or a sign flip).
EXPONENT_BOX = (1e-3, 5.0)
#: A fitted E below this fraction of the lowest observed loss counts as E at its bound 0 (not identified).
E_FLOOR_FRACTION = 1e-3
#: A fitted A or B above this is no scale of a loss term but a degenerate fit (the paper's: 1.5e5, 5.3e5).
MAGNITUDE_LIMIT = 1e30
#: A term that takes less than this share of the reducible loss at every data point has dropped out of the law.
DEAD_TERM_SHARE = 1e-3
#: Bounds of the efficiencies (fitted as ln eff).
EFF_BOUNDS = (1e-5, 4.0)
#: An efficiency below this says the runs behave like a model (or a budget) over 20x smaller: the base law is
#: evaluated far outside the range it was fitted on, so the number describes no measured cost.
EFF_IMPLAUSIBLE = 0.05


#: Status values of every fit result.
STATUSES = ("converged", "hit_bound", "not_identified", "too_few_points", "failed")


def huber_cost(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    """scipy's ``loss='huber'`` cost ½δ²Σρ((r/δ)²) over the last axis (vectorised over starts)."""
    z = (r / delta) ** 2
    rho = np.where(z <= 1.0, z, 2.0 * np.sqrt(z) - 1.0)
    return 0.5 * delta**2 * rho.sum(axis=-1)


@dataclass(frozen=True)
class MultiStartLog:
    """What the multi-start search saw: how many starts reached the best basin and how tight it is."""

    n_starts: int
    n_converged: int  # starts whose first-pass cost is within ``rel_tol`` of the best first-pass cost
    rel_tol: float
    best_costs: tuple[float, ...]  # the best few distinct polished costs, ascending
    spread: dict  # parameter -> (min, max) over the starts that reached the best basin
    n_polished: int
    seconds: float

    def to_dict(self) -> dict:
        return {"n_starts": self.n_starts, "n_converged": self.n_converged, "rel_tol": self.rel_tol,
                "best_costs": list(self.best_costs), "spread": {k: list(v) for k, v in self.spread.items()},
                "n_polished": self.n_polished, "seconds": self.seconds}


@dataclass(frozen=True)
class BaseFit:
    """Stage-1 result: the base law's parameters (natural scale) and how trustworthy they are."""

    law: str
    params: dict  # A, alpha, B, beta, E, gamma (fixed ones included)
    raw: tuple[float, ...]  # (a, alpha, b, beta, e, gamma)
    free: tuple[str, ...]
    cost: float
    n_points: int
    status: str
    message: str
    multistart: MultiStartLog | None = None
    run_ids: tuple[str, ...] = ()
    #: Distinct end points of the first pass (free raw vectors, best first): warm starts for refits
    #: of resampled data (bootstrap), which land near the same basins.
    basins: tuple[tuple[float, ...], ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "converged"

    def to_dict(self) -> dict:
        return {"law": self.law, "params": dict(self.params), "raw": list(self.raw), "free": list(self.free),
                "cost": self.cost, "n_points": self.n_points, "status": self.status, "message": self.message,
                "multistart": self.multistart.to_dict() if self.multistart else None,
                "run_ids": list(self.run_ids)}


@dataclass(frozen=True)
class EffFit:
    """Stage-2 result for one precision: effN and/or effD with the base frozen.

    ``kind`` is ``forward`` (only effN fitted; effD = 1), ``backward`` (only effD; effN = 1) or
    ``joint`` (both).
    """

    scheme: str
    forward: str
    backward: str
    kind: str
    eff_n: float
    eff_d: float
    cost: float
    n_points: int
    status: str
    message: str
    run_ids: tuple[str, ...] = ()

    @property
    def fits_n(self) -> bool:
        return self.kind in ("forward", "joint")

    @property
    def fits_d(self) -> bool:
        return self.kind in ("backward", "joint")

    def to_dict(self) -> dict:
        return {"scheme": self.scheme, "forward": self.forward, "backward": self.backward, "kind": self.kind,
                "eff_n": self.eff_n, "eff_d": self.eff_d, "cost": self.cost, "n_points": self.n_points,
                "status": self.status, "message": self.message, "run_ids": list(self.run_ids)}


def _as_arrays(n, d, loss):
    n = np.asarray(n, dtype=float).ravel()
    d = np.asarray(d, dtype=float).ravel()
    loss = np.asarray(loss, dtype=float).ravel()
    if not (n.shape == d.shape == loss.shape):
        raise AnalysisError(f"n, d and loss must have the same length (got {n.size}, {d.size}, {loss.size})")
    for name, arr in (("n_params", n), ("tokens", d), ("loss", loss)):
        if not np.all(np.isfinite(arr)):
            raise AnalysisError(f"{name} contains NaN or infinite values; drop those runs first")
        if np.any(arr <= 0):
            raise AnalysisError(f"{name} must be positive (found {arr[arr <= 0][:3].tolist()})")
    return np.log(n), np.log(d), np.log(loss)


def _batched_lm(law: Law, starts: np.ndarray, log_n, log_d, log_obs, delta: float, iters: int = 200,
                tol: float = 1e-10):
    """Damped IRLS Gauss-Newton on the Huber cost for every start at once; returns (θ_free, cost)."""
    theta = np.array(starts, dtype=float)
    k = theta.shape[1]
    lam = np.full(theta.shape[0], 1e-3)
    r, j = residuals_and_jac(law.full(theta), log_n, log_d, log_obs, law.free)
    cost = huber_cost(r, delta)
    eye = np.eye(k)
    active = np.ones(theta.shape[0], dtype=bool)
    for _ in range(iters):
        if not active.any():
            break
        idx = np.nonzero(active)[0]
        ra, ja = r[idx], j[idx]
        w = np.minimum(1.0, delta / np.maximum(np.abs(ra), 1e-300))
        jw = ja * w[..., None]
        h = np.einsum("spi,spj->sij", jw, ja)
        g = np.einsum("spi,sp->si", jw, ra)
        diag = np.einsum("sii->si", h)
        a_mat = h + lam[idx, None, None] * (diag[:, :, None] * eye + 1e-12 * eye)
        try:
            step = -np.linalg.solve(a_mat, g[..., None])[..., 0]
        except np.linalg.LinAlgError:  # a singular start: fall back to a one-by-one pseudo-inverse
            step = -np.stack([np.linalg.lstsq(a_mat[i], g[i], rcond=None)[0] for i in range(len(idx))])
        step = np.where(np.isfinite(step), step, 0.0)
        new = theta[idx] + step
        r_new, j_new = residuals_and_jac(law.full(new), log_n, log_d, log_obs, law.free)
        c_new = huber_cost(r_new, delta)
        better = c_new < cost[idx]
        acc = idx[better]
        theta[acc], r[acc], j[acc] = new[better], r_new[better], j_new[better]
        rel = (cost[acc] - c_new[better]) / np.maximum(cost[acc], 1e-300)
        cost[acc] = c_new[better]
        lam[acc] = np.maximum(lam[acc] * 0.3, 1e-9)
        lam[idx[~better]] *= 10.0
        # A start stops when its damping explodes (no descent direction) or it stops improving.
        done = np.zeros(theta.shape[0], dtype=bool)
        done[idx[~better]] = lam[idx[~better]] > 1e8
        done[acc[rel < tol]] = True
        active &= ~done
    return theta, cost


def _polish(law: Law, x0: np.ndarray, log_n, log_d, log_obs, delta: float):
    """The paper's exact objective in scipy (trf, Huber, f_scale=δ) from one start, analytic Jacobian."""

    def fun(x):
        return residuals_and_jac(law.full(x), log_n, log_d, log_obs, law.free, jac=False)[0]

    def jac(x):
        return residuals_and_jac(law.full(x), log_n, log_d, log_obs, law.free)[1]

    # Far-off starts overflow inside scipy's trust-region step; the start then just loses to better ones,
    # so keep those warnings out of the user's terminal.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return least_squares(fun, x0, jac=jac, loss="huber", f_scale=delta, method="trf",
                             x_scale="jac", max_nfev=400, ftol=1e-10, xtol=1e-10, gtol=1e-10)


def fit_base(n, d, loss, law: Law = BUSBRIDGE, *, delta: float = HUBER_DELTA, starts: np.ndarray | None = None,
             extra_starts: np.ndarray | None = None, n_polish: int = 6, rel_tol: float = 1e-3,
             polish_ratio: float = 1.5, run_ids=()) -> BaseFit:
    """Stage 1: fit the base law to (N, D, loss) points with the paper's multi-start Huber fit.

    ``starts`` defaults to the paper's grid (486 starts for the full law, a superset of the paper's
    324); ``extra_starts`` (raw free-parameter vectors) are added. After the batched first pass, up
    to ``n_polish`` distinct end points whose cost is within ``polish_ratio`` × the best are polished
    with the exact objective in scipy; the best polished cost wins. Raises
    :class:`AnalysisError` on bad input or fewer points than free parameters.
    """
    import time

    t0 = time.perf_counter()
    log_n, log_d, log_obs = _as_arrays(n, d, loss)
    k = law.n_free
    if log_obs.size < k:
        raise AnalysisError(f"too few points for the {law.name} law: {log_obs.size} points, {k} free parameters "
                            f"(need at least {k}, better {math.ceil(1.5 * k)}+)")
    grid = law.start_grid() if starts is None else np.atleast_2d(np.asarray(starts, float))
    if extra_starts is not None:
        grid = np.vstack([grid, np.atleast_2d(np.asarray(extra_starts, float))])
    theta, cost = _batched_lm(law, grid, log_n, log_d, log_obs, delta)
    # Polish the best *distinct* end points (many starts land in the same basin).
    order = np.argsort(cost)
    picked: list[int] = []
    for i in order:
        # Only competitive end points are worth polishing: after the first pass a start whose cost
        # is far above the best sits in a worse basin, and trf would crawl there for thousands of steps.
        if not np.isfinite(cost[i]) or (picked and cost[i] > polish_ratio * cost[order[0]] + 1e-15):
            continue
        if all(np.max(np.abs(theta[i] - theta[p])) > 1e-3 for p in picked):
            picked.append(i)
        if len(picked) >= n_polish:
            break
    basins = []
    for i in order:
        if np.isfinite(cost[i]) and all(np.max(np.abs(theta[i] - q)) > 1e-2 for q in basins):
            basins.append(theta[i])
        if len(basins) >= 16:
            break
    polished = []
    for i in picked:
        try:
            res = _polish(law, theta[i], log_n, log_d, log_obs, delta)
            polished.append((float(res.cost), res.x, res))
        except (ValueError, FloatingPointError) as exc:  # a start in overflow territory
            log.debug("polish from start %d failed: %s", i, exc)
    if not polished:
        raise AnalysisError("every start of the multi-start fit failed; check the data (losses, N, D)")
    polished.sort(key=lambda t: t[0])
    best_cost, best_x, best_res = polished[0]
    raw = law.full(best_x)
    # Starts that agree on the best basin: first-pass cost within rel_tol of the best first-pass cost.
    reach = cost <= np.nanmin(cost) * (1 + rel_tol) + 1e-15
    spread = {}
    if reach.any():
        full = law.full(theta[reach])
        for i in law.free:
            spread[RAW_NAMES[i]] = (float(full[:, i].min()), float(full[:, i].max()))
    ms = MultiStartLog(n_starts=len(grid), n_converged=int(reach.sum()), rel_tol=rel_tol,
                       best_costs=tuple(sorted({round(c, 14) for c, _, _ in polished}))[:5], spread=spread,
                       n_polished=len(polished), seconds=time.perf_counter() - t0)
    first_pass_best = float(cost[order[0]])
    status, message = _base_status(law, raw, best_res, log_obs.size, first_pass_best, float(np.exp(log_obs.min())),
                                   log_n, log_d)
    return BaseFit(law=law.name, params=raw_to_params(raw), raw=tuple(float(x) for x in raw),
                   free=tuple(RAW_NAMES[i] for i in law.free), cost=best_cost, n_points=int(log_obs.size),
                   status=status, message=message, multistart=ms, run_ids=tuple(str(r) for r in run_ids),
                   basins=tuple([tuple(best_x.tolist())] + [tuple(b.tolist()) for b in basins]))


def _term_shares(raw: np.ndarray, log_n: np.ndarray, log_d: np.ndarray) -> tuple[float, float]:
    """The largest share of the reducible loss that the N-term and the D-term take at any data point."""
    a, alpha, b, beta = raw[0], raw[1], raw[2], raw[3]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        u = a - alpha * log_n  # log of A/N^α
        v = b - beta * log_d
        share_n = 1.0 / (1.0 + np.exp(v - u))
    share_n = np.nan_to_num(share_n, nan=0.5)
    return float(share_n.max()), float((1.0 - share_n).max())


def _base_status(law: Law, raw: np.ndarray, res, n_points: int, first_pass_cost: float,
                 min_loss: float = float("inf"), log_n: np.ndarray | None = None,
                 log_d: np.ndarray | None = None) -> tuple[str, str]:
    if not np.all(np.isfinite(raw)) or res.status < 0:
        return "failed", f"optimizer error: {res.message}"
    note, still_improving = "", False
    if res.status == 0:
        # Evaluation limit. In a flat valley of the near-L1 objective trf creeps along without
        # lowering the cost: the cost has converged (not every parameter). If the cost was still
        # falling noticeably, the fit has not converged.
        if abs(res.cost - first_pass_cost) > 1e-3 * first_pass_cost:
            still_improving = True
            note = "; the optimizer was still improving at its evaluation limit"
        else:
            note = "; cost settled but parameters drift along a flat valley (see the multistart spread)"
    if n_points < math.ceil(1.5 * law.n_free):
        # the root cause, whatever else the fit shows: too few points to pin this many parameters
        return "too_few_points", (f"{n_points} points for {law.n_free} parameters "
                                  f"(< {math.ceil(1.5 * law.n_free)}); treat the values as indicative{note}")
    lo, hi = EXPONENT_BOX
    for name in ("alpha", "beta", "gamma"):
        if name in law.fixed:
            continue
        val = raw[RAW_NAMES.index(name)]
        if not lo <= val <= hi:
            return "hit_bound", f"{name} = {val:.4g} is outside the plausible range [{lo}, {hi}]{note}"
    for name, idx in (("A", 0), ("B", 2)):
        if raw[idx] > np.log(MAGNITUDE_LIMIT):
            return "hit_bound", (f"{name} = {np.exp(raw[idx]):.3g} is an implausible magnitude (> {MAGNITUDE_LIMIT:g}): "
                                 f"the law degenerated{note}")
    if log_n is not None and log_d is not None:
        for term, share in zip(("N-term A/N^α", "D-term B/D^β"), _term_shares(raw, log_n, log_d)):
            if share < DEAD_TERM_SHARE:
                return "hit_bound", (f"the {term} is below {DEAD_TERM_SHARE:.0e} of the reducible loss at every point: "
                                     f"the law lost a term{note}")
    if "e" not in law.fixed:
        # E is fitted as ln E, so "E = 0" is ln E running off to -inf: the irreducible loss sits on its
        # lower bound and the data cannot tell it apart from zero (typical of too narrow an N/D range).
        e_val = float(np.exp(raw[RAW_NAMES.index("e")]))
        if e_val < E_FLOOR_FRACTION * min_loss:
            return "hit_bound", (f"E = {e_val:.3g} is at its lower bound 0 (< {E_FLOOR_FRACTION:g} x the lowest loss "
                                 f"{min_loss:.4g}): the data do not identify the irreducible loss{note}")
    if still_improving:
        return "failed", f"not converged: {res.message}{note}"
    return "converged", "ok" + note


def identification(base: BaseFit, n, d, loss, law: Law | None = None) -> str | None:
    """Why the data do not identify a base fit's exponents or E, from the linearized covariance s²·(JᵀJ)⁻¹ at the
    optimum (s² the residual variance, J the Jacobian of the log-residuals in the free raw parameters), or None.

    A point estimate can sit well inside every bound while the data barely constrain it — nine points of 2%
    noise fit by six parameters, say. An exponent whose 1-sd range includes 0 (sd > |value|), or an E uncertain by
    more than a factor e (sd(ln E) > 1), is not a measurement. This is the check without a bootstrap; the
    bootstrap's intervals answer the same question without linearizing (:func:`analysis.report.fit_all`).
    ``law`` is the fitted law (default: looked up by ``base.law``; pass it for a law with extra fixed parameters).
    """
    from analysis.laws import get_law

    law = law or get_law(base.law)
    log_n, log_d, log_obs = _as_arrays(n, d, loss)
    dof = log_obs.size - law.n_free
    if dof <= 0:
        return None  # exactly determined: too_few_points says so
    r, jac = residuals_and_jac(np.asarray(base.raw, float), log_n, log_d, log_obs, law.free)
    s2 = float(np.sum(r**2)) / dof
    try:
        cov = s2 * np.linalg.inv(jac.T @ jac)
    except np.linalg.LinAlgError:
        return "the Jacobian is singular at the optimum: some parameter combination is not constrained at all"
    sd = dict(zip((RAW_NAMES[i] for i in law.free), np.sqrt(np.abs(np.diag(cov)))))
    loose = [f"{k} = {base.raw[RAW_NAMES.index(k)]:.3g} ± {sd[k]:.2g}" for k in ("alpha", "beta", "gamma")
             if k in sd and sd[k] > abs(base.raw[RAW_NAMES.index(k)])]
    if "e" in sd and sd["e"] > 1.0:
        loose.append(f"E = {base.params['E']:.3g} (ln E ± {sd['e']:.2g})")
    if not loose:
        return None
    return (f"not identified by the data: {', '.join(loose)} (1 sd, linearized from the residuals); "
            f"run with --bootstrap N for intervals, or add sizes and budgets")


def scheme_kind(forward: str, backward: str, base_label: str = "bf16") -> str:
    """Which efficiencies a precision gets: forward-only → effN, backward-only → effD, else both."""
    if backward == base_label and forward != base_label:
        return "forward"
    if forward == base_label and backward != base_label:
        return "backward"
    return "joint"


def _split_eff(x, kind: str) -> tuple[float, float]:
    if kind == "forward":
        return x[0], 0.0
    if kind == "backward":
        return 0.0, x[0]
    return x[0], x[1]


def eff_residuals_and_jac(raw: np.ndarray, log_n, log_d, log_obs, x, kind: str, jac: bool = True):
    """Stage-2 residuals and Jacobian w.r.t. x = (ln effN and/or ln effD), base ``raw`` frozen.

    ln N' = ln N + ln effN, so ∂r/∂(ln effN) = −α·∂r/∂a; likewise ∂r/∂(ln effD) = −β·∂r/∂b.
    """
    xn, xd = _split_eff(x, kind)
    r, jr = residuals_and_jac(raw, log_n + xn, log_d + xd, log_obs, free=(0, 2), jac=jac)
    if not jac:
        return r, None
    cols = {"n": -raw[1] * jr[:, 0], "d": -raw[3] * jr[:, 1]}
    use = {"forward": ("n",), "backward": ("d",), "joint": ("n", "d")}[kind]
    return r, np.stack([cols[c] for c in use], axis=-1)


def fit_efficiency(base: BaseFit | dict, n, d, loss, kind: str, *, scheme: str = "", forward: str = "",
                   backward: str = "", delta: float = HUBER_DELTA, run_ids=(), starts=None) -> EffFit:
    """Stage 2: fit effN (``kind='forward'``), effD (``'backward'``) or both (``'joint'``), base frozen.

    Starts as the paper: effN = 0.5 (forward-only), effD = 1.0 (backward-only), the grid {0.5, 1}²
    (joint); best cost wins. Fitted as ln eff within :data:`EFF_BOUNDS`. ``starts`` overrides them
    with (effN, effD) pairs (e.g. the full-data estimate when bootstrapping).
    """
    if kind not in ("forward", "backward", "joint"):
        raise AnalysisError(f"kind must be forward, backward or joint (got {kind!r})")
    log_n, log_d, log_obs = _as_arrays(n, d, loss)
    k = 2 if kind == "joint" else 1
    # repeats of one (N, D) (seeds fitted one by one, a bootstrap's redraws) add no point: count distinct ones
    distinct = len(set(zip(log_n.tolist(), log_d.tolist())))
    if distinct < k:
        raise AnalysisError(f"too few points for a {kind} efficiency fit of {scheme or 'this precision'}: "
                            f"{distinct} distinct (N, D) point(s) for {k} parameters")
    raw = np.asarray(base.raw if isinstance(base, BaseFit) else base, dtype=float)
    lo, hi = np.log(EFF_BOUNDS[0]), np.log(EFF_BOUNDS[1])

    def split(x):
        return _split_eff(x, kind)

    def fun(x):
        return eff_residuals_and_jac(raw, log_n, log_d, log_obs, x, kind, jac=False)[0]

    def jac(x):
        return eff_residuals_and_jac(raw, log_n, log_d, log_obs, x, kind)[1]

    if starts is not None:
        pick = {"forward": [0], "backward": [1], "joint": [0, 1]}[kind]
        starts = [list(np.log(np.asarray(s_, float)[pick])) for s_ in starts]
    elif kind == "forward":
        starts = [[np.log(0.5)]]
    elif kind == "backward":
        starts = [[0.0]]
    else:
        starts = [[np.log(a), np.log(b)] for a in (0.5, 1.0) for b in (0.5, 1.0)]
    best = None
    for x0 in starts:
        x0 = np.clip(np.asarray(x0, float), lo + 1e-9, hi - 1e-9)
        res = least_squares(fun, x0, jac=jac, bounds=(lo, hi), loss="huber", f_scale=delta, method="trf",
                            x_scale=1.0, ftol=1e-12, xtol=1e-12, gtol=1e-12, max_nfev=1000)
        if best is None or res.cost < best.cost:
            best = res
    xn, xd = split(best.x)
    eff_n, eff_d = float(np.exp(xn)), float(np.exp(xd))
    if best.status <= 0 or not np.all(np.isfinite(best.x)):
        status, msg = "failed", f"optimizer did not converge: {best.message}"
    elif np.any(np.isclose(best.x, lo, atol=1e-6)) or np.any(np.isclose(best.x, hi, atol=1e-6)):
        status, msg = "hit_bound", f"an efficiency sits on its bound {EFF_BOUNDS}: the data do not constrain it"
    elif distinct < k + 1:
        status, msg = "too_few_points", f"{distinct} distinct point(s) for {k} parameter(s): exactly determined, no check"
    elif min(eff_n, eff_d) < EFF_IMPLAUSIBLE:
        name, val = ("effN", eff_n) if eff_n <= eff_d else ("effD", eff_d)
        status, msg = "hit_bound", (f"{name} = {val:.3g} is an implausible magnitude (< {EFF_IMPLAUSIBLE:g}): the runs "
                                    f"behave like a {1 / val:.3g}x smaller {'model' if name == 'effN' else 'budget'}, "
                                    f"where the base law was never fitted; the law does not describe this precision")
    else:
        status, msg = "converged", "ok"
    if isinstance(base, BaseFit) and base.status != "converged" and status == "converged":
        # an efficiency is measured against the base law: it is no better than that law
        status, msg = base.status, f"inherited from the base fit ({base.status}: {base.message})"
    return EffFit(scheme=scheme or f"{forward}:{backward}", forward=forward, backward=backward, kind=kind,
                  eff_n=eff_n, eff_d=eff_d, cost=float(best.cost), n_points=int(log_obs.size), status=status,
                  message=msg, run_ids=tuple(str(r) for r in run_ids))


__all__ = ["BaseFit", "EffFit", "MultiStartLog", "fit_base", "fit_efficiency", "huber_cost", "identification",
           "scheme_kind",
           "HUBER_DELTA", "STATUSES", "PARAM_NAMES"]
