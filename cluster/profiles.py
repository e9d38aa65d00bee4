"""Cluster profiles (``conf/cluster/<name>.yaml``): where and with what resources runs go.

A profile is plain YAML checked against :class:`ClusterProfile`; a site adds its own by dropping a
file in ``conf/cluster/`` (or passing a path to ``--cluster``) -- no code change. Every key can be
overridden on the command line as ``cluster.<key>=<value>``.

Resources per run come from an ordered list of rules keyed by the run's non-embedding parameter
count N: the first rule with ``N <= max_params`` gives GPUs (one task per GPU), nodes, CPUs per task,
memory and the time limit. Runs with equal resources form one job array.

A rule may also fix the run's data parallelism (``parallel: ddp | fsdp``); without it the plan takes DDP
when the run's per-GPU memory estimate (:mod:`quartet.memory`) fits ``gpu_memory_gb``, else FSDP2, and it
refuses a run whose estimate under the chosen mode exceeds ``gpu_memory_gb`` (``null``: not checked).

Local profiles (``kind: local``) run a process pool on this machine, one run per worker at a time:

- ``gpus: 0`` (default): CPU only, ``workers`` processes with ``threads_per_worker`` torch threads each.
- ``gpus: N`` (GPUs 0..N-1, counted within ``CUDA_VISIBLE_DEVICES`` when the launcher has it set) or
  ``gpus: auto`` (every visible GPU): the pool has ``gpus * workers_per_gpu`` workers (``workers`` is
  then ignored) and each worker is pinned to one GPU (``CUDA_VISIBLE_DEVICES=<index>`` set before it
  touches CUDA), never more than ``workers_per_gpu`` workers on one GPU. Small models cannot fill a
  large GPU alone, so packing several runs per GPU is what makes a workstation sweep fast.

A local run is one process: its rule may ask for at most one GPU and one node (multi-GPU runs need
a Slurm profile); the pool, not the rule, decides whether it gets a GPU.

GPU-hours estimate (printed by the plan; a budget, not a promise)::

    gpu_hours = 6 * N * D / (peak_flops_per_gpu * mfu * speedup[precision]) / 3600

with N non-embedding parameters, D tokens, ``peak_flops_per_gpu`` the dense BF16 peak, ``mfu`` the
model-FLOPs utilisation you expect and ``speedup`` an optional per-precision factor (1.0 when not
listed: the reference quantized path is emulated in BF16, so it is not faster). Once runs of a sweep have
finished, the plan measures their device-hours against this estimate and scales the rest by the ratio
(:func:`cluster.plan.calibrate`).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from quartet.errors import ConfigError
from quartet.paths import CONF_DIR

PROFILES_DIR = CONF_DIR / "cluster"


@dataclass
class ResourceRule:
    """Resources for runs with ``N <= max_params`` (non-embedding parameters)."""

    max_params: float = math.inf
    gpus: int = 1  # GPUs per run in total (= tasks); 0 = CPU-only
    nodes: int = 1
    cpus_per_task: Optional[int] = None  # None: the profile's cpus_per_gpu (or cpus_per_task)
    mem_gb: Optional[float] = None  # per node; None: gpus_per_node_used * mem_per_gpu_gb
    time_min: Optional[int] = None  # None: the profile's time_min
    # ddp | fsdp for runs of this rule; None: ddp when its per-GPU memory estimate fits gpu_memory_gb, else fsdp
    # (a run's own run.parallel=ddp|fsdp wins over the rule)
    parallel: Optional[str] = None


@dataclass
class ClusterProfile:
    """Schema of ``conf/cluster/*.yaml``."""

    name: str = ""
    kind: str = "local"  # local | slurm
    description: str = ""
    # --- local ---
    workers: int = 2  # parallel runs on this machine when gpus=0 (ignored with gpus > 0)
    threads_per_worker: int = 1  # torch CPU threads per local run (also with GPUs: data, optimizer)
    # GPUs of the local pool: 0 = CPU only, N = GPUs 0..N-1 (of CUDA_VISIBLE_DEVICES if set),
    # "auto" = all visible. Any, not int|str: OmegaConf structured configs have no primitive unions.
    gpus: Any = 0
    workers_per_gpu: int = 1  # with gpus > 0: runs at once per GPU; pool = gpus * workers_per_gpu
    # --- slurm: sbatch options (None = not passed) ---
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    gpu_type: Optional[str] = None  # gres name, e.g. b200 -> --gres=gpu:b200:<n>
    gpus_per_node: int = 8
    cpus_per_gpu: int = 8  # CPUs per task (one task per GPU)
    mem_per_gpu_gb: float = 100.0
    time_min: int = 1440
    array_parallelism: int = 64  # the %N cap of every job array
    max_array_size: Optional[int] = None  # None: ask `scontrol show config`, else 1001
    max_num_timeout: int = 20  # requeues after time-limit signals before giving up
    signal_delay_s: int = 120  # USR2 this long before the time limit -> checkpoint + requeue
    exclusive: bool = False
    setup: list[str] = field(default_factory=list)  # sbatch lines before srun (module load ...)
    srun_args: list[str] = field(default_factory=list)
    additional: dict[str, Any] = field(default_factory=dict)  # any other sbatch flag
    python: Optional[str] = None  # interpreter on the nodes (default: the launching one)
    # --- planning ---
    # memory of one GPU: a run whose per-GPU estimate (quartet.memory) exceeds it is refused; None = unchecked
    gpu_memory_gb: Optional[float] = None
    device_label: str = "GPU"
    peak_flops_per_gpu: float = 1.0e15
    mfu: float = 0.35
    speedup: dict[str, float] = field(default_factory=dict)
    resources: list[ResourceRule] = field(default_factory=lambda: [ResourceRule()])


@dataclass(frozen=True)
class Resources:
    """What one run asks for; equal Resources -> same job array."""

    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int
    mem_gb: float
    time_min: int

    @property
    def gpus(self) -> int:
        """GPUs of the whole run."""
        return self.nodes * self.gpus_per_node

    def describe(self, profile: ClusterProfile) -> str:
        """One-line summary for the plan."""
        if profile.kind == "local":
            return describe_local(profile)
        gres = f"gpu:{profile.gpu_type}:{self.gpus_per_node}" if profile.gpu_type else f"{self.gpus_per_node} GPU"
        return (
            f"{self.nodes} node(s) x {self.tasks_per_node} task(s), {gres}/node, "
            f"{self.cpus_per_task} CPU/task, {self.mem_gb:g} GB/node, {self.time_min} min"
        )


def available_profiles() -> list[str]:
    """Profile names shipped in ``conf/cluster/``."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name_or_path: str, overrides: list[str] | None = None) -> ClusterProfile:
    """Load ``conf/cluster/<name>.yaml`` (or a YAML path) and apply ``key=value`` overrides."""
    p = Path(name_or_path)
    path = p if p.suffix in {".yaml", ".yml"} and p.exists() else PROFILES_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise ConfigError(
            f"cluster profile {name_or_path!r} not found in {PROFILES_DIR}; choose one of: {', '.join(available_profiles())}"
        )
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(ClusterProfile), OmegaConf.load(path))
        if overrides:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
        prof: ClusterProfile = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except OmegaConfBaseException as exc:
        msg = str(exc).strip().splitlines()[0]
        raise ConfigError(f"cluster profile {path.stem}: {msg}") from None
    prof.name = prof.name or path.stem
    if prof.kind not in {"local", "slurm"}:
        raise ConfigError(f"cluster profile {prof.name}: kind={prof.kind!r}; allowed: local, slurm")
    if not prof.resources:
        raise ConfigError(f"cluster profile {prof.name}: resources must list at least one rule")
    if prof.workers < 1:
        raise ConfigError(f"cluster profile {prof.name}: workers must be >= 1, got {prof.workers}")
    prof.gpus = _parse_gpus(prof)
    if prof.workers_per_gpu < 1:
        raise ConfigError(f"cluster profile {prof.name}: workers_per_gpu must be >= 1, got {prof.workers_per_gpu}")
    return prof


def _parse_gpus(profile: ClusterProfile) -> int | str:
    """``gpus`` as an int >= 0 or the string ``auto`` (YAML and dotlist overrides give int or str)."""
    value = profile.gpus
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        if text.isdigit():
            return int(text)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ConfigError(f"cluster profile {profile.name}: gpus={value!r}; allowed: 0 (CPU only), a GPU count N, auto")


def visible_cuda_count() -> int:
    """CUDA devices this process can see (honours CUDA_VISIBLE_DEVICES).

    ``torch.cuda.device_count()`` does not create a CUDA context, and the local pool spawns (never
    forks) its workers, so counting here leaves them free to pick their own device.
    """
    import torch

    return int(torch.cuda.device_count())


def local_gpus(profile: ClusterProfile) -> int:
    """How many GPUs the local pool of ``profile`` uses (0 = CPU only); resolves ``gpus: auto``.

    Raises a one-line ConfigError for ``auto`` with no visible GPU, or for more GPUs than are visible.
    """
    value = _parse_gpus(profile)
    if value == "auto":
        n = visible_cuda_count()
        if n < 1:
            raise ConfigError(f"cluster profile {profile.name}: gpus=auto but no CUDA device is visible; "
                              f"use --cluster local (CPU) or cluster.gpus=N")
        return n
    n = int(value)
    if n > 0:
        seen = visible_cuda_count()
        # With no GPU at all, N is taken as given: CPU-only runs (run.device=cpu) can still be
        # pinned and packed, which is how the tests exercise the pool on a CPU machine.
        if seen and n > seen:
            raise ConfigError(f"cluster profile {profile.name}: gpus={n} but only {seen} CUDA device(s) are visible; "
                              f"use cluster.gpus=auto or a smaller N")
    return n


def local_pool_size(profile: ClusterProfile, gpus: int | None = None) -> int:
    """Workers of the local pool: ``gpus * workers_per_gpu`` on GPUs, else ``workers``."""
    gpus = local_gpus(profile) if gpus is None else gpus
    return gpus * max(1, profile.workers_per_gpu) if gpus > 0 else max(1, profile.workers)


def describe_local(profile: ClusterProfile) -> str:
    """One line for a local pool, e.g. ``local, 1 GPU x 4 runs at once, 2 thread(s) each``.

    Never raises: a dry run of a GPU profile on a machine without GPUs still prints its plan.
    """
    t = max(1, profile.threads_per_worker)
    if _parse_gpus(profile) == 0:
        w = max(1, profile.workers)
        return f"local, CPU, {w} run{'s' if w != 1 else ''} at once, {t} thread(s) each"
    k = max(1, profile.workers_per_gpu)
    per = f"{k} run{'s' if k != 1 else ''} at once"
    try:
        n = local_gpus(profile)
    except ConfigError:
        return f"local, gpus={profile.gpus} (none visible here) x {per}, {t} thread(s) each"
    return f"local, {n} GPU{'s' if n != 1 else ''} x {per}, {t} thread(s) each"


def rule_for(profile: ClusterProfile, n_params: float) -> ResourceRule:
    """The first rule of the profile with ``n_params <= max_params``; ConfigError when none covers it."""
    for rule in profile.resources:
        if n_params <= rule.max_params:
            if rule.parallel not in (None, "ddp", "fsdp"):
                raise ConfigError(f"cluster profile {profile.name}: rule max_params={rule.max_params:g} has "
                                  f"parallel={rule.parallel!r}; allowed: ddp, fsdp, null (by the memory estimate)")
            return rule
    raise ConfigError(
        f"cluster profile {profile.name}: no resources rule covers N={n_params:.3g}; add a rule with a larger max_params"
    )


def resources_for(profile: ClusterProfile, n_params: float) -> Resources:
    """Apply the profile's per-size rule to a run with ``n_params`` non-embedding parameters."""
    rule = rule_for(profile, n_params)
    gpus = max(0, rule.gpus)
    nodes = max(1, rule.nodes)
    if profile.kind == "local":
        # A local run is one pool worker: one GPU when the pool has GPUs, else CPU, whatever the rule says.
        if gpus > 1 or nodes > 1:
            raise ConfigError(
                f"cluster profile {profile.name}: rule max_params={rule.max_params:g} asks gpus={gpus}, nodes={nodes}; "
                f"a local run is one process (one GPU or CPU); use a Slurm profile for multi-GPU runs"
            )
        gpus = 0 if _parse_gpus(profile) == 0 else 1
    if gpus and gpus % nodes:
        raise ConfigError(f"cluster profile {profile.name}: rule max_params={rule.max_params:g} has gpus={gpus} not divisible by nodes={nodes}")
    gpn = gpus // nodes if gpus else 0
    if gpn > profile.gpus_per_node:
        raise ConfigError(
            f"cluster profile {profile.name}: rule max_params={rule.max_params:g} needs {gpn} GPUs/node > gpus_per_node={profile.gpus_per_node}"
        )
    tasks = max(1, gpn)
    cpus = rule.cpus_per_task or profile.cpus_per_gpu
    mem = rule.mem_gb if rule.mem_gb is not None else max(1.0, tasks * profile.mem_per_gpu_gb)
    return Resources(
        nodes=nodes,
        tasks_per_node=tasks,
        gpus_per_node=gpn,
        cpus_per_task=int(cpus),
        mem_gb=float(mem),
        time_min=int(rule.time_min or profile.time_min),
    )


@functools.cache
def _recipe_of(precision: str) -> str:
    """The recipe a half-recipe variant halves (the name itself otherwise); cached: planning asks once per run.
    analysis.design.recipe_of reads it from the name alone (analysis/ imports no quartet.quant), on the suffixes
    tests/analysis/test_half_recipes.py checks against these."""
    from quartet.quant.config import half_variants

    return half_variants().get(precision, (precision,))[0]


def speedup_of(profile: ClusterProfile, precision: str) -> float:
    """``profile.speedup[precision]``; a half-recipe variant (``<recipe>_fwd`` / ``_bwd``) not listed takes its
    recipe's factor (it quantizes one half of the recipe's GEMMs: at most the recipe's cost); else 1.0."""
    if precision in profile.speedup:
        return float(profile.speedup[precision])
    return float(profile.speedup.get(_recipe_of(precision), 1.0))


def gpu_hours(profile: ClusterProfile, n_params: float, tokens: float, precision: str) -> float:
    """The documented estimate: 6·N·D FLOPs at ``peak * mfu * speedup[precision]`` per device."""
    rate = profile.peak_flops_per_gpu * profile.mfu * speedup_of(profile, precision)
    return 6.0 * n_params * tokens / rate / 3600.0
