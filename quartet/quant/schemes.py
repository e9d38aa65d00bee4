"""Precision schemes: which quantizer each of the six GEMM operands of a linear layer gets.

A linear layer Y = X·Wᵀ (X: tokens × K, W: N × K) runs three GEMMs, each written here as
``a @ b.T`` with the reduction axis last in both operands:

=========  ===========  ================  =====================================
GEMM       a (M × K')   b (N' × K')       reduction axis (group / Hadamard axis)
=========  ===========  ================  =====================================
forward    X            W                 K  = in_features
dX = E·W   E            Wᵀ (from Ŵ or W)  N  = out_features
dW = Eᵀ·X  Eᵀ           Xᵀ (from X̂ or X)  M  = tokens
=========  ===========  ================  =====================================

A :class:`GemmSpec` gives the quantizer of ``a`` and ``b`` (``None`` = high precision) and the
rotation applied to both along the reduction axis: ``none``, ``hadamard`` (fixed block Hadamard),
``random_hadamard`` (fresh random signs per layer, step and micro-batch, signs before H) or
``seeded_hadamard`` (one random sign vector per run, shared by every layer and step — NVIDIA's NVFP4
recipe fixes its sign vector for the whole training). Because
both operands get the same orthogonal rotation, the product is unchanged up to quantization error.

The forward rotation defines the basis the layer "lives in": the backward GEMMs produce gradients
with respect to X̂ and Ŵ in that basis, multiply them by the forward quantizers' gradient factor
(QuEST clip mask, MS-FP4 DGE derivative, 1 otherwise) and rotate back with Hᵀ.

``bwd_source`` says what the backward GEMMs requantize: ``quantized`` = the forward-quantized X̂, Ŵ
(Quartet's Algorithm 1; the tensors saved for backward are then the quantized ones), ``input`` = the
(rotated) high-precision X, W.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from quartet.errors import ConfigError
from quartet.quant.config import RECIPES, UNQUANTIZED_LABEL, half_variants
from quartet.quant.quantizers import GROUPED_KINDS, QuantizerSpec

__all__ = ["GemmSpec", "Scheme", "SCHEMES", "RECIPES", "HALF_VARIANTS", "build_scheme", "half_scheme",
           "scheme_names"]

TRANSFORMS = ("none", "hadamard", "random_hadamard", "seeded_hadamard")


@dataclass(frozen=True)
class GemmSpec:
    """Quantizers of the two operands of one GEMM and the rotation along its reduction axis."""

    a: QuantizerSpec | None = None
    b: QuantizerSpec | None = None
    transform: str = "none"
    block: int = 32

    def __post_init__(self):
        if self.transform not in TRANSFORMS:
            raise ValueError(f"transform must be one of {TRANSFORMS}, got {self.transform!r}")

    @property
    def quantized(self) -> bool:
        return self.a is not None or self.b is not None

    def multiple(self) -> int:
        """The reduction length must be a multiple of this (Hadamard block, quantizer groups)."""
        m = self.block if self.transform != "none" else 1
        for spec in (self.a, self.b):
            if spec is not None and spec.kind in GROUPED_KINDS:
                m = math.lcm(m, spec.group)
        return m

    def describe(self) -> dict:
        rot = "" if self.transform == "none" else f"{self.transform}{self.block}"
        return {
            "a": self.a.label() if self.a else "high precision",
            "b": self.b.label() if self.b else "high precision",
            "transform": rot or "none",
        }


@dataclass(frozen=True)
class Scheme:
    """A named precision scheme (see the module docstring)."""

    name: str
    forward_label: str
    backward_label: str
    description: str
    fwd: GemmSpec = field(default_factory=GemmSpec)
    dx: GemmSpec = field(default_factory=GemmSpec)
    dw: GemmSpec = field(default_factory=GemmSpec)
    bwd_source: str = "quantized"
    #: False only for bf16: the model is left untouched.
    convert: bool = True

    def specs(self) -> list[QuantizerSpec]:
        """Every quantizer the scheme uses (for backend capability checks)."""
        return [s for g in (self.fwd, self.dx, self.dw) for s in (g.a, g.b) if s is not None]

    def rotated_specs(self) -> list[tuple[QuantizerSpec, int | None]]:
        """Every distinct (quantizer, Hadamard block) pair the three GEMMs apply, in order of first use; the block is
        None where the GEMM does not rotate its operands. What a backend is asked to quantize."""
        pairs: dict[tuple[QuantizerSpec, int | None], None] = {}
        for g in (self.fwd, self.dx, self.dw):
            block = g.block if g.transform != "none" else None
            for s in (g.a, g.b):
                if s is not None:
                    pairs.setdefault((s, block), None)
        return list(pairs)

    def operand_map(self) -> dict:
        """Operand -> quantizer label / "high precision", as written to quant_map.json."""
        f, dx, dw = self.fwd.describe(), self.dx.describe(), self.dw.describe()

        def source(operand: str, fwd_label: str) -> str:
            # an unquantized backward operand is the forward's quantized one (reused as is) or the input
            if self.bwd_source == "quantized" and fwd_label != "high precision":
                return f"{fwd_label} (forward {operand}̂ reused)"
            return f"high precision ({self.bwd_source} {operand})"

        return {
            "forward": {"X": f["a"], "W": f["b"], "transform": f["transform"]},
            "grad_input": {"E": dx["a"], "W^T": dx["b"] if self.dx.b else source("W", f["b"]),
                           "transform": dx["transform"]},
            "grad_weight": {"E^T": dw["a"], "X^T": dw["b"] if self.dw.b else source("X", f["a"]),
                            "transform": dw["transform"]},
        }


def _mx(kind: str, stochastic: bool = False) -> QuantizerSpec:
    return QuantizerSpec(kind=kind, stochastic=stochastic, group=32)


def _quartet(name: str, fwd_q: bool, bwd: str | None, block: int, fwd_kind: str = "quest",
             fwd_stochastic: bool = False) -> Scheme:
    """Quartet family: forward QuEST (or absmax) with a fixed Hadamard, backward absmax×3/4 with a
    re-randomised Hadamard; either half may be left high precision."""
    fwd = GemmSpec(_mx(fwd_kind, fwd_stochastic), _mx(fwd_kind, fwd_stochastic), "hadamard", block) if fwd_q else GemmSpec()
    if bwd is None:
        dx = dw = GemmSpec()
    else:
        q = _mx("absmax", stochastic=(bwd == "sr"))
        dx = dw = GemmSpec(q, q, "random_hadamard", block)
    fl = {"quest": "quest", "absmax": "sr_absmax" if fwd_stochastic else "rtn_absmax"}[fwd_kind] if fwd_q else "bf16"
    bl = {"sr": "sr_absmax", "rtn": "rtn_absmax", None: "bf16"}[bwd]
    descs = {
        "quartet": "Quartet (paper v4): QuEST MXFP4 forward, RTN absmax×3/4 backward with re-randomised Hadamard",
        "quartet_sr": "Quartet (public code / first draft): QuEST forward, stochastic-rounding absmax backward",
        "quest_fwd": "forward-only QuEST MXFP4; backward GEMMs high precision (masked STE)",
        "sr_bwd": "backward-only stochastic-rounding absmax×3/4 MXFP4 with random Hadamard; forward high precision",
        "rtn_bwd": "backward-only round-to-nearest absmax×3/4 MXFP4 with random Hadamard; forward high precision",
        "sr_fwd": "forward-only stochastic-rounding absmax×3/4 MXFP4 with Hadamard (Table 2 row)",
        "rtn_fwd": "forward-only round-to-nearest absmax×3/4 MXFP4 with Hadamard (Table 2 row)",
    }
    return Scheme(name, fl, bl, descs[name], fwd, dx, dw, bwd_source="quantized")


@dataclass(frozen=True)
class _Knobs:
    """The precision config's knobs a scheme is built from (checked by :func:`build_scheme`)."""

    block: int
    fp8_scaling: str
    occ: float
    dge_k: float
    dge_cap: float


