"""Scripts of the repository that are not in a package (``benchmarks/``, ``cluster/scripts/``), loaded as modules by
the tests that check them."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(path: str) -> ModuleType:
    """The script at ``path`` (relative to the repository root, e.g. ``benchmarks/recipes_table.py``) as a module."""
    file = REPO / path
    spec = importlib.util.spec_from_file_location(file.stem, file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
