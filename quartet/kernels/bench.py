"""``quartet bench`` — GPU benchmarks of the fused quantizers, the Quartet linear layer and training steps.

Runs with only torch + triton (no hydra): models are built from explicit sizes. Every section writes
medians of ``triton.testing.do_bench`` (CUDA events, warm-up excluded) and the ratios taken in the
same run into one JSON file (default ``benchmarks/results/<device>-<section>.json``).

    quartet bench quant            # quantizer bandwidth vs device copy bandwidth (x = 16384 x 4096 bf16)
    quartet bench linear           # linear fwd+bwd vs BF16 at the three training shapes (GEMM-only and end to end)
    quartet bench step             # full training step of the 100M and 800M models vs BF16 (tokens/s, memory)
    quartet bench all --out F.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

LINEAR_SHAPES = [(16384, 2048, 8192), (16384, 8192, 2048), (16384, 4096, 4096)]
MODELS = {"100m": dict(n_layer=8, d_model=1024, n_head=8), "800m": dict(n_layer=16, d_model=2048, n_head=16)}


def _bench(fn, warmup=25, rep=100) -> float:
    """Median milliseconds of ``fn`` (CUDA events)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def _graph(fn, params=()):
    """Capture ``fn`` (a layer's forward + backward) in a CUDA graph; returns the replay callable.

    Gradients of ``params`` are reset before capture so the graph writes them (no accumulation).
    """
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