def _fp8(k: _Knobs) -> Scheme:
    e4 = QuantizerSpec("fp8", fmt="e4m3", scaling=k.fp8_scaling)
    e5 = QuantizerSpec("fp8", fmt="e5m2", scaling=k.fp8_scaling)
    return Scheme("fp8", "fp8", "fp8", f"FP8: E4M3 X, W; E5M2 gradients; {k.fp8_scaling}-wise current scaling",
                  GemmSpec(e4, e4), GemmSpec(e5, e4), GemmSpec(e5, e4), bwd_source="quantized")


def _ms_fp4(k: _Knobs) -> Scheme:
    x_q = QuantizerSpec("ms_fp4", clip_quantile=k.occ if k.occ < 1.0 else 0.0)
    w_q = QuantizerSpec("ms_fp4", dge_k=k.dge_k, dge_cap=k.dge_cap)
    g_q = QuantizerSpec("fp8", fmt="e5m2", scaling="tensor")
    return Scheme("ms_fp4", "ms_fp4", "ms_fp4",
                  f"MS-FP4 (Wang et al.): per-token/per-channel absmax E2M1 forward with OCC q={k.occ:g} and "
                  f"DGE k={k.dge_k:g} cap={k.dge_cap:g}; backward GEMMs E5M2 gradients × FP4-valued W, X",
                  GemmSpec(x_q, w_q), GemmSpec(g_q, None), GemmSpec(g_q, None), bwd_source="quantized")


