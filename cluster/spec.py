"""Sweep definitions: ``sweeps/<name>.yaml`` -> a list of runs (each a list of Hydra overrides).

A sweep file is an OmegaConf document checked against :class:`SweepSpec` (a typo in a sweep key
fails at load time)::

    name: smoke                     # group folder under the runs root (defaults to the file name)
    description: tiny CPU grid
    extends: null                   # optional: another sweep whose keys this one overrides
    cluster: local                  # default cluster profile (conf/cluster/<name>.yaml)
    axes:                           # the full grid, in this order; keys are Hydra override keys:
      model: [llama_tiny, llama_mini]   #   a config group ...
      budget.tokens_per_param: [10, 20] #   ... or any dotted config key
      precision: [bf16, quartet]
    fixed: {data: shakespeare}      # overrides applied to every run
    include: []                     # extra runs: mappings of overrides (on top of `fixed`)
    exclude: []                     # grid points matching ALL key/values of an entry are dropped
    only: {}                        # a stage of the sweep: keep the runs (grid and include) whose value of each
                                    # key is one listed ({model: [llama_3m]}; `quartet sweep --only model=llama_3m`)
    branches: false                 # true: budgets as decay branches of one WSD trunk (docs/branches.md)

Runs that differ only in precision get identical seeds (``run.seed`` / ``run.data_seed`` are config
values the grid never derives from the precision), so every comparison against BF16 sees the same
initialisation and the same data order.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from quartet.errors import ConfigError
from quartet.paths import SWEEPS_DIR, check_folder_name


@dataclass
class SweepSpec:
    """Schema of a sweep YAML (see the module docstring)."""

    name: str = ""
    description: str = ""
    extends: Any = None
    cluster: str = "local"
    axes: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    include: list[Any] = field(default_factory=list)
    exclude: list[Any] = field(default_factory=list)
    #: a stage of the sweep: only the runs whose value of each key (a run's value: its point's, else ``fixed``'s)
    #: is one of those listed; the run ids are the full sweep's, so the stages of one sweep share its group folder
    only: dict[str, Any] = field(default_factory=dict)
    #: free-form notes shown by --dry-run (e.g. which points the paper actually ran)
    notes: list[str] = field(default_factory=list)
    #: budget branches (cluster/branches.py, docs/branches.md): false | true (a WSD trunk per group of runs that
    #: differ only in budget, a decay branch per budget) | independent (the same WSD runs, each from scratch)
    branches: Any = False


@dataclass(frozen=True)
class RunPoint:
    """One run of a sweep before composition: its grid values and its Hydra overrides."""

    values: dict[str, Any]
    overrides: tuple[str, ...]

    @property
    def label(self) -> str:
        """Short human label (the grid values), used in errors before a run id exists."""
        return " ".join(f"{k}={_fmt(v)}" for k, v in self.values.items())


def available_sweeps(sweeps_dir: Path = SWEEPS_DIR) -> list[str]:
    """Names of the sweeps shipped in ``sweeps_dir``."""
    return sorted(p.stem for p in Path(sweeps_dir).glob("*.yaml"))


def sweep_file(name_or_path: str, sweeps_dir: Path = SWEEPS_DIR) -> Path:
    """The YAML file of a sweep given by name (``sweeps/<name>.yaml``) or path; ConfigError naming the choices."""
    p = Path(name_or_path)
    if p.suffix in {".yaml", ".yml"} and p.exists():
        return p
    cand = Path(sweeps_dir) / f"{name_or_path}.yaml"
    if cand.exists():
        return cand
    raise ConfigError(
        f"sweep {name_or_path!r} not found in {sweeps_dir}; choose one of: {', '.join(available_sweeps(sweeps_dir)) or '(none)'}"
    )


def load_sweep(name_or_path: str, overrides: list[str] | None = None, sweeps_dir: Path = SWEEPS_DIR) -> SweepSpec:
    """Load and validate a sweep by name (``sweeps/<name>.yaml``) or path.

    ``overrides`` are OmegaConf dot-list edits of the sweep itself, e.g.
    ``["axes.precision=[bf16]", "fixed.optim.lr=0.001"]``. ``extends`` chains are merged first.
    """
    path = sweep_file(name_or_path, sweeps_dir)
    raw = _load_chain(path, sweeps_dir, seen=())
    try:
        merged = OmegaConf.merge(OmegaConf.structured(SweepSpec), raw)
        for item in overrides or []:
            key, _, value = item.partition("=")
            head, _, rest = key.partition(".")
            parsed = OmegaConf.from_dotlist([f"v={value}"]).v
            if head in {"axes", "fixed", "only"} and rest:
                # axis / fixed keys are whole Hydra keys and may contain dots: axes.budget.tokens=[...]
                merged[head][rest] = parsed
            else:
                merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([item]))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"sweep {path.stem}: {_one_line(exc)}") from None
    spec: SweepSpec = OmegaConf.to_object(merged)  # type: ignore[assignment]
    if not spec.name:
        spec.name = path.stem
    spec.extends = None
    _check(spec)
    return spec


def _load_chain(path: Path, sweeps_dir: Path, seen: tuple[str, ...]) -> DictConfig:
    if str(path) in seen:
        raise ConfigError(f"sweep {path.stem}: 'extends' forms a cycle: {' -> '.join(seen + (str(path),))}")
    try:
        doc = OmegaConf.load(path)
    except Exception as exc:  # yaml errors
        raise ConfigError(f"sweep {path.stem}: cannot parse {path}: {_one_line(exc)}") from None
    if not isinstance(doc, DictConfig):
        raise ConfigError(f"sweep {path.stem}: top level of {path} must be a mapping")
    parent = doc.get("extends")
    if parent:
        base = _load_chain(sweep_file(str(parent), sweeps_dir), sweeps_dir, seen + (str(path),))
        base.pop("name", None)  # a child never inherits its parent's group folder
        # axes are replaced key by key; lists (include/exclude/values) are replaced, not appended
        doc = OmegaConf.merge(base, doc)
    return doc


#: ``branches:`` of a sweep (cluster/branches.py): off | trunk (true) | independent
MODES = ("off", "trunk", "independent")


def branch_mode(value: Any) -> str:
    """The sweep's ``branches`` value as one of :data:`MODES` (``true`` = trunk, ``false`` / null = off)."""
    if value is None or value is False:
        return "off"
    if value is True:
        return "trunk"
    if str(value) in MODES:
        return str(value)
    raise ConfigError(f"branches={value!r}: allowed: true (a trunk per group + a decay branch per budget), "
                      f"independent (the same WSD runs, each from scratch), false")


