"""quartet.quant never names quartet.kernels (DESIGN: arrows point one way); kernels plug in through the registry."""
from __future__ import annotations

import ast
from pathlib import Path

import quartet.quant

QUANT = Path(quartet.quant.__file__).parent


def _kernel_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("quartet.kernels"):
            found.append(f"{path.name}:{node.lineno} from {node.module}")
        elif isinstance(node, ast.Import):
            found += [f"{path.name}:{node.lineno} import {a.name}" for a in node.names
                      if a.name.startswith("quartet.kernels")]
    return found


def test_quant_package_does_not_import_the_kernels():
    """Only the registry's plugin loader names the kernel package, by string (importlib): a fused layer, its
    traceable draws and every fast path reach ``quant`` through :class:`quartet.quant.backend.Backend`."""
    offenders = [hit for path in sorted(QUANT.rglob("*.py")) for hit in _kernel_imports(path)]
    assert offenders == []
