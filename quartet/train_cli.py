"""``quartet train``'s front: its arguments, and the refusal of a bad config before torch is imported.

Composing and resolving a config needs no torch (:mod:`quartet.config`), so a typo'd key or a wrong value is
refused in a fraction of a second; only a valid config goes on to :func:`quartet.train.cli_main`, which imports
torch and trains (it composes again, from the in-process compose cache).
"""
from __future__ import annotations

import sys

from quartet.train_args import parser


def check(argv: list[str] | None) -> int | None:
    """Parse and validate ``argv`` without torch: 2 (after one line on stderr) when the config is bad, else None."""
    from quartet.config import compose, load_config_file, resolve
    from quartet.errors import QuartetError

    args = parser().parse_intermixed_args(argv)
    try:
        cfg = load_config_file(args.config_file, args.overrides) if args.config_file else compose(args.overrides)
        resolve(cfg)  # the world size (torchrun's WORLD_SIZE) is checked by the trainer's own resolve
        # an unwritable run.out_dir is refused by the trainer once torch is up, before it builds data and model, in
        # one line naming the folder's owner or the read-only file system (quartet.train.os_error_line)
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