def _luq_int4(k: _Knobs) -> Scheme:
    i4 = QuantizerSpec("int4", scaling="row")
    lq = QuantizerSpec("luq", stochastic=True)
    return Scheme("luq_int4", "luq-int4", "luq-int4",
                  "LUQ-INT4 baseline: per-row absmax INT4 forward; gradients LUQ log-FP4 (stochastic "
                  "underflow + log SR) against the INT4 X̂, Ŵ",
                  GemmSpec(i4, i4), GemmSpec(lq, None), GemmSpec(lq, None), bwd_source="quantized")


def _nvfp4(k: _Knobs) -> Scheme:
    rtn = QuantizerSpec("nvfp4", group=16)
    sr = QuantizerSpec("nvfp4", group=16, stochastic=True)
    return Scheme("nvfp4", "nvfp4", "nvfp4",
                  "NVFP4: 16-groups with E4M3 block scale + FP32 tensor scale; RTN X, W; SR gradients; "
                  "random Hadamard (16) on the weight-gradient GEMM; backward requantizes X, W",
                  GemmSpec(rtn, rtn), GemmSpec(sr, rtn), GemmSpec(sr, rtn, "random_hadamard", 16),
                  bwd_source="input")


def _quartet2(k: _Knobs) -> Scheme:
    fwd = QuantizerSpec("nvfp4_4o6", group=16)
    bwd = QuantizerSpec("ms_eden", group=16)
    return Scheme("quartet2", "nvfp4_4o6", "ms_eden",
                  f"Quartet II (Panferov et al. 2026): NVFP4 forward with Four Over Six block scales (RTN); "
                  f"backward GEMMs MS-EDEN NVFP4 (RTN elements, EDEN-corrected E4M3 scales rounded "
                  f"stochastically) after a random-sign {k.block}-Hadamard, requantizing the forward X̂, Ŵ",
                  GemmSpec(fwd, fwd), GemmSpec(bwd, bwd, "random_hadamard", k.block),
                  GemmSpec(bwd, bwd, "random_hadamard", k.block), bwd_source="quantized")


def _mxfp8(k: _Knobs) -> Scheme:
    q = QuantizerSpec("mxfp8", group=32)
    return Scheme("mxfp8", "mxfp8", "mxfp8",
                  "MXFP8 (OCP MX): E4M3 elements with one E8M0 scale per 32 along every GEMM's reduction axis, "
                  "RTN, all six operands; the backward requantizes X, W from high precision along their new axis",
                  GemmSpec(q, q), GemmSpec(q, q), GemmSpec(q, q), bwd_source="input")


