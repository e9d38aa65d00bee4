"""Number formats, transforms, quantizers and precision schemes (pure PyTorch, CPU-exact).

The model seam (docs/ARCHITECTURE.md, "Model <-> quantization seam"):

* :func:`apply_precision` converts exactly the model's ``quartet.model.BlockLinear`` modules to
  :class:`~quartet.quant.linear.QuantLinear` (sharing the weight Parameter) and returns a
  :class:`QuantPlan` — the module → quantizer map, with the backend that runs each GEMM.
* :func:`set_step` tells the quantized layers the optimizer step (random signs / SR seeds, stats), and
  :func:`begin_micro_batch` which of its micro-batches comes next.
* :func:`collect_stats` returns the per-layer quantization statistics gathered since the last call.

Using this package needs only torch; importing it imports no torch (the torch modules load on first use), so
:mod:`quartet.config` reads the precision schema (:mod:`quartet.quant.config`) without torch.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quartet.errors import ConfigError
from quartet.quant.config import keep_bf16_matches

if TYPE_CHECKING:
    import torch
    from torch import nn

    from quartet.quant.backend import BACKEND_NAMES, get_backend
    from quartet.quant.linear import QuantLinear
    from quartet.quant.schemes import SCHEMES, Scheme, build_scheme, scheme_names

#: names of this package's namespace that live in its torch modules, imported on first use (PEP 562 / :func:`_load`)
_LAZY = {"BACKEND_NAMES": "quartet.quant.backend", "get_backend": "quartet.quant.backend",
         "QuantLinear": "quartet.quant.linear", "SCHEMES": "quartet.quant.schemes", "Scheme": "quartet.quant.schemes",
         "build_scheme": "quartet.quant.schemes", "scheme_names": "quartet.quant.schemes"}


def _load() -> None:
    """Put the torch modules' names into this namespace, once; a name already there (e.g. patched) is kept."""
    g = globals()
    for name, module in _LAZY.items():
        if name not in g:
            g[name] = getattr(importlib.import_module(module), name)


def __getattr__(name: str):
    if name in _LAZY:
        _load()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["QuantPlan", "apply_precision", "set_step", "begin_micro_batch", "collect_stats", "build_scheme",
           "scheme_names", "SCHEMES", "QuantLinear"]


@dataclass
class QuantPlan:
    """Which modules a scheme converted and how (written to ``quant_map.json``, printed at start)."""

    scheme: str
    forward: str = "bf16"
    backward: str = "bf16"
    description: str = ""
    backend: str = "none"
    backend_detail: str = ""
    #: run seed that the random Hadamard signs / SR seeds derive from
    seed: int = 0
    #: converted module name -> {layer_index, shape, operands (per GEMM), backend}
    modules: dict[str, dict] = field(default_factory=dict)
    #: modules with weights that stay high precision (embeddings, lm_head, unconverted linears)
    high_precision: list[str] = field(default_factory=list)
    #: block linears that ``precision.keep_bf16`` keeps high precision -> the pattern that matched
    keep_bf16: dict[str, str] = field(default_factory=dict)
    #: the layer class that runs the converted modules' GEMMs (fused kernel layer or operand-by-operand QuantLinear)
    implementation: str = "none"
    #: whether the fused Quartet layers run as registered operators that torch.compile traces (draws on the device)
    traceable: bool = False

    def to_dict(self) -> dict:
        return {
            "scheme": self.scheme,
            "forward": self.forward,
            "backward": self.backward,
            "description": self.description,
            "backend": self.backend,
            "backend_detail": self.backend_detail,
            "implementation": self.implementation,
            "traceable": self.traceable,
            "seed": self.seed,
            "modules": self.modules,
            "high_precision": self.high_precision,
            "keep_bf16": self.keep_bf16,
        }

    def summary(self) -> str:
        """A few human lines for the run log."""
        lines = [f"precision {self.scheme} (forward {self.forward}, backward {self.backward}): {self.description}"]
        if self.modules:
            first = next(iter(self.modules.values()))
            lines.append(f"  {len(self.modules)} block linears quantized, GEMMs run by {self.backend_detail}")
            lines.append(f"  layer: {self.implementation}"
                         + (" as traceable operators (draws on the device)" if self.traceable else ""))
            for gemm, ops in first["operands"].items():
                lines.append(f"    {gemm}: " + ", ".join(f"{k}={v}" for k, v in ops.items()))
        else:
            lines.append("  no module converted")
        if self.keep_bf16:
            pats = sorted(set(self.keep_bf16.values()))
            lines.append(f"  keep_bf16 {', '.join(pats)}: {len(self.keep_bf16)} block linears left unquantized")
        lines.append(f"  high precision: {', '.join(self.high_precision) or '(none)'}")
        return "\n".join(lines)


