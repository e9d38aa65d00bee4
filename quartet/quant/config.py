"""Schema of the ``precision`` config group (owned by the quantization library).

MINIMAL PLACEHOLDER written with the foundation so configs compose; the precision-schemes work
extends it (per-operand quantizer specs, stats schedule, ...).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrecisionConfig:
    #: scheme name in the registry (bf16, fp8, quartet, quartet_sr, quest_fwd, sr_bwd, rtn_bwd, ms_fp4, luq_int4, nvfp4)
    name: str = "bf16"
    #: short label of the forward-GEMM precision, used by the analysis (bf16, quest, fp8, ...)
    forward: str = "bf16"
    #: short label of the backward-GEMM precision (bf16, sr_absmax, rtn_absmax, fp8, ...)
    backward: str = "bf16"
    #: implementation: auto | reference | triton | hopper_fp8 | blackwell_mxfp4
    backend: str = "auto"
    #: per-layer quantization statistics every N steps (0 = never)
    stats_every: int = 0
