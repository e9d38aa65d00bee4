"""``quartet demo`` — the README's main command (embedded default).

For now: prepare the bundled Shakespeare corpus (once, cached) and train one tiny Llama on it,
printing the loss curve and the final full-validation loss. The sweep, fit and figures steps extend
this module later; keep each step a small function so they can be chained.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from quartet.errors import QuartetError


def prepare_corpus(overrides: list[str]) -> Path:
    """Tokenize the bundled corpus into shards (reused when already prepared); returns the data folder."""
    from quartet.config import compose
    from quartet.data import prepare, read_manifest

    cfg = compose(overrides)
    t0 = time.time()
    folder = prepare(cfg.data, progress=sys.stderr.isatty())
    man = read_manifest(folder)
    print(f"[data] {man['name']}: {man['splits']['train']['tokens']:,} train / {man['splits']['val']['tokens']:,} val "
          f"tokens, vocab {man['tokenizer']['vocab_size']} ({time.time() - t0:.1f} s) -> {folder}")
    return folder


def train_one(overrides: list[str]) -> dict:
    """Train (or reuse) one run; prints its loss curve; returns the summary."""
    from quartet.config import compose
    from quartet.runs import run_dir
    from quartet.train import Trainer

    cfg = compose(overrides)
    trainer = Trainer(cfg)
    r = trainer.res
    print(f"[train] {cfg.model.name}: N={r.n_params:,} non-embedding params, D={r.tokens:,} tokens "
          f"({r.steps} steps of {r.batch_size}x{r.seq_len}), lr {r.lr:g}, precision {cfg.precision.name}")
    summary = {**trainer.run(), "vocab_size": r.vocab_size}
    rows = [json.loads(x) for x in (run_dir(cfg) / "metrics.jsonl").read_text().splitlines()]
    curve = [x for x in rows if "loss" in x]
    if curve:
        picks = sorted({0, len(curve) // 4, len(curve) // 2, 3 * len(curve) // 4, len(curve) - 1})
        print("[train] step   train_loss   val_loss")
        for i in picks:
            x = curve[i]
            val = f"{x['val_loss']:.4f}" if "val_loss" in x else "   -  "
            print(f"[train] {x['step']:>5}   {x['loss']:.4f}       {val}")
    return summary


def cli_main(argv: list[str] | None = None) -> int:
    """``quartet demo [overrides...]``: prepare the bundled corpus, train a tiny model, print the val loss."""
    parser = argparse.ArgumentParser(prog="quartet demo", description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="extra config overrides for the demo run")
    args = parser.parse_intermixed_args(argv)
    base = ["model=llama_tiny", "data=shakespeare", "budget=demo", "run.name=demo", "logging.val_every=50",
            "logging.val_batches=8", "logging.log_every=10", "logging.ckpt_every=100"]
    overrides = base + list(args.overrides)
    t0 = time.time()
    try:
        prepare_corpus(overrides)
        summary = train_one(overrides)
    except QuartetError as exc:
        print(f"quartet: error: {exc}", file=sys.stderr)
        return 2
    if summary.get("state") != "completed":
        print("[demo] stopped early; run `quartet demo` again to resume")
        return 0
    print(f"[demo] final validation loss {summary['val_loss']:.4f} nats/token (a uniform guess over the "
          f"{summary['vocab_size']} tokens scores {math.log(summary['vocab_size']):.2f}); {time.time() - t0:.0f} s total")
    return 0