def _block_linear_type():
    # Imported lazily: quartet.model is the foundation's module; quant must import without it.
    from quartet.model import BlockLinear

    return BlockLinear


def _device_of(model: nn.Module) -> torch.device:
    import torch

    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def apply_precision(model: nn.Module, precision_cfg, *, seed: int | None = None, device: torch.device | str | None = None,
                    targets: tuple[type, ...] | None = None, traceable: bool = False) -> QuantPlan:
    """Convert the model's block linears in place to the scheme's quantized linear.

    ``precision_cfg`` is a ``PrecisionConfig`` (or any object with its attributes). ``seed`` (the run
    seed) enters every random Hadamard sign and stochastic-rounding seed; None takes
    ``torch.initial_seed()``, i.e. the seed of the caller's last ``torch.manual_seed(run.seed)``.
    ``targets`` overrides the module types to convert (default: ``quartet.model.BlockLinear``). ``bf16`` converts nothing.
    ``precision_cfg.keep_bf16`` (module-name globs) leaves the block linears it matches unconverted under any scheme;
    the others keep the layer index (and so the random draws) they have without it.
    ``traceable=True`` (for a model that will be compiled) runs the fused Quartet layers as registered operators
    that ``torch.compile`` traces and CUDA graphs capture, their random draws fed from the device per micro-batch
    (call :func:`begin_micro_batch` before each one); the numbers are those of the eager layer. Convert the model
    on its final device.
    Raises :class:`ConfigError` at once if the scheme or backend cannot run on ``device``.
    """
    import torch
    from torch import nn

    _load()
    scheme: Scheme = build_scheme(precision_cfg)
    backend_name = str(getattr(precision_cfg, "backend", "auto"))
    if backend_name not in BACKEND_NAMES:
        raise ConfigError(f"precision.backend={backend_name!r}: allowed: {', '.join(BACKEND_NAMES)}")
    stats_every = int(getattr(precision_cfg, "stats_every", 0))
    if stats_every < 0:
        raise ConfigError(f"precision.stats_every={stats_every}: must be >= 0")
    targets = targets or (_block_linear_type(),)
    seed = torch.initial_seed() if seed is None else int(seed)
    device = torch.device(device) if device is not None else _device_of(model)
    if any(isinstance(m, QuantLinear) for m in model.modules()):
        raise ConfigError("apply_precision: the model is already converted (call it once per model)")

    plan = QuantPlan(scheme=scheme.name, forward=scheme.forward_label, backward=scheme.backward_label,
                     description=scheme.description, seed=seed)
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, targets)]
    weighted = [n for n, m in model.named_modules()
                if isinstance(m, (nn.Linear, nn.Embedding)) and not isinstance(m, targets)]
    plan.keep_bf16 = keep_bf16_matches([n for n, _ in found], getattr(precision_cfg, "keep_bf16", None) or (),
                                       lambda prefix: _list_length(model, prefix))
    if not scheme.convert:
        plan.backend, plan.backend_detail = "none", "PyTorch (unconverted model)"
        plan.high_precision = [n for n, _ in found] + weighted
        return plan

    backend = get_backend(backend_name, device, scheme.specs(), scheme=scheme)
    plan.backend, plan.backend_detail = backend.name, backend.describe(device)
    operands = scheme.operand_map()
    # A kernel backend offers its fused layer where it covers the scheme (each operand quantized once, FP8
    # kept for the backward, ~2.5x faster than driving the kernels operand by operand); the layer falls back
    # to the seam path itself on steps that record statistics.
    seam = "QuantLinear, operand by operand (quartet.quant.linear)"
    fused_factory, fused_name = backend.fused_layer(scheme) or (None, seam)
    for index, (name, mod) in enumerate(found):
        if name in plan.keep_bf16:
            continue
        if getattr(mod, "bias", None) is not None:
            raise ConfigError(f"apply_precision: {name} has a bias; block linears must be bias-free")
        kw = dict(name=name, layer_index=index, seed=seed, stats_every=stats_every,
                  residual=bool(getattr(mod, "residual", False)))
        q = fused_factory(mod.weight, scheme, backend, **kw) if fused_factory else None
        impl = fused_name
        if q is None:  # no fused layer for this scheme / backend / layer shape
            q, impl = QuantLinear(mod.weight, scheme, backend, **kw), seam
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, q)
        plan.modules[name] = {"layer_index": index, "shape": [q.out_features, q.in_features],
                              "operands": operands, "backend": backend.name, "implementation": impl}
    impls = sorted({m["implementation"] for m in plan.modules.values()})
    plan.implementation = impls[0] if len(impls) == 1 else " + ".join(impls) if impls else seam
    plan.high_precision = list(plan.keep_bf16) + weighted
    if traceable and fused_factory is not None:
        plan.traceable = backend.bind_device_draws(model, device)
        _upload_draws(model)
    return plan


