"""Schema of the ``precision`` config group (owned by the quantization library).

Every YAML in ``conf/precision/`` is validated against :class:`PrecisionConfig` at compose time
(a typo'd key or a wrong type fails before anything runs); the scheme name and the knob values are
checked by :func:`quartet.quant.schemes.build_scheme` when the model is converted.
:func:`keep_bf16_matches` resolves the ``keep_bf16`` module-name patterns (the per-module precision map).

The names of the half-recipe variants live here too (:func:`half_variants`): ``<recipe>_fwd`` quantizes only the
forward GEMM as the recipe does, ``<recipe>_bwd`` only the two backward GEMMs. Both the scheme registry
(:mod:`quartet.quant.schemes`, which builds them from the recipe's operands) and the config composition
(:mod:`quartet.config`, which selects them as ``precision=<recipe>_fwd`` from the recipe's YAML) read them, and
composing a config needs no torch. Imports only the standard library (and the project's error type).
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from quartet.errors import ConfigError


#: The training recipes of the recipe table (docs/recipes.md, sweeps/recipes.yaml): every scheme a team would train
#: with, as opposed to the ablations (quest_fwd, sr_bwd, rtn_bwd, sr_fwd, rtn_fwd) that quantize one half only.
RECIPES = ("bf16", "fp8", "mxfp8", "fp8_deepseek", "nvfp4", "nvfp4_recipe", "quartet", "quartet_sr", "quartet2",
           "ms_fp4", "luq_int4")
#: The label of an unquantized GEMM (the bf16 scheme's, and the unquantized half of a half-recipe variant): what the
#: analysis reads as "this half is the baseline" (forward-only runs measure effN, backward-only runs effD).
UNQUANTIZED_LABEL = "bf16"
#: Half-recipe variants: name suffix -> the half of the recipe's GEMMs the variant quantizes.
HALVES = {"_fwd": "forward", "_bwd": "backward"}


def half_variants() -> dict[str, tuple[str, str]]:
    """``{variant: (recipe, half)}`` for every recipe of :data:`RECIPES` but bf16: ``<recipe>_fwd`` (half
    ``forward``: the forward GEMM's operands quantized as the recipe does, the two backward GEMMs unquantized) and
    ``<recipe>_bwd`` (``backward``: the reverse). The Quartet paper's way to measure effN (forward-only runs, effD = 1)
    and effD (backward-only runs, effN = 1) apart."""
    return {f"{recipe}{suffix}": (recipe, half) for recipe in RECIPES if recipe != UNQUANTIZED_LABEL
            for suffix, half in HALVES.items()}


@dataclass
class PrecisionConfig:
    #: scheme name in the registry (bf16, fp8, quartet, quartet_sr, quest_fwd, sr_bwd, rtn_bwd, sr_fwd,
    #: rtn_fwd, ms_fp4, luq_int4, nvfp4, quartet2, mxfp8, nvfp4_recipe, fp8_deepseek) or a half-recipe variant
    #: ``<recipe>_fwd`` / ``<recipe>_bwd`` (:func:`half_variants`)
    name: str = "bf16"
    #: short label of the forward-GEMM precision, used by the analysis (bf16, quest, fp8, ...)
    forward: str = "bf16"
    #: short label of the backward-GEMM precision (bf16, sr_absmax, rtn_absmax, fp8, ...)
    backward: str = "bf16"
    #: implementation: auto | reference | compiled | fused | triton | hopper_fp8 | blackwell_mxfp4
    backend: str = "auto"
    #: per-layer quantization statistics every N steps (0 = never)
    stats_every: int = 0
    #: block size of the (random) Hadamard transforms of the MXFP4 schemes and of quartet2's backward: 32, 64, 128
    #: or 256
    hadamard_block: int = 32
    #: FP8 scale granularity of the fp8 scheme: tensor (per-tensor current scaling) | row
    fp8_scaling: str = "tensor"
    #: MS-FP4 outlier clamping quantile per token (1.0 disables clamping)
    occ_quantile: float = 0.99
    #: MS-FP4 differentiable gradient estimator sharpness k and derivative cap
    dge_k: float = 5.0
    dge_cap: float = 3.0
    #: block linears kept in BF16 under any scheme: module-name globs (``blocks.-1.*`` = every linear of the last
    #: block; a negative index counts from the end of its list; a pattern naming a module covers its children).
    #: Part of the run's identity when non-empty; a pattern that matches no block linear is an error.
    keep_bf16: list[str] = field(default_factory=list)


_NEG_INDEX = re.compile(r"-\d+")


def _absolute(pattern: str, list_length: Callable[[str], int | None]) -> str:
    """``pattern`` with every negative index segment (``blocks.-2``) replaced by its absolute index."""
    parts = pattern.split(".")
    for i, seg in enumerate(parts):
        if _NEG_INDEX.fullmatch(seg):
            prefix = ".".join(parts[:i])
            n = list_length(prefix) if prefix and not any(c in prefix for c in "*?[") else None
            if n is None:
                raise ConfigError(f"precision.keep_bf16: {pattern!r}: a negative index needs a module list before it "
                                  f"(e.g. blocks.-1.*)")
            k = n + int(seg)
            if k < 0:
                raise ConfigError(f"precision.keep_bf16: {pattern!r}: {prefix} has only {n} entries")
            parts[i] = str(k)
    return ".".join(parts)


def keep_bf16_matches(names: Iterable[str], patterns: Iterable[str],
                      list_length: Callable[[str], int | None]) -> dict[str, str]:
    """Which of the block-linear ``names`` the ``keep_bf16`` patterns keep high precision → {name: pattern}.

    ``list_length(prefix)`` is the length of the module list at ``prefix`` (None if it is not one), for negative
    indices. Raises :class:`ConfigError` naming the first pattern that matches no name."""
    names = list(names)
    kept: dict[str, str] = {}
    for pattern in patterns:
        pattern = str(pattern)
        absolute = _absolute(pattern, list_length)
        hits = [n for n in names if fnmatch.fnmatchcase(n, absolute) or fnmatch.fnmatchcase(n, absolute + ".*")]
        if not hits:
            example = ", ".join(names[:2]) or "(none)"
            raise ConfigError(f"precision.keep_bf16: {pattern!r} matches no block linear (names look like {example})")
        for n in hits:
            kept.setdefault(n, pattern)
    return kept
