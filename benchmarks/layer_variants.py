"""Layouts of the fused Quartet layer timed against each other and against BF16, interleaved.

Two layout choices of ``quartet.kernels.linear`` are measured here, each a flag read when a layer runs:

* ``RIGHT_BLOCK`` — the right GEMM operands (W, Ŵᵀ, X̂ᵀ) scaled per 128×128 block (the default) or per 1×128
  block like the left ones. The 1×128 quantizer tile runs at twice the 128×128 tile's occupancy (Nsight Compute);
  cuBLAS multiplies two 1×128-scaled operands too (``scaled_mm_probe.py``); ``r1_bits`` and ``right`` time the cost.
* ``MASK_BITS`` — the forward's QuEST masks saved as one bool per element or packed into one int32 word per
  32-group: an eighth of the bytes written by the forward quantizers and read by the backward's inverse rotations.
* ``triton_quant.MAXNREG`` — register caps on the quantizer launches, per tile (1×128, 128×128) and read
  (direct, transposed): more programs per SM for a few more instructions and some spills (``sass_report.py
  --maxnreg``). The ``caps`` section times each quantizer call of the layer under each cap of ``--caps``; the
  ``cap*`` variants the whole layer with one cap per tile, ``tuned`` with the measured per-kind default.

Every variant, BF16 and the quantizer calls are CUDA-graphed and timed *interleaved* (``timing.time_interleaved``:
short slices of each in turn until each has >= 20 repeats and >= 2 s), because these kernels are instruction-bound
and an H100 at its power cap moves its SM clock by ~40% within seconds: variants timed one after the other compare
clocks. A figure is the median with p10/p90; ratios are of medians taken under the same clock history.

    python3 benchmarks/layer_variants.py --out layer_variants.json          # one H100: ~3 min
    python3 benchmarks/layer_variants.py --sections caps,layer --variants r128_bits,cap96,cap96_64,cap80_64
    python3 benchmarks/layer_variants.py --sections caps,layer --caps 0,96,64 --variants r128_bits,tuned,r128_bits_sr,tuned_sr
    python3 benchmarks/layer_variants.py --sections warps       # the 128x128 launches: warps vs programs per SM
    python3 benchmarks/layer_variants.py --sections inscale     # X̂ᵀ / Ŵᵀ: input scales per element vs per row
    python3 benchmarks/layer_variants.py --sections split,layer --variants tuned,default,tuned_sr,default_sr
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
for p in (REPO, REPO / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import bench as B  # noqa: E402
from quartet.kernels import linear as L  # noqa: E402
from quartet.kernels import triton_quant as tq  # noqa: E402
from quartet.kernels.timing import time_interleaved  # noqa: E402

#: the register caps measured for one-piece 128×128 tiles (``triton_quant.MAXNREG_MEASURED`` before the 128×128 blocks
#: were sliced and before stochastic rounding got caps of its own): the ``tuned`` variants and the ``split`` section
ONE_PIECE_CAPS = {"1x128": 96, "1x128 T": None, "128x128": None, "128x128 T": 64}
#: variant name -> (RIGHT_BLOCK, MASK_BITS, stochastic backward, register-cap table ``triton_quant.MAXNREG``,
#: slices table ``triton_quant.BLOCK128_SPLIT``); every variant runs today's kernels (e.g. per-row input scales), so a
#: variant is a layout, not an older version of the code
VARIANTS = {
    "r128_bool": (128, False, False, tq.caps_table(None, None), tq.split_table(1)),   # bool masks, nothing capped
    "r128_bits": (128, True, False, tq.caps_table(None, None), tq.split_table(1)),    # packed masks, nothing capped
    "r1_bits": (1, True, False, tq.caps_table(None, None), tq.split_table(1)),
    "r128_bool_sr": (128, False, True, tq.caps_table(None, None), tq.split_table(1)),
    "r128_bits_sr": (128, True, True, tq.caps_table(None, None), tq.split_table(1)),
    # register caps (1x128 tiles, 128x128 tiles); 96 spills nothing, 64 lets two 128x128 programs share an SM
    "cap96": (128, True, False, tq.caps_table(96, None), tq.split_table(1)),
    "cap96_64": (128, True, False, tq.caps_table(96, 64), tq.split_table(1)),
    "cap80_64": (128, True, False, tq.caps_table(80, 64), tq.split_table(1)),
    "cap96_64_sr": (128, True, True, tq.caps_table(96, 64), tq.split_table(1)),
    # each launch kind's cap chosen from its caps section, the 128x128 blocks in one piece
    "tuned": (128, True, False, dict(ONE_PIECE_CAPS), tq.split_table(1)),
    "tuned_sr": (128, True, True, dict(ONE_PIECE_CAPS), tq.split_table(1)),
    # every 128x128 block in 4 row slices of 32 (a 4-warp program, uncapped), the 1x128 caps kept
    "split4": (128, True, False, dict(ONE_PIECE_CAPS), tq.split_table(4)),
    "split4_sr": (128, True, True, dict(ONE_PIECE_CAPS), tq.split_table(4)),
    # today's defaults (triton_quant.MAXNREG_MEASURED, BLOCK128_SPLIT_MEASURED: slices per launch kind)
    "default": (128, True, False, dict(tq.MAXNREG_MEASURED), dict(tq.BLOCK128_SPLIT_MEASURED)),
    "default_sr": (128, True, True, dict(tq.MAXNREG_MEASURED), dict(tq.BLOCK128_SPLIT_MEASURED)),
}
#: register caps of the ``caps`` section (0: uncapped, ptxas's choice)
CAPS = (0, 96, 80, 64)
#: tiles (rows, cols, warps) tried for the transposed 1×128 reads (Eᵀ from bf16): only the transposed calls change,
#: timed interleaved (a sweep that changes every launch's tile at once, one run per tile, times the clock as well)
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
    old = (L.RIGHT_BLOCK, L.MASK_BITS, tq.MAXNREG, tq.BLOCK128_SPLIT)
    if name in VARIANTS:
        rb, bits, _, caps, split = VARIANTS[name]
        L.RIGHT_BLOCK, L.MASK_BITS, tq.MAXNREG, tq.BLOCK128_SPLIT = rb, bits, dict(caps), dict(split)
    try:
        return fn()
    finally:
        L.RIGHT_BLOCK, L.MASK_BITS, tq.MAXNREG, tq.BLOCK128_SPLIT = old


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
    work, launched from Python is at the edge of host-bound: on an H100 every eager call took 205-230 µs, whatever
    the kernel); the section's JSON, with a log line."""
    graph = dev == "cuda"
    t = time_interleaved({k: B._graph(f) for k, f in fns.items()} if graph else fns,
                         run_chunk=None if graph else B._host_chunk, **timing)
    B._log(f"  {label} {'x'.join(map(str, shape))}: " + " | ".join(f"{k} {v.median_ms * 1e3:.1f} us" for k, v in t.items()))
    return {"shape": shape, "graphed": graph, "figures": {k: v.as_dict() for k, v in t.items()}}