#: The registry of precision schemes: name -> builder. Each name but the half-recipe variants has its YAML in
#: conf/precision/; the variants (added below from :func:`quartet.quant.config.half_variants`) compose from their
#: recipe's YAML (quartet.config.register_configs).
_BUILDERS = {
    "bf16": lambda k: Scheme("bf16", "bf16", "bf16", "unquantized: nothing converted", convert=False),
    "fp8": _fp8,
    "quartet": lambda k: _quartet("quartet", True, "rtn", k.block),
    "quartet_sr": lambda k: _quartet("quartet_sr", True, "sr", k.block),
    "quest_fwd": lambda k: _quartet("quest_fwd", True, None, k.block),
    "sr_bwd": lambda k: _quartet("sr_bwd", False, "sr", k.block),
    "rtn_bwd": lambda k: _quartet("rtn_bwd", False, "rtn", k.block),
    "sr_fwd": lambda k: _quartet("sr_fwd", True, None, k.block, fwd_kind="absmax", fwd_stochastic=True),
    "rtn_fwd": lambda k: _quartet("rtn_fwd", True, None, k.block, fwd_kind="absmax"),
    "ms_fp4": _ms_fp4,
    "luq_int4": _luq_int4,
    "nvfp4": _nvfp4,
    "quartet2": _quartet2,
    "mxfp8": _mxfp8,
    "nvfp4_recipe": lambda k: _nvfp4_recipe(),
    "fp8_deepseek": lambda k: _fp8_deepseek(),
}


def build_scheme(cfg) -> Scheme:
    """Build the scheme named ``cfg.name`` with the knobs of a :class:`PrecisionConfig`-like object."""
    name = str(cfg.name)
    block = int(getattr(cfg, "hadamard_block", 32))
    if block < 2 or block & (block - 1):
        raise ConfigError(f"precision.hadamard_block={block}: must be a power of two (32, 64, 128, 256)")
    fp8_scaling = str(getattr(cfg, "fp8_scaling", "tensor"))
    if fp8_scaling not in ("tensor", "row"):
        raise ConfigError(f"precision.fp8_scaling={fp8_scaling!r}: allowed: tensor, row")
    occ = float(getattr(cfg, "occ_quantile", 0.99))
    if not 0.5 < occ <= 1.0:
        raise ConfigError(f"precision.occ_quantile={occ}: must be in (0.5, 1]")
    if name not in _BUILDERS:
        raise ConfigError(f"precision.name={name!r}: unknown scheme; allowed: {', '.join(scheme_names())}")
    knobs = _Knobs(block, fp8_scaling, occ, float(getattr(cfg, "dge_k", 5.0)), float(getattr(cfg, "dge_cap", 3.0)))
    return _BUILDERS[name](knobs)


def _nvfp4_recipe() -> Scheme:
    """NVIDIA's NVFP4 pre-training recipe (arXiv 2509.25149 §4): 1×16 NVFP4 for activations and gradients,
    16×16 2-D tiles for weights, round to nearest except stochastic rounding of the gradients, and a 16-point
    random Hadamard (one sign vector for the run) on both inputs of the weight-gradient GEMM only.

    The backward re-quantizes the high-precision W and X (``bwd_source="input"``): the 2-D weight rule is
    transpose-symmetric, so Q(Wᵀ) in the input-gradient GEMM is bitwise the forward's Ŵᵀ, while Xᵀ is quantized
    afresh along the token axis (after the Hadamard), as the paper does. Layers kept in BF16 are chosen by
    ``precision.keep_bf16`` (conf/precision/nvfp4_recipe.yaml)."""
    act = QuantizerSpec("nvfp4", group=16)
    grad = QuantizerSpec("nvfp4", group=16, stochastic=True)
    weight = QuantizerSpec("nvfp4", group=16, tile_rows=16)
    return Scheme("nvfp4_recipe", "nvfp4_2d", "nvfp4_sr_rht",
                  "NVIDIA NVFP4 recipe: 1x16 NVFP4 X (RTN), 16x16 2-D NVFP4 W (RTN, W^T reuses it), SR gradients, "
                  "16-point random Hadamard (fixed signs) on the weight-gradient GEMM inputs",
                  GemmSpec(act, weight), GemmSpec(grad, weight), GemmSpec(grad, act, "seeded_hadamard", 16),
                  bwd_source="input")


