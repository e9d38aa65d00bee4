"""Training-step speed of the one-GPU ladder sizes, as ``quartet train`` runs them: eager vs compiled.

For each model size and each (precision, mode) the script builds the real :class:`quartet.train.Trainer`
(same config composition, data, ``apply_precision``, fused AdamW, bf16 autocast) and times its optimizer step
``Trainer._step()`` — sampling, host-to-device copy, forward, backward, clipping, AdamW, LR schedule — which
synchronises once per step (it reads the loss), so the wall time of a step is its real cost.

Modes: ``eager``; ``compile`` (``run.compile=true``, torch.compile default mode; the fused Quartet layer traced
as registered operators); ``graphs`` (``run.compile_mode=reduce-overhead``: the compiled step replayed as CUDA
graphs); ``compile_untraced`` (compiled with the fused Quartet layer left eager between compiled regions,
``run.compile_fused=false``: how quartet ran compiled before the layer was traceable). ``fp8@reference`` is the fp8 scheme as it ran before the FP8 tensor-core layer existed (float32
fake quantization), i.e. the "before" of the fp8 rows.

Fairness: one process per model size compiles all its configurations in parallel with the others (phase 1,
CPU-bound), then the processes wait for each other and take turns on the GPU under a file lock (phase 2), so
no timing shares the GPU or the launching CPU with a compilation. Each figure: warm-up steps, then at least
20 timed steps and 2 s of work; median with the 10th/90th percentiles. Peak memory per configuration.

Memory. Every configuration of a model runs at one micro-batch: ``--micro-batch auto`` (default) takes the largest
divisor of the batch whose training estimate (:mod:`quartet.memory`, the trainer's plan) fits the GPU, as a
single run would; an ``optim.micro_batch_size=`` override or ``--micro-batch N`` fixes it. Configurations stay
alive until every one is timed, so where the estimates of all of them do not fit the GPU together each runs in a
process of its own and the processes go in waves that do (``--concurrent auto``; ``N`` forces N at a time).

    python3 benchmarks/ladder_speed.py --out benchmarks/results/ladder_speed.json
    python3 benchmarks/ladder_speed.py --models llama_1m --configs bf16:eager,quartet:compile   # a subset

Needs a CUDA GPU, the project's environment (Hydra) and prepared data (``quartet data prepare data=pycode``).
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = "llama_1m,llama_3m,llama_10m,llama_20m"
DEFAULT_CONFIGS = ("bf16:eager,bf16:compile,bf16:graphs,fp8@reference:eager,fp8:eager,fp8:compile,"
                   "quartet:eager,quartet:compile")
MODES = {"eager": ["run.compile=false"], "compile": ["run.compile=true"],
         "graphs": ["run.compile=true", "run.compile_mode=reduce-overhead"],
         # compiled, but the fused Quartet layer eager between the compiled regions (how run.compile ran it before
         # the layer became traceable): the "before" of the quartet rows
         "compile_untraced": ["run.compile=true", "run.compile_fused=false"]}


def _overrides(model: str, config: str, data: str, out_dir: str, extra: list[str], device: str) -> list[str]:
    prec_mode, _, mode = config.partition(":")
    precision, _, backend = prec_mode.partition("@")
    ov = [f"model={model}", f"precision={precision}", f"data={data}", "logging=quiet", f"run.device={device}",
          "budget=tokens", "budget.tokens=100000000000", f"run.out_dir={out_dir}", *MODES[mode], *extra]
    if backend:
        ov.append(f"precision.backend={backend}")
    return ov


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def _gpu_bytes() -> float | None:
    import torch

    return float(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None


def plan_memory(model: str, configs: list[str], data: str, extra: list[str], device: str, micro: str,
                concurrent: str, gpu_bytes: float | None) -> tuple[list[str], int, int]:
    """``(overrides for every run, micro-batch, configurations alive at once)`` of ``model``: the micro-batch that
    fits one run (the largest divisor of the batch whose :func:`quartet.memory.estimate_run` fits 85% of the GPU),
    and how many configurations fit the GPU together at it (at least 1)."""
    from quartet.config import compose, resolve
    from quartet.memory import estimate_run

    explicit = next((o.split("=", 1)[1] for o in extra if o.startswith("optim.micro_batch_size=")), None)
    cfg = compose(_overrides(model, configs[0], data, tempfile.gettempdir(), extra, device))
    res = resolve(cfg)
    budget = 0.85 * gpu_bytes if gpu_bytes else None

    def footprint(mb: int) -> float:
        cfg.optim.micro_batch_size = mb
        est = max((estimate_run(resolve(_with(cfg, c)), parallel="ddp", world_size=1).total for c in configs))
        return est

    if explicit is not None or micro != "auto":
        mb = int(explicit if explicit is not None else micro)
    else:
        divisors = [d for d in range(res.batch_size, 0, -1) if res.batch_size % d == 0]
        mb = next((d for d in divisors if budget is None or footprint(d) <= budget), divisors[-1])
    each = footprint(mb)
    if concurrent != "auto":
        n = max(1, int(concurrent))
    else:
        n = len(configs) if budget is None else max(1, min(len(configs), int(budget // each)))
    extra = [o for o in extra if not o.startswith("optim.micro_batch_size=")] + [f"optim.micro_batch_size={mb}"]
    return extra, mb, n


def _with(cfg, config: str):
    """``cfg`` with the precision of ``config`` (the estimate tells quantized from bf16 runs)."""
    from omegaconf import OmegaConf

    c = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    c.precision.name = config.partition(":")[0].partition("@")[0]
    return c


def child(args) -> int:
    """Phase 1: build + compile every configuration of one model; barrier; phase 2: time each under the GPU lock."""
    import torch

    from quartet.config import compose, resolve
    from quartet.train import Trainer

    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    out_dir = tempfile.mkdtemp(prefix="ladder_speed_")
    results, trainers = [], {}
    for config in args.configs.split(","):
        row = {"model": args.model, "config": config}
        try:
            cfg = compose(_overrides(args.model, config, args.data, out_dir, args.override, args.device))
            res = resolve(cfg)
            t0 = time.perf_counter()
            trainer = Trainer(cfg)
            for _ in range(2):  # compiles (compile modes) and allocates
                trainer._step()
            sync()
            row.update(n_params=res.n_params, tokens_per_step=res.tokens_per_step,
                       implementation=trainer.plan.implementation, backend=trainer.plan.backend,
                       traceable=trainer.plan.traceable,
                       build_and_compile_s=round(time.perf_counter() - t0, 2))
            trainers[config] = trainer
            if cuda:
                torch.cuda.empty_cache()  # the next configuration compiles against a clean cache
        except Exception as exc:  # noqa: BLE001 - one failing configuration must not hide the others
            traceback.print_exc()  # the row keeps one line; the log keeps where it came from
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        results.append(row)
    Path(args.barrier, f"ready.{Path(args.part).stem}").touch()
    while len(list(Path(args.barrier).glob("ready.*"))) < args.n_procs:
        time.sleep(0.5)
    with open(Path(args.barrier) / "gpu.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            for row in results:
                trainer = trainers.get(row["config"])
                if trainer is None:
                    continue
                try:
                    for _ in range(3):
                        trainer._step()
                    sync()
                    if cuda:
                        torch.cuda.reset_peak_memory_stats()
                    times: list[float] = []
                    start = time.perf_counter()
                    while len(times) < args.min_steps or time.perf_counter() - start < args.min_seconds:
                        t = time.perf_counter()
                        trainer._step()  # reads the loss: one host sync per step
                        times.append(time.perf_counter() - t)
                    med = statistics.median(times)
                    row.update(steps_timed=len(times), step_ms_median=round(med * 1e3, 3),
                               step_ms_p10=round(_percentile(times, 0.1) * 1e3, 3),
                               step_ms_p90=round(_percentile(times, 0.9) * 1e3, 3),
                               tokens_per_s=round(row["tokens_per_step"] / med),
                               peak_mem_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None)
                except Exception as exc:  # noqa: BLE001
                    traceback.print_exc()
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                print(json.dumps(row), flush=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    Path(args.part).write_text(json.dumps(results, indent=1))
    return 0


def _bf16_base(rows: list[dict], model: str, config: str) -> float | None:
    """tokens/s of the bf16 row of ``model`` in ``config``'s mode (else in any mode): the table's denominator."""
    mode = config.partition(":")[2]
    bf16 = [r for r in rows if r["model"] == model and r["config"].startswith("bf16:") and r.get("tokens_per_s")]
    same = [r for r in bf16 if r["config"].partition(":")[2] == mode]
    return (same or bf16 or [{}])[0].get("tokens_per_s")


def _table(rows: list[dict]) -> str:
    lines = [f"{'model':<11} {'config':<22} {'step ms (p10-p90)':<24} {'tokens/s':>11} {'x bf16 step':>13} "
             f"{'mem GiB':>8}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['model']:<11} {r['config']:<22} error: {r['error'][:80]}")
            continue
        base = _bf16_base(rows, r["model"], r["config"])
        ratio = base / r["tokens_per_s"] if base else float("nan")
        span = f"{r['step_ms_median']:.2f} ({r['step_ms_p10']:.2f}-{r['step_ms_p90']:.2f})"
        lines.append(f"{r['model']:<11} {r['config']:<22} {span:<24} {r['tokens_per_s']:>11,} {ratio:>12.2f}x "
                     f"{str(r['peak_mem_gib']):>8}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=DEFAULT_MODELS)
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="precision[@backend]:mode,... (mode: eager|compile|graphs)")
    p.add_argument("--data", default="pycode")
    p.add_argument("--min-steps", type=int, default=20)
    p.add_argument("--min-seconds", type=float, default=2.0)
    p.add_argument("--out", default=None, help="JSON file for the results")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke test of the script only")
    p.add_argument("--split", type=int, default=1,
                   help="processes per model (configurations dealt round-robin): compiles N configurations at once")
    p.add_argument("--micro-batch", default="auto",
                   help="micro-batch of every configuration: auto (the largest that fits one run) or a number")
    p.add_argument("--concurrent", default="auto",
                   help="configurations alive at once: auto (as many as fit the GPU together) or a number")
    p.add_argument("override", nargs="*", help="extra overrides for every run (e.g. optim.micro_batch_size=64)")
    # child mode
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--barrier", help=argparse.SUPPRESS)
    p.add_argument("--n-procs", type=int, help=argparse.SUPPRESS)
    p.add_argument("--part", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)

    import torch

    models = args.models.split(",")
    configs = args.configs.split(",")
    gpu = _gpu_bytes() if args.device == "cuda" else None
    t0 = time.time()
    rows: list[dict] = []
    memory = {}
    for m in models:
        extra, mb, n = plan_memory(m, configs, args.data, list(args.override), args.device, args.micro_batch,
                                   args.concurrent, gpu)
        memory[m] = {"micro_batch_size": mb, "configurations_at_once": n}
        if n >= len(configs):  # all alive together: one wave of --split processes
            split = max(1, min(args.split, len(configs)))
            waves = [[",".join(configs[i::split]) for i in range(split)]]
        else:  # a process per configuration, n of them at a time
            waves = [configs[i:i + n] for i in range(0, len(configs), n)]
        print(f"{m}: micro-batch {mb}, {n} configuration(s) at once, {len(waves)} wave(s)", flush=True)
        for wave in waves:
            barrier = tempfile.mkdtemp(prefix="ladder_speed_barrier_")
            procs = []
            for i, chunk in enumerate(wave):
                part = Path(barrier) / f"part.{m}.{i}.json"
                cmd = [sys.executable, __file__, "--child", "--model", m, "--configs", chunk, "--data", args.data,
                       "--barrier", barrier, "--n-procs", str(len(wave)), "--part", str(part),
                       "--min-steps", str(args.min_steps), "--min-seconds", str(args.min_seconds), "--device",
                       args.device, *extra]
                procs.append((m, part, subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})))
            for _, part, proc in procs:
                code = proc.wait()
                if part.is_file():
                    rows += [dict(r, micro_batch_size=mb) for r in json.loads(part.read_text())]
                else:
                    rows.append({"model": m, "config": "*", "error": f"benchmark process exited with {code}"})
    table = _table(rows)
    print(table)
    result = {
        "what": "one-GPU ladder: quartet train's optimizer step (Trainer._step), median of >= "
                f"{args.min_steps} steps and >= {args.min_seconds} s per configuration, timed alone on the GPU",
        "command": "python3 benchmarks/ladder_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "torch": torch.__version__,
        "wall_s": round(time.time() - t0, 1), "memory": memory, "rows": rows, "table": table.splitlines(),
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