def _operands(T: int, K: int, N: int, dev: str, seed: int):
    """Random layer operands: bf16 input x (T, K), bf16 output gradient e (T, N), float32 master weight w (N, K)."""
    torch.manual_seed(seed)
    return (torch.randn(T, K, device=dev, dtype=torch.bfloat16), torch.randn(T, N, device=dev, dtype=torch.bfloat16),
            torch.randn(N, K, device=dev) * K ** -0.5)


def call_bytes(T: int, K: int, N: int) -> dict:
    """The fewest bytes each quantizer call of :func:`_layer_calls` must move (inputs read once, outputs written once:
    FP8 values, float32 block scales, packed masks) for a ``(T, K) × (N, K)`` layer with 128×128 right blocks."""
    s1, s128 = 4 / 128, 4 / 128 ** 2  # float32 scale bytes per element, 1x128 and 128x128 blocks
    e_call = 2 * T * N + T * N * (1 + s1)  # bf16 in, FP8 + 1x128 scales out
    return {"x_fwd": 2 * T * K + T * K * (1 + 1 / 8 + s1), "w_fwd": 4 * N * K + N * K * (1 + 1 / 8 + s128),
            "e_rtn": e_call, "e_sr": e_call, "et_rtn": e_call,
            "wt_bwd": N * K * (1 + s128) * 2, "xt_bwd": T * K * (1 + s1) + T * K * (1 + s128)}