def _fp8_deepseek() -> Scheme:
    """DeepSeek-V3 FP8 (arXiv 2412.19437 §3.3): E4M3 everywhere, one scale per 1×128 tile of activations and
    gradients (along each GEMM's reduction axis) and per 128×128 block of weights, no rotation.

    The backward multiplies the forward's FP8 tensors (``bwd_source="quantized"``, as DeepSeek caches them):
    the input-gradient GEMM reuses Ŵ transposed (a 128×128 block stays a block), the weight-gradient GEMM
    re-tiles X̂ into 1×128 tiles along the token axis; the gradient E is quantized along each GEMM's own axis."""
    act = QuantizerSpec("fp8", fmt="e4m3", scaling="block", group=128, tile_rows=1)
    weight = QuantizerSpec("fp8", fmt="e4m3", scaling="block", group=128, tile_rows=128)
    return Scheme("fp8_deepseek", "fp8_block", "fp8_block",
                  "DeepSeek-V3 FP8: E4M3 with 1x128 tile scales (activations, gradients) and 128x128 block scales "
                  "(weights); backward on the forward's FP8 W (reused) and X (re-tiled along tokens)",
                  GemmSpec(act, weight), GemmSpec(act, None), GemmSpec(act, act), bwd_source="quantized")


def half_scheme(recipe: Scheme, half: str, name: str) -> Scheme:
    """``recipe`` with one half of its GEMMs left unquantized: ``half="forward"`` keeps the forward GEMM's operands
    and rotation and runs the two backward GEMMs on unquantized operands; ``"backward"`` the reverse. The operand the
    backward reads (``bwd_source``) stays the recipe's, so a forward-only variant's backward multiplies what the
    recipe's backward quantizers would have been given (the forward's X̂, Ŵ or the inputs), and a backward-only
    variant's backward requantizes unquantized forward operands. The unquantized half's label is
    :data:`~quartet.quant.config.UNQUANTIZED_LABEL`, so the analysis fits effN alone (forward-only) or effD alone."""
    if half == "forward":
        return Scheme(name, recipe.forward_label, UNQUANTIZED_LABEL,
                      f"forward-only {recipe.name} (backward GEMMs unquantized): {recipe.description}",
                      recipe.fwd, GemmSpec(), GemmSpec(), bwd_source=recipe.bwd_source)
    if half == "backward":
        return Scheme(name, UNQUANTIZED_LABEL, recipe.backward_label,
                      f"backward-only {recipe.name} (forward GEMM unquantized): {recipe.description}",
                      GemmSpec(), recipe.dx, recipe.dw, bwd_source=recipe.bwd_source)
    raise ValueError(f"half must be forward or backward, got {half!r}")


#: ``{variant: (recipe, half)}``: the forward-only and backward-only variant of every recipe but bf16
HALF_VARIANTS = half_variants()
_clash = set(HALF_VARIANTS) & set(_BUILDERS)
assert not _clash, f"half-recipe variant names clash with registered schemes: {sorted(_clash)}"
_BUILDERS.update({variant: (lambda k, r=recipe, h=half, v=variant: half_scheme(_BUILDERS[r](k), h, v))
                  for variant, (recipe, half) in HALF_VARIANTS.items()})

#: Registered scheme names (the keys of the builders' registry).
SCHEMES = tuple(_BUILDERS)


def scheme_names() -> list[str]:
    """Names accepted by ``precision.name``."""
    return list(SCHEMES)
