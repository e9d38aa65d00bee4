"""Number formats, transforms, quantizers and precision schemes (pure PyTorch, CPU-exact).

MINIMAL PLACEHOLDER of the model seam (see docs/ARCHITECTURE.md): only ``bf16`` works until the
precision-schemes work replaces these functions with the real registry.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from quartet.errors import ConfigError


@dataclass
class QuantPlan:
    scheme: str
    modules: dict[str, dict] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"scheme": self.scheme, "modules": self.modules}


def apply_precision(model: nn.Module, precision_cfg) -> QuantPlan:
    """Convert the model's block linears to the scheme's quantized linear (in place)."""
    if precision_cfg.name != "bf16":
        raise ConfigError(f"precision.name={precision_cfg.name!r} is not available yet; allowed: bf16")
    return QuantPlan(scheme="bf16", modules={})


def set_step(model: nn.Module, step: int) -> None:
    """Tell quantized layers the current optimizer step (per-step random signs / SR seeds)."""


def collect_stats(model: nn.Module) -> dict[str, float]:
    """Per-layer quantization statistics gathered since the last call."""
    return {}