def _layer_calls(x, e, w, right_block: int = 128, **bwd) -> dict:
    """The quantizer calls of one step of the fused layer (``linear._forward_gemm`` / ``_backward_gemms`` with block-
    scaled FP8, packed masks, right operands per ``right_block``×128), each ``fn(**extra)`` (e.g. ``maxnreg``):
    forward X, W (from float32); backward E (RTN, and SR as ``e_sr``), Eᵀ, Ŵᵀ and X̂ᵀ from the saved FP8. ``bwd`` goes
    to every backward call (the layer passes its Hadamard signs and seeds there)."""
    from quartet.kernels.triton_quant import mx_quantize

    f8 = dict(fp8="e4m3", deq=False)
    fwd = dict(rule="quest", mask=True, mask_bits=True, **f8)
    back = dict(rule="absmax", **bwd, **f8)
    qx = mx_quantize(x, fp8_block=1, **fwd)
    qw = mx_quantize(w, cast_bf16=True, fp8_block=right_block, **fwd)
    rb = right_block
    return {
        "x_fwd": lambda **k: mx_quantize(x, fp8_block=1, **fwd, **k),
        "w_fwd": lambda **k: mx_quantize(w, cast_bf16=True, fp8_block=rb, **fwd, **k),
        "e_rtn": lambda **k: mx_quantize(e, fp8_block=1, **back, **k),
        "e_sr": lambda **k: mx_quantize(e, stochastic=True, fp8_block=1, **back, **k),
        "et_rtn": lambda **k: mx_quantize(e, axis=0, fp8_block=1, **back, **k),
        "wt_bwd": lambda **k: mx_quantize(qw.fp8, axis=0, in_scale=qw.block_scale, in_scale_rows=rb, fp8_block=rb,
                                          **back, **k),
        "xt_bwd": lambda **k: mx_quantize(qx.fp8, axis=0, in_scale=qx.block_scale, in_scale_rows=1, fp8_block=rb,
                                          **back, **k),
    }


def bench_right_operands(T: int, K: int, N: int, dev: str, timing: dict) -> dict:
    """The right operands' quantizer calls (W forward from float32, Ŵᵀ and X̂ᵀ from the saved FP8) and the three
    GEMMs, with 128×128 and with 1×128 right blocks, interleaved."""
    from quartet.kernels import gemm as G

    x, e, w = _operands(T, K, N, dev, 1)
    fns, gemms = {}, {}
    for rb in (128, 1):
        calls = _layer_calls(x, e, w, rb)
        for name in ("w_fwd", "wt_bwd", "xt_bwd"):
            fns[f"{name}_r{rb}"] = calls[name]
        qx, qw, qe, qet = (calls[k]() for k in ("x_fwd", "w_fwd", "e_rtn", "et_rtn"))
        qwt, qxt = calls["wt_bwd"](), calls["xt_bwd"]()
        gemms[f"gemms_r{rb}"] = lambda qx=qx, qw=qw, qe=qe, qet=qet, qwt=qwt, qxt=qxt: (
            G.hopper_fp8_mm(qx, qw), G.hopper_fp8_mm(qe, qwt), G.hopper_fp8_mm(qet, qxt))
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


#: the Hadamard signs and SR seed every quantizer section passes to the backward calls (``_layer_calls(**bwd)``)
BWD = dict(signs=0x5A5A5A5A, seed=5)


def _same_outputs(a, b) -> bool:
    """Two quantizer calls' outputs bit for bit (FP8 values, block scales, packed masks, flush counts)."""
    def bits(t):
        return t.view(torch.uint8) if t.dtype.itemsize == 1 else t
    return all(torch.equal(bits(u), bits(v)) for u, v in
               ((getattr(a, n), getattr(b, n)) for n in ("fp8", "block_scale", "mask_bits", "flushed")) if u is not None)


