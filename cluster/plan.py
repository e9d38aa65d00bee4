"""From a sweep + a cluster profile to a validated plan: every run composed, resolved, identified.

Nothing is written or submitted here. :func:`build_plan` composes and resolves EVERY run first; if
any run is bad it raises one :class:`~quartet.errors.ConfigError` naming the run and the key, so a
launch with one broken point submits nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cluster import runstate, slurm
from cluster.branches import branch_mode, expand_branches
from cluster.profiles import ClusterProfile, Resources, describe_local, gpu_hours, resources_for, rule_for
from cluster.spec import RunPoint, SweepSpec, expand_named
from quartet import paths
from quartet.errors import ConfigError, QuartetError
from quartet.memory import GB, MemoryEstimate, choose_parallel


@dataclass
class PlannedRun:
    """One run of the plan: config, derived numbers, resources and current state."""

    point: RunPoint
    cfg: DictConfig
    run_id: str
    run_dir: Path
    n_params: int
    tokens: int
    steps: int
    lr: float
    precision: str
    resources: Resources
    hours: float
    #: the run's per-GPU memory estimate under its parallelism (``memory.parallel``: ddp | fsdp)
    memory: MemoryEstimate | None = None
    view: runstate.RunView | None = None
    #: a budget branch's step of departure from its trunk (0 otherwise): it trains only the updates after it
    start_step: int = 0
    #: device-hours of this run without budget branches: a branch's whole budget from scratch, a trunk's 0
    hours_alone: float | None = None

    @property
    def flops(self) -> float:
        """Training compute 6·N·D (N non-embedding; a branch's D counts its own updates only)."""
        return 6.0 * self.n_params * self.tokens * (1.0 - self.start_step / max(self.steps, 1))

    @property
    def role(self) -> str | None:
        """trunk | branch (budget branches, docs/branches.md) or None."""
        b = self.cfg.get("branch") or {}
        return "trunk" if b.get("save_steps") else ("branch" if b.get("trunk") else None)

    @property
    def state(self) -> str:
        """done | running | failed | preempted | cancelled | corrupt | invalid | new (what the plan table shows)."""
        v = self.view
        if v is None or v.state == "new":
            return "new"
        if v.state == "completed":
            return "done"
        if v.state in {"corrupt", "invalid"}:
            return v.state
        if v.live or v.state == "running":
            # still "running" after inspect: a trainer nobody could show gone (a standalone `quartet train` on
            # another host, whose lock this host cannot see); submitting it would overwrite its state.json
            return "running"
        return v.state if v.state in {"failed", "preempted", "cancelled"} else "new"

    @property
    def to_submit(self) -> bool:
        """Submit unless finished (an ``invalid`` summary too), someone is on it, or its summary.json is corrupt."""
        return self.state not in {"done", "running", "corrupt", "invalid"}


@dataclass
class Plan:
    """A whole sweep, validated."""

    spec: SweepSpec
    profile: ClusterProfile
    runs_root: Path
    runs: list[PlannedRun] = field(default_factory=list)
    #: grid points dropped because an earlier point is the same run (one line each)
    duplicates: list[str] = field(default_factory=list)
    #: the sweep file, as recorded in the group folder by a launch (``cluster.launch.sweep_origin``); None: not known
    sweep_file: str | None = None

    @property
    def group_dir(self) -> Path:
        """``<runs root>/<sweep name>``: the sweep's folder (run dirs, logs, sbatch scripts)."""
        return self.runs_root / self.spec.name

    def counts(self) -> dict[str, int]:
        """Runs per plan state."""
        out: dict[str, int] = {}
        for r in self.runs:
            out[r.state] = out.get(r.state, 0) + 1
        return out

    def corrupt(self) -> list[PlannedRun]:
        """Runs whose summary.json exists but is unreadable (see ``runstate.corrupt_summary``)."""
        return [r for r in self.runs if r.state == "corrupt"]

    def pending(self) -> list[PlannedRun]:
        """Runs to submit now."""
        return [r for r in self.runs if r.to_submit]

    def arrays(self, runs: list[PlannedRun] | None = None, max_array_size: int | None = None) -> list[tuple[Resources, list[PlannedRun]]]:
        """Group ``runs`` (default: the pending ones) by resources; split groups above MaxArraySize."""
        runs = self.pending() if runs is None else runs
        size = max_array_size or self.max_array_size()
        groups: dict[Resources, list[PlannedRun]] = {}
        for r in runs:
            groups.setdefault(r.resources, []).append(r)
        out = []
        for res, members in groups.items():
            for i in range(0, len(members), size):
                out.append((res, members[i : i + size]))
        return out

    def max_array_size(self) -> int:
        """Profile value, else the cluster's MaxArraySize (array indices 0..size-1), else 1001."""
        if self.profile.max_array_size:
            return int(self.profile.max_array_size)
        return slurm.max_array_size() if self.profile.kind == "slurm" else 10**9


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def compose_run(point: RunPoint, spec: SweepSpec, runs_root: Path, extra: list[str]) -> DictConfig:
    """Compose one run: the point's overrides, the sweep name and runs root, then CLI extras."""
    from quartet.config import compose

    overrides = [*point.overrides, f"run.name={spec.name}", f"run.out_dir={runs_root}", *extra]
    return compose(overrides)


def build_plan(spec: SweepSpec, profile: ClusterProfile, runs_root: Path, extra: list[str] | None = None,
               with_state: bool = True, progress: bool = False, reconcile: bool = True) -> Plan:
    """Compose, resolve and identify every run of ``spec``; attach resources, estimates, state.

    Raises ConfigError (one line) naming the first bad run and its key, plus how many are bad. Writes nothing,
    except that with ``reconcile`` runs that ``runstate.inspect`` finds dead are recorded so in their state.json.
    """
    from quartet.config import resolve
    from quartet.runs import run_dir as run_dir_of

    runs_root = Path(runs_root).resolve()
    extra = list(extra or [])
    plan = Plan(spec=spec, profile=profile, runs_root=runs_root)
    errors: list[str] = []
    points, plan.duplicates = expand_named(spec)
    iterator: Any = _progress(points, f"planning sweep {spec.name}") if progress and len(points) > 20 else points
    composed = []
    for point in iterator:
        try:  # one compose per run (from the per-group cache, see quartet.config.compose)
            composed.append((point, compose_run(point, spec, runs_root, extra)))
        except Exception as exc:  # noqa: BLE001 - named below, with the run
            errors.append(_run_error(point, exc))
    if not errors:
        try:
            composed = expand_branches(composed, branch_mode(spec.branches))
        except QuartetError as exc:
            errors.append(f"branches: {_one_line(exc)}")
    seen: dict[str, str] = {}
    for point, cfg in composed if not errors else []:
        try:
            # One resolve per run: the resolved run is passed on to the memory estimate and the run id.
            res = resolve(cfg)
            resources = resources_for(profile, res.n_params)
            world = max(1, resources.gpus)
            res.check_world_size(world)  # the batch must split over the data-parallel ranks too
            memory = plan_memory(cfg, res, profile, world)
            rdir = Path(run_dir_of(cfg, res))
            rid = rdir.name
        except Exception as exc:  # noqa: BLE001 - anything from resolve: still name the run
            errors.append(_run_error(point, exc))
            continue
        if rid in seen:  # the same experiment twice (e.g. points differing only in logging): run once
            plan.duplicates.append(f"run [{point.label}] = run [{seen[rid]}] (id {rid})")
            continue
        seen[rid] = point.label
        precision = str(cfg.precision.name)
        start = int(cfg.branch.step or 0)
        alone = 0.0 if cfg.branch.save_steps else gpu_hours(profile, res.n_params, res.tokens, precision)
        plan.runs.append(
            PlannedRun(point=point, cfg=cfg, run_id=rid, run_dir=Path(rdir), n_params=res.n_params,
                       tokens=res.tokens, steps=res.steps, lr=res.lr, precision=precision, resources=resources,
                       hours=gpu_hours(profile, res.n_params, res.tokens - start * res.tokens_per_step, precision),
                       memory=memory, start_step=start, hours_alone=alone)
        )
    if errors:
        more = f" (and {len(errors) - 1} more bad run(s))" if len(errors) > 1 else ""
        raise ConfigError(f"sweep {spec.name}: {errors[0]}{more}; nothing was submitted")
    if with_state:
        queue = slurm.queue() if slurm.available() else None
        for r in plan.runs:
            r.view = runstate.inspect(r.run_dir, queue, reconcile_dead=reconcile) if r.run_dir.exists() else None
    return plan


#: a precision gets its own calibration ratio from this many measured runs; with fewer, the sweep-wide ratio
CALIBRATE_MIN_RUNS = 3


@dataclass
class Calibration:
    """The sweep's completed runs: the device-hours they took against the profile's estimate of the same runs.

    The profile's estimate (6·N·D at ``peak · mfu · speedup``) is a budget; small models run far below any one
    MFU, so a sweep that has finished some runs measures its own ratio and scales the rest by it -- per precision
    where that precision has :data:`CALIBRATE_MIN_RUNS` measured runs, else sweep-wide."""

    runs: int
    measured_h: float
    estimated_h: float
    by_precision: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Measured / estimated device-hours over every measured run."""
        return self.measured_h / self.estimated_h

    def hours(self, run: PlannedRun) -> float:
        """The run's estimate scaled by its precision's ratio (else the sweep-wide one)."""
        return run.hours * self.by_precision.get(run.precision, self.ratio)


def _device_share(summary: dict, state: dict, profile: ClusterProfile) -> float:
    """Devices a finished run held while it trained: its world size; in a local GPU pool that packs k runs per GPU,
    1/k of one (``runs_per_gpu`` in its state.json, else this profile's ``workers_per_gpu``)."""
    world = max(1, int(summary.get("world_size") or 1))
    if state.get("gpu") is None or not str(state.get("job_id") or "").startswith("local-"):
        return float(world)
    per_gpu = state.get("runs_per_gpu") or max(1, profile.workers_per_gpu)
    return world / float(per_gpu)


def calibrate(plan: Plan) -> Calibration | None:
    """Measured vs estimated device-hours of the plan's completed runs (budget-branch trunks and branches left out:
    a branch's clock includes its trunk's); None when none has a usable ``wall_clock_s``."""
    measured: dict[str, list[float]] = {}
    for r in plan.runs:
        if r.state != "done" or r.role or r.hours <= 0:
            continue
        summary = r.view.summary or {}  # the files as the plan's inspect read them
        wall = summary.get("wall_clock_s")
        if not isinstance(wall, (int, float)) or not math.isfinite(wall) or wall <= 0:
            continue
        share = _device_share(summary, r.view.record, plan.profile)
        m = measured.setdefault(r.precision, [0.0, 0.0, 0])
        m[0] += wall / 3600.0 * share
        m[1] += r.hours
        m[2] += 1
    if not measured:
        return None
    return Calibration(runs=sum(int(m[2]) for m in measured.values()),
                       measured_h=sum(m[0] for m in measured.values()),
                       estimated_h=sum(m[1] for m in measured.values()),
                       by_precision={p: m[0] / m[1] for p, m in measured.items() if m[2] >= CALIBRATE_MIN_RUNS})


def _run_error(point: RunPoint, exc: BaseException) -> str:
    """One line naming the run and what is wrong with it (non-project errors keep their type name)."""
    what = _one_line(exc) if isinstance(exc, QuartetError) else f"{type(exc).__name__}: {_one_line(exc)}"
    return f"run [{point.label}]: {what}"


def _progress(points: list, what: str, every_s: float = 5.0, clock=None):
    """Yield ``points``, showing progress on stderr. First, before any work, one line with the count; then a
    transient bar with the time left on a terminal, else (logs and pipes) one line with an estimate of the whole
    once the first runs are timed (1 s or 50 runs), and one line about every ``every_s`` seconds (and at the end)
    with the time left. ``clock``: seconds (default ``time.monotonic``)."""
    import sys
    import time

    clock = clock or time.monotonic
    total = len(points)
    print(f"{what}: {total} runs to compose and resolve", file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import track

        yield from track(points, description=f"{what}: {total} runs", transient=True, console=Console(stderr=True))
        return
    t0 = last = clock()
    estimated = False
    for i, point in enumerate(points, 1):
        yield point
        now = clock()
        left = (now - t0) / i * (total - i)
        if not estimated and i < total and (now - t0 >= 1.0 or i >= 50):
            estimated = True
            print(f"{what}: about {runstate.duration(left + now - t0)} for all {total} runs (the first {i} took "
                  f"{now - t0:.1f} s)", file=sys.stderr, flush=True)
        if now - last >= every_s or i == total:
            last = now
            tail = f", about {runstate.duration(left)} left" if i < total else ""
            print(f"{what}: {i}/{total} runs composed and resolved ({now - t0:.0f} s{tail})", file=sys.stderr,
                  flush=True)


def plan_memory(cfg: DictConfig, res, profile: ClusterProfile, world: int) -> MemoryEstimate:
    """Decide the run's parallelism and check its per-GPU memory estimate against the profile's GPU.

    The run's own ``run.parallel`` (ddp | fsdp) wins; ``auto`` takes the profile rule's ``parallel``, else DDP
    when its estimate fits ``gpu_memory_gb``, else FSDP. The choice is written into ``cfg.run.parallel`` (so the
    run's config.yaml states it). Raises ConfigError (one line with the numbers) when the estimate exceeds
    ``gpu_memory_gb``. ``res`` is ``resolve(cfg)``: the estimate takes the per-rank micro-batch at ``world`` from
    ``cfg`` itself, and the caller has checked that the batch splits over ``world`` (``res.check_world_size``).
    """
    requested = str(cfg.run.parallel)
    if requested == "auto":
        requested = rule_for(profile, res.n_params).parallel or "auto"
    ac = bool(cfg.run.activation_checkpointing)
    gpu_gb = profile.gpu_memory_gb
    mode, est = choose_parallel(res, world_size=world, gpu_memory_gb=gpu_gb,
                                requested=requested, activation_checkpointing=ac)
    if gpu_gb is not None and est.total > float(gpu_gb) * GB:
        fixes = [] if mode == "fsdp" else ["run.parallel=fsdp"]
        fixes += [] if ac else ["run.activation_checkpointing=true"]
        fit = _micro_batch_that_fits(cfg, world, mode, ac, float(gpu_gb))
        fixes += ([f"optim.micro_batch_size={fit}"] if fit else []) + ["a rule with more GPUs"]
        raise ConfigError(f"per-GPU memory estimate {est.describe()} exceeds the {gpu_gb:g} GB GPU of profile "
                          f"{profile.name}; try {' or '.join(fixes)}")
    OmegaConf.set_readonly(cfg.run, False)
    cfg.run.parallel = mode
    return est


def _micro_batch_that_fits(cfg: DictConfig, world: int, mode: str, ac: bool, gpu_gb: float) -> int | None:
    """The largest micro-batch (halving the per-rank batch) whose estimate fits ``gpu_gb``; None if none does."""
    from quartet.config import resolve
    from quartet.memory import estimate_run

    micro = resolve(cfg.copy(), world).batch_size // world
    while micro >= 1:
        c = cfg.copy()
        OmegaConf.set_readonly(c, False)
        c.optim.micro_batch_size = micro
        if estimate_run(resolve(c, world), parallel=mode, world_size=world,
                        activation_checkpointing=ac).total <= gpu_gb * GB:
            return micro
        micro //= 2
    return None


def write_run_config(run: PlannedRun, profile: ClusterProfile) -> Path:
    """Write the resolved ``config.yaml`` into the run directory (before submission).

    ``cluster`` records where it was sent (informational: not part of the run id), so the run can
    be replayed from its directory alone with ``quartet train --config-file DIR/config.yaml``.
    """
    cfg = run.cfg.copy()
    OmegaConf.set_struct(cfg, False)
    cfg.cluster = {
        "profile": profile.name,
        "kind": profile.kind,
        "nodes": run.resources.nodes,
        "tasks_per_node": run.resources.tasks_per_node,
        "gpus_per_node": run.resources.gpus_per_node,
        "time_min": run.resources.time_min,
    }
    text = OmegaConf.to_yaml(cfg, resolve=True)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    paths.atomic_write_text(run.run_dir / paths.CONFIG, text, parents=True)
    return run.run_dir / paths.CONFIG


# ------------------------------------------------------------------------------------ printing


def _si(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    for unit, div in (("Z", 1e21), ("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def _parallel_cell(r: PlannedRun) -> str:
    """``ddp`` or ``fsdp/64`` (sharded over 64 ranks)."""
    mode = str(r.cfg.run.parallel)
    return f"{mode}/{r.memory.shards}" if r.memory and mode == "fsdp" else mode


#: runs shown in the plan table unless ``max_rows`` says otherwise: a table of 10^5 rows takes minutes to print
TABLE_ROWS = 1000


def render_plan(plan: Plan, console=None, max_rows: int | None = None) -> None:
    """Print the plan: per run N, D, steps, LR, FLOPs, hours, resources, state (the first ``max_rows``, by default
    :data:`TABLE_ROWS`); then the totals and the arrays."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    given = max_rows is not None
    max_rows = max_rows if given else TABLE_ROWS
    prof = plan.profile
    dev = prof.device_label
    table = Table(title=f"sweep {plan.spec.name} -> {prof.name} ({prof.kind})", show_lines=False)
    for col in ("run", "N", "D", "D/N", "steps", "LR", "FLOPs", f"{dev}s", "parallel", f"GB/{dev}", f"{dev}-h",
                "state"):
        table.add_column(col, justify="left" if col in ("run", "state") else "right", no_wrap=True)
    rows = plan.runs[:max_rows]
    for r in rows:
        table.add_row(r.run_id, _si(r.n_params), _si(r.tokens), f"{r.tokens / r.n_params:.0f}", str(r.steps),
                      f"{r.lr:.3g}", _si(r.flops), str(max(1, r.resources.gpus)), _parallel_cell(r),
                      f"{r.memory.total / GB:.1f}" if r.memory else "-", f"{r.hours:.3g}", r.state)
    console.print(table)
    if len(plan.runs) > max_rows:
        console.print(f"... {len(plan.runs) - max_rows} more runs" + ("" if given else " (--max-rows N shows N)"))
    counts = plan.counts()
    total_h = sum(r.hours for r in plan.runs)
    todo_h = sum(r.hours for r in plan.pending())
    console.print(
        f"[bold]{len(plan.runs)} runs[/]: " + ", ".join(f"{counts.get(k, 0)} {k}" for k in ("new", "done", "running", "failed", "preempted", "cancelled", "corrupt", "invalid") if counts.get(k))
        + f" | to submit: {len(plan.pending())} | {dev}-hours: {todo_h:.4g} to run, {total_h:.4g} for the whole sweep"
        + f" | FLOPs total {_si(sum(r.flops for r in plan.runs))}"
    )
    cal = calibrate(plan)
    if cal is not None:
        ratios = sorted(cal.by_precision.values())
        spread = f"; per precision {ratios[0]:.2g}-{ratios[-1]:.2g}x" if len(ratios) > 1 else ""
        console.print(f"measured: {cal.runs} completed run(s) took {cal.measured_h:.4g} {dev}-hours where the profile "
                      f"estimates {cal.estimated_h:.4g} ({cal.ratio:.2g}x{spread}); scaled by it: "
                      f"{sum(cal.hours(r) for r in plan.pending()):.4g} {dev}-hours to run")
    if any(r.role for r in plan.runs):
        alone = sum(r.hours_alone or 0.0 for r in plan.runs)
        console.print(f"budget branches: {sum(r.role == 'trunk' for r in plan.runs)} trunks + "
                      f"{sum(r.role == 'branch' for r in plan.runs)} branches: {dev}-hours {total_h:.4g} with branches, "
                      f"{alone:.4g} without (every budget from scratch): {1 - total_h / alone if alone else 0:.0%} "
                      f"saved (planned, not measured)")
    if prof.kind == "local":
        console.print(f"pool: {describe_local(prof)}")
    if prof.kind == "slurm":
        arrays = plan.arrays(plan.runs)
        todo = plan.arrays()
        console.print(f"job arrays (one per resource shape, <= {plan.max_array_size()} tasks each, at most "
                      f"{prof.array_parallelism} running at once): {len(arrays)} for the whole sweep, {len(todo)} to submit now")
        for res, members in arrays:
            n_todo = sum(1 for m in members if m.to_submit)
            console.print(f"  {len(members):4d} runs ({n_todo} to submit)  {res.describe(prof)}"
                          f"  {dev}-h {sum(m.hours for m in members):.4g}")
    if prof.gpu_memory_gb:
        worst = max((r for r in plan.runs if r.memory), key=lambda r: r.memory.total, default=None)
        if worst is not None:
            console.print(f"memory: largest per-{dev} estimate {worst.memory.describe()} ({worst.run_id}), "
                          f"{dev} memory {prof.gpu_memory_gb:g} GB")
    for note in plan.spec.notes:
        console.print(f"note: {note}")
