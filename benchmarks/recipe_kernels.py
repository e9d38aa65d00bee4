"""Where a recipe's fused layer spends its time: each quantizer call against the copy floor, and each recipe's
linear (forward + backward) against BF16's, at the shapes of a ladder size.

For every recipe the fused layers run (``mxfp8``, ``nvfp4``, ``nvfp4_recipe``, ``quartet2``, ``ms_fp4``,
``luq_int4``, ``fp8``, ``fp8_deepseek``, and ``quartet`` for reference) it times:

* ``quant``: every operand quantization one layer makes per micro-batch (the six of the three GEMMs; the amax pass
  of tensor-scaled kinds included), each on the activation-sized operand of the layer shape, as the median of
  ``triton.testing.do_bench``; its floor is one read of the operand plus one write of its values at the copy
  bandwidth measured in the same process (a 1 GiB device-to-device copy).
* ``layer``: the block linear as ``apply_precision`` installs it (``auto`` backend), forward + backward under bf16
  autocast, against ``F.linear`` under autocast on the same bf16 input, variants interleaved over ``--rounds``
  rounds (median of the rounds' medians, each of ≥ 20 repeats).

    python3 benchmarks/recipe_kernels.py --out benchmarks/results/recipes/kernels_h200.json
    python3 benchmarks/recipe_kernels.py --model llama_7m --recipes mxfp8,nvfp4 --sections layer

Needs a CUDA GPU with Triton.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: (d_model, ffn_hidden, tokens per micro-batch) of the ladder sizes timed here (tokens: micro-batch x 512)
MODELS = {"llama_200m": (1280, 3584, 64 * 512), "llama_7m": (384, 1024, 128 * 512), "llama_800m": (2048, 5632, 32 * 512)}
RECIPES = ("mxfp8", "nvfp4", "nvfp4_recipe", "quartet2", "ms_fp4", "luq_int4", "fp8", "fp8_deepseek", "quartet")


def _shapes(model: str) -> dict[str, tuple[int, int]]:
    d, h, _ = MODELS[model]
    return {"qkv": (d, 3 * d), "proj": (d, d), "w12": (d, 2 * h), "c_proj": (h, d)}


def _median_us(fn, reps: int) -> float:
    from triton.testing import do_bench

    return 1e3 * do_bench(fn, warmup=10, rep=max(20, reps), return_mode="median")


def copy_gbps() -> float:
    x = torch.empty(2**29, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    us = _median_us(lambda: y.copy_(x), 50)
    return 2 * x.numel() * 2 / (us * 1e-6) / 1e9


def _precision(name: str):
    """The recipe's shipped precision config; ``keep_bf16`` cleared (the one linear timed here is every layer)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from oracle_sensitivity import precision

    return precision(name, keep_bf16=[])


def quant_calls(recipe: str, T: int, K: int, N: int):
    """The operand quantizations of one fused layer of ``recipe`` (K in, N out, T tokens): ``[(label, fn, floor
    bytes)]``. Weight-sized calls are left out (N x K is a small fraction of the activations at these shapes)."""
    from quartet.kernels import recipe_linear as RL
    from quartet.kernels import recipe_quant as rq
    from quartet.quant.schemes import build_scheme

    plan = RL.plan_for(build_scheme(_precision(recipe)))
    if plan is None:
        return []
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, K, device="cuda", generator=g).bfloat16()
    e = torch.randn(T, N, device="cuda", generator=g).bfloat16()
    seed = torch.tensor([1], device="cuda", dtype=torch.int64)
    calls = []

    def add(label, src, op, axis, hb=0):
        if not isinstance(op, RL.OperandPlan):  # an operand the layer does not quantize
            return
        signs = torch.ones(hb, device="cuda") if hb else None
        if op.tile:
            fn = (lambda: rq.recipe_quantize(src, op.spec, axis=axis, hadamard=hb, signs=signs, seed=seed))
            out_bytes = 1 if rq.kernel_kind(op.spec).code == rq.K_FP8_BLOCK else 2
        else:
            occ = op.occ
            fn = (lambda: rq.row_quantize(src, op.spec, values=not occ, deq=True))
            out_bytes = 2 if occ else 4
        calls.append((label, fn, src.numel() * (src.element_size() + out_bytes)))

    add("X (forward)", x, plan.fwd_a, -1)
    add("E (dX)", e, plan.dx_a, -1, plan.dx_hb)
    add("Eᵀ (dW)", e, plan.dw_a, 0, plan.dw_hb)
    add("Xᵀ (dW)", x, plan.dw_b, 0, plan.dw_hb)
    return calls