def bench_caps(T: int, K: int, N: int, dev: str, timing: dict, caps=CAPS) -> dict:
    """Each quantizer call of one layer step (forward X and W, backward E, Eᵀ, Ŵᵀ, X̂ᵀ; E also with SR) under each
    register cap of ``caps`` (``mx_quantize(maxnreg=...)``), interleaved: which calls, if any, a cap speeds up."""
    calls = _layer_calls(*_operands(T, K, N, dev, 3), 128, **BWD)
    fns = {f"{name}@{cap or 'free'}": (lambda fn=fn, cap=cap: fn(maxnreg=cap)) for name, fn in calls.items()
           for cap in caps}
    return _time_calls("register caps", [T, K, N], fns, dev, timing)


def _with_quant_flags(fn, **flags):
    """``fn`` as a callable that runs with ``triton_quant``'s module flags set to ``flags`` and restores them after."""
    def run():
        old = {k: getattr(tq, k) for k in flags}
        for k, v in flags.items():
            setattr(tq, k, v)
        try:
            return fn()
        finally:
            for k, v in old.items():
                setattr(tq, k, v)
    return run


def bench_in_scale(T: int, K: int, N: int, dev: str, timing: dict) -> dict:
    """The backward's transposed reads of the saved FP8 operands (X̂ᵀ, Ŵᵀ; X̂ᵀ also into 1×128 blocks), their input
    scales loaded once per element or once per stored row of the tile (``triton_quant.IN_SCALE_PER_ROW``), under
    the default register caps, interleaved."""
    x, e, w = _operands(T, K, N, dev, 3)
    r128, r1 = (_layer_calls(x, e, w, rb, **BWD) for rb in (128, 1))
    calls = {"wt_bwd": r128["wt_bwd"], "xt_bwd": r128["xt_bwd"], "xt_bwd_r1": r1["xt_bwd"]}
    fns = {f"{n}@{'row' if per_row else 'element'}": _with_quant_flags(fn, IN_SCALE_PER_ROW=per_row)
           for n, fn in calls.items() for per_row in (False, True)}
    return _time_calls("input scales", [T, K, N], fns, dev, timing)


def _block128_calls(T: int, K: int, N: int, dev: str) -> dict:
    """:func:`_layer_calls` at one shape, plus the backward's Ŵᵀ and X̂ᵀ with SR (``wt_bwd_sr``, ``xt_bwd_sr``)."""
    calls = _layer_calls(*_operands(T, K, N, dev, 3), 128, **BWD)
    for name in ("wt_bwd", "xt_bwd"):
        calls[f"{name}_sr"] = lambda name=name, **k: calls[name](stochastic=True, **k)
    return calls


def _launch_grid(label: str, shape: list, calls: dict, names, settings, launch, tag: str, ref, dev: str,
                 timing: dict) -> dict:
    """Each call of ``names`` under each launch setting (``launch(fn, *setting)`` gives the callable; its figure is
    ``f"{name}@" + tag.format(*setting)``), timed interleaved; every setting but ``ref`` has its outputs checked bitwise
    against ``ref``'s (``bitwise`` in the JSON: a launch setting must not change them)."""
    bitwise = {}
    for name in names:
        want = launch(calls[name], *ref)()
        for setting in settings:
            if setting != ref:
                bitwise[f"{name}@" + tag.format(*setting)] = _same_outputs(want, launch(calls[name], *setting)())
    fns = {f"{n}@" + tag.format(*st): launch(calls[n], *st) for n in names for st in settings}
    return {**_time_calls(label, shape, fns, dev, timing), "bitwise": bitwise}


#: (warps, register cap) of the ``warps`` section's 128×128-tile launches (16 warps uncapped: the default tile)
BLOCK128_LAUNCHES = ((16, 0), (16, 64), (32, 0), (8, 0))


def bench_block128_warps(T: int, K: int, N: int, dev: str, timing: dict) -> dict:
    """The layer's three 128×128-tile calls (W forward, Ŵᵀ and X̂ᵀ backward) in one piece under each (warps, cap) of
    :data:`BLOCK128_LAUNCHES`, interleaved: more warps in one program vs more programs per SM; outputs checked
    bitwise against the default tile's."""
    def launch(fn, warps, cap):
        return _with_quant_flags(lambda: fn(maxnreg=cap), BLOCK128_WARPS=warps, BLOCK128_SPLIT=tq.split_table(1))

    return _launch_grid("128x128 launches", [T, K, N], _block128_calls(T, K, N, dev), ("w_fwd", "wt_bwd", "xt_bwd"),
                        BLOCK128_LAUNCHES, launch, "w{}c{}", BLOCK128_LAUNCHES[0], dev, timing)


