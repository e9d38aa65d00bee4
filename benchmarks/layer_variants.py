"""Issue #16, round 6: layouts of the fused Quartet layer timed against each other and against BF16, interleaved.

Two layout choices of ``quartet.kernels.linear`` are measured here, each a flag read when a layer runs:

* ``RIGHT_BLOCK`` — the right GEMM operands (W, Ŵᵀ, X̂ᵀ) scaled per 128×128 block (round 3's choice) or per 1×128
  block like the left ones. The 1×128 quantizer tile runs at twice the 128×128 tile's occupancy (round 5's ncu);
  cuBLAS multiplies two 1×128-scaled operands (``scaled_mm_probe.py``), at a speed nobody had measured.
* ``MASK_BITS`` — the forward's QuEST masks saved as one bool per element or packed into one int32 word per
  32-group: an eighth of the bytes written by the forward quantizers and read by the backward's inverse rotations.

Every variant, BF16 and the quantizer calls are CUDA-graphed and timed *interleaved* (``timing.time_interleaved``:
short slices of each in turn until each has >= 20 repeats and >= 2 s), because these kernels are instruction-bound
and an H100 at its power cap moves its SM clock by ~40% within seconds: variants timed one after the other compare
clocks. A figure is the median with p10/p90; ratios are of medians taken under the same clock history.

    python3 benchmarks/layer_variants.py --out layer_variants.json          # one H100: ~3 min
    python3 benchmarks/layer_variants.py --device cpu --smoke               # CPU interpreter: the code path only

Prints a table last; ``--out`` gets the JSON (figures, per-variant kernel profile at 16384×4096×4096, provenance).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from quartet.kernels import bench as B  # noqa: E402
from quartet.kernels import linear as L  # noqa: E402
from quartet.kernels.timing import time_interleaved  # noqa: E402

#: variant name -> (RIGHT_BLOCK, MASK_BITS, stochastic backward)
VARIANTS = {
    "r128_bool": (128, False, False),   # round 5's layer
    "r128_bits": (128, True, False),    # round 6's default
    "r1_bits": (1, True, False),
    "r128_bool_sr": (128, False, True),
    "r128_bits_sr": (128, True, True),
}
#: tiles (rows, cols, warps) tried for the transposed 1×128 reads (Eᵀ from bf16): round 5's sweep changed every
#: tile at once and its figures moved with the clock; here only the transposed calls change, timed interleaved
TILES_T = [(32, 128, 4), (16, 128, 4), (64, 128, 4), (64, 128, 8), (128, 128, 8), (32, 128, 8)]


def _layer_step(lin, x, e, dev):
    def step():
        x.grad = lin.weight.grad = None  # as zero_grad(set_to_none=True)
        with B._autocast(dev):
            y = lin(x)
        y.backward(e)
    return step


def _variant_layer(name: str, K: int, N: int, w: torch.Tensor, dev: str, engine: str, graph: bool):
    """The layer of one variant (BF16: a plain bias-free ``nn.Linear``), its weight a copy of ``w``."""
    if name == "bf16":
        lin = torch.nn.Linear(K, N, bias=False, device=dev, dtype=B.WEIGHT_DTYPE)
    else:
        lin = L.QuartetLinear(K, N, engine=engine, stochastic=VARIANTS[name][2], device=dev, dtype=B.WEIGHT_DTYPE,
                              graph_safe=graph)
    with torch.no_grad():
        lin.weight.copy_(w)
    return lin


def _with_flags(name: str, fn):
    """Run ``fn()`` with the module flags of variant ``name`` (BF16: unchanged), restoring them after."""
    old = (L.RIGHT_BLOCK, L.MASK_BITS)
    if name in VARIANTS:
        L.RIGHT_BLOCK, L.MASK_BITS = VARIANTS[name][:2]
    try:
        return fn()
    finally:
        L.RIGHT_BLOCK, L.MASK_BITS = old


def bench_shape(T: int, K: int, N: int, dev: str, engine: str, variants, timing: dict, profile: bool) -> dict:
    """fwd+bwd of BF16 and every variant at one shape, interleaved; (graphed on a GPU)."""
    torch.manual_seed(0)
    graph = dev == "cuda"
    x = torch.randn(T, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
    e = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K) * K ** -0.5
    fns, layers = {}, {}
    for name in ("bf16", *variants):
        lin = _variant_layer(name, K, N, w, dev, engine, graph)
        step = _layer_step(lin, x, e, dev)
        layers[name] = (lin, step)
        if graph:  # the flags are read while the graph is captured, so replays keep them
            fns[name] = _with_flags(name, lambda step=step, lin=lin: B._graph(step, (x, lin.weight)))
        else:  # eager: read on every call
            fns[name] = lambda name=name, step=step: _with_flags(name, step)
    t = time_interleaved(fns, run_chunk=None if graph else B._host_chunk, **timing)
    row = {"shape": [T, K, N], "graphed": graph, "figures": {k: v.as_dict() for k, v in t.items()}}
    base = t["bf16"].median_ms
    row["ratio_to_bf16"] = {k: v.median_ms / base for k, v in t.items() if k != "bf16"}
    if profile and graph:
        row["profile"] = {}
        for name in variants:
            lin, step = layers[name]
            B._log(f"  profile {name} (eager):")
            row["profile"][name] = _with_flags(name, lambda step=step: B._profile(step, top=6))
    B._log(f"  {T}x{K}x{N}: bf16 {base:.3f} ms | " + " | ".join(f"{k} {r:.3f}x" for k, r in row["ratio_to_bf16"].items()))
    return row


def _time_calls(label: str, shape: list, fns: dict, dev: str, timing: dict) -> dict:
    """``fns`` timed interleaved, each captured in a CUDA graph on a GPU (a single quantizer call, 100-200 µs of GPU
    work, launched from Python is at the edge of host-bound: round 6's second call timed every eager call at
    205-230 µs, whatever the kernel); the section's JSON, with a log line."""
    t = time_interleaved({k: B._graph(f) for k, f in fns.items()} if dev == "cuda" else fns, **timing)
    B._log(f"  {label} {'x'.join(map(str, shape))}: " + " | ".join(f"{k} {v.median_ms * 1e3:.1f} us" for k, v in t.items()))
    return {"shape": shape, "graphed": dev == "cuda", "figures": {k: v.as_dict() for k, v in t.items()}}


