"""``quartet train``'s arguments, in a module of their own: the torch-free front (:mod:`quartet.train_cli`) and
the trainer's entry point (:func:`quartet.train.cli_main`) both parse them, and neither imports the other for it."""
from __future__ import annotations

import argparse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quartet train", description="Train one run (Hydra overrides, e.g. "
                                "model=llama_30m precision=quartet budget=dn100 run.name=mysweep).")
    p.add_argument("overrides", nargs="*", help="Hydra overrides key=value / group=option")
    p.add_argument("--print-config", action="store_true", help="print the resolved config (with derived values) and exit")
    p.add_argument("--config-file", help="replay a run from its config.yaml (or run directory); overrides still apply")
    return p