#: (row slices, register cap) of the ``split`` section's 128×128-block launches: (1, None) is the one-piece
#: 16-warp tile under its caps (``ONE_PIECE_CAPS``); 0 runs a launch uncapped; ("default", None) today's tables
SPLIT_LAUNCHES = ((1, None), (2, 0), (4, 0), (8, 0), (4, 96), (8, 96))


def bench_block128_split(T: int, K: int, N: int, dev: str, timing: dict) -> dict:
    """The layer's 128×128-block calls (W forward, Ŵᵀ and X̂ᵀ backward, both also with SR) as one 16-warp tile or in
    row slices (``triton_quant.BLOCK128_SPLIT``) under register caps, and under today's default tables, interleaved;
    every launch's outputs checked bitwise against the one-piece tile's."""
    def launch(fn, split, cap):
        if split == "default":
            return fn
        return _with_quant_flags(lambda: fn(maxnreg=cap), BLOCK128_SPLIT=tq.split_table(split), MAXNREG=dict(ONE_PIECE_CAPS))

    return _launch_grid("128x128 slices", [T, K, N], _block128_calls(T, K, N, dev),
                        ("w_fwd", "wt_bwd", "wt_bwd_sr", "xt_bwd", "xt_bwd_sr"), (*SPLIT_LAUNCHES, ("default", None)),
                        launch, "s{}c{}", SPLIT_LAUNCHES[0], dev, timing)


#: (row slices, warps) of the ``slicewarps`` section's sliced 128×128 launches (uncapped; 4 warps is the default)
SLICE_WARPS = ((4, 4), (4, 8), (2, 8), (8, 4), (8, 8))