def bench_right_operands(T: int, K: int, N: int, dev: str, timing: dict) -> dict:
    """The right operands' quantizer calls (W forward from float32, Ŵᵀ and X̂ᵀ from the saved FP8) and the three
    GEMMs, with 128×128 and with 1×128 right blocks, interleaved."""
    from quartet.kernels import gemm as G
    from quartet.kernels.triton_quant import mx_quantize

    torch.manual_seed(1)
    x = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
    e = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev) * K ** -0.5
    L1 = dict(fp8="e4m3", fp8_block=1, deq=False)
    qx = mx_quantize(x, rule="quest", mask=True, mask_bits=True, **L1)
    qe, qet = mx_quantize(e, rule="absmax", **L1), mx_quantize(e, rule="absmax", axis=0, **L1)
    fns, gemms = {}, {}
    for rb in (128, 1):
        R = dict(fp8="e4m3", fp8_block=rb, deq=False)
        qw = mx_quantize(w, rule="quest", mask=True, mask_bits=True, cast_bf16=True, **R)
        fns[f"w_fwd_r{rb}"] = lambda R=R: mx_quantize(w, rule="quest", mask=True, mask_bits=True, cast_bf16=True, **R)
        fns[f"wt_bwd_r{rb}"] = lambda R=R, qw=qw, rb=rb: mx_quantize(qw.fp8, axis=0, rule="absmax", seed=2,
                                                                     in_scale=qw.block_scale, in_scale_rows=rb, **R)
        fns[f"xt_bwd_r{rb}"] = lambda R=R: mx_quantize(qx.fp8, axis=0, rule="absmax", seed=4, in_scale=qx.block_scale,
                                                       in_scale_rows=1, **R)
        qwt = fns[f"wt_bwd_r{rb}"]()
        qxt = fns[f"xt_bwd_r{rb}"]()
        gemms[f"gemms_r{rb}"] = lambda qw=qw, qwt=qwt, qxt=qxt: (G.hopper_fp8_mm(qx, qw), G.hopper_fp8_mm(qe, qwt),
                                                                 G.hopper_fp8_mm(qet, qxt))
    return _time_calls("right operands", [T, K, N], {**fns, **gemms}, dev, timing)


