"""``quartet train``'s front: its arguments, and the refusal of a bad config before torch is imported.

Composing and resolving a config needs no torch (:mod:`quartet.config`), so a typo'd key or a wrong value is
refused in a fraction of a second; only a valid config goes on to :func:`quartet.train.cli_main`, which imports
torch and trains (it composes again, from the in-process compose cache).
"""
from __future__ import annotations

import argparse
import sys


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quartet train", description="Train one run (Hydra overrides, e.g. "
                                "model=llama_30m precision=quartet budget=dn100 run.name=mysweep).")
    p.add_argument("overrides", nargs="*", help="Hydra overrides key=value / group=option")
    p.add_argument("--print-config", action="store_true", help="print the resolved config (with derived values) and exit")
    p.add_argument("--config-file", help="replay a run from its config.yaml (or run directory); overrides still apply")
    return p


def check(argv: list[str] | None) -> int | None:
    """Parse and validate ``argv`` without torch: 2 (after one line on stderr) when the config is bad, else None."""
    from quartet.config import compose, load_config_file, resolve
    from quartet.errors import QuartetError
    from quartet.paths import not_writable
    from quartet.runs import runs_base

    args = parser().parse_intermixed_args(argv)
    try:
        cfg = load_config_file(args.config_file, args.overrides) if args.config_file else compose(args.overrides)
        resolve(cfg)  # the world size (torchrun's WORLD_SIZE) is checked by the trainer's own resolve
        if not args.print_config:
            why = not_writable(runs_base(cfg))
            if why:
                raise QuartetError(f"run.out_dir {runs_base(cfg)}: {why}; set run.out_dir (or QUARTET_RUNS) to a "
                                   f"writable folder")
    except QuartetError as exc:
        print(f"quartet: error: {exc}", file=sys.stderr)
        return 2
    return None


def cli_main(argv: list[str] | None = None) -> int:
    """``quartet train``: refuse a bad config at once, else train (:func:`quartet.train.cli_main`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    code = check(argv)
    if code is not None:
        return code
    from quartet.train import cli_main as train_main

    return train_main(argv)