def bench_split_warps(T: int, K: int, N: int, dev: str, timing: dict) -> dict:
    """The sliced 128×128-block calls (W forward; Ŵᵀ, X̂ᵀ with SR; X̂ᵀ RTN) under each (slices, warps) of
    :data:`SLICE_WARPS` (``triton_quant.BLOCK128_SPLIT_WARPS``), interleaved, each launch's outputs checked bitwise
    against the one-piece tile's (one slice)."""
    def launch(fn, split, warps):
        return _with_quant_flags(lambda: fn(maxnreg=0), BLOCK128_SPLIT=tq.split_table(split), BLOCK128_SPLIT_WARPS=warps)

    return _launch_grid("sliced 128x128 warps", [T, K, N], _block128_calls(T, K, N, dev),
                        ("w_fwd", "wt_bwd_sr", "xt_bwd", "xt_bwd_sr"), SLICE_WARPS, launch, "s{}w{}", (1, 4), dev,
                        timing)


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
    if result.get("in_scale"):
        row = result["in_scale"]
        lines.append(f"input scales {'x'.join(map(str, row['shape']))} (us):")
        lines += [f"    {k:18s} {v['median_ms'] * 1e3:6.1f} ±{v['spread']:.0%}" for k, v in row["figures"].items()]
    for key, ref in (("warps", "w16c0"), ("split", "s1cNone"), ("slice_warps", "the one-piece tile")):
        row = result.get(key)
        if row:
            lines.append(f"128x128 {key.replace('_', ' ')} {'x'.join(map(str, row['shape']))} "
                         f"(us; bitwise equal to {ref}: {all(row['bitwise'].values())}):")
            lines += [f"    {k:18s} {v['median_ms'] * 1e3:6.1f} ±{v['spread']:.0%}" for k, v in row["figures"].items()]
    for row in result.get("caps", []):
        f = row["figures"]
        lines.append(f"register caps {'x'.join(map(str, row['shape']))} (us; ratio to uncapped):")
        for call in dict.fromkeys(k.split("@")[0] for k in f):
            free = f[f"{call}@free"]["median_ms"]
            lines.append(f"    {call:7s} " + "  ".join(
                f"{k.split('@')[1]:>4s} {v['median_ms'] * 1e3:6.1f} ±{v['spread']:.0%} ({v['median_ms'] / free:.3f})"
                for k, v in f.items() if k.split("@")[0] == call))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and repeats (the CPU test of the code path)")
    ap.add_argument("--shapes", default=None, help="T,K,N;T,K,N... (default: the three benchmark shapes)")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--sections", default="layer,tiles,right",
                    help="comma list of: layer (the variants vs BF16), tiles (Eᵀ tiles), right (right operands), "
                         "caps (each quantizer call under each register cap), warps (the 128x128 launches under "
                         "more warps or more programs per SM), inscale (the FP8 inputs' scales per element or per row), "
                         "split (the 128x128 blocks in one tile or in row slices), slicewarps (the sliced "
                         "programs' warps)")
    ap.add_argument("--caps", default=",".join(map(str, CAPS)),
                    help="comma list of the caps section's register caps (0: uncapped, always included)")
    ap.add_argument("--variants", default=None, help=f"comma list of the layer's variants (default: all of "
                    f"{', '.join(VARIANTS)})")
    args = ap.parse_args(argv)
    try:
        caps = tuple(dict.fromkeys((0, *(int(v) for v in args.caps.split(",") if v))))
    except ValueError:
        ap.error(f"--caps wants a comma list of register caps, got {args.caps!r}")
    chosen = tuple(args.variants.split(",")) if args.variants else tuple(VARIANTS)
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    dev = args.device
    bench = B.Bench(dev)
    if args.smoke:
        shapes, variants = [(64, 64, 96)], (chosen if args.variants else ("r128_bool", "r1_bits"))
        timing = dict(min_reps=2, min_seconds=0.0, chunk_seconds=0.0, settle_seconds=0.0)
    else:
        shapes = ([tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";")] if args.shapes
                  else list(B.LINEAR_SHAPES))
        timing, variants = {}, chosen
    result = {"meta": B.meta(["layer_variants", *(argv if argv is not None else sys.argv[1:])], bench),
              "variants": {k: dict(zip(("right_block", "mask_bits", "stochastic", "maxnreg", "block128_split"), v))
                           for k, v in VARIANTS.items() if k in variants},
              "shapes": [], "right_operands": []}
    result["meta"]["timing"]["order"] = "interleaved (timing.time_interleaved)"
    result["gpu_before"] = B.gpu_state() if dev == "cuda" else None
    t0 = time.monotonic()
    sections = set(args.sections.split(","))
    # the one-shape sections run at the square benchmark shape (block-scaled FP8 wants multiples of 128: the smoke
    # run's layer shape has none)
    square = (128, 128, 128) if args.smoke else (16384, 4096, 4096) if (16384, 4096, 4096) in shapes else shapes[0]

    def save():
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))

    if "caps" in sections:  # first: the per-call figures are what the layer's cap variants are chosen from
        result["caps"] = []
        for T, K, N in [square] if args.smoke else shapes:
            result["caps"].append(bench_caps(T, K, N, dev, timing, caps))
            bench.empty()
            save()
    one_shape = {"inscale": ("in_scale", bench_in_scale), "split": ("split", bench_block128_split),
                 "slicewarps": ("slice_warps", bench_split_warps), "warps": ("warps", bench_block128_warps)}
    for section, (key, bench_fn) in one_shape.items():
        if section in sections:
            result[key] = bench_fn(*square, dev, timing)
            bench.empty()
            save()
    for T, K, N in shapes if "layer" in sections else []:
        result["shapes"].append(bench_shape(T, K, N, dev, bench.engine, variants, timing,
                                            profile=not args.no_profile and (T, K, N) == (16384, 4096, 4096)))
        bench.empty()
        save()
    if dev == "cuda" and "tiles" in sections:
        result["tiles"] = bench_tiles(16384, 4096, dev, timing)
        save()
        # the right operands' calls under both blocks at the square shape (timed at all three shapes, the
        # 1x128 x 1x128 GEMMs were 1.48-1.52x slower at each)
        for T, K, N in [square] if "right" in sections else []:
            result["right_operands"].append(bench_right_operands(T, K, N, dev, timing))
            bench.empty()
    result["gpu_after"] = B.gpu_state() if dev == "cuda" else None
    result["wall_s"] = round(time.monotonic() - t0, 1)
    result["table"] = table(result).splitlines()
    save()
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