def _check(spec: SweepSpec) -> None:
    check_folder_name("sweep name", spec.name)
    branch_mode(spec.branches)
    if not spec.axes and not spec.include:
        raise ConfigError(f"sweep {spec.name}: needs at least one axis in 'axes' or one run in 'include'")
    for key, values in spec.axes.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep {spec.name}: axes.{key} must be a non-empty list, got {values!r}")
        shown = [_fmt(v) for v in values]
        twice = next((v for i, v in enumerate(shown) if v in shown[:i]), None)
        if twice is not None:  # [bf16, bf16] is a slip for two precisions, not a request for one run twice
            raise ConfigError(f"sweep {spec.name}: axes.{key} lists {twice} twice ({_fmt(values)}); list each value "
                              f"once")
    for i, entry in enumerate(spec.include):
        if not isinstance(entry, dict) or not entry:
            raise ConfigError(f"sweep {spec.name}: include[{i}] must be a mapping of overrides, got {entry!r}")
    for key, values in spec.only.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep {spec.name}: only.{key} must be a non-empty list, got {values!r}")
    if spec.only and branch_mode(spec.branches) != "off":
        # a stage would change each trunk (its warm-up and length come from the branches kept): other run ids
        raise ConfigError(f"sweep {spec.name}: only (a stage) cannot be used with branches: the trunks would change; "
                          f"stage a sweep without branches")
    for i, entry in enumerate(spec.exclude):
        if not isinstance(entry, dict) or not entry:
            raise ConfigError(f"sweep {spec.name}: exclude[{i}] must be a mapping of overrides, got {entry!r}")
        unknown = set(entry) - set(spec.axes)
        if unknown:
            raise ConfigError(
                f"sweep {spec.name}: exclude[{i}] names {sorted(unknown)} which are not axes; axes are {sorted(spec.axes)}"
            )


def expand(spec: SweepSpec) -> list[RunPoint]:
    """The full grid (axes order, last axis fastest), minus ``exclude``, plus ``include``; then ``only``.

    Duplicates (an include equal to a grid point) are dropped; order is deterministic.
    """
    return expand_named(spec)[0]


def expand_named(spec: SweepSpec) -> tuple[list[RunPoint], list[str]]:
    """:func:`expand`, and one line per dropped duplicate naming it and the earlier point it equals."""
    keys = list(spec.axes)
    points: list[dict[str, Any]] = []
    for combo in itertools.product(*(spec.axes[k] for k in keys)):
        values = dict(zip(keys, combo))
        if any(all(_same(values.get(k), v) for k, v in ex.items()) for ex in spec.exclude):
            continue
        points.append(values)
    points += [dict(entry) for entry in spec.include]
    runs: list[RunPoint] = []
    dropped: list[str] = []
    seen: dict[tuple[str, ...], RunPoint] = {}
    matched: set[tuple[str, str]] = set()
    for values in points:
        merged = {**spec.fixed, **values}
        hits = {(k, _fmt(v)) for k, allowed in spec.only.items() for v in allowed if _same(merged.get(k), v)}
        matched |= hits
        if {k for k, _ in hits} != set(spec.only):
            continue
        overrides = tuple(f"{k}={_fmt(v)}" for k, v in merged.items())
        point = RunPoint(values=values, overrides=overrides)
        if overrides in seen:
            dropped.append(f"run [{point.label}] = run [{seen[overrides].label}]")
            continue
        seen[overrides] = point
        runs.append(point)
    unmatched = [f"{k}={_fmt(v)}" for k, allowed in spec.only.items() for v in allowed if (k, _fmt(v)) not in matched]
    if unmatched:  # a typo in a stage would silently drop what it names
        raise ConfigError(f"sweep {spec.name}: only {', '.join(unmatched)} matches no run of the sweep")
    return runs, dropped


def _same(a: Any, b: Any) -> bool:
    return _fmt(a) == _fmt(b)


def _fmt(value: Any) -> str:
    """A value in Hydra override syntax (bools lower-case, None -> null, lists bracketed)."""
    if isinstance(value, (ListConfig, DictConfig)):
        value = OmegaConf.to_container(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_fmt(v)}" for k, v in value.items()) + "}"
    return str(value)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
