"""Where a training step's GPU time goes: ``quartet train``'s optimizer step under ``torch.profiler``.

Builds the real :class:`quartet.train.Trainer` (as ``benchmarks/ladder_speed.py`` does), runs warm-up steps, then
profiles a few steps and sums each kernel's device time. Kernels are grouped by what they are (GEMM on tensor
cores, the Triton quantizers / Hadamard kernels, FP8 casts, inductor-fused elementwise, attention, optimizer,
other), so the question "what does quartet spend over bf16, and on what?" has a number per group.

Use a mode without CUDA graphs (``compile``): the profiler sees each kernel of an eager or compiled step, while a
replayed graph would show as one launch. Device time per kernel does not depend on how the host launched it, so
the per-group sums are what a graph replay runs on the GPU (the wall time of ``graphs`` mode is then ~ their sum).

    python3 benchmarks/profile_step.py --model llama_20m --configs bf16:compile,quartet:compile \
        --out benchmarks/results/profile_20m.json [--data pycode] [override ...]

Needs a CUDA GPU, the project's environment and prepared data for ``--data``.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from ladder_speed import _overrides  # noqa: E402  (the same run composition as the step-speed benchmark)

#: kernel-name patterns -> group, first match wins (names as CUPTI reports them)
GROUPS = [
    ("attention", r"flash|fmha|attention|sdpa|cudnn"),  # before gemm: cuDNN's attention kernels say "wgmma" too
    ("gemm", r"gemm|cutlass|sm90_xmma|nvjet|cublas|wgmma|ampere_|sm80_"),
    ("quant (triton)", r"_mx_quant|_fp8_fold|_absmax|_masked_ihadamard|_rq_kernel|_rq_row_kernel"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("inductor fused", r"^triton_"),
    ("reduction/norm", r"reduce|norm|amax|max_kernel|sum_kernel"),
    ("copy/cast", r"copy|cast|convert|fill|elementwise|vectorized|unrolled"),
]


def _group(name: str) -> str:
    for group, pattern in GROUPS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return group
    return "other"


def profile_config(model: str, config: str, data: str, overrides: list[str], steps: int) -> dict:
    """Profile ``steps`` optimizer steps of one (model, precision:mode); device microseconds per step by kernel."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from quartet.config import compose, resolve
    from quartet.train import Trainer

    out_dir = tempfile.mkdtemp(prefix="profile_step_")
    cfg = compose(_overrides(model, config, data, out_dir, overrides, "cuda"))
    res = resolve(cfg)
    trainer = Trainer(cfg)
    for _ in range(5):  # compile, allocate, settle
        trainer._step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            trainer._step()
        torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA and evt.device_time > 0:
            per_kernel[evt.name][0] += evt.device_time / steps
            per_kernel[evt.name][1] += 1 / steps
    groups: dict[str, float] = defaultdict(float)
    for name, (us, _) in per_kernel.items():
        groups[_group(name)] += us
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:25]
    return {"model": model, "config": config, "n_params": res.n_params, "tokens_per_step": res.tokens_per_step,
            "steps_profiled": steps, "device_us_per_step": round(sum(groups.values()), 1),
            "kernels_per_step": round(sum(c for _, c in per_kernel.values()), 1),
            "groups_us_per_step": {k: round(v, 1) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
            "top_kernels": [{"name": n[:160], "us_per_step": round(us, 1), "calls_per_step": round(c, 2),
                             "group": _group(n)} for n, (us, c) in top]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama_20m")
    ap.add_argument("--configs", default="bf16:compile,fp8:compile,quartet:compile")
    ap.add_argument("--data", default="pycode")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("override", nargs="*", help="extra Hydra overrides for every configuration")
    args = ap.parse_args(argv)
    rows = []
    for config in args.configs.split(","):
        row = profile_config(args.model, config, args.data, args.override, args.steps)
        rows.append(row)
        print(f"{args.model} {config}: {row['device_us_per_step'] / 1e3:.2f} ms of kernels per step, "
              f"{row['kernels_per_step']:.0f} kernels", flush=True)
        for group, us in row["groups_us_per_step"].items():
            print(f"   {group:<16} {us / 1e3:8.2f} ms", flush=True)
        for k in row["top_kernels"][:12]:
            print(f"      {k['us_per_step'] / 1e3:7.3f} ms  x{k['calls_per_step']:<6g} {k['name'][:100]}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
