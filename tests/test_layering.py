"""Arrows point one way (docs/ARCHITECTURE.md, "Layers"): the imports of quartet/, cluster/ and analysis/, read with
``ast`` (nothing is imported), form no circle and no upward arrow.

Every import counts, at module level or inside a function (a lazy import is still an arrow), and so does a module
loaded by name (``importlib.import_module("…")`` / ``__import__("…")`` with a literal, and the dispatcher's
``"module:function"`` table). The layers, from the top:

    dispatcher   quartet/cli.py, cli_demo.py, cli_predict.py, cli_design.py  (may import anything; nothing imports them)
    cluster/     sweeps, run state, executors          (imports the library; never analysis, never the dispatcher)
    library      quartet/ … with quartet/kernels above quartet/quant
    analysis/    torch-free; from quartet only the version, its errors and its paths
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("quartet", "cluster", "analysis")
#: the CLI dispatcher layer: the one part of quartet/ that may import cluster/ and analysis/
DISPATCHER = {"quartet.cli", "quartet.cli_demo", "quartet.cli_predict", "quartet.cli_design"}
#: what analysis/ may take from quartet/ (torch-free leaves)
ANALYSIS_MAY_IMPORT = {"quartet", "quartet.errors", "quartet.paths"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an import of ``name`` lands in (its longest known prefix), else None (third party)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _raw_imports(mod: str, path: Path) -> list[tuple[str, int]]:
    """(imported dotted name, line) for every import of one file, relative ones made absolute."""
    tree = ast.parse(path.read_text(), str(path))
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule when there is one, else a name of pkg
            out += [(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base, node.lineno) for a in node.names]
        elif isinstance(node, ast.Call):
            fn = node.func
            fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if fname in {"import_module", "__import__"} and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                out.append((node.args[0].value, node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and mod in DISPATCHER:
            target = node.value.partition(":")[0]
            if ":" in node.value and _resolve(target) == target:  # the dispatcher's "module:function" table
                out.append((target, node.lineno))
    return out


def _edges() -> dict[str, dict[str, int]]:
    """module -> {imported project module: first line}; self-imports and imports of one's own package left out."""
    edges: dict[str, dict[str, int]] = defaultdict(dict)
    for mod, path in MODULES.items():
        for name, line in _raw_imports(mod, path):
            target = _resolve(name)
            if target is None or target == mod or mod.startswith(target + "."):
                continue  # third party; itself; its own enclosing package (imported implicitly by Python anyway)
            edges[mod].setdefault(target, line)
    return edges


EDGES = _edges()


def _arrows(src_pred, dst_pred) -> list[str]:
    return [f"{src} -> {dst} (line {line})" for src, dsts in sorted(EDGES.items()) if src_pred(src)
            for dst, line in sorted(dsts.items()) if dst_pred(dst)]


def _in(pkg: str):
    return lambda m: m == pkg or m.startswith(pkg + ".")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _unit(mod: str) -> str:
    """A package drawn as one node (quant, kernels, cluster, analysis, the dispatcher); the library's other modules
    each as their own."""
    if mod in DISPATCHER:
        return "dispatcher"
    for unit in ("quartet.quant", "quartet.kernels", "cluster", "analysis"):
        if _in(unit)(mod):
            return unit
    return mod


def test_the_walk_sees_the_house():
    """The walk reads real arrows (guards the test against passing on an empty graph)."""
    assert {"quartet.quant.linear", "quartet.kernels.linear", "cluster.launch", "analysis.fit"} <= set(MODULES)
    assert "quartet.quant.linear" in EDGES["quartet.kernels.linear"]
    assert "quartet.cli_demo" in EDGES["quartet.cli"]  # through the dispatcher's "module:function" table
    assert "cluster.launch" in EDGES["quartet.cli_demo"]


def test_no_circle_between_modules():
    graph = {m: set(d) for m, d in EDGES.items()}
    assert _cycles(graph) == []


def test_no_circle_between_packages():
    """With each package drawn as one node — quartet.quant, quartet.kernels, cluster, analysis, the dispatcher — the
    graph still has no loop (e.g. kernels -> quant -> kernels through two different modules would be one)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for src, dsts in EDGES.items():
        for dst in dsts:
            if _unit(src) != _unit(dst):
                graph[_unit(src)].add(_unit(dst))
    assert _cycles(graph) == []


def test_library_imports_neither_cluster_nor_analysis():
    library = lambda m: _in("quartet")(m) and m not in DISPATCHER  # noqa: E731
    assert _arrows(library, lambda d: _in("cluster")(d) or _in("analysis")(d)) == []


def test_nothing_imports_the_dispatcher():
    """Only the dispatcher itself (quartet.cli -> quartet.cli_demo) reaches its modules."""
    assert _arrows(lambda m: m not in DISPATCHER, lambda d: d in DISPATCHER) == []


def test_cluster_does_not_import_analysis():
    assert _arrows(_in("cluster"), _in("analysis")) == []


def test_quant_does_not_import_or_load_the_kernels():
    """Kernels plug into quant's registry; the caller that picks a device loads them (quartet.plugins)."""
    assert _arrows(_in("quartet.quant"), _in("quartet.kernels")) == []
    named = [f"{p.relative_to(REPO)}:{i}" for p in sorted((REPO / "quartet" / "quant").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if "quartet.kernels" in line]
    assert named == []


def test_analysis_imports_no_torch_and_no_training_internals():
    third_party = []
    for mod, path in MODULES.items():
        if _in("analysis")(mod):
            third_party += [f"{mod}: {name} (line {line})" for name, line in _raw_imports(mod, path)
                            if name.split(".")[0] in {"torch", "triton"}]
    assert third_party == []
    assert _arrows(_in("analysis"), lambda d: _in("quartet")(d) and d not in ANALYSIS_MAY_IMPORT) == []