def _log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------- quant
def bench_quant(rows: int = 16384, cols: int = 4096, sweep: bool = False) -> dict:
    """Each recipe's time and bytes moved over the device copy bandwidth (same tensor, same run)."""
    import quartet.kernels.triton_quant as TQ
    from quartet.kernels.triton_quant import mx_quantize

    dev = "cuda"
    x = torch.randn(rows, cols, device=dev, dtype=torch.bfloat16)
    n = x.numel()
    y = torch.empty_like(x)
    t_copy = _bench(lambda: y.copy_(x))
    copy_bw = 4 * n / t_copy / 1e6  # GB/s, bytes read + written
    signs = (torch.randint(0, 2, (32,), device=dev) * 2 - 1).float()
    recipes = {
        # name: (kwargs, bytes that must move)
        "fwd_quest_mask_deq_bf16": (dict(rule="quest", mask=True), 2 * n + 2 * n + n),
        "bwd_sr_absmax_deq_bf16": (dict(rule="absmax", stochastic=True, signs=signs), 2 * n + 2 * n),
        "fwd_quest_mask_fp8_e4m3": (dict(rule="quest", mask=True, deq=False, fp8="e4m3"), 2 * n + n + n),
        "bwd_sr_absmax_fp8_e4m3": (dict(rule="absmax", stochastic=True, signs=signs, deq=False, fp8="e4m3"), 2 * n + n),
        "bwd_sr_absmax_fp8_e5m2_transposed": (dict(rule="absmax", stochastic=True, signs=signs, deq=False,
                                                   fp8="e5m2", axis=0), 2 * n + n),
        "bwd_sr_absmax_deq_bf16_transposed": (dict(rule="absmax", stochastic=True, signs=signs, axis=0), 2 * n + 2 * n),
        "fwd_quest_mx_codes": (dict(rule="quest", mask=True, deq=False, mx=True), 2 * n + n // 2 + n // 32 + n),
    }
    # the one-pass FP8 fold (row_exp="fused"): one full pass + a cheap in-place fold (fp8_scaling "row")
    for name in ("fwd_quest_mask_fp8_e4m3", "bwd_sr_absmax_fp8_e4m3", "bwd_sr_absmax_fp8_e5m2_transposed"):
        kw, nbytes = recipes[name]
        recipes[name + "_fused"] = ({**kw, "row_exp": "fused"}, nbytes)
    # block-scaled FP8 written in one pass (what the fused layer runs by default); scales are n/128 floats
    sb = 4 * n // 128
    recipes.update({
        "fwd_quest_mask_fp8_block1x128": (dict(rule="quest", mask=True, deq=False, fp8="e4m3", fp8_block=1),
                                          2 * n + n + n + sb),
        "fwd_quest_mask_fp8_block128x128": (dict(rule="quest", mask=True, deq=False, fp8="e4m3", fp8_block=128),
                                            2 * n + n + n),
        "bwd_rtn_absmax_fp8_block1x128": (dict(rule="absmax", signs=signs, deq=False, fp8="e4m3", fp8_block=1),
                                          2 * n + n + sb),
        "bwd_sr_absmax_fp8_block1x128": (dict(rule="absmax", stochastic=True, signs=signs, deq=False, fp8="e4m3",
                                              fp8_block=1), 2 * n + n + sb),
        "bwd_rtn_absmax_fp8_block1x128_transposed": (dict(rule="absmax", signs=signs, deq=False, fp8="e4m3",
                                                          fp8_block=1, axis=0), 2 * n + n + sb),
        "bwd_rtn_absmax_fp8_block128x128_transposed": (dict(rule="absmax", signs=signs, deq=False, fp8="e4m3",
                                                            fp8_block=128, axis=0), 2 * n + n),
    })
    out = {"shape": [rows, cols], "copy_ms": t_copy, "copy_GBps": copy_bw, "recipes": {}, "tiles": {}}
    if sweep:
        default = TQ.GPU_BLOCK
        for tile in [(32, 128, 4), (64, 128, 8), (16, 256, 4), (64, 64, 4), (128, 64, 8), (32, 256, 8)]:
            TQ.GPU_BLOCK = tile
            row = {}
            for name in ("fwd_quest_mask_deq_bf16", "bwd_sr_absmax_deq_bf16", "bwd_sr_absmax_fp8_e5m2_transposed"):
                kw, nbytes = recipes[name]
                t = _bench(lambda kw=kw: mx_quantize(x, seed=1, **kw))
                row[name] = nbytes / t / 1e6 / copy_bw
            out["tiles"][str(tile)] = row
            _log(f"  tile {tile}: " + "  ".join(f"{k} {v:.1%}" for k, v in row.items()))
        TQ.GPU_BLOCK = default
    # warps of the 128-row tiles (fp8_block=128): time 4/8/16 and keep the best for the rest of the run
    out["block128_warps"] = {}
    for w in (4, 8, 16):
        TQ.BLOCK128_WARPS = w
        out["block128_warps"][w] = {name: _bench(lambda kw=recipes[name][0]: mx_quantize(x, seed=1, **kw))
                                    for name in ("fwd_quest_mask_fp8_block128x128",
                                                 "bwd_rtn_absmax_fp8_block128x128_transposed")}
        _log(f"  128-row tiles, {w} warps: " + "  ".join(f"{k} {v * 1e3:.1f} us" for k, v in out["block128_warps"][w].items()))
    TQ.BLOCK128_WARPS = min(out["block128_warps"], key=lambda w: sum(out["block128_warps"][w].values()))
    out["block128_warps_chosen"] = TQ.BLOCK128_WARPS
    for name, (kw, nbytes) in recipes.items():
        seed = [0]

        def run(kw=kw):
            seed[0] += 1
            return mx_quantize(x, seed=seed[0], **kw)

        t = _bench(run)
        bw = nbytes / t / 1e6
        out["recipes"][name] = {"ms": t, "bytes": nbytes, "GBps": bw, "share_of_copy": bw / copy_bw}
        _log(f"  quant {name:38s} {t * 1e3:8.1f} us  {bw:7.0f} GB/s  {bw / copy_bw:6.1%} of copy")
    return out


# -------------------------------------------------------------------------------------------- linear
def bench_linear(shapes=LINEAR_SHAPES) -> dict:
    """Linear fwd+bwd: BF16 F.linear vs the fused Quartet layer (hopper_fp8 / triton engines)."""
    from quartet.kernels import gemm as G
    from quartet.kernels.linear import QuartetLinear
    from quartet.kernels.triton_quant import mx_quantize

    dev = "cuda"
    res = []
    for T, K, N in shapes:
        torch.manual_seed(0)
        x = torch.randn(T, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(N, K, device=dev) * K ** -0.5).to(torch.bfloat16).requires_grad_(True)
        e = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
        row = {"shape": [T, K, N]}

        def bf16_step():
            y = torch.nn.functional.linear(x, w)
            y.backward(e)

        row["bf16_ms"] = _bench(bf16_step)
        row["bf16_graph_ms"] = _bench(_graph(bf16_step, (x, w)))
        lin_profiled = QuartetLinear(K, N, engine="hopper_fp8", stochastic=False, device=dev)
        # BF16 on MXFP4-valued data (anchors: BF16 runs faster on such data): the three GEMMs only
        xq = mx_quantize(x.detach(), rule="quest").deq
        wq = mx_quantize(w.detach(), rule="quest").deq
        eq = mx_quantize(e, rule="absmax").deq
        row["bf16_gemms_ms"] = _bench(lambda: (xq @ wq.t(), eq @ wq, eq.t() @ xq))
        # FP8 GEMMs only on pre-quantized operands (the GEMM-only speed of the hopper_fp8 engine)
        a1, b1 = mx_quantize(x.detach(), rule="quest", fp8="e4m3"), mx_quantize(w.detach(), rule="quest", fp8="e4m3")
        a2, b2 = mx_quantize(e, rule="absmax", fp8="e4m3"), mx_quantize(w.detach(), rule="absmax", axis=0, fp8="e4m3")
        a3, b3 = mx_quantize(e, rule="absmax", axis=0, fp8="e5m2"), mx_quantize(x.detach(), rule="absmax", axis=0, fp8="e4m3")
        row["fp8_row_gemms_ms"] = _bench(lambda: (G.hopper_fp8_mm(a1, b1), G.hopper_fp8_mm(a2, b2), G.hopper_fp8_mm(a3, b3)))
        # the same with block scales (1x128 left operand, 128x128 right operand), what the layer runs
        L1, R128 = dict(fp8="e4m3", fp8_block=1), dict(fp8="e4m3", fp8_block=128)
        c1, d1 = mx_quantize(x.detach(), rule="quest", **L1), mx_quantize(w.detach(), rule="quest", **R128)
        c2, d2 = mx_quantize(e, rule="absmax", **L1), mx_quantize(w.detach(), rule="absmax", axis=0, **R128)
        c3, d3 = mx_quantize(e, rule="absmax", axis=0, **L1), mx_quantize(x.detach(), rule="absmax", axis=0, **R128)
        row["fp8_gemms_ms"] = _bench(lambda: (G.hopper_fp8_mm(c1, d1), G.hopper_fp8_mm(c2, d2), G.hopper_fp8_mm(c3, d3)))
        import quartet.kernels.linear as LIN

        default_row_exp, default_scaling = LIN.ROW_EXP, LIN.FP8_SCALING
        for engine, sr, scaling in [("hopper_fp8", False, "block"), ("hopper_fp8", True, "block"),
                                    ("hopper_fp8", False, "row"), ("triton", False, "block"), ("triton", True, "block")]:
            LIN.FP8_SCALING = scaling
            if True:
                lin = QuartetLinear(K, N, engine=engine, stochastic=sr, device=dev)
                with torch.no_grad():
                    lin.weight.copy_(w)

                def q_step(lin=lin):
                    y = lin(x)
                    y.backward(e)

                key = f"quartet_{engine}_{'sr' if sr else 'rtn'}" + ("_row" if scaling == "row" else "")
                row[key + "_ms"] = _bench(q_step)
                row[key + "_ratio"] = row[key + "_ms"] / row["bf16_ms"]
                if engine == "hopper_fp8":
                    lin.state.flushed = None
                    q_step()
                    torch.cuda.synchronize()
                    row[key + "_flushed_per_step"] = int(lin.state.flushed.item()) if lin.state.flushed is not None else 0
        LIN.ROW_EXP, LIN.FP8_SCALING = default_row_exp, default_scaling
        # the same layers captured in CUDA graphs (launch overhead removed; fresh device seeds per replay)
        for sr in (False, True):
            lin = QuartetLinear(K, N, engine="hopper_fp8", stochastic=sr, device=dev, graph_safe=True)
            with torch.no_grad():
                lin.weight.copy_(w)

            def q_step(lin=lin):
                lin(x).backward(e)

            key = f"quartet_hopper_fp8_{'sr' if sr else 'rtn'}_graph"
            row[key + "_ms"] = _bench(_graph(q_step, (x, lin.weight)))
            row[key + "_ratio"] = row[key + "_ms"] / row["bf16_graph_ms"]
        row["gemm_only_ratio"] = row["fp8_gemms_ms"] / row["bf16_gemms_ms"]
        if (T, K, N) == (16384, 4096, 4096):
            row["profile"] = _profile(lambda: (lin_profiled(x).backward(e)))
        # where the time goes: the six quantizer calls + two masked inverse rotations of one step
        from quartet.kernels.triton_quant import masked_inverse_hadamard

        mxk = torch.ones(T, K, device=dev, dtype=torch.bool)
        g = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
        row["quantizers_row_ms"] = _bench(lambda rx="fused": (
            mx_quantize(x.detach(), rule="quest", mask=True, deq=False, fp8="e4m3", row_exp=rx),
            mx_quantize(w.detach(), rule="quest", mask=True, deq=False, fp8="e4m3", row_exp=rx),
            mx_quantize(e, rule="absmax", deq=False, fp8="e4m3", row_exp=rx),
            mx_quantize(w.detach(), rule="absmax", axis=0, deq=False, fp8="e4m3", row_exp=rx),
            mx_quantize(e, rule="absmax", axis=0, deq=False, fp8="e5m2", row_exp=rx),
            mx_quantize(x.detach(), rule="absmax", axis=0, deq=False, fp8="e4m3", row_exp=rx)))
        # the six block-scaled calls of one layer step, the backward ones reading the saved FP8 X̂ / Ŵ
        row["quantizers_ms"] = _bench(lambda: (
            mx_quantize(x.detach(), rule="quest", mask=True, deq=False, **L1),
            mx_quantize(w.detach(), rule="quest", mask=True, deq=False, **R128),
            mx_quantize(e, rule="absmax", deq=False, **L1),
            mx_quantize(d1.fp8, rule="absmax", axis=0, deq=False, in_scale=d1.block_scale,
                        in_scale_rows=128, **R128),
            mx_quantize(e, rule="absmax", axis=0, deq=False, **L1),
            mx_quantize(c1.fp8, rule="absmax", axis=0, deq=False, in_scale=c1.block_scale, in_scale_rows=1, **R128)))
        row["inverse_rotations_ms"] = _bench(lambda: masked_inverse_hadamard(g, mxk))
        _log(f"  linear {T}x{K}x{N}: bf16 {row['bf16_ms']:.3f} ms | quartet hopper_fp8 rtn "
             f"{row['quartet_hopper_fp8_rtn_ms']:.3f} ms ({row['quartet_hopper_fp8_rtn_ratio']:.2f}x) | "
             f"GEMM-only fp8/bf16 {row['gemm_only_ratio']:.2f} | quantizers {row['quantizers_ms']:.3f} ms | "
             f"graphed: bf16 {row['bf16_graph_ms']:.3f} ms, quartet rtn {row['quartet_hopper_fp8_rtn_graph_ms']:.3f} ms "
             f"({row['quartet_hopper_fp8_rtn_graph_ratio']:.2f}x) sr {row['quartet_hopper_fp8_sr_graph_ratio']:.2f}x | "
             f"row-scaled {row['quartet_hopper_fp8_rtn_row_ratio']:.2f}x | sr {row['quartet_hopper_fp8_sr_ratio']:.2f}x | "
             f"triton engine {row['quartet_triton_rtn_ratio']:.2f}x")
        res.append(row)
        del x, w, e
        torch.cuda.empty_cache()
    return {"shapes": res}


def _profile(fn, top: int = 14) -> list[dict]:
    """CUDA time per kernel name of a few calls of ``fn`` (torch.profiler), largest first."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0:
            rows.append({"kernel": ev.key[:90], "us_per_call_of_fn": t / 5, "count": ev.count // 5})
    rows.sort(key=lambda r: -r["us_per_call_of_fn"])
    for r in rows[:top]:
        _log(f"    {r['us_per_call_of_fn']:9.1f} us  x{r['count']:<3d} {r['kernel']}")
    return rows[:top]


# ---------------------------------------------------------------------------------------------- step
def _convert(model, engine: str, stochastic: bool, graph_safe: bool = False):
    from quartet.kernels.linear import QuartetLinear
    from quartet.model import BlockLinear

    for name, mod in list(model.named_modules()):
        for cname, child in list(mod.named_children()):
            if isinstance(child, BlockLinear):
                setattr(mod, cname, QuartetLinear.from_linear(child, engine=engine, stochastic=stochastic,
                                                              graph_safe=graph_safe))
    return model


def _graphed_step(name: str, precision: str, batch: int, seq: int, vocab: int) -> float:
    """The same optimizer step captured whole in a CUDA graph (capturable fused AdamW, device RNG)."""
    from quartet.model import Llama

    dev = "cuda"
    torch.manual_seed(0)
    model = Llama(vocab_size=vocab, seq_len=seq, device=dev, **MODELS[name])
    if precision == "quartet":
        _convert(model, "hopper_fp8", stochastic=False, graph_safe=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True, capturable=True)
    idx = torch.randint(0, vocab, (batch, seq), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = model(idx, idx)
        loss.backward()
        opt.step()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(s)
    opt.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    ms = _bench(g.replay, warmup=50, rep=300)
    del g, model, opt
    return ms


def bench_step(models=("100m", "800m"), batch: int = 32, seq: int = 512, vocab: int = 32000,
               graphs: bool = True) -> dict:
    """One optimizer step (fwd + bwd + AdamW) under bf16 autocast, tokens/s and peak memory."""
    from quartet.model import Llama

    dev = "cuda"
    res = []
    for name in models:
        row = {"model": name, **MODELS[name], "batch": batch, "seq": seq}
        for precision in ("bf16", "quartet", "wired"):
            torch.manual_seed(0)
            model = Llama(vocab_size=vocab, seq_len=seq, device=dev, **MODELS[name])
            if precision == "quartet":
                _convert(model, "hopper_fp8", stochastic=False)
            counter = [0]
            if precision == "wired":
                # what `quartet train` runs: apply_precision (auto backend -> fused layer), set_step per step
                from quartet.quant import apply_precision, set_step
                from quartet.quant.config import PrecisionConfig

                plan = apply_precision(model, PrecisionConfig(name="quartet"), seed=0)
                row["wired_backend"], row["wired_implementation"] = plan.backend, plan.implementation
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
            idx = torch.randint(0, vocab, (batch, seq), device=dev)

            def step():
                if precision == "wired":
                    counter[0] += 1
                    set_step(model, counter[0])
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(idx, idx)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            ms = _bench(step, warmup=50, rep=300)
            row[f"{precision}_ms"] = ms
            row[f"{precision}_tokens_per_s"] = batch * seq / ms * 1e3
            row[f"{precision}_peak_GiB"] = torch.cuda.max_memory_allocated() / 2**30
            del model, opt
            torch.cuda.empty_cache()
            if graphs and precision != "wired":
                try:
                    row[f"{precision}_graph_ms"] = _graphed_step(name, precision, batch, seq, vocab)
                except Exception as exc:  # report, do not lose the eager numbers
                    row[f"{precision}_graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
                torch.cuda.empty_cache()
        row["ratio"] = row["quartet_ms"] / row["bf16_ms"]
        row["wired_ratio"] = row["wired_ms"] / row["bf16_ms"]
        _log(f"  step {name} via apply_precision ({row['wired_implementation']}, {row['wired_backend']}): "
             f"{row['wired_ms']:.1f} ms | {row['wired_ratio']:.2f}x eager bf16")
        if "quartet_graph_ms" in row and "bf16_graph_ms" in row:
            row["graph_ratio"] = row["quartet_graph_ms"] / row["bf16_graph_ms"]
            _log(f"  step {name} graphed: bf16 {row['bf16_graph_ms']:.1f} ms | quartet {row['quartet_graph_ms']:.1f} ms"
                 f" | {row['graph_ratio']:.2f}x")
        for k in ("bf16_graph_error", "quartet_graph_error"):
            if k in row:
                _log(f"  step {name} {k}: {row[k]}")
        _log(f"  step {name}: bf16 {row['bf16_ms']:.1f} ms ({row['bf16_tokens_per_s']:.0f} tok/s, "
             f"{row['bf16_peak_GiB']:.1f} GiB) | quartet {row['quartet_ms']:.1f} ms "
             f"({row['quartet_tokens_per_s']:.0f} tok/s, {row['quartet_peak_GiB']:.1f} GiB) | {row['ratio']:.2f}x")
        res.append(row)
    return {"models": res}


def _env() -> dict:
    import triton

    return {"device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def cli_main(argv: list[str] | None = None) -> int:
    """Entry point of ``quartet bench {quant,linear,step,all} [--out FILE]``."""
    p = argparse.ArgumentParser(prog="quartet bench", description=__doc__.split("\n\n")[0])
    p.add_argument("section", choices=["quant", "linear", "step", "all"])
    p.add_argument("--out", type=Path, default=None, help="JSON file (default benchmarks/results/<gpu>-<section>.json)")
    p.add_argument("--models", default="100m,800m", help="comma list of step models (100m, 800m)")
    p.add_argument("--batch", type=int, default=32, help="sequences per step for the step benchmark")
    p.add_argument("--sweep", action="store_true", help="also time the quantizers over several tile shapes")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("quartet bench: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    result = {"env": _env()}
    if args.section in ("quant", "all"):
        _log("quantizers:")
        result["quant"] = bench_quant(sweep=args.sweep)
    if args.section in ("linear", "all"):
        _log("linear layer:")
        result["linear"] = bench_linear()
    if args.section in ("step", "all"):
        _log("training step:")
        result["step"] = bench_step(tuple(args.models.split(",")), batch=args.batch)
    out = args.out or Path("benchmarks/results") / f"{torch.cuda.get_device_name().replace(' ', '_')}-{args.section}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    _log(f"wrote {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cli_main())