def _list_length(model: nn.Module, prefix: str) -> int | None:
    """Length of the module list at ``prefix`` (for negative indices in ``keep_bf16``), None if it is not one."""
    from torch import nn

    try:
        mod = model.get_submodule(prefix)
    except AttributeError:
        return None
    return len(mod) if isinstance(mod, (nn.ModuleList, nn.Sequential)) else None


def _quant_layers(model: nn.Module):
    _load()
    return [m for m in model.modules() if isinstance(m, QuantLinear)]


def set_step(model: nn.Module, step: int, first_call: int = 0) -> None:
    """Tell quantized layers the current optimizer step (per-step random signs / SR seeds, stats).

    ``first_call``: global index of this process's first micro-batch of the step (rank × micro-batches
    per rank under DDP), so seeds match single-process training micro-batch for micro-batch.
    """
    for m in _quant_layers(model):
        m.set_step(step, first_call)
    _upload_draws(model)


def begin_micro_batch(model: nn.Module, index: int) -> None:
    """Micro-batch ``index`` (0-based, this process's) of the current step comes next.

    Layers run eagerly count their calls themselves; layers inside a compiled graph cannot, so the training
    loop calls this before every micro-batch: it sets each layer's call number and refreshes the device
    draws of traceable fused layers (one host-to-device copy, ordered before the micro-batch's kernels).
    """
    for m in _quant_layers(model):
        m.begin_micro_batch(index)
    _upload_draws(model)


def _upload_draws(model: nn.Module) -> None:
    arenas = {id(a): a for m in _quant_layers(model) if (a := getattr(m, "device_draws", None)) is not None}
    for arena in arenas.values():
        arena.upload()


def collect_stats(model: nn.Module) -> dict[str, float]:
    """Per-layer statistics gathered since the last call: ``q/<module>/<operand>/<stat>`` → value.

    Stats are only computed on steps where ``step % precision.stats_every == 0``; otherwise the
    result is empty. Operands: x, w (forward), dx_e, dx_w (input-grad GEMM), dw_e, dw_x (weight-grad
    GEMM); stats: clip_frac, underflow_frac, scale_exp_min, scale_exp_max, rel_err.
    """
    out: dict[str, float] = {}
    for m in _quant_layers(model):
        for operand, stats in m.pop_stats().items():
            for key, val in stats.items():
                out[f"q/{m.qname}/{operand}/{key}"] = float(val)
    return out
