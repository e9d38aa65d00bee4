"""Shape arithmetic of the Llama decoder that needs no torch: the SwiGLU hidden size and the block linears' names.

:mod:`quartet.model` builds the modules; :mod:`quartet.config` validates and derives a run's numbers from these
same rules before anything imports torch (so a bad override is refused in a fraction of a second).
"""
from __future__ import annotations

import math


def block_linear_names(n_layer: int) -> list[str]:
    """Module names of the :class:`~quartet.model.BlockLinear` layers of a :class:`~quartet.model.Llama` with
    ``n_layer`` blocks, in module order (what ``keep_bf16`` patterns are checked against before a model is built)."""
    return [f"blocks.{i}.{leaf}" for i in range(n_layer) for leaf in ("attn.qkv", "attn.proj", "mlp.w12", "mlp.c_proj")]


def ffn_hidden(d_model: int, multiple_of: int = 256) -> int:
    """SwiGLU hidden size: ``multiple_of * ceil(int(8d/3) / multiple_of)`` (the paper's rule)."""
    return multiple_of * math.ceil(int(8 * d_model / 3) / multiple_of)
