"""Schema of the ``precision`` config group (owned by the quantization library).

Every YAML in ``conf/precision/`` is validated against :class:`PrecisionConfig` at compose time
(a typo'd key or a wrong type fails before anything runs); the scheme name and the knob values are
checked by :func:`quartet.quant.schemes.build_scheme` when the model is converted.
Imports only the standard library.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrecisionConfig:
    #: scheme name in the registry (bf16, fp8, quartet, quartet_sr, quest_fwd, sr_bwd, rtn_bwd, sr_fwd,
    #: rtn_fwd, ms_fp4, luq_int4, nvfp4, quartet2, mxfp8)
    name: str = "bf16"
    #: short label of the forward-GEMM precision, used by the analysis (bf16, quest, fp8, ...)
    forward: str = "bf16"
    #: short label of the backward-GEMM precision (bf16, sr_absmax, rtn_absmax, fp8, ...)
    backward: str = "bf16"
    #: implementation: auto | reference | triton | hopper_fp8 | blackwell_mxfp4
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