def section_quant(model: str, recipes, reps: int, gbps: float) -> list[dict]:
    T = MODELS[model][2]
    rows = []
    for name, (K, N) in _shapes(model).items():
        for recipe in recipes:
            for label, fn, floor in quant_calls(recipe, T, K, N):
                fn()
                us = _median_us(fn, reps)
                floor_us = floor / (gbps * 1e9) * 1e6
                rows.append({"layer": name, "shape": [T, K, N], "recipe": recipe, "call": label, "us": round(us, 1),
                             "floor_us": round(floor_us, 1), "x_floor": round(us / floor_us, 2)})
                print(f"  quant {name:<6} {recipe:<12} {label:<12} {us:8.1f} us  floor {floor_us:7.1f}  "
                      f"x{us / floor_us:5.2f}", flush=True)
    return rows


def _layer(recipe: str, K: int, N: int):
    from torch import nn

    from quartet.model import BlockLinear
    from quartet.plugins import load_kernels
    from quartet.quant import apply_precision, set_step

    load_kernels()
    torch.manual_seed(0)
    m = nn.Sequential(BlockLinear(K, N)).cuda()
    if recipe == "bf16":
        return m, "bf16", "none"
    plan = apply_precision(m, _precision(recipe), seed=1, device="cuda")
    set_step(m, 1)
    return m, plan.backend, plan.implementation


def section_layer(model: str, recipes, reps: int, rounds: int) -> list[dict]:
    T = MODELS[model][2]
    rows = []
    for name, (K, N) in _shapes(model).items():
        x = torch.randn(T, K, device="cuda").bfloat16().requires_grad_(True)
        gy = torch.randn(T, N, device="cuda").bfloat16()
        variants = {}
        for recipe in ("bf16", *recipes):
            m, backend, impl = _layer(recipe, K, N)

            def step(m=m):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = m(x)
                y.backward(gy)

            step()
            variants[recipe] = (step, backend, impl)
        times = {r: [] for r in variants}
        for _ in range(rounds):  # interleaved: drift of the clock or the machine hits every variant alike
            for recipe, (step, _, _) in variants.items():
                times[recipe].append(_median_us(step, reps))
        base = statistics.median(times["bf16"])
        for recipe, (_, backend, impl) in variants.items():
            us = statistics.median(times[recipe])
            rows.append({"layer": name, "shape": [T, K, N], "recipe": recipe, "backend": backend,
                         "implementation": impl, "us": round(us, 1), "x_bf16": round(us / base, 3),
                         "rounds_us": [round(t, 1) for t in times[recipe]]})
            print(f"  layer {name:<6} {recipe:<12} {us:9.1f} us  x{us / base:5.2f}  ({backend})", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama_200m", choices=sorted(MODELS))
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--sections", default="quant,layer")
    ap.add_argument("--reps", type=int, default=100, help="do_bench repeat time per measurement, ms")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    recipes = [r for r in args.recipes.split(",") if r]
    t0 = time.time()
    gbps = copy_gbps()
    print(f"copy bandwidth {gbps:.0f} GB/s (bytes read + written)", flush=True)
    out = {"what": "fused recipe layers: quantizer calls against the copy floor, layer fwd+bwd against BF16",
           "command": "python3 benchmarks/recipe_kernels.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "model": args.model,
           "tokens": MODELS[args.model][2], "copy_gbps": round(gbps, 1)}
    sections = args.sections.split(",")
    if "quant" in sections:
        out["quant"] = section_quant(args.model, recipes, args.reps, gbps)
    if "layer" in sections:
        out["layer"] = section_layer(args.model, recipes, args.reps, args.rounds)
    out["wall_s"] = round(time.time() - t0, 1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
