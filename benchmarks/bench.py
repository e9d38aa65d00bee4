"""GPU benchmarks of the fused quantizers, the Quartet linear layer and training steps.

Models are built from explicit sizes (the ladder sizes are read from ``conf/model/*.yaml`` with OmegaConf, no Hydra
composition). What makes the figures fair:

* every figure is the median of >= 20 timed repeats AND >= 2 s of timed work (:mod:`quartet.kernels.timing`),
  recorded with p10/p90, the repeat count and the seconds timed; inputs smaller than twice the L2 are rotated;
* one denominator per run: a 1 GiB device-to-device copy (bytes read + written) for every "share of copy
  bandwidth", and the best measured BF16 GEMM as the peak for every MFU;
* both backward recipes of the Quartet layer: ``quartet`` (round-to-nearest) and ``quartet_sr`` (stochastic);
* both sides get the weight in the dtype ``quartet train`` keeps it in (float32 master weights, forward under
  bf16 autocast; :data:`WEIGHT_DTYPE`), so both pay the same per-call cast;
* the BF16 step at its best: SDPA flash attention (checked), fused AdamW, eager / ``torch.compile`` / a whole-step
  CUDA graph, with its MFU; the quantized step eager and graphed;
* ``nvidia-smi`` clocks, power and temperature before and after each section.

    python benchmarks/bench.py quant     # quantizer bandwidth / the 1 GiB copy bandwidth (x = 16384 x 4096 bf16)
    python benchmarks/bench.py linear    # linear fwd+bwd: bf16 vs quartet vs quartet_sr at the three training shapes
    python benchmarks/bench.py step      # training step (fwd + bwd + AdamW), 100M / 800M and ladder sizes, MFU
    python benchmarks/bench.py all --out F.json --budget-s 400
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from quartet.kernels.timing import MIN_REPS, MIN_SECONDS, cuda_event_chunk, input_sets, rotating, time_callable  # noqa: E402

LINEAR_SHAPES = [(16384, 2048, 8192), (16384, 8192, 2048), (16384, 4096, 4096)]
#: the paper's sizes at the benchmark's micro-batch (vocab 32000, seq 512)
MODELS = {"100m": dict(n_layer=8, d_model=1024, n_head=8), "800m": dict(n_layer=16, d_model=2048, n_head=16)}
#: the one-GPU ladder's sizes (sweeps/ladder_1gpu.yaml), read from conf/model/llama_<size>.yaml
LADDER = ("1m", "3m", "7m", "20m")
#: the weight dtype ``quartet train`` keeps (Llama is built in float32 and the step runs under bf16 autocast);
#: both the BF16 baseline and the quantized layers get it (tests/kernels/test_bench.py ties it to the model)
WEIGHT_DTYPE = torch.float32
#: the precisions benchmarked: name -> stochastic backward (None: plain BF16 under autocast)
PRECISIONS = {"bf16": None, "quartet": False, "quartet_sr": True}
#: keys every timed figure carries in the JSON
FIGURE_KEYS = ("median_ms", "p10_ms", "p90_ms", "n", "total_s", "spread")
#: keys the JSON's "meta" carries
META_KEYS = ("command", "argv", "git_commit", "torch", "triton", "cuda", "device", "capability", "time", "timing")
#: how the JSON's ``meta.command`` and the error lines name this script
PROG = "benchmarks/bench.py"


def _log(msg: str) -> None:
    print(msg, flush=True)


class Bench:
    """What every section shares: device, timing minima, the run's ceilings, the time budget."""

    def __init__(self, device: str = "cuda", min_reps: int = MIN_REPS, min_seconds: float = MIN_SECONDS,
                 budget_s: float | None = None, engine: str | None = None):
        self.dev = device
        self.cuda = device == "cuda"
        self.min_reps, self.min_seconds = min_reps, min_seconds
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        #: the Quartet layer's GEMM engine: FP8 tensor cores on a GPU; bf16 GEMMs in the CPU smoke run
        self.engine = engine or ("hopper_fp8" if self.cuda else "triton")
        self.copy_GBps: float | None = None
        #: called after each section and each step model: writes the JSON so far (a run cut short keeps it)
        self.checkpoint = lambda: None
        self.peak_tflops: float | None = None
        if self.cuda:
            props = torch.cuda.get_device_properties(0)
            self.l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
        else:
            self.l2 = 32 * 2**20

    def time(self, fn) -> dict:
        """One figure of ``fn`` as a JSON dict (median, p10, p90, n, seconds timed, spread)."""
        run = cuda_event_chunk if self.cuda else _host_chunk
        return time_callable(fn, min_reps=self.min_reps, min_seconds=self.min_seconds, run_chunk=run).as_dict()

    def left_s(self) -> float:
        """Seconds left of ``--budget-s`` (inf without a budget)."""
        return math.inf if self.budget_s is None else self.budget_s - (time.monotonic() - self.t0)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def empty(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()


def _host_chunk(fn, k: int) -> list:
    """The CPU smoke run's clock (host time per call); GPU figures always use CUDA events."""
    out = []
    for _ in range(k):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def gpu_state() -> dict:
    """SM clock, its maximum, power draw and limit, temperature (``nvidia-smi``), or why they are missing."""
    fields = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:200], "time": time.time()}
    lines = [ln for ln in out.stdout.strip().splitlines() if ln.strip()]
    if out.returncode or len(lines) < 2:
        return {"error": (out.stderr or out.stdout).strip()[:200], "time": time.time()}
    names = [h.strip() for h in lines[0].split(",")]
    gpus = [dict(zip(names, (v.strip() for v in ln.split(",")))) for ln in lines[1:]]
    return {"time": time.time(), "gpus": gpus}


