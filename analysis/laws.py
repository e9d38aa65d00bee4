"""The low-precision scaling law and its special cases, with analytic derivatives.

Maths (Quartet, arXiv 2505.14669, Eq. 1; the form of Busbridge et al.):

    L(N, D) = ( A / (N·effN)^α  +  B / (D·effD)^β )^γ  +  E

N is the non-embedding parameter count, D the number of training tokens; effN, effD ∈ (0, 1] are the
parameter / data efficiencies of a precision (both 1 for the unquantized baseline). Special cases:
γ = 1 gives the Hoffmann (Chinchilla) form, β = 1 the Kaplan-style form used in the paper's Fig. 6.

The fit works on the paper's parametrisation θ = (a, α, b, β, e, γ) with A = exp(a), B = exp(b),
E = exp(e), so that the scale parameters stay positive without bounds. Writing
u = exp(a − α·ln N'), v = exp(b − β·ln D') (N' = N·effN, D' = D·effD), S = u + v, P = S^γ:

    ∂L/∂a = γ S^(γ−1) u        ∂L/∂α = −ln N' · ∂L/∂a
    ∂L/∂b = γ S^(γ−1) v        ∂L/∂β = −ln D' · ∂L/∂b
    ∂L/∂e = E                  ∂L/∂γ = P · ln S

and the log-space residual r = ln L_obs − ln L has ∂r/∂θ = −(∂L/∂θ)/L. Efficiencies enter only through
ln N' and ln D', so with x = ln effN, y = ln effD: ∂L/∂x = −α ∂L/∂a and ∂L/∂y = −β ∂L/∂b.
Everything is vectorised over a leading "starts" axis so that hundreds of starting points are
evaluated in one numpy call.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Order of the raw parameter vector θ used everywhere in the fitting code.
RAW_NAMES = ("a", "alpha", "b", "beta", "e", "gamma")
#: Names of the reported (natural-scale) parameters, same order.
PARAM_NAMES = ("A", "alpha", "B", "beta", "E", "gamma")


@dataclass(frozen=True)
class Law:
    """A member of the law family: which raw parameters are free and the values of the fixed ones.

    ``fixed`` maps a raw name (``"gamma"``, ``"beta"``) to its fixed value.
    """

    name: str
    fixed: dict = field(default_factory=dict)
    description: str = ""

    @property
    def free(self) -> tuple[int, ...]:
        """Indices (into :data:`RAW_NAMES`) of the parameters the fit adjusts."""
        return tuple(i for i, n in enumerate(RAW_NAMES) if n not in self.fixed)

    @property
    def n_free(self) -> int:
        return len(self.free)

    def full(self, theta_free: np.ndarray) -> np.ndarray:
        """Expand free parameters (..., n_free) to the full raw vector (..., 6)."""
        theta_free = np.asarray(theta_free, dtype=float)
        out = np.empty(theta_free.shape[:-1] + (6,))
        j = 0
        for i, n in enumerate(RAW_NAMES):
            if n in self.fixed:
                out[..., i] = self.fixed[n]
            else:
                out[..., i] = theta_free[..., j]
                j += 1
        return out

    def start_grid(self, wide: bool = False) -> np.ndarray:
        """The paper's multi-start grid restricted to the free parameters (486 starts for Busbridge).

        a ∈ {0,5,10}, α ∈ {0,0.5,1}, b ∈ {0,5,10}, β ∈ {0,0.5,1}, e ∈ {0,0.5}, γ ∈ {0,0.5,1}.
        ``wide`` adds a fourth or third value per axis (a, b ∈ {…, 20}, α, β ∈ {…, 1.5}, e ∈ {…, −1},
        γ ∈ {…, 2}: 3,072 starts for Busbridge) for data far from the paper's scale.
        """
        axes = {
            "a": (0.0, 5.0, 10.0),
            "alpha": (0.0, 0.5, 1.0),
            "b": (0.0, 5.0, 10.0),
            "beta": (0.0, 0.5, 1.0),
            "e": (0.0, 0.5),
            "gamma": (0.0, 0.5, 1.0),
        }
        if wide:
            extra = {"a": 20.0, "alpha": 1.5, "b": 20.0, "beta": 1.5, "e": -1.0, "gamma": 2.0}
            axes = {k: v + (extra[k],) for k, v in axes.items()}
        free_axes = [axes[RAW_NAMES[i]] for i in self.free]
        mesh = np.meshgrid(*free_axes, indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=-1)


BUSBRIDGE = Law("busbridge", {}, "L = (A/N^α + B/D^β)^γ + E (paper's main form)")
HOFFMANN = Law("hoffmann", {"gamma": 1.0}, "γ = 1: L = A/N^α + B/D^β + E (Chinchilla)")
KAPLAN = Law("kaplan", {"beta": 1.0}, "β = 1: L = (A/N^α + B/D)^γ + E")
LAWS = {law.name: law for law in (BUSBRIDGE, HOFFMANN, KAPLAN)}


def get_law(name: str) -> Law:
    """Look a law up by name; unknown names raise a one-line error listing the choices."""
    from analysis.errors import AnalysisError

    try:
        return LAWS[name]
    except KeyError:
        raise AnalysisError(f"unknown law {name!r}; choose one of: {', '.join(LAWS)}") from None


def raw_to_params(raw: np.ndarray) -> dict[str, float]:
    """θ = (a, α, b, β, e, γ) → {"A", "alpha", "B", "beta", "E", "gamma"} (natural scale)."""
    a, alpha, b, beta, e, gamma = (float(x) for x in raw)
    with np.errstate(over="ignore"):  # a degenerate fit's log-scale may be huge: A = inf says so plainly
        return {"A": float(np.exp(a)), "alpha": alpha, "B": float(np.exp(b)), "beta": beta,
                "E": float(np.exp(e)), "gamma": gamma}


def params_to_raw(p: dict[str, float]) -> np.ndarray:
    """Inverse of :func:`raw_to_params` (E = 0, a fit that drove E to its floor, maps to e = -inf quietly)."""
    with np.errstate(divide="ignore"):
        return np.array([np.log(p["A"]), p["alpha"], np.log(p["B"]), p["beta"], np.log(p["E"]), p["gamma"]])


def _parts(raw: np.ndarray, log_n: np.ndarray, log_d: np.ndarray):
    """Shared intermediate terms; raw (..., 6), log_n/log_d broadcastable to (..., P)."""
    a, alpha, b, beta, e, gamma = (raw[..., i, None] for i in range(6))
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        u = np.exp(a - alpha * log_n)
        v = np.exp(b - beta * log_d)
        s = u + v
        log_s = np.log(s)
        p = np.exp(gamma * log_s)
        big_e = np.exp(e)
        loss = p + big_e
    return u, v, s, log_s, p, big_e, loss, gamma


def predict_raw(raw: np.ndarray, log_n: np.ndarray, log_d: np.ndarray) -> np.ndarray:
    """Model loss for raw parameters (..., 6) at log N, log D (effective values already folded in)."""
    return _parts(np.asarray(raw, float), log_n, log_d)[6]


def predict(params: dict[str, float], n, d, eff_n: float = 1.0, eff_d: float = 1.0) -> np.ndarray:
    """L(N·effN, D·effD) for natural-scale parameters; n, d array-like of the same shape."""
    log_n = np.log(np.asarray(n, float) * eff_n)
    log_d = np.log(np.asarray(d, float) * eff_d)
    raw = params_to_raw(params)
    return predict_raw(raw, log_n.ravel(), log_d.ravel()).reshape(np.shape(log_n))


def residuals_and_jac(raw: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_obs: np.ndarray,
                      free: tuple[int, ...] = tuple(range(6)), jac: bool = True):
    """Log residuals r = ln L_obs − ln L (..., P) and their Jacobian w.r.t. the free raw parameters.

    Where the model is not positive and finite the residual is 1000 (as the paper's code) and the
    Jacobian row is zero, so a start that wanders into overflow is simply not preferred.
    """
    u, v, s, log_s, p, big_e, loss, gamma = _parts(raw, log_n, log_d)
    ok = np.isfinite(loss) & (loss > 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = np.where(ok, log_obs - np.log(np.where(ok, loss, 1.0)), 1000.0)
    if not jac:
        return r, None
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        g = gamma * p / s  # γ S^(γ−1), written to stay finite when S is tiny and γ > 1
        cols = {
            0: g * u,
            1: -g * u * log_n,
            2: g * v,
            3: -g * v * log_d,
            4: np.broadcast_to(big_e, loss.shape),
            5: p * log_s,
        }
        j = np.stack([-cols[i] / loss for i in free], axis=-1)
    j = np.where(ok[..., None] & np.isfinite(j), j, 0.0)
    return r, j
