"""How far two correct implementations of a recipe can drift apart: the CPU oracle against itself, perturbed.

The GPU tests compare a fast path with the CPU oracle through two stacked block linears (256 -> 512 -> 256,
bf16-valued inputs and weights). A fast layer that emits bf16 (the fused Quartet layer, the FP8 tensor-core
layers) hands the second layer a rounded input, and its GEMM sums in another order; the second layer's quantizer
may then round some values to the other grid neighbour. This script measures that drift on the oracle alone, per
recipe, on the same two layers:

- ``bf16_between``: relative change of the output when the first layer's output is rounded to bf16;
- ``reordered_median`` / ``reordered_max``: relative change, against that bf16-rounded oracle, when the first layer's
  output also carries a 1e-5 relative perturbation before the rounding (a float32 sum in another order moves a
  value by about that much), over ``--draws`` draws;
- ``quant_error``: the oracle's own relative error against the bf16 model, for scale;
- ``ties_between``: the share of the first layer's float32 outputs that lie exactly halfway between two bf16 numbers
  (where the rounding is decided by the tie rule, and any change of the sum decides it otherwise).

A scale taken from the group's RMS (QuEST, ``quartet``) moves with every input of its group, so one flipped bf16
value can move a whole group's rounding; scales from the group's maximum rounded to a power of two rarely move.

    python benchmarks/oracle_sensitivity.py --json benchmarks/results/recipes/oracle_sensitivity.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def precision(name: str, **overrides):
    """The recipe's shipped precision config (conf/precision/<name>.yaml; a forward-only / backward-only variant's is
    its recipe's under the variant's name), with ``overrides`` (e.g. ``backend``)."""
    from quartet.quant.config import UNQUANTIZED_LABEL, PrecisionConfig, half_variants

    recipe, half = half_variants().get(name, (name, None))
    raw = yaml.safe_load((REPO / "conf" / "precision" / f"{recipe}.yaml").read_text())
    raw["name"] = name
    if half is not None:  # the unquantized half's label, as the config group gives it
        raw["backward" if half == "forward" else "forward"] = UNQUANTIZED_LABEL
    raw.update(overrides)
    return PrecisionConfig(**raw)


def two_layers(name: str, device: str = "cpu", backend: str = "reference"):
    """``(model, plan)``: the GPU tests' two block linears 256 -> 512 -> 256 (multiples of 128: every fused layer
    covers them), bf16-valued weights (the fused layers quantize bf16 copies of W), converted to recipe ``name`` on
    ``backend`` (seed 5). The fast backends register themselves first, as the trainer's kernels do."""
    from torch import nn

    from quartet.model import BlockLinear
    from quartet.plugins import load_kernels
    from quartet.quant import apply_precision

    load_kernels()
    torch.manual_seed(0)
    m = nn.Sequential(BlockLinear(256, 512), BlockLinear(512, 256))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.bfloat16().float())
    m = m.to(device)
    # keep_bf16 names Llama blocks; these two layers are all the model there is
    plan = apply_precision(m, precision(name, backend=backend, keep_bf16=[]), seed=5, device=device)
    return m, plan


def block_input(device: str = "cpu") -> torch.Tensor:
    """The tests' input: bf16-valued (what the block linears see under the trainer's bf16 autocast, exact on every
    path), seed 1."""
    return torch.randn(4, 128, 256, generator=torch.Generator().manual_seed(1)).bfloat16().float().to(device)


def output(name: str, between=None) -> torch.Tensor:
    """The two layers' forward output on the oracle; ``between`` rewrites the first layer's output."""
    from quartet.quant import set_step

    m, _ = two_layers(name)
    if between is not None:
        m[0].register_forward_hook(lambda _m, _i, o: between(o))
    set_step(m, 1)
    with torch.no_grad():
        return m(block_input()).float()


def bf16_tie_share(t: torch.Tensor) -> float:
    """Share of float32 values exactly halfway between two bf16 numbers (low 16 bits 0x8000)."""
    return float(((t.contiguous().view(torch.int32) & 0xFFFF) == 0x8000).float().mean())


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def measure(name: str, draws: int, noise: float) -> dict:
    """The drifts of recipe ``name`` (see the module docstring)."""
    first: list[torch.Tensor] = []
    y = output(name, lambda o: first.append(o.detach()))  # a hook returning None leaves the output as it is
    y_bf16 = output(name, lambda o: o.bfloat16().float())
    gen = torch.Generator().manual_seed(7)
    moved = [rel(output(name, lambda o: (o * (1 + noise * torch.randn(o.shape, generator=gen))).bfloat16().float()),
                 y_bf16) for _ in range(draws)]
    return {"recipe": name, "bf16_between": rel(y_bf16, y), "reordered_median": statistics.median(moved),
            "reordered_max": max(moved), "quant_error": rel(y, output("bf16")),
            "ties_between": bf16_tie_share(first[0])}


def main(argv: list[str] | None = None) -> int:
    from quartet.quant.schemes import RECIPES

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipes", default=",".join(r for r in RECIPES if r != "bf16"))
    p.add_argument("--draws", type=int, default=5)
    p.add_argument("--noise", type=float, default=1e-5, help="relative perturbation before the bf16 rounding")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    print(f"{'recipe':14s} {'bf16 between':>13s} {'reordered (median / max)':>26s} {'quant error':>12s} "
          f"{'ties between':>13s}")
    for name in a.recipes.split(","):
        r = measure(name, a.draws, a.noise)
        rows.append(r)
        print(f"{name:14s} {r['bf16_between']:13.4f} {r['reordered_median']:15.4f} / {r['reordered_max']:.4f} "
              f"{r['quant_error']:12.4f} {r['ties_between']:13.4f}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"noise": a.noise, "draws": a.draws, "torch": torch.__version__,
                                            "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