def _section(bench: Bench, name: str, fn, result: dict) -> None:
    """Run one section, ``fn(entry)``, bracketed by ``nvidia-smi`` readings; an error is recorded, not raised (the
    JSON of the other sections must survive a single device call). ``entry`` is already in ``result`` while the
    section runs, so a section may fill it as it goes (checkpoints then see its progress)."""
    _log(f"{name}:")
    entry = {"gpu_before": gpu_state()}
    result[name] = entry
    t = time.monotonic()
    try:
        entry.update(fn(entry))
    except Exception as exc:  # noqa: BLE001 - recorded in the JSON and printed
        entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
        _log(f"  {name} failed: {entry['error']}")
    entry["wall_s"] = round(time.monotonic() - t, 1)
    entry["gpu_after"] = gpu_state()
    bench.empty()
    bench.checkpoint()


# ------------------------------------------------------------------------------------------ ceilings
def bench_ceilings(bench: Bench, copy_bytes: int = 2**30, gemm=(8192, 8192, 8192)) -> dict:
    """The run's two denominators: a large device-to-device copy (bytes read + written) and the best BF16 GEMM.

    ``copy_bytes`` is the size of the copied tensor (1 GiB by default: far larger than any L2, so the copy streams
    from memory); the GEMMs are ``gemm`` and the three linear shapes' forward products, random normal bf16 inputs
    (never zeros, which run faster)."""
    dev = bench.dev
    n = copy_bytes // 2
    x = torch.randn(n, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    t = bench.time(lambda: y.copy_(x))
    copy = {**t, "bytes": 2 * copy_bytes, "GBps": 2 * copy_bytes / t["median_ms"] / 1e6}
    del x, y
    bench.empty()
    gemms = {}
    shapes = [gemm] + [(T, K, N) for T, K, N in LINEAR_SHAPES] if bench.cuda else [gemm]
    for M, K, N in shapes:
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        b = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
        t = bench.time(lambda a=a, b=b: a @ b.t())
        gemms[f"{M}x{K}x{N}"] = {**t, "TFLOPs": 2 * M * K * N / t["median_ms"] / 1e9}
        del a, b
    bench.copy_GBps = copy["GBps"]
    bench.peak_tflops = max(g["TFLOPs"] for g in gemms.values())
    _log(f"  copy {copy_bytes / 2**30:.2f} GiB: {bench.copy_GBps:.0f} GB/s (read + written) | "
         f"BF16 GEMM peak {bench.peak_tflops:.0f} TFLOP/s")
    return {"copy": copy, "bf16_gemm": gemms, "copy_GBps": bench.copy_GBps, "peak_bf16_TFLOPs": bench.peak_tflops}


# --------------------------------------------------------------------------------------------- quant
def quant_recipes(n: int, signs, all_recipes: bool = False) -> dict:
    """Quantizer recipes: name -> (``mx_quantize`` keywords, bytes that must move for ``n`` bf16 inputs).

    The default set is what the speed targets and the fused layer need (forward QuEST + mask, backward SR, and
    the block-scaled FP8 calls of one layer step); ``all_recipes`` adds the row-scaled FP8 and MX-code outputs."""
    sb = 4 * n // 128  # float32 scales of 1x128 blocks
    L1, R128 = dict(fp8="e4m3", fp8_block=1, deq=False), dict(fp8="e4m3", fp8_block=128, deq=False)
    r = {
        "fwd_quest_mask_deq_bf16": (dict(rule="quest", mask=True), 2 * n + 2 * n + n),
        "bwd_sr_absmax_deq_bf16": (dict(rule="absmax", stochastic=True, signs=signs), 2 * n + 2 * n),
        "fwd_quest_mask_fp8_block1x128": (dict(rule="quest", mask=True, **L1), 2 * n + n + n + sb),
        "fwd_quest_mask_fp8_block128x128": (dict(rule="quest", mask=True, **R128), 2 * n + n + n),
        "bwd_rtn_absmax_fp8_block1x128": (dict(rule="absmax", signs=signs, **L1), 2 * n + n + sb),
        "bwd_sr_absmax_fp8_block1x128": (dict(rule="absmax", stochastic=True, signs=signs, **L1), 2 * n + n + sb),
        "bwd_rtn_absmax_fp8_block1x128_transposed": (dict(rule="absmax", signs=signs, axis=0, **L1), 2 * n + n + sb),
        "bwd_sr_absmax_fp8_block1x128_transposed": (dict(rule="absmax", stochastic=True, signs=signs, axis=0, **L1),
                                                    2 * n + n + sb),
    }
    if all_recipes:
        r.update({
            "fwd_quest_mask_fp8_e4m3_row": (dict(rule="quest", mask=True, deq=False, fp8="e4m3", row_exp="fused"),
                                            2 * n + n + n),
            "bwd_sr_absmax_fp8_e4m3_row": (dict(rule="absmax", stochastic=True, signs=signs, deq=False, fp8="e4m3",
                                                row_exp="fused"), 2 * n + n),
            "bwd_sr_absmax_deq_bf16_transposed": (dict(rule="absmax", stochastic=True, signs=signs, axis=0),
                                                  2 * n + 2 * n),
            "fwd_quest_mx_codes": (dict(rule="quest", mask=True, deq=False, mx=True), 2 * n + n // 2 + n // 32 + n),
        })
    return r


def bench_quant(bench: Bench, rows: int = 16384, cols: int = 4096, all_recipes: bool = False) -> dict:
    """Each recipe's time, bytes moved, and share of the run's large-copy bandwidth."""
    from quartet.kernels.triton_quant import mx_quantize

    dev = bench.dev
    n = rows * cols
    sets = input_sets(2 * n, bench.l2)
    xs = [torch.randn(rows, cols, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    signs = (torch.randint(0, 2, (32,), device=dev) * 2 - 1).float()
    # on a GPU each call is a CUDA graph: one quantizer call launched from Python costs the host more than the
    # ~100 µs the kernel takes, so eager figures time the launch (on an H100 every eager call took 205-230 µs whatever
    # the kernel; the same calls graphed 40-204 µs at ±1-2%). A graph replays the same SR seed; the kernel's speed does
    # not depend on it. Off the GPU (the smoke run) the calls stay eager, each with a fresh seed.
    out = {"shape": [rows, cols], "input_sets": sets, "copy_GBps": bench.copy_GBps, "graphed": bench.cuda,
           "recipes": {}}
    for name, (kw, nbytes) in quant_recipes(n, signs, all_recipes).items():
        seed = [0]

        def one(x, kw=kw):
            seed[0] += 1  # a fresh SR stream per call, as training draws
            return mx_quantize(x, seed=seed[0], **kw)

        fns = [lambda x=x: one(x) for x in xs]
        t = bench.time(rotating([_graph(f) for f in fns] if bench.cuda else fns))
        bw = nbytes / t["median_ms"] / 1e6
        share = bw / bench.copy_GBps if bench.copy_GBps else None
        out["recipes"][name] = {**t, "bytes": nbytes, "GBps": bw, "share_of_copy": share}
        _log(f"  quant {name:42s} {t['median_ms'] * 1e3:8.1f} us (±{t['spread']:.1%})  {bw:7.0f} GB/s"
             + (f"  {share:6.1%} of copy" if share else ""))
    return out


# -------------------------------------------------------------------------------------------- linear
def build_linears(K: int, N: int, device, engine: str = "hopper_fp8", graph_safe: bool = False, seed: int = 0):
    """The layers compared at one shape: precision name -> module, every weight a copy of the same draw in
    :data:`WEIGHT_DTYPE` (what training keeps). ``bf16`` is a plain bias-free ``nn.Linear`` run under autocast;
    ``quartet`` / ``quartet_sr`` are :class:`~quartet.kernels.linear.QuartetLinear` with RTN / SR backward."""
    from quartet.kernels.linear import QuartetLinear

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * K ** -0.5
    layers = {}
    for name, sr in PRECISIONS.items():
        if sr is None:
            lin = torch.nn.Linear(K, N, bias=False, device=device, dtype=WEIGHT_DTYPE)
        else:
            lin = QuartetLinear(K, N, engine=engine, stochastic=sr, device=device, dtype=WEIGHT_DTYPE,
                                graph_safe=graph_safe)
        with torch.no_grad():
            lin.weight.copy_(w)
        layers[name] = lin
    return layers


def _graph(fn, params=()):
    """Capture ``fn`` (a forward + backward) in a CUDA graph; returns the replay callable.

    Gradients of ``params`` are reset before capture so the graph writes them (no accumulation)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            for p in params:
                p.grad = None
            fn()
    torch.cuda.current_stream().wait_stream(s)
    for p in params:
        p.grad = None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def _autocast(dev: str):
    # cache off: a CUDA graph must not keep autocast's cast of the weight from capture time; training's cache
    # never serves a second use either (one use per weight per autocast region)
    return torch.autocast(dev, dtype=torch.bfloat16, cache_enabled=False)


def bench_linear(bench: Bench, shapes=LINEAR_SHAPES, graphs: bool = True, profile: bool = True) -> dict:
    """Linear fwd+bwd under bf16 autocast, fp32 weights on every side: bf16 vs quartet (RTN) vs quartet_sr (SR),
    eager and CUDA-graphed, plus the GEMMs alone and the quantizer calls of one step (where the time goes)."""
    from quartet.kernels import gemm as G
    from quartet.kernels.linear import MASK_BITS
    from quartet.kernels.triton_quant import masked_inverse_hadamard, mx_quantize

    dev = bench.dev
    res = []
    modes = ("eager", "graph") if graphs and bench.cuda else ("eager",)
    for T, K, N in shapes:
        torch.manual_seed(0)
        sets = input_sets(2 * T * K + 2 * T * N, bench.l2)
        xs = [torch.randn(T, K, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(sets)]
        es = [torch.randn(T, N, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
        row = {"shape": [T, K, N], "input_sets": sets, "weight_dtype": str(WEIGHT_DTYPE), "engine": bench.engine,
               "autocast": "bf16", "flops": 6 * T * K * N, "figures": {}}
        for mode in modes:
            layers = build_linears(K, N, dev, bench.engine, graph_safe=mode == "graph")
            for name, lin in layers.items():
                def step(x, e, lin=lin):
                    x.grad = lin.weight.grad = None  # as zero_grad(set_to_none=True): no accumulation kernels
                    with _autocast(dev):
                        y = lin(x)
                    y.backward(e)

                fns = [lambda x=x, e=e: step(x, e) for x, e in zip(xs, es)]
                if mode == "graph":
                    fns = [_graph(f, (x, lin.weight)) for f, x in zip(fns, xs)]
                t = bench.time(rotating(fns))
                t["TFLOPs"] = row["flops"] / t["median_ms"] / 1e9
                row["figures"][f"{name}_{mode}"] = t
                if name != "bf16" and mode == "eager" and bench.engine == "hopper_fp8":
                    lin.state.flushed = None
                    step(xs[0], es[0])
                    bench.sync()
                    row[f"{name}_flushed_per_step"] = int(lin.state.flushed.item()) if lin.state.flushed is not None else 0
                if profile and (T, K, N) == (16384, 4096, 4096) and mode == "eager" and name != "bf16" and bench.cuda:
                    row[f"{name}_profile"] = _profile(lambda: step(xs[0], es[0]))
            for name in PRECISIONS:
                if name != "bf16":
                    f = row["figures"]
                    row[f"{name}_{mode}_ratio"] = f[f"{name}_{mode}"]["median_ms"] / f[f"bf16_{mode}"]["median_ms"]
            del layers
            bench.empty()
        x, e = xs[0].detach(), es[0]
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * K ** -0.5
        # the three GEMMs alone: BF16 on MXFP4-valued data (BF16 runs faster on such data) vs block-scaled FP8
        xq, wq, eq = (mx_quantize(x, rule="quest").deq, mx_quantize(w, rule="quest").deq,
                      mx_quantize(e, rule="absmax").deq)
        row["figures"]["bf16_gemms"] = bench.time(lambda: (xq @ wq.t(), eq @ wq, eq.t() @ xq))
        L1, R128 = dict(fp8="e4m3", fp8_block=1, deq=False), dict(fp8="e4m3", fp8_block=128, deq=False)
        mk = dict(mask=True, mask_bits=MASK_BITS)  # the masks as the layer saves them
        c1, d1 = mx_quantize(x, rule="quest", **mk, **L1), mx_quantize(w, rule="quest", **mk, **R128)
        if bench.engine == "hopper_fp8":
            c2, d2 = mx_quantize(e, rule="absmax", **L1), mx_quantize(w, rule="absmax", axis=0, **R128)
            c3, d3 = mx_quantize(e, rule="absmax", axis=0, **L1), mx_quantize(x, rule="absmax", axis=0, **R128)
            row["figures"]["fp8_gemms"] = bench.time(
                lambda: (G.hopper_fp8_mm(c1, d1), G.hopper_fp8_mm(c2, d2), G.hopper_fp8_mm(c3, d3)))
            row["gemm_only_ratio"] = row["figures"]["fp8_gemms"]["median_ms"] / row["figures"]["bf16_gemms"]["median_ms"]
        # the six block-scaled quantizer calls of one step (backward ones read the saved FP8 X̂ / Ŵ) and the two
        # masked inverse rotations
        for sr in (False, True):
            kw = dict(rule="absmax", stochastic=sr)
            row["figures"][f"quantizers_{'sr' if sr else 'rtn'}"] = bench.time(lambda kw=kw: (
                mx_quantize(x, rule="quest", **mk, **L1),
                mx_quantize(w, rule="quest", **mk, **R128),
                mx_quantize(e, seed=1, **kw, **L1),
                mx_quantize(d1.fp8, axis=0, seed=2, in_scale=d1.block_scale, in_scale_rows=128, **kw, **R128),
                mx_quantize(e, axis=0, seed=3, **kw, **L1),
                mx_quantize(c1.fp8, axis=0, seed=4, in_scale=c1.block_scale, in_scale_rows=1, **kw, **R128)))
        mxk = c1.mask_bits if MASK_BITS else c1.mask
        g = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
        row["figures"]["inverse_rotation"] = bench.time(lambda: masked_inverse_hadamard(g, mxk))
        f = row["figures"]
        _log(f"  linear {T}x{K}x{N}: " + " | ".join(
            f"{m}: bf16 {f[f'bf16_{m}']['median_ms']:.3f} ms, quartet {row[f'quartet_{m}_ratio']:.3f}x, "
            f"quartet_sr {row[f'quartet_sr_{m}_ratio']:.3f}x" for m in modes))
        res.append(row)
        del xs, es, x, e, w
        bench.empty()
    return {"modes": list(modes), "shapes": res}


def _profile(fn, top: int = 14) -> list[dict]:
    """CUDA time per kernel name of a few calls of ``fn`` (torch.profiler), largest first, followed by the aten ops
    that launched GPU work, with their input shapes (``op`` rows show work that kernel names hide, such as a zero
    fill and a copy around a GEMM). Ops nest (``aten::zeros`` holds ``aten::zero_`` holds
    ``aten::fill_``), so op rows overlap one another; kernel rows do not."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    rows, ops = [], []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0 and ev.device_type.name == "CUDA":
            rows.append({"kernel": ev.key[:90], "us_per_call_of_fn": t / 5, "count": ev.count // 5})
    for ev in prof.key_averages(group_by_input_shape=True):
        t = getattr(ev, "device_time_total", None) or 0
        if t > 0 and ev.device_type.name == "CPU" and ev.key.startswith("aten::"):
            ops.append({"op": ev.key[:60], "shapes": str(ev.input_shapes)[:160], "us_per_call_of_fn": t / 5,
                        "count": ev.count // 5})
    rows.sort(key=lambda r: -r["us_per_call_of_fn"])
    ops.sort(key=lambda r: -r["us_per_call_of_fn"])
    for r in rows[:top]:
        _log(f"    {r['us_per_call_of_fn']:9.1f} us  x{r['count']:<3d} {r['kernel']}")
    for r in ops[:top]:
        _log(f"    {r['us_per_call_of_fn']:9.1f} us  x{r['count']:<3d} {r['op']} {r['shapes']}")
    return rows[:top] + ops[:top]


# ---------------------------------------------------------------------------------------------- step
def model_spec(name: str) -> dict:
    """Sizes of a step model: ``100m`` / ``800m`` (paper sizes, 32 x 512 tokens, vocab 32000) or a ladder size
    (``1m`` ...: layers, width, heads, batch from ``conf/model/llama_<name>.yaml``, vocab from
    ``conf/data/pycode.yaml``, each file read on its own with OmegaConf)."""
    if name in MODELS:
        return {**MODELS[name], "ffn_multiple_of": 256, "seq": 512, "batch": 32, "vocab": 32000}
    if name == "smoke":  # the CPU smoke run's model (Triton interpreter): no figure to quote
        return {"n_layer": 1, "d_model": 128, "n_head": 2, "ffn_multiple_of": 128, "seq": 32, "batch": 2, "vocab": 256}
    path = REPO / "conf" / "model" / f"llama_{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown step model {name!r}: not in {sorted(MODELS)} and no {path}")
    cfg = OmegaConf.load(path)
    vocab = int(OmegaConf.load(REPO / "conf" / "data" / "pycode.yaml").vocab_size)
    return {"n_layer": int(cfg.n_layer), "d_model": int(cfg.d_model), "n_head": int(cfg.n_head),
            "ffn_multiple_of": int(cfg.get("ffn_multiple_of", 256)), "seq": int(cfg.seq_len),
            "batch": int(cfg.batch_size), "vocab": vocab}


def _build_model(spec: dict, precision: str, device, engine: str, graph_safe: bool = False):
    """The Llama of ``spec`` in :data:`WEIGHT_DTYPE`, its block linears replaced by the fused layer for a
    quantized ``precision`` (weights shared)."""
    from quartet.kernels.linear import QuartetLinear
    from quartet.model import BlockLinear, Llama

    torch.manual_seed(0)
    model = Llama(spec["n_layer"], spec["d_model"], spec["n_head"], spec["vocab"], spec["seq"],
                  ffn_multiple_of=spec["ffn_multiple_of"], device=device)
    sr = PRECISIONS[precision]
    if sr is not None:
        for mod in list(model.modules()):
            for cname, child in list(mod.named_children()):
                if isinstance(child, BlockLinear):
                    setattr(mod, cname, QuartetLinear.from_linear(child, engine=engine, stochastic=sr,
                                                                  graph_safe=graph_safe))
    return model


def step_flops(spec: dict, model) -> int:
    """Model FLOPs of one training step: 6 x (block linears + lm_head) x tokens + causal attention
    6 x layers x seq x width x tokens (forward + backward, recomputation not counted)."""
    tokens = spec["batch"] * spec["seq"]
    matmul = model.num_params(non_embedding=True) + model.lm_head.weight.numel()
    matmul -= sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    return 6 * matmul * tokens + 6 * spec["n_layer"] * spec["seq"] * spec["d_model"] * tokens


def _flash_check(model, idx, dev) -> str:
    """'flash' when the model's attention runs under SDPA's flash backend alone, else why not."""
    if dev != "cuda":
        return "not checked (CPU)"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with torch.no_grad(), _autocast(dev), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            model(idx[:1], idx[:1])
        return "flash"
    except RuntimeError as exc:
        return f"flash unavailable: {str(exc).splitlines()[0][:200]}"


def _step_fn(bench: Bench, spec: dict, precision: str, mode: str):
    """(step callable, model) of one configuration: ``eager``, ``compile`` (torch.compile, default mode) or
    ``graph`` (the whole step — forward, backward, fused AdamW — captured in one CUDA graph)."""
    dev = bench.dev
    model = _build_model(spec, precision, dev, bench.engine, graph_safe=mode == "graph")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=bench.cuda, capturable=mode == "graph")
    g = torch.Generator(device=dev).manual_seed(0)
    idx = torch.randint(0, spec["vocab"], (spec["batch"], spec["seq"]), device=dev, generator=g)
    run = torch.compile(model) if mode == "compile" else model

    def step():
        with _autocast(dev):
            loss = run(idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if mode != "graph":
        return step, model, idx
    if precision != "bf16":
        from quartet.kernels.triton_quant import prepare_device

        prepare_device(dev)

    def body():  # the optimizer's zero_grad stays outside: the graph rewrites the same gradient memory
        with _autocast(dev):
            loss = run(idx, idx)
        loss.backward()
        opt.step()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            body()
    torch.cuda.current_stream().wait_stream(s)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph.replay, model, idx


def bench_step(bench: Bench, models=("800m", "100m") + LADDER, modes=("eager", "compile", "graph"),
               compile_quantized: bool = False, live: dict | None = None) -> dict:
    """One optimizer step (fwd + bwd + fused AdamW, bf16 autocast, fp32 master weights) per precision and mode:
    median, spread, tokens/s, peak memory, MFU against the run's BF16 GEMM peak; ratios to BF16 in the same mode
    and to BF16's best mode. ``compile`` runs BF16 only unless ``compile_quantized`` (the eager fused layer is
    excluded from tracing, so compiling a quantized model mostly measures graph breaks). ``live``: a dict that
    holds the rows as they are measured (the section's JSON entry)."""
    res = []
    out = live if live is not None else {}
    out.update(modes=list(modes), models=res)
    for name in models:
        if bench.left_s() < 30:
            res.append({"model": name, "skipped": f"time budget ({bench.budget_s} s) spent"})
            _log(f"  step {name}: skipped (budget)")
            continue
        spec = model_spec(name)
        row = {"model": name, **spec, "tokens": spec["batch"] * spec["seq"], "figures": {}, "errors": {}}
        res.append(row)
        last_s = 20.0  # what one configuration of this model costs (build + timing), updated as they run
        for precision in PRECISIONS:
            for mode in modes:
                key = f"{precision}_{mode}"
                if (mode == "graph" and not bench.cuda) or (mode == "compile" and not bench.cuda):
                    continue
                if mode == "compile" and precision != "bf16" and not compile_quantized:
                    continue
                need = max(120.0, 2 * last_s) if mode == "compile" else 1.5 * last_s
                if bench.left_s() < need:
                    row["errors"][key] = f"skipped: {bench.left_s():.0f} s of the time budget left, ~{need:.0f} s needed"
                    continue
                t_build = time.monotonic()
                try:
                    step, model, idx = _step_fn(bench, spec, precision, mode)
                    for _ in range(2 if mode != "graph" else 0):  # compiles, allocates
                        step()
                    bench.sync()
                    row.setdefault("flops", step_flops(spec, model))
                    row.setdefault("n_params", model.num_params(non_embedding=True))
                    if precision == "bf16" and mode == "eager":
                        row["sdpa"] = _flash_check(model, idx, bench.dev)
                    build_s = time.monotonic() - t_build
                    if bench.cuda:
                        torch.cuda.reset_peak_memory_stats()
                    t = bench.time(step)
                    t.update(build_s=round(build_s, 1), tokens_per_s=row["tokens"] / t["median_ms"] * 1e3)
                    if bench.peak_tflops:
                        t["MFU"] = row["flops"] / (t["median_ms"] / 1e3) / (bench.peak_tflops * 1e12)
                    if bench.cuda:
                        t["peak_GiB"] = torch.cuda.max_memory_allocated() / 2**30
                    row["figures"][key] = t
                    del step, model
                    if mode != "compile":
                        last_s = time.monotonic() - t_build
                except Exception as exc:  # noqa: BLE001 - one failing configuration must not hide the others
                    row["errors"][key] = f"{type(exc).__name__}: {exc}"[:300]
                    _log(f"  step {name} {key}: {row['errors'][key]}")
                bench.empty()
        f = row["figures"]
        bf16 = {k: v["median_ms"] for k, v in f.items() if k.startswith("bf16_")}
        if bf16:
            best = min(bf16, key=bf16.get)
            row["bf16_best"] = best
            for k, v in f.items():
                if not k.startswith("bf16_"):
                    mode = k.rsplit("_", 1)[1]
                    if f"bf16_{mode}" in f:
                        v["ratio_same_mode"] = v["median_ms"] / f[f"bf16_{mode}"]["median_ms"]
                    v["ratio_bf16_best"] = v["median_ms"] / bf16[best]
        _log(f"  step {name}: " + " | ".join(f"{k} {v['median_ms']:.2f} ms (±{v['spread']:.1%})"
                                             + (f" MFU {v['MFU']:.0%}" if "MFU" in v else "") for k, v in f.items()))
        bench.checkpoint()
    return out


# ------------------------------------------------------------------------------------------ the JSON
def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def meta(argv: list[str], bench: Bench) -> dict:
    """Provenance of a run: exact command, git commit (``QUARTET_GIT_COMMIT`` where the copy has no .git), versions,
    device, and the timing rule."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    # QUARTET_GIT_COMMIT wins: a device copy of a working tree can carry a .git whose HEAD is an older commit with
    # the newer files on top, and git's HEAD would then name the wrong commit ("dirty")
    env_commit = os.environ.get("QUARTET_GIT_COMMIT")
    head = None if env_commit else _git("rev-parse", "HEAD")
    commit = env_commit or head or "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no") if head else None
    return {
        "command": f"python {PROG} " + shlex.join(argv), "argv": [sys.executable, *sys.argv],
        "git_commit": commit, "git_dirty": None if dirty is None else bool(dirty),
        "git_commit_from": "QUARTET_GIT_COMMIT" if env_commit else ("git" if head else None),
        "torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if bench.cuda else "cpu",
        "capability": list(torch.cuda.get_device_capability()) if bench.cuda else None,
        "l2_bytes": bench.l2, "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "timing": {"min_reps": bench.min_reps, "min_seconds": bench.min_seconds,
                   "clock": "CUDA events per repeat" if bench.cuda else "host clock (CPU smoke run)",
                   "statistic": "median; p10/p90 and spread = (p90 - p10) / median"},
        "weight_dtype": str(WEIGHT_DTYPE), "engine": bench.engine,
    }


#: the timing rule a figure must have been taken under to be quoted (the project's benchmark floor)
QUOTABLE_RULE = {"min_reps": MIN_REPS, "min_seconds": MIN_SECONDS}


def quotable(result: dict, problems: list[str] | None = None) -> bool:
    """Whether a result's figures may be quoted: its schema is complete (no ``problems``, computed unless given)
    AND its timing rule is at least :data:`QUOTABLE_RULE`. A run with ``--min-reps 3`` is internally consistent (no
    problems) but not quotable: ``check_result`` judges figures against the run's own rule, this against the
    project's."""
    rule = result.get("meta", {}).get("timing", {})
    if problems is None:
        problems = check_result(result)
    return not problems and all(rule.get(k, 0) >= v for k, v in QUOTABLE_RULE.items())


def check_result(result: dict) -> list[str]:
    """Problems with a result's schema: missing meta keys, figures without their spread or below the timing
    minima. Empty when the JSON is complete."""
    problems = [f"meta lacks {k}" for k in META_KEYS if k not in result.get("meta", {})]
    rule = result.get("meta", {}).get("timing", {})

    def walk(node, path):
        if isinstance(node, dict):
            if "median_ms" in node:
                problems.extend(f"{path} lacks {k}" for k in FIGURE_KEYS if k not in node)
                if node.get("n", 0) < rule.get("min_reps", 0):
                    problems.append(f"{path}: {node.get('n')} repeats < {rule['min_reps']}")
                if node.get("total_s", 0) < rule.get("min_seconds", 0):
                    problems.append(f"{path}: {node.get('total_s')} s timed < {rule['min_seconds']}")
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else k)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk({k: v for k, v in result.items() if k != "meta"}, "")
    for name in ("ceilings", "quant", "linear", "step"):
        sec = result.get(name)
        if sec is not None and not {"gpu_before", "gpu_after"} <= set(sec):
            problems.append(f"{name} lacks its nvidia-smi readings")
    return problems


def summary_table(result: dict) -> str:
    """The short table printed last: ceilings, quantizer shares, linear and step ratios with their spread."""
    lines = []
    c = result.get("ceilings", {})
    if "copy_GBps" in c:
        lines.append(f"copy {c['copy_GBps']:.0f} GB/s | BF16 GEMM peak {c['peak_bf16_TFLOPs']:.0f} TFLOP/s")
    for name, r in result.get("quant", {}).get("recipes", {}).items():
        share = f"{r['share_of_copy']:.0%}" if r.get("share_of_copy") else "-"
        lines.append(f"quant {name:42s} {r['median_ms'] * 1e3:7.1f} us ±{r['spread']:.0%}  {share} of copy")
    for row in result.get("linear", {}).get("shapes", []):
        f = row["figures"]
        for m in result["linear"]["modes"]:
            b = f[f"bf16_{m}"]
            cells = [f"bf16 {b['median_ms']:.3f} ms ±{b['spread']:.0%}"]
            for p in ("quartet", "quartet_sr"):
                q = f[f"{p}_{m}"]
                cells.append(f"{p} {q['median_ms'] / b['median_ms']:.2f}x ±{q['spread']:.0%}")
            lines.append(f"linear {'x'.join(map(str, row['shape'])):17s} {m:5s} " + "  ".join(cells))
    for row in result.get("step", {}).get("models", []):
        if "skipped" in row:
            lines.append(f"step {row['model']:5s} skipped: {row['skipped']}")
            continue
        f = row["figures"]
        cells = []
        for k, v in f.items():
            rel = f" {v['ratio_bf16_best']:.2f}x best" if "ratio_bf16_best" in v else ""
            mfu = f" MFU {v['MFU']:.0%}" if "MFU" in v else ""
            cells.append(f"{k} {v['median_ms']:.1f} ms ±{v['spread']:.0%}{mfu}{rel}")
        lines.append(f"step {row['model']:5s} " + " | ".join(cells))
        lines.extend(f"step {row['model']:5s} {k}: {v}" for k, v in row.get("errors", {}).items())
    return "\n".join(lines)


def cli_main(argv: list[str] | None = None) -> int:
    """``python benchmarks/bench.py {ceilings,quant,linear,step,all} [--out FILE] ...``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("section", choices=["ceilings", "quant", "linear", "step", "all"])
    p.add_argument("--out", type=Path, default=None, help="JSON file (default benchmarks/results/<gpu>-<section>.json)")
    p.add_argument("--models", default="800m,100m," + ",".join(LADDER),
                   help="comma list of step models (100m, 800m, or ladder sizes 1m, 3m, 7m, 20m, ...)")
    p.add_argument("--modes", default="eager,compile,graph", help="step modes (eager, compile, graph)")
    p.add_argument("--compile-quantized", action="store_true", help="also torch.compile the quantized models")
    p.add_argument("--no-linear-graphs", action="store_true", help="linear: eager only")
    p.add_argument("--all-recipes", action="store_true", help="quant: also the row-scaled FP8 and MX-code outputs")
    p.add_argument("--min-reps", type=int, default=MIN_REPS,
                   help=f"timed repeats per figure, at least (default {MIN_REPS})")
    p.add_argument("--min-seconds", type=float, default=MIN_SECONDS,
                   help=f"seconds of timed work per figure, at least (default {MIN_SECONDS})")
    p.add_argument("--budget-s", type=float, default=None,
                   help="skip step models (and compiles) once this many seconds have passed")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: a smoke run of the script on tiny shapes (Triton interpreter), no figures to quote")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"{PROG}: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    if args.min_reps < 1 or args.min_seconds < 0:
        print(f"{PROG}: --min-reps must be >= 1 and --min-seconds >= 0", file=sys.stderr)
        return 2
    models = tuple(m for m in args.models.split(",") if m)
    try:
        for m in models:
            model_spec(m)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    bench = Bench(args.device, args.min_reps, args.min_seconds, args.budget_s)
    tiny = args.device == "cpu"
    result = {"meta": meta(argv, bench)}
    out = args.out or Path("benchmarks/results") / f"{result['meta']['device'].replace(' ', '_')}-{args.section}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def write():
        result["problems"] = check_result(result)
        result["quotable"] = quotable(result, result["problems"])
        result["table"] = summary_table(result).splitlines()
        out.write_text(json.dumps(result, indent=1))

    bench.checkpoint = write
    sec = args.section
    # the denominators come first in every run: no section divides by a figure from another run
    _section(bench, "ceilings", lambda _: bench_ceilings(bench, copy_bytes=2**20 if tiny else 2**30,
                                                       gemm=(128, 128, 128) if tiny else (8192, 8192, 8192)), result)
    if sec in ("quant", "all"):
        _section(bench, "quant", lambda _: bench_quant(bench, *((128, 128) if tiny else (16384, 4096)),
                                                     all_recipes=args.all_recipes), result)
    if sec in ("linear", "all"):
        _section(bench, "linear", lambda _: bench_linear(bench, [(128, 128, 256)] if tiny else LINEAR_SHAPES,
                                                       graphs=not args.no_linear_graphs), result)
    if sec in ("step", "all"):
        _section(bench, "step", lambda live: bench_step(bench, models, tuple(args.modes.split(",")),
                                                        args.compile_quantized, live), result)
    write()
    _log(f"wrote {out}")
    for pr in result["problems"]:
        _log(f"problem: {pr}")
    if not result["quotable"]:
        _log(f"not quotable: the timing rule is below {QUOTABLE_RULE} or the JSON has problems")
    _log("\n".join(result["table"]))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cli_main())