def bench_tiles(T: int, N: int, dev: str, timing: dict) -> dict:
    """Eᵀ (a (T, N) bf16 gradient read along its columns) quantized to 1×128-block FP8, RTN and SR, under each tile
    of :data:`TILES_T`, with E read along its rows (the same work, the direct layout) as the yardstick."""
    from quartet.kernels.triton_quant import mx_quantize

    torch.manual_seed(2)
    e = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
    kw = dict(rule="absmax", fp8="e4m3", fp8_block=1, deq=False, signs=0x5A5A5A5A)
    fns = {"direct_rtn": lambda: mx_quantize(e, seed=1, **kw)}
    for tile in TILES_T:
        name = "x".join(map(str, tile))
        for sr in (False, True):
            fns[f"T{name}_{'sr' if sr else 'rtn'}"] = (
                lambda tile=tile, sr=sr: mx_quantize(e, axis=0, seed=3, stochastic=sr, block=tile, **kw))
    return _time_calls("tiles", [T, N], fns, dev, timing)


def table(result: dict) -> str:
    lines = []
    for row in result.get("shapes", []):
        T, K, N = row["shape"]
        f = row["figures"]
        lines.append(f"{T}x{K}x{N} bf16 {f['bf16']['median_ms']:.3f} ms ±{f['bf16']['spread']:.0%}")
        for k, r in row["ratio_to_bf16"].items():
            lines.append(f"    {k:14s} {f[k]['median_ms']:.3f} ms ±{f[k]['spread']:.0%}  {r:.3f}x bf16")
    for row in [result["tiles"]] if result.get("tiles") else []:
        lines.append(f"Eᵀ tiles {row['shape'][0]}x{row['shape'][1]}: " + ", ".join(
            f"{k} {v['median_ms'] * 1e3:.1f} us ±{v['spread']:.0%}" for k, v in row["figures"].items()))
    for row in result.get("right_operands", []):
        T, K, N = row["shape"]
        lines.append(f"right operands {T}x{K}x{N}: " + ", ".join(
            f"{k} {v['median_ms'] * 1e3:.1f} us ±{v['spread']:.0%}" for k, v in row["figures"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and repeats (the CPU test of the code path)")
    ap.add_argument("--shapes", default=None, help="T,K,N;T,K,N... (default: the three benchmark shapes)")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--sections", default="layer,tiles,right",
                    help="comma list of: layer (the variants vs BF16), tiles (Eᵀ tiles), right (right operands)")
    args = ap.parse_args(argv)
    dev = args.device
    bench = B.Bench(dev)
    if args.smoke:
        shapes, variants = [(64, 64, 96)], ("r128_bool", "r1_bits")
        timing = dict(min_reps=2, min_seconds=0.0, chunk_seconds=0.0, settle_seconds=0.0)
    else:
        shapes = ([tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";")] if args.shapes
                  else list(B.LINEAR_SHAPES))
        timing, variants = {}, tuple(VARIANTS)
    result = {"meta": B.meta(["layer_variants", *(argv if argv is not None else sys.argv[1:])], bench),
              "variants": {k: dict(zip(("right_block", "mask_bits", "stochastic"), v)) for k, v in VARIANTS.items()},
              "shapes": [], "right_operands": []}
    result["meta"]["timing"]["order"] = "interleaved (timing.time_interleaved)"
    result["gpu_before"] = B.gpu_state() if dev == "cuda" else None
    t0 = time.monotonic()
    sections = set(args.sections.split(","))
    for T, K, N in shapes if "layer" in sections else []:
        result["shapes"].append(bench_shape(T, K, N, dev, bench.engine, variants, timing,
                                            profile=not args.no_profile and (T, K, N) == (16384, 4096, 4096)))
        bench.empty()
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
    if dev == "cuda" and "tiles" in sections:
        result["tiles"] = bench_tiles(16384, 4096, dev, timing)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
        # the right operands' calls under both blocks at the square shape (round 6's first call timed all three
        # shapes: the 1x128 x 1x128 GEMMs 1.48-1.52x slower at each)
        for T, K, N in ([s for s in shapes if s == (16384, 4096, 4096)] or shapes[:1]) if "right" in sections else []:
            result["right_operands"].append(bench_right_operands(T, K, N, dev, timing))
            bench.empty()
    result["gpu_after"] = B.gpu_state() if dev == "cuda" else None
    result["wall_s"] = round(time.monotonic() - t0, 1)
    result["table"] = table(result).splitlines()
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
