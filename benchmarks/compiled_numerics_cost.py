"""What the ``compiled`` backend's exactness costs: its quantizers timed with and without each of its two guards.

``quartet/kernels/compiled.py`` makes Inductor's code equal the oracle by (1) IEEE float32 division and libdevice
without flush-to-zero (:func:`inductor_numerics`) and (2) :func:`finite_if_input_finite`, a whole-tensor
``isfinite().all()`` reduction before the values are written. Each variant runs in its own process (Inductor's
numerics switches are process-wide) on the same inputs:

- ``exact``: as shipped;
- ``no_guard``: without (2);
- ``fast_div``: without (1) (Inductor's default ``div.full.f32`` with flush-to-zero);
- ``fast_div_no_guard``: without either (the backend as it was before it was made exact).

Per recipe without a hand-written kernel, every distinct quantizer of its three GEMMs (forward, dX, dW operands,
Hadamard block where it rotates) is applied to an activation-shaped operand (``--rows`` x ``--cols``, float32,
standard normal); the time is the sum over those quantizers after warm-up compiles: wall time (median of >=
``--min-reps`` repeats and >= 2 s, p10-p90), and the GPU kernels' summed time per call from the profiler, a mean
over ``--profile-reps`` calls (what a CUDA-graphed training step pays; the table shows it). One process per
variant: a difference between variants smaller than two processes of one guard state disagree by is not resolved. Output: a table on stdout and ``--out`` JSON.

    python benchmarks/compiled_numerics_cost.py --out benchmarks/results/recipes/compiled_numerics_cost.json
    python benchmarks/compiled_numerics_cost.py --device cpu --rows 64 --cols 128 --min-reps 2 --min-seconds 0
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from oracle_sensitivity import precision  # noqa: E402  (this script's folder: the recipe's shipped config)

VARIANTS = ("exact", "fast_div_no_guard", "no_guard", "fast_div")
RECIPES = ("mxfp8", "nvfp4", "nvfp4_recipe", "quartet2", "ms_fp4", "luq_int4")


def recipe_quantizers(name: str) -> list[tuple[str, object, int | None]]:
    """``[(label, spec, block)]``: the distinct quantizers of recipe ``name``'s three GEMMs
    (:meth:`Scheme.rotated_specs`; block: the Hadamard block where the GEMM rotates its operands, else None)."""
    from quartet.quant.schemes import build_scheme

    return [(spec.label(), spec, block) for spec, block in build_scheme(precision(name)).rotated_specs()]


def _kernel_time(once, sync, dev, reps: int) -> dict:
    """GPU time of ``once`` as the profiler sees it: the kernels' summed device time and their count per call, a mean
    over ``reps`` profiled calls (the profiler gives totals, not per-call spread). The
    wall time above includes the host's launches and the graph breaks' eager draws (which CUDA graphs hide in a
    training step); this is what the GPU itself spends."""
    from torch.profiler import ProfilerActivity, profile

    if dev.type != "cuda":
        return {}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            once()
        sync()
    events = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    return {"kernel_us": sum(e.self_device_time_total for e in events) / reps,
            "kernels_per_call": sum(e.count for e in events) / reps, "profiled_calls": reps}


def child(variant: str, args) -> dict:
    """Time every recipe's quantizers under ``variant`` in this process."""
    import quartet.kernels.compiled as compiled
    from quartet.quant.hadamard import random_signs

    if variant in ("no_guard", "fast_div_no_guard"):
        compiled.finite_if_input_finite = lambda values, x: values
    if variant in ("fast_div", "fast_div_no_guard"):
        compiled.inductor_numerics = lambda: {}
    dev = torch.device(args.device)
    x = torch.randn(args.rows, args.cols, generator=torch.Generator().manual_seed(0)).to(dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    out = {}
    for name in args.recipes.split(","):
        quantizers = recipe_quantizers(name)
        signs = {b: random_signs(b, torch.Generator().manual_seed(1)).to(dev) for _, _, b in quantizers if b}

        def once():
            for _, spec, block in quantizers:
                compiled.compiled_quantize(x, spec, block=block, signs=signs.get(block), seed=7)

        for _ in range(3):  # compile and warm up
            once()
        sync()
        times, t_start = [], time.perf_counter()
        while len(times) < args.min_reps or time.perf_counter() - t_start < args.min_seconds:
            t0 = time.perf_counter()
            once()
            sync()
            times.append(time.perf_counter() - t0)
        q = statistics.quantiles(times, n=10) if len(times) >= 2 else [times[0]] * 9
        out[name] = {"quantizers": [label for label, _, _ in quantizers], "reps": len(times),
                     "median_us": 1e6 * statistics.median(times), "p10_us": 1e6 * q[0], "p90_us": 1e6 * q[-1],
                     **_kernel_time(once, sync, dev, args.profile_reps)}
    return out


def _report(results: dict, args) -> list[str]:
    """The table (GPU kernel time per recipe and variant -- wall time without a GPU -- and the ratio to the first
    variant); written with the JSON to ``--out``."""
    variants = list(results)
    lines = [f"{'recipe':<14}" + "".join(f"{v:>22}" for v in variants)]
    for name in args.recipes.split(","):
        key = "kernel_us" if "kernel_us" in results[variants[0]][name] else "median_us"
        base = results[variants[0]][name][key]
        cells = "".join(f"{results[v][name][key]:>12.0f} us {results[v][name][key] / base:>5.2f}x" for v in variants)
        lines.append(f"{name:<14}{cells}")
    if args.out:
        device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        Path(args.out).write_text(json.dumps({
            "what": __doc__.split("\n\n")[0], "command": " ".join(["python3", *sys.argv]), "device": device,
            "torch": torch.__version__, "shape": [args.rows, args.cols], "results": results, "table": lines},
            indent=1) + "\n")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", default=",".join(RECIPES))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--rows", type=int, default=16384, help="llama_7m: 16,384 tokens per micro-batch (--split 4)")
    p.add_argument("--cols", type=int, default=384, help="llama_7m: d_model 384")
    p.add_argument("--min-reps", type=int, default=20)
    p.add_argument("--min-seconds", type=float, default=2.0)
    p.add_argument("--profile-reps", type=int, default=20, help="profiled calls the kernel time is the mean of")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke test of the script only")
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args)))
        return 0
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r} (one of {', '.join(VARIANTS)})")
    results = {}
    passthrough = ["--recipes", args.recipes, "--rows", str(args.rows), "--cols", str(args.cols), "--min-reps",
                   str(args.min_reps), "--min-seconds", str(args.min_seconds), "--profile-reps", str(args.profile_reps),
                   "--device", args.device]
    for v in variants:
        print(f"variant {v} ...", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, __file__, "--child", v, *passthrough], capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            return done.returncode
        results[v] = json.loads(done.stdout.strip().splitlines()[-1])
        lines = _report(results, args)  # after every variant: a cut-short run keeps what it measured
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
