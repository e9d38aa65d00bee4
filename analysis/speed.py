"""Speed model, break-even speedups and optimal-precision maps (Quartet paper §4.2, Fig. 1(b)/(c)).

Maths. A forward:backward precision option runs the forward GEMM sp_fw× and the two backward GEMMs
sp_bw× faster than the reference (FP8:FP8). The forward pass is ~1/3 of training compute and the
backward ~2/3, so the training speedup is the weighted harmonic mean

    sp_tr = ( 1/(3·sp_fw) + 2/(3·sp_bw) )^-1.

For a forward (inference) budget N_max and a training budget N_max·D_max, a faster forward lets the
option afford a model of N_max·sp_fw parameters and the training budget buys N_max·D_max·sp_tr
"parameter-tokens", i.e. D_max·sp_tr/sp_fw tokens. Its effective loss is therefore

    L_eff = L( N_max·sp_fw·effN,  D_max·sp_tr/sp_fw·effD )

with the option's efficiencies (FP8 treated as lossless, effN = effD = 1, as in the paper). The
option with the lowest L_eff is "optimal" at (N_max, D_max/N_max).

Break-even speedup (the headline's Z). Give a scheme a uniform speedup s (sp_fw = sp_bw = s, so
sp_tr = s). Its effective loss is L(s·effN·N, effD·D). Setting it equal to the baseline's L(N, D),
γ and E cancel (both sides are (inner)^γ + E), leaving

    A/(s·effN·N)^α + B/(effD·D)^β = A/N^α + B/D^β
    ⇒  s = (1/effN) · [ A N^-α / ( A N^-α − B D^-β (effD^-β − 1) ) ]^(1/α).

If the bracket's denominator is ≤ 0 the data penalty alone exceeds the whole parameter term: no
speedup compensates at that (N, D) and Z = ∞. Z depends on where it is evaluated; the CLI uses the
largest model of the base fit at D/N = 100 unless told otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.laws import predict

#: The four forward:backward options of the paper, in plotting order.
OPTIONS = ("FP8:FP8", "FP4:FP8", "FP8:FP4", "FP4:FP4")
#: Table 1 of the paper: speedups vs FP8 by bit-operations (BOPS), (sp_fw, sp_bw) per option.
BOPS_SPEEDUPS = {"FP8:FP8": (1.0, 1.0), "FP4:FP8": (2.0, 1.0), "FP8:FP4": (1.0, 2.0), "FP4:FP4": (2.0, 2.0)}
#: Measured MXFP4-vs-FP8 (forward, backward) speedups per transformer-block size on an RTX 5090
#: (Quartet notebooks/benchmark_mxfp4.ipynb at HEAD; key = total linear parameters), spec §1.5.
RTX5090_VS_FP8 = (
    (102_760_448, 1.644, 0.555),
    (203_161_600, 1.808, 0.567),
    (822_083_584, 1.943, 0.706),
    (1_585_971_200, 2.018, 0.785),
    (2_717_908_992, 2.040, 0.857),
    (6_476_005_376, 2.136, 0.997),
    (9_172_942_848, 2.509, 1.070),
    (21_743_271_936, 2.297, 1.268),
    (51_808_043_008, 2.135, 1.381),
)
#: Models plotted on the paper's maps: (label, N, D).
MODEL_POINTS = (
    ("Llama 3 70B", 70e9, 15e12),
    ("Qwen 2.5 72B", 72e9, 18e12),
    ("Gemma 3 27B", 27e9, 14e12),
    ("Gemma 3 12B", 12e9, 12e12),
    ("Gemma 3 4B", 4e9, 4e12),
    ("Gemma 3 1B", 1e9, 2e12),
)


def training_speedup(sp_fw, sp_bw):
    """sp_tr = (1/(3·sp_fw) + 2/(3·sp_bw))^-1 (forward ≈ 1/3, backward ≈ 2/3 of training compute)."""
    sp_fw = np.asarray(sp_fw, float)
    sp_bw = np.asarray(sp_bw, float)
    return 1.0 / (1.0 / (3.0 * sp_fw) + 2.0 / (3.0 * sp_bw))


def rtx5090_speedups(n) -> tuple[np.ndarray, np.ndarray]:
    """Measured FP4-vs-FP8 (forward, backward) speedups at model size(s) n: linear in log N, clamped."""
    xs = np.log([p for p, _, _ in RTX5090_VS_FP8])
    ln = np.log(np.asarray(n, float))
    fw = np.interp(ln, xs, [f for _, f, _ in RTX5090_VS_FP8])
    bw = np.interp(ln, xs, [b for _, _, b in RTX5090_VS_FP8])
    return fw, bw


def option_speedups(option: str, n, speedups: str | dict = "bops") -> tuple[np.ndarray, np.ndarray]:
    """(sp_fw, sp_bw) of an option at size(s) n: ``"bops"``, ``"rtx5090"`` or a dict option -> (fw, bw)."""
    n = np.asarray(n, float)
    if isinstance(speedups, dict):
        fw, bw = speedups.get(option, (1.0, 1.0))
        return np.full_like(n, fw), np.full_like(n, bw)
    if speedups == "bops":
        fw, bw = BOPS_SPEEDUPS[option]
        return np.full_like(n, fw), np.full_like(n, bw)
    if speedups == "rtx5090":
        f4, b4 = rtx5090_speedups(n)
        fwd_fp4, bwd_fp4 = option.split(":")[0] == "FP4", option.split(":")[1] == "FP4"
        return (f4 if fwd_fp4 else np.ones_like(n)), (b4 if bwd_fp4 else np.ones_like(n))
    from analysis.errors import AnalysisError

    raise AnalysisError(f"speedups must be 'bops', 'rtx5090' or a dict option -> (fw, bw) (got {speedups!r})")


def effective_loss(params: dict, n_max, ratio, eff_n: float, eff_d: float, sp_fw, sp_bw):
    """L(N_max·sp_fw·effN, D_max·sp_tr/sp_fw·effD) with D_max = ratio·N_max (broadcasting)."""
    n_max = np.asarray(n_max, float)
    d_max = n_max * np.asarray(ratio, float)
    sp_tr = training_speedup(sp_fw, sp_bw)
    return predict(params, n_max * sp_fw, d_max * sp_tr / sp_fw, eff_n, eff_d)


@dataclass(frozen=True)
class OptimalMap:
    """Which option minimises the effective loss on an (N_max, D/N) grid."""

    n_max: np.ndarray  # (nx,)
    ratio: np.ndarray  # (ny,)
    best: np.ndarray  # (ny, nx) index into ``options``
    losses: np.ndarray  # (n_options, ny, nx)
    options: tuple[str, ...]
    speedups: str
    eff: dict  # option -> (effN, effD)

    def option_at(self, n: float, ratio: float) -> str:
        """The optimal option at the grid cell nearest (n, ratio) in log space."""
        i = int(np.argmin(np.abs(np.log(self.ratio) - np.log(ratio))))
        j = int(np.argmin(np.abs(np.log(self.n_max) - np.log(n))))
        return self.options[int(self.best[i, j])]


def optimal_map(params: dict, fp4_eff: tuple[float, float], fp8_eff: tuple[float, float] = (1.0, 1.0),
                speedups: str | dict = "bops", n_range=(1e8, 1e11), ratio_range=(25, 2200),
                resolution: int = 200) -> OptimalMap:
    """The argmin over {FP8:FP8, FP4:FP8, FP8:FP4, FP4:FP4} of the effective loss (paper Fig. 1(b)/(c)).

    ``fp4_eff`` = (effN, effD) of the FP4 scheme (an FP4 forward costs effN, an FP4 backward effD);
    ``fp8_eff`` likewise for FP8 (1, 1 in the paper).
    """
    n_max = np.geomspace(*n_range, resolution)
    ratio = np.geomspace(*ratio_range, resolution)
    nn, rr = np.meshgrid(n_max, ratio)
    eff = {}
    losses = []
    for opt in OPTIONS:
        fwd, bwd = opt.split(":")
        en = fp4_eff[0] if fwd == "FP4" else fp8_eff[0]
        ed = fp4_eff[1] if bwd == "FP4" else fp8_eff[1]
        eff[opt] = (float(en), float(ed))
        sp_fw, sp_bw = option_speedups(opt, nn, speedups)
        losses.append(effective_loss(params, nn, rr, en, ed, sp_fw, sp_bw))
    losses = np.stack(losses)
    return OptimalMap(n_max=n_max, ratio=ratio, best=np.argmin(losses, axis=0), losses=losses, options=OPTIONS,
                      speedups=speedups if isinstance(speedups, str) else "custom", eff=eff)


def compute_optimal(params: dict, flops, eff_n: float = 1.0, eff_d: float = 1.0, speedup: float = 1.0) -> dict:
    """The compute-optimal model for a training budget of ``flops`` (C = 6·N·D) under the fitted law.

    A precision with a training ``speedup`` s affords C·s: N·D = C·s/6. Its loss L(N·effN, D·effD) is minimised
    where the two terms' slopes balance; γ and E do not move the optimum (the power γ is monotone, E constant):

        N_opt = [α·A·effN^-α / (β·B·effD^-β)]^(1/(α+β)) · (C·s/6)^(β/(α+β)),   D_opt = C·s / (6·N_opt).

    Returns arrays (broadcast over ``flops``): ``n_opt``, ``d_opt``, ``ratio`` (D_opt/N_opt) and ``loss`` (the law at
    the optimum, efficiencies included).
    """
    c = np.asarray(flops, float) * float(speedup) / 6.0
    a, alpha, b, beta = params["A"], params["alpha"], params["B"], params["beta"]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        g = (alpha * a * eff_n ** (-alpha) / (beta * b * eff_d ** (-beta))) ** (1.0 / (alpha + beta))
        n_opt = g * c ** (beta / (alpha + beta))
        d_opt = c / n_opt
    return {"n_opt": n_opt, "d_opt": d_opt, "ratio": d_opt / n_opt,
            "loss": predict(params, n_opt, d_opt, eff_n, eff_d)}


def breakeven_speedup(params: dict, eff_n: float, eff_d: float, n, d) -> np.ndarray:
    """The uniform speedup s at which L(s·effN·N, effD·D) = L(N, D) (closed form; ∞ if none)."""
    n = np.asarray(n, float)
    d = np.asarray(d, float)
    a, alpha, b, beta = params["A"], params["alpha"], params["B"], params["beta"]
    term_n = a * n ** (-alpha)
    penalty_d = b * d ** (-beta) * (eff_d ** (-beta) - 1.0)
    denom = term_n - penalty_d
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(denom > 0, (term_n / np.where(denom > 0, denom, 1.0)) ** (1.0 / alpha) / eff_n, np.inf)
    return s


def headline(scheme: str, params: dict, eff_n: float, eff_d: float, n: float, ratio: float,
             caveat: str | None = None, note: str | None = None, includes_one=()) -> dict:
    """The user's headline for one precision: % of effective N and D lost, and the break-even speedup.

    ``caveat`` (the fit's status and reason when it is not ``converged``) is prefixed, so an unreliable fit
    never reads as a finding; ``note`` (e.g. an interval that includes 1) is appended in the same sentence;
    ``includes_one`` names the efficiencies ("effN", "effD") whose interval includes 1, for tables."""
    z = float(breakeven_speedup(params, eff_n, eff_d, n, n * ratio))
    lost_n, lost_d = 100.0 * (1.0 - eff_n), 100.0 * (1.0 - eff_d)
    verb_n, verb_d = ("costs" if lost_n >= 0 else "gains"), ("costs" if lost_d >= 0 else "gains")
    cost_n = f"{verb_n} {abs(lost_n):.1f}% effective parameters"
    # the data clause repeats its verb unless it is the parameters' one ("costs 3% ... and 1% effective data")
    cost_d = f"{'' if verb_d == verb_n else verb_d + ' '}{abs(lost_d):.1f}% effective data"
    verdict = (f"so it pays off when its speedup exceeds {z:.2f}x" if np.isfinite(z)
               else "so no speedup makes it pay off")
    text = f"{scheme} {cost_n} and {cost_d}, {verdict} (at N = {n:.3g}, D/N = {ratio:g})"
    if note:
        text = f"{text}; but {note}"
    if caveat:
        text = f"NOT A FINDING ({caveat.split(':')[0]}; see the fit status): {text}"
    return {"scheme": scheme, "lost_params_pct": lost_n, "lost_data_pct": lost_d, "breakeven_speedup": z,
            "at_n": float(n), "at_ratio": float(ratio), "text": text, "caveat": caveat, "note": note,
            "includes_one": list(includes_one)}
