"""The ``quartet`` console script: a thin dispatcher over subcommands.

Each subcommand lives in its own module and is imported only when called, so ``quartet fit`` and
``quartet figures`` work without torch and ``quartet --help`` is instant. This is the one place in
``quartet/`` allowed to reach into ``cluster/`` and ``analysis/``.
"""
from __future__ import annotations

import importlib
import sys

#: subcommand -> ("module:function", one-line help). Each function takes argv (list[str]) and
#: returns an exit code (int) or None for success.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("quartet.train_cli:cli_main", "train one run (Hydra overrides: model=... precision=... budget.tokens_per_param=...)"),
    "data": ("quartet.data:cli_main", "prepare tokenized shards: quartet data prepare ..."),
    "quant-stats": ("quartet.quant.stats:cli_main", "MSE / misalignment of every quantizer on Gaussian data"),
    "sweep": ("cluster.launch:cli_main", "expand a sweep and submit what is not finished (local or Slurm)"),
    "status": ("cluster.status:cli_main", "state of every run of a sweep"),
    "fit": ("analysis.cli:fit_main", "fit the low-precision scaling law to runs or a loss table"),
    "predict": ("quartet.cli_predict:predict_main", "forecast the loss at (N, D) per precision from a fit, with 95% intervals"),
    "figures": ("analysis.cli:figures_main", "plot losses, fits, efficiencies and optimal-precision maps"),
    "design": ("quartet.cli_design:design_main", "choose the runs that pin efficiencies: simulate the fit before running it"),
    "ladder": ("analysis.ladder:cli_main", "seed noise and each precision's gap to bf16 per cell of a replicated sweep"),
    "demo": ("quartet.cli_demo:cli_main", "the main job: tiny sweep + fit + figures + report on this machine"),
}


def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: quartet <command> [args...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run 'quartet <command> --help' for a command's options."]
    return "\n".join(lines)


def keep_caches_inside() -> None:
    """Point the caches that wandb and matplotlib keep in the home folder (``~/.cache/wandb``, ``~/.config/wandb``,
    ``~/.local/share/wandb``, ``~/.cache/matplotlib``) into the project cache (``QUARTET_CACHE``, default
    ``<checkout>/.cache``) unless they are set already, so a command writes nothing outside the checkout by default.
    A run's wandb files go to its run directory (``quartet.recorder``)."""
    import os

    from quartet.paths import cache_dir

    cache = cache_dir()
    for var, sub in (("WANDB_CACHE_DIR", "wandb/cache"), ("WANDB_CONFIG_DIR", "wandb/config"),
                     ("WANDB_DATA_DIR", "wandb/data"), ("MPLCONFIGDIR", "matplotlib")):
        os.environ.setdefault(var, str(cache / sub))


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``quartet <command> ...`` to the command's module; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    if argv[0] in {"-V", "--version"}:
        from quartet import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    keep_caches_inside()
    if name not in SUBCOMMANDS:
        print(f"quartet: unknown command {name!r}; choose one of: {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    module_name, func_name = SUBCOMMANDS[name][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    code = func(rest)
    return int(code or 0)


def entry() -> None:
    """The ``quartet`` console script: :func:`main`, then the exit. A process that ran a torch.distributed group
    (``quartet train`` under torchrun, or FSDP on one process) ends through
    :func:`quartet.distributed.exit_process`, which says why; every other through ``sys.exit``."""
    code = main()
    qdist = sys.modules.get("quartet.distributed")  # imported only by commands that may create a group
    if qdist is not None and qdist.group_created():
        qdist.exit_process(code)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
