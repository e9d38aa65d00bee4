"""The trainer: one run from a resolved config into its run directory, resumable and preemptible.

Loop per optimizer step (the paper's recipe): take the next ``batch_size`` windows of the seeded
sampler, split them over ranks and micro-batches (gradient accumulation), forward under BF16 autocast
on CUDA (fp32 on CPU), backward, clip the global grad norm to ``optim.grad_clip``, AdamW step, LR
schedule step. A non-finite loss or gradient stops the run before the update and names the step and
the first module whose output (or gradient) went non-finite. Files follow docs/ARCHITECTURE.md; everything
the run writes besides its checkpoints (state, metrics, summary, logs, wandb, the non-finite diagnosis) is
:mod:`quartet.recorder`'s, so this module reads as the loop: build (model, precision, optimizer) → wrap
(DDP, compile) → step → checkpoint.

The LR schedule is torch's OneCycleLR with ``anneal_strategy='cos'``, ``div_factor=100`` and
``final_div_factor=0.1`` as in the paper's code, written out in :func:`lr_at` so it needs no guard for
tiny runs: a cosine-shaped warm-up from ``lr/100`` to ``lr`` over the first ``warmup`` updates, then a
cosine from ``lr`` down to ``lr/10`` at the last update.
"""
from __future__ import annotations

import contextlib
import errno
import math
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from quartet import checkpoint as ckpt_io
from quartet import distributed as qdist
from quartet import parallel as qpar
from quartet import runlock
from quartet.config import ResolvedRun, compose, load_config_file, resolve, to_container, to_yaml
from quartet.data import WindowSampler, open_data, read_windows, val_windows
from quartet.errors import NonFiniteError, QuartetError
from quartet.model import BlockLinear, Llama
from quartet import paths
from quartet.paths import apply_shared_umask, branch_source
from quartet.recorder import RunRecorder, diagnose_non_finite, make_summary
from quartet.runs import config_hash, run_dir, run_id

# ----------------------------------------------------------------------------------------------
# Schedule and optimizer
# ----------------------------------------------------------------------------------------------


def _cos_anneal(start: float, end: float, pct: float) -> float:
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1.0)


def lr_at(t: int, *, lr: float, steps: int, warmup: int, div_factor: float = 100.0, end_div: float = 10.0) -> float:
    """LR of the update with 0-based index ``t`` (OneCycleLR cos, two phases; see the module docstring).

    Phase 1 ends at index ``warmup - 1`` (LR = lr), phase 2 at ``steps - 1`` (LR = lr / end_div),
    exactly as torch's OneCycleLR(pct_start=warmup/steps, div_factor, final_div_factor=div/end_div).
    With fewer than 2 warm-up updates the run starts at the peak (OneCycleLR would divide by zero).
    """
    start, end = lr / div_factor, lr / end_div
    e1, e2 = float(warmup) - 1.0, float(steps) - 1.0
    if warmup >= 2 and t <= e1:
        return _cos_anneal(start, lr, t / e1)
    if warmup < 2:
        e1 = 0.0
    if e2 <= e1:
        return lr
    return _cos_anneal(lr, end, min(max((t - e1) / (e2 - e1), 0.0), 1.0))


def wsd_lr_at(t: int, *, lr: float, steps: int, warmup: int, decay_start: int, div_factor: float = 100.0,
              end_div: float = 10.0) -> float:
    """LR of update ``t`` under warm-up-stable-decay (``optim.schedule=wsd``; docs/training.md).

    Warm-up as :func:`lr_at` (cosine-shaped from ``lr/div_factor`` to ``lr`` at ``warmup - 1``), then ``lr`` up to
    ``decay_start - 1``, then the 1-sqrt decay (Hägele et al. 2024) ``end + (lr - end) * (1 - sqrt(p))`` with
    ``end = lr/end_div`` and ``p = (t - decay_start + 1) / (steps - decay_start)``, so the last update has
    ``lr/end_div``. Nothing before ``decay_start`` depends on ``steps``: runs of every budget share their LR up
    to their decay, which is what lets a budget branch start from a trunk's checkpoint.
    """
    if warmup >= 2 and t <= warmup - 1:
        return _cos_anneal(lr / div_factor, lr, t / (warmup - 1.0))
    if t < decay_start or steps <= decay_start:
        return lr
    end = lr / end_div
    return end + (lr - end) * (1.0 - math.sqrt(min((t - decay_start + 1) / (steps - decay_start), 1.0)))


def schedule_of(res: ResolvedRun, optim) -> Callable[[int], float]:
    """``t -> LR`` of the run's ``optim.schedule`` (cosine: :func:`lr_at`; wsd: :func:`wsd_lr_at`)."""
    kw = {"lr": res.lr, "steps": res.steps, "warmup": res.warmup_steps, "div_factor": float(optim.div_factor),
          "end_div": float(optim.end_div)}
    if res.decay_start is not None:
        return lambda t: wsd_lr_at(t, decay_start=res.decay_start, **kw)
    return lambda t: lr_at(t, **kw)


def param_groups(model: torch.nn.Module, decay_ids: set[int], weight_decay: float) -> list[dict]:
    """Two AdamW groups: weight decay on block-linear weights only; norms, embeddings, lm_head undecayed."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if id(p) in decay_ids else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# ----------------------------------------------------------------------------------------------
# Trainer
# ----------------------------------------------------------------------------------------------


class BranchWaitingError(QuartetError):
    """A budget branch whose trunk has not yet saved the checkpoint it starts from (one-line message)."""


class BranchSourceLostError(QuartetError):
    """A budget branch whose trunk finished without a good checkpoint at the branch step: waiting cannot help (one
    line saying what happened and the two ways back, as commands)."""


class RunDirMovedError(QuartetError):
    """The run directory was moved, renamed or replaced while its trainer held it (one-line message)."""


def _dir_key(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``, or None when it does not exist (any more)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class Trainer:
    """One training run of ``cfg`` into ``run_dir(cfg)``; see docs/ARCHITECTURE.md for the files.

    Construction validates everything (config, data, precision scheme) before any file is written,
    so a bad input leaves no run directory behind. ``run()`` resumes from ``ckpt/last.pt`` when present
    (from ``ckpt/prev.pt`` when last.pt is missing or fails its checksum; see :mod:`quartet.checkpoint`).
    """

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        want = str(cfg.run.device)
        dev_type = "cuda" if (want == "cuda" or (want == "auto" and torch.cuda.is_available())) else "cpu"
        if dev_type == "cuda" and not torch.cuda.is_available():
            from quartet.errors import ConfigError

            raise ConfigError("run.device=cuda: no CUDA device is visible; allowed: auto, cpu")
        threads = cpu_threads(int(cfg.run.threads))
        if threads:
            torch.set_num_threads(threads)
        # FSDP2 needs a process group even on one rank: decide the parallelism before setting up
        self.parallel = qpar.resolve_mode(resolve(cfg.copy(), qdist.world_size_from_env()), str(cfg.run.parallel),
                                          qdist.world_size_from_env(), dev_type, bool(cfg.run.activation_checkpointing))
        self.dist = qdist.setup(dev_type, single_group=self.parallel == "fsdp")
        try:
            self._build(cfg, dev_type)
        except BaseException:
            qdist.teardown(self.dist)  # a bad input must not leave a process group behind
            raise

    def _build(self, cfg: DictConfig, dev_type: str) -> None:
        self.res: ResolvedRun = resolve(cfg, self.dist.world_size)
        self.device = torch.device(dev_type, self.dist.local_rank) if dev_type == "cuda" else torch.device("cpu")
        self.is_main = self.dist.is_main
        self.run_id = run_id(cfg)
        self.dir = run_dir(cfg)
        self.config_hash = config_hash(cfg)
        self._stop = threading.Event()
        #: callables ``fn(trainer, row)`` called on rank 0 after every optimizer step (row: metrics of the step)
        self.callbacks: list = []
        #: callables ``fn(trainer)`` called on rank 0 once run() holds the run lock, before it writes anything
        #: (a launcher records its job in state.json there, so a refused duplicate never touches it)
        self.on_start: list = []
        self._lock = None
        self._dir_id: tuple[int, int] | None = None  # the run directory trained in (rank 0): detects a move
        self.step = 0
        self.elapsed_prev = 0.0
        #: the steps whose metrics row the run has written (or a resume found lost): rows 1..step of metrics.jsonl
        #: should be these; kept in every checkpoint, so a resume notices rows that went missing since
        self.logged_steps: list[int] = []
        #: the run directory's files other than checkpoints (state, metrics, summary, logs, wandb)
        self.record = RunRecorder(self.dir, self.run_id, self.res.steps, self.is_main)
        self.log = self.record.log
        #: budget branches (docs/branches.md): a trunk keeps ckpt/branch_<step>.pt at these steps; a branch starts
        #: from its trunk's (branch_src) unless it has a checkpoint of its own
        self.save_steps = {int(x) for x in (cfg.get("branch") or {}).get("save_steps") or []}
        self.branch_src = branch_source(cfg, self.dir)
        self._check_branch_ready()

        progress = bool(cfg.logging.progress) and self.is_main
        self.data = open_data(cfg.data, progress=progress and sys.stderr.isatty())
        self.sampler = WindowSampler(self.data.train, self.res.seq_len, int(cfg.run.data_seed))
        self.val_windows = val_windows(self.data.val, self.res.seq_len)

        torch.manual_seed(int(cfg.run.seed))
        self.model = Llama.from_config(cfg.model, self.res.vocab_size, device=self.device)
        # by name: FSDP2 replaces the parameter objects (ids) but keeps their names
        decay = {f"{n}.weight" for n, m in self.model.named_modules() if isinstance(m, BlockLinear)}
        from quartet import quant
        from quartet.plugins import load_kernels

        load_kernels()  # the device is picked: let the fast backends register before apply_precision chooses one
        self.quant = quant
        # a compiled run traces the fused Quartet layers too (random draws fed from the device per micro-batch)
        self.plan = quant.apply_precision(self.model, cfg.precision, seed=int(cfg.run.seed), device=self.device,
                                          traceable=bool(cfg.run.compile) and bool(cfg.run.get("compile_fused", True)))
        o = cfg.optim
        fused = {"fused": True} if self.device.type == "cuda" else {}  # DTensor (FSDP2) shards take it too
        # FSDP2 shards the parameters in place: wrap before the optimizer sees them
        self.train_model: torch.nn.Module = qpar.wrap(self.model, self.parallel, self.device,
                                                      world_size=self.dist.world_size, amp=bool(cfg.run.amp),
                                                      activation_checkpointing=bool(cfg.run.activation_checkpointing))
        decay_ids = {id(p) for n, p in self.model.named_parameters() if n in decay}
        self.optimizer = torch.optim.AdamW(param_groups(self.model, decay_ids, float(o.weight_decay)), lr=self.res.lr,
                                           betas=(float(o.beta1), float(o.beta2)), eps=float(o.eps), **fused)
        r = self.res
        lr_of = schedule_of(r, o)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda t: lr_of(t) / r.lr)
        self.train_model = self._compiled(self.train_model)
        #: the compiled step is replayed as CUDA graphs (run.compile_mode=reduce-overhead)
        self.cuda_graphs = bool(cfg.run.compile) and str(cfg.run.compile_mode) == "reduce-overhead"
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.amp = self.device.type == "cuda" and bool(cfg.run.amp)
        self.accum = r.accum_steps(self.dist.world_size)

    def _check_branch_ready(self) -> None:
        """A branch without a checkpoint of its own whose trunk checkpoint is not there yet raises
        :class:`BranchWaitingError` before anything is written (a completed branch needs its trunk no more)."""
        if (self.save_steps or self.branch_src is not None) and self.parallel == "fsdp":
            from quartet.errors import ConfigError

            raise ConfigError("budget branches keep one-file checkpoints: they need run.parallel=ddp, not fsdp")
        if self.branch_src is None or (self.dir / paths.SUMMARY).exists() or ckpt_io.exists(self.ckpt_path):
            return
        if not self.branch_src.is_file():
            b = self.cfg.branch
            if self._trunk_finished():
                raise self._branch_source_lost("is missing")
            raise BranchWaitingError(f"branch {self.run_id} waits for its trunk {b.trunk} to save step {b.step} "
                                     f"({self.branch_src} is not there yet); launch it again once the trunk got there")

    def _trunk_finished(self) -> bool:
        """Whether this branch's trunk completed (its summary.json exists): it will write no branch point again."""
        return (paths.trunk_of(self.branch_src) / paths.SUMMARY).is_file()

    def _branch_source_lost(self, why: str) -> BranchSourceLostError:
        """The error of a branch whose finished trunk lacks a good ``branch_<step>.pt``, with the two ways back."""
        b, trunk_dir = self.cfg.branch, paths.trunk_of(self.branch_src)
        own = self.dir / paths.CONFIG
        scratch = (f"quartet train --config-file {own} branch.trunk=null branch.step=null" if own.is_file()
                   else "the same quartet train command with branch.trunk=null branch.step=null")
        return BranchSourceLostError(
            f"branch {self.run_id} cannot start: its trunk {b.trunk} is finished but {self.branch_src} {why}, and a "
            f"finished trunk never writes it again (was the trunk's ckpt/ deleted to free disk?); either train this "
            f"budget from scratch (the same WSD run, its own run id): {scratch}; or retrain the trunk (all its steps) "
            f"so that it keeps step {b.step} again: mv {trunk_dir / paths.SUMMARY} {trunk_dir / paths.SUMMARY}.old "
            f"&& rm -r {trunk_dir / paths.CKPT} && quartet train --config-file {trunk_dir / paths.CONFIG}, then launch "
            f"this branch again")

    def _compiled(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module the step runs, compiled when run.compile (after DDP / FSDP2 wrapping, quartet.parallel.wrap)."""
        if not bool(self.cfg.run.compile):
            return module
        # bf16, the FP8 layer and the fused Quartet layer (as registered operators) compile whole; the
        # operand-by-operand QuantLinear of other schemes runs eagerly between compiled regions.
        return torch.compile(module, mode=str(self.cfg.run.compile_mode))

    # -- public API --------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Thread-safe: checkpoint at the next step boundary, mark the run "preempted" and return."""
        self._stop.set()

    @property
    def ckpt_path(self) -> Path:
        """ckpt/last.pt, or the folder ckpt/last of a sharded (FSDP) checkpoint."""
        return paths.last_checkpoint(self.dir, sharded=self.parallel == "fsdp")

    def _state(self) -> dict:
        """What a checkpoint holds besides model and optimizer (step, scheduler, sampler, RNG, wall time)."""
        return {
            "step": self.step, "run_id": self.run_id, "config_hash": self.config_hash,
            "scheduler": self.scheduler.state_dict(), "sampler": self.sampler.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
            "elapsed_s": self.elapsed_prev + (time.time() - self._t_start if hasattr(self, "_t_start") else 0.0),
            "metrics_steps": list(self.logged_steps),
        }

    def save_checkpoint(self) -> None:
        """Write ckpt/last.pt atomically with a checksum, the old one kept as ckpt/prev.pt (rank 0; all ranks wait);
        under FSDP every rank writes its shards into the folder ckpt/last (old one: ckpt/prev)."""
        self.record.sync_metrics()  # rows 1..step on disk before the checkpoint that says they are there
        if self.is_main or self.parallel == "fsdp":
            state = self._state()
            if self.parallel == "fsdp":  # collective: every rank writes its shards
                ckpt_io.save_sharded(self.model, self.optimizer, state, self.ckpt_path)
            else:
                ckpt_io.save_atomic({**state, "model": self.model.state_dict(),
                                     "optimizer": self.optimizer.state_dict()}, self.ckpt_path)
        qdist.barrier(self.dist)

    def save_branch_point(self) -> None:
        """A trunk keeps its state after this update as ckpt/branch_<step>.pt: atomic and checksummed like last.pt,
        never rotated (a resumed trunk that passes the step again writes it again: the same state where the run is
        bitwise reproducible, docs/branches.md says where it is not). It holds the trunk's
        metrics rows 1..step too (``metrics``): a branch's history is exactly those, whatever the trunk's live
        metrics.jsonl says when the branch starts (a resuming trunk cuts it back to its last.pt)."""
        if self.is_main:
            ckpt_io.save_atomic({**self._state(), "model": self.model.state_dict(),
                                 "optimizer": self.optimizer.state_dict(),
                                 "metrics": self.record.metrics_lines(self.step)},
                                paths.branch_point(self.dir, self.step), keep_prev=False)
        qdist.barrier(self.dist)

    def _check_ckpt_kind(self) -> None:
        """Refuse (one line) a checkpoint written under the other parallelism rather than restart from step 0."""
        one, folder = paths.last_checkpoint(self.dir), paths.last_checkpoint(self.dir, sharded=True)
        ours = ckpt_io.sharded_exists(folder) if self.parallel == "fsdp" else ckpt_io.exists(one)
        theirs = ckpt_io.exists(one) if self.parallel == "fsdp" else ckpt_io.sharded_exists(folder)
        if theirs and not ours:
            other = "ddp" if self.parallel == "fsdp" else "fsdp"
            raise QuartetError(f"{self.dir / paths.CKPT} holds a run.parallel={other} checkpoint; resume with run.parallel={other}")

    def _load_checkpoint(self) -> None:
        """Restore from ckpt/last.pt, or ckpt/prev.pt when last.pt is bad (one warning line; see quartet.checkpoint)."""
        warn = self.log.warning if self.is_main else (lambda _msg: None)
        if self.parallel == "fsdp":  # collective; re-sliced to this world size
            state, path = ckpt_io.load_sharded_latest(self.model, self.optimizer, self.ckpt_path, warn=warn)
        else:
            state, path = ckpt_io.load_latest(self.ckpt_path, map_location=self.device, move_bad=self.is_main,
                                              warn=warn)
        if state.get("config_hash") != self.config_hash:
            raise QuartetError(f"checkpoint {path} belongs to another config (hash "
                               f"{str(state.get('config_hash'))[:8]} != {self.config_hash[:8]}); move it away")
        self._restore(state)
        self.elapsed_prev = float(state.get("elapsed_s", 0.0))
        self.logged_steps = self._steps_logged(state)

    def _steps_logged(self, state: dict) -> list[int]:
        """The steps up to the checkpoint's whose metrics row was written: recorded in the checkpoint, or (one written
        before they were) those this run's logging settings log."""
        if state.get("metrics_steps") is not None:
            return [int(s) for s in state["metrics_steps"]]
        return [t for t in range(1, self.step + 1) if any(self._row_due(t))]

    def _start_branch(self) -> None:
        """A budget branch's first start: its trunk's state at the branch step (model, optimizer, data position, RNG),
        the LR of its next update from this run's own schedule (the trunk's scheduler set the plateau's), and the
        trunk's metrics up to the branch step as the start of its own (docs/branches.md)."""
        import shutil

        b, path = self.cfg.branch, self.branch_src
        try:
            state = ckpt_io.load(path, map_location=self.device, warn=self.log.warning if self.is_main else None)
        except ckpt_io.CheckpointError as exc:
            if self._trunk_finished():
                raise self._branch_source_lost(f"is unusable ({str(exc).removeprefix(f'{path}: ')})") from None
            raise
        if state.get("run_id") != str(b.trunk) or int(state.get("step", -1)) != int(b.step):
            raise QuartetError(f"{path} is run {state.get('run_id')} at step {state.get('step')}, not trunk {b.trunk} "
                               f"at step {b.step}; move it away")
        self._restore(state)
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
            group["lr"] = base * self.scheduler.lr_lambdas[0](self.step)
        self.elapsed_prev = 0.0  # a branch's wall time is its own decay's
        self.logged_steps = self._steps_logged(state)
        if state.get("metrics") is not None:  # the trunk's rows 1..step, as they were when it saved this state
            self.record.write_metrics_lines(state["metrics"])
            return
        trunk_metrics = paths.trunk_of(path) / paths.METRICS  # a branch point written before it kept its rows
        if self.is_main and trunk_metrics.is_file():  # begin() drops its rows past the branch step
            shutil.copyfile(trunk_metrics, self.dir / paths.METRICS)

    def _restore(self, state: dict) -> None:
        """Model (unless FSDP restored it in place), optimizer, scheduler, sampler, RNG and step from ``state``."""
        if self.parallel != "fsdp":  # the sharded load restored model and optimizer in place
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        rng = state["rng"]
        torch.set_rng_state(rng["torch"].cpu())
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            # one state per GPU the saving process saw; a run resumed where fewer are visible (saved by 2 ranks that
            # each saw 2 GPUs, resumed on 1) restores those it has (torch would raise IndexError for the others)
            torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]][:torch.cuda.device_count()])
        self.step = int(state["step"])

    # -- evaluation --------------------------------------------------------------------------
    def _autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()

    @torch.no_grad()
    def evaluate(self, max_batches: int | None = None) -> float:
        """Mean CE per token (nats) over the first ``max_batches`` micro-batches of validation windows
        (all of them when None: the final full pass). Windows are split over ranks and summed."""
        wins = self.val_windows
        mb = self.res.micro_batch_size
        if max_batches is not None:
            wins = wins[: max_batches * mb]
        self.model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        for chunk, counted in qpar.eval_batches(wins, rank=self.dist.rank, world_size=self.dist.world_size, micro=mb,
                                                lockstep=self.parallel == "fsdp"):
            x, y = read_windows(self.data.val, chunk, self.res.seq_len, self.res.vocab_size)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self._autocast():
                loss_sum = self.model(x, y, reduction="sum")
            if counted:
                total[0] += loss_sum.double()
                total[1] += y.numel()
        self.model.train()
        total = qdist.all_reduce_sum(total, self.dist)
        return float(total[0] / total[1])

    # -- the loop ----------------------------------------------------------------------------
    def _step(self) -> tuple[float, float]:
        B, W, r = self.res.batch_size, self.dist.world_size, self.dist.rank
        windows = self.sampler.take(B)
        per_rank = B // W
        mine = windows[r * per_rank:(r + 1) * per_rank]
        mb = self.res.micro_batch_size
        batches = []
        for i in range(0, per_rank, mb):
            x, y = read_windows(self.data.train, mine[i:i + mb], self.res.seq_len, self.res.vocab_size)
            batches.append((x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)))
        # Global micro-batch numbering: rank r's first micro-batch is r * accum (see the slicing above).
        self.quant.set_step(self.model, self.step + 1, first_call=r * len(batches))
        loss_acc = torch.zeros((), device=self.device, dtype=torch.float32)
        for i, (x, y) in enumerate(batches):
            ctx = qpar.micro_batch_context(self.train_model, last=i == len(batches) - 1)
            self.quant.begin_micro_batch(self.model, i)
            if self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()  # the last micro-batch's outputs are consumed
            with ctx:
                with self._autocast():
                    loss = self.train_model(x, y)
                (loss / len(batches)).backward()
            loss_acc += loss.detach().float()
            if self.cuda_graphs and i < len(batches) - 1:
                # A replayed backward writes the gradients into its graph's own memory, and the next micro-batch's
                # replay would overwrite them while they are still being accumulated (torch raises "accessing
                # tensor output of CUDAGraphs that has been overwritten"): move them out first.
                for p in self.model.parameters():
                    if p.grad is not None:
                        p.grad = p.grad.clone()
        loss_mean = qdist.all_reduce_mean(loss_acc / len(batches), self.dist)
        clip = float(self.cfg.optim.grad_clip)
        grad_norm = qpar.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else float("inf"))
        loss_v, gn_v = float(loss_mean), float(grad_norm)
        if not math.isfinite(loss_v) or not math.isfinite(gn_v):
            what = "loss" if not math.isfinite(loss_v) else "gradient norm"
            raise NonFiniteError(diagnose_non_finite(self.model, self.optimizer, self.quant, self._autocast, batches,
                                                     what, self.step + 1))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return loss_v, gn_v

    def run(self) -> dict:
        """Train to the end (or until request_stop); returns the summary (with "state") or a preempted record.

        Holds the run's lock (:mod:`quartet.runlock`) from before its first write until it returns: when
        another process is training this run it raises :class:`~quartet.runlock.RunLockedError` (one line
        naming the holder) and changes nothing.
        """
        done = self._done_or_check()
        if done is not None:
            return self._already_done(done)
        self._lock = self._acquire_lock()
        try:
            # the holder we waited for may have just finished it: never train a completed run again
            done = self._done_or_check()
            if done is not None:
                return self._already_done(done)
            try:
                if self.is_main:
                    for fn in self.on_start:
                        fn(self)
            except BaseException:
                qdist.teardown(self.dist)
                raise
            return self._run_locked()
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _done_or_check(self) -> dict | None:
        """The summary of a completed run, else None; QuartetError (after teardown) on a corrupt file."""
        try:  # checked before anything is written: a corrupt file stops the run with state.json untouched
            done = self.record.completed_summary()
            if done is None:
                self.record.metrics_rows()
        except QuartetError:
            qdist.teardown(self.dist)
            raise
        return done

    def _already_done(self, done: dict) -> dict:
        if self.is_main:
            print(f"quartet: {self.dir} is already completed (val_loss={done.get('val_loss')}); not retraining")
        qdist.teardown(self.dist)
        return {**done, "state": "completed"}

    def _acquire_lock(self):
        """Rank 0 takes the run lock; every rank raises RunLockedError (after teardown) if it is held."""
        lock, refused = None, None
        if self.is_main:
            apply_shared_umask(self.dir)  # a group-shared runs directory: what the run writes stays group-writable
            try:
                lock = runlock.acquire(self.dir, what=f"run {self.run_id}")
            except runlock.RunLockedError as exc:
                refused = exc
        # all ranks must stop together, or the others would wait for rank 0 at the first collective
        if qdist.any_rank(refused is not None, self.dist, self.device):
            if lock is not None:
                lock.release()
            qdist.teardown(self.dist)
            raise refused or runlock.RunLockedError(f"run {self.run_id}: rank 0 found it being trained by another "
                                                    f"process (see {self.dir / paths.TRAIN_LOCK})")
        return lock

    def _dir_moved(self) -> bool:
        """Rank 0: True when ``self.dir`` no longer names the directory this trainer locked (moved, renamed,
        deleted, or another directory put in its place). Other ranks: False."""
        return self.is_main and self._dir_id is not None and _dir_key(self.dir) != self._dir_id

    def _raise_if_moved(self, moved: bool) -> None:
        """Collective: stop every rank with :class:`RunDirMovedError` when rank 0 found its directory moved."""
        if qdist.any_rank(moved, self.dist, self.device):
            raise self._moved_error()

    def _moved_error(self) -> RunDirMovedError:
        """The error of a run directory that moved while this trainer held it.

        Nothing more is written at the old path (it may be gone, or be another run's now). Where the kernel still
        knows the directory (the lock file's open descriptor follows a rename), the failure is recorded there, so
        the run resumes from its last checkpoint at its new place."""
        if not self.is_main:
            return RunDirMovedError(f"run {self.run_id}: rank 0 found its directory {self.dir} moved; stopped")
        old, new = self.dir, self._lock.current_dir() if self._lock is not None else None
        if new is not None and new != old:
            self.record.dir = new  # fail() records the reason where the run now is
            return RunDirMovedError(
                f"run directory {old} was moved to {new} while training (step {self.step}); stopped without writing "
                f"to the old path; resume there from its last checkpoint: quartet train --config-file {new / paths.CONFIG}")
        self.record.is_main = False  # nowhere to record it: the old path is not this run's any more
        return RunDirMovedError(
            f"run directory {old} vanished or was replaced while training (step {self.step}); stopped without writing "
            f"to it again; if it was moved, resume from its new place: quartet train --config-file NEW_DIR/config.yaml")

    def _run_locked(self) -> dict:
        if self.is_main:
            (self.dir / paths.CKPT).mkdir(parents=True, exist_ok=True)
            self._dir_id = _dir_key(self.dir)
        qdist.barrier(self.dist)
        self.record.open_log()
        resuming = False
        try:
            self.record.write_start_files(self.cfg, self.device, self.plan)
            self._check_ckpt_kind()
            if (ckpt_io.sharded_exists if self.parallel == "fsdp" else ckpt_io.exists)(self.ckpt_path):
                resuming = True  # until loaded, self.step (0) is not the run's step: keep the recorded one
                self._load_checkpoint()
                resuming = False
                self.log.info("resuming %s from step %d/%d", self.run_id, self.step, self.res.steps)
            elif self.branch_src is not None:
                resuming = True
                self._start_branch()
                resuming = False
                self.log.info("branching %s from trunk %s at step %d/%d", self.run_id, self.cfg.branch.trunk,
                              self.step, self.res.steps)
            self.record.begin(self.step, self.cfg.logging.wandb, {**to_container(self.cfg), "run_id": self.run_id},
                              logged=self.logged_steps)
            r = self.res
            self.log.info("run %s -> %s", self.run_id, self.dir)
            self.log.info("model %s: N=%s non-embedding (%s total), D=%s tokens, %d steps (warm-up %d) of %d x %d "
                          "tokens, lr %.3g, precision %s, device %s x%d", self.cfg.model.name, f"{r.n_params:,}",
                          f"{r.n_params_total:,}", f"{r.tokens:,}", r.steps, r.warmup_steps, r.batch_size, r.seq_len,
                          r.lr, self.cfg.precision.name, self.device, self.dist.world_size)
            for line in self.plan.summary().splitlines():  # a few lines; the whole map is in quant_map.json
                self.log.info("%s", line)
            result = self._loop()
            self.record.finish_mirror(0)
            return result
        except BaseException as exc:
            if isinstance(exc, OSError) and self._dir_moved():
                # moved between the last check and a write (which then found no folder): say that, not ENOENT
                moved = self._moved_error()
                self.record.fail(moved, self.step, keep_step=resuming)
                self.record.finish_mirror(1)
                raise moved from None
            self.record.fail(exc, self.step, keep_step=resuming)
            self.record.finish_mirror(1)
            raise
        finally:
            self.record.free_reserve()
            self.record.close_log()
            qdist.teardown(self.dist)

    def _loop(self) -> dict:
        """Optimizer steps until the last one (or a stop request), then the final evaluation and summary."""
        r, lcfg = self.res, self.cfg.logging
        self._t_start = time.time()
        self._last_row = (self._t_start, self.step)  # (time, step) of the last timed metrics row
        loss_v = float("nan")
        with self.record.progress(self.step, show=bool(lcfg.progress)) as record:
            while self.step < r.steps:
                moved = self._dir_moved()
                if qdist.any_rank(self._stop.is_set() or moved, self.dist, self.device):
                    self._raise_if_moved(moved)
                    return self._preempt()
                lr = self.optimizer.param_groups[0]["lr"]
                loss_v, gn_v = self._step()
                s = self.step
                row = self._metrics_row(s, loss_v, lr, gn_v)
                record(row, s, loss_v, lr)
                if row is not None:
                    self.logged_steps.append(s)
                if self.is_main:
                    for fn in self.callbacks:
                        fn(self, {"step": s, "loss": loss_v, "grad_norm": gn_v, "lr": lr})
                if s in self.save_steps:
                    self.save_branch_point()
                if int(lcfg.ckpt_every) > 0 and s % int(lcfg.ckpt_every) == 0 and s != r.steps:
                    self._raise_if_moved(self._dir_moved())
                    self.save_checkpoint()
                    self.record.write_state("running", s)
        val_loss = self.evaluate(None)
        if not math.isfinite(loss_v):  # resumed at the last step (killed between the final checkpoint and the
            # summary): no step ran here, so the last training loss is the one the metrics rows logged
            logged = [row["loss"] for _, _, row in paths.metrics_lines(self.dir)
                      if isinstance(row, dict) and isinstance(row.get("loss"), (int, float))]
            loss_v = float(logged[-1]) if logged else None
        elapsed = self.elapsed_prev + time.time() - self._t_start
        self._raise_if_moved(self._dir_moved())
        self.save_checkpoint()
        summary = make_summary(self.cfg, r, run_id=self.run_id, config_hash=self.config_hash,
                               manifest=self.data.manifest, device=self.device, world_size=self.dist.world_size,
                               plan=self.plan, val_loss=val_loss, train_loss=loss_v, elapsed=elapsed)
        self.record.complete(summary)
        return {**summary, "state": "completed"}

    def _preempt(self) -> dict:
        """A stop was requested: checkpoint, state "preempted", and the record run() returns."""
        self.save_checkpoint()
        self.record.write_state("preempted", self.step)
        self.log.info("stop requested: checkpointed at step %d/%d", self.step, self.res.steps)
        return {"state": "preempted", "run_id": self.run_id, "step": self.step, "steps": self.res.steps,
                "run_dir": str(self.dir)}

    def _row_due(self, s: int) -> tuple[bool, bool]:
        """(a training row, a validation loss) due at update ``s``: see :meth:`_metrics_row`."""
        r, lcfg = self.res, self.cfg.logging
        log = s % int(lcfg.log_every) == 0 or s == r.steps or s == 1
        return log, int(lcfg.val_every) > 0 and s % int(lcfg.val_every) == 0 and s != r.steps

    def _metrics_row(self, s: int, loss_v: float, lr: float, gn_v: float) -> dict | None:
        """The metrics row of update ``s`` (None when it logs nothing): every ``log_every`` steps, the first and
        the last (with throughput since the previous one), and every ``val_every`` (with a validation loss,
        except at the last step, whose full pass is the final row). Collective: every rank calls it."""
        r, lcfg = self.res, self.cfg.logging
        log, validate = self._row_due(s)
        row = None
        if log:
            now = time.time()
            t_last, step_last = self._last_row
            row = {"step": s, "tokens": s * r.tokens_per_step, "loss": loss_v, "lr": lr, "grad_norm": gn_v,
                   "tokens_per_s": (s - step_last) * r.tokens_per_step / max(now - t_last, 1e-9),
                   "elapsed_s": self.elapsed_prev + now - self._t_start}
            self._last_row = (now, s)
            if validate:
                row["val_loss"] = self.evaluate(int(lcfg.val_batches))
            stats_every = int(getattr(self.cfg.precision, "stats_every", 0) or 0)
            if stats_every and s % stats_every == 0:
                row.update(self.quant.collect_stats(self.model))
        elif validate:
            row = {"step": s, "tokens": s * r.tokens_per_step, "loss": loss_v, "lr": lr, "grad_norm": gn_v,
                   "tokens_per_s": None, "elapsed_s": self.elapsed_prev + time.time() - self._t_start,
                   "val_loss": self.evaluate(int(lcfg.val_batches))}
        return row


def train(cfg: DictConfig) -> dict:
    """Build a Trainer for ``cfg`` and run it; returns the summary dict."""
    return Trainer(cfg).run()


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


#: most torch threads ``run.threads=0`` gives a process (more rarely pay off for the models trained on CPUs here)
AUTO_THREADS_MAX = 4


def cpu_threads(requested: int) -> int:
    """torch threads for ``run.threads``: the number asked for, or for 0 (the default) min(4, the cores this process
    may use / the processes of this node's torchrun) -- never more threads than cores -- unless OMP_NUM_THREADS is set
    (a sweep's pool worker, or the user): then 0, torch's default, which follows it."""
    import os

    if requested > 0:
        return requested
    if os.environ.get("OMP_NUM_THREADS"):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    procs = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, min(AUTO_THREADS_MAX, cores // max(1, procs)))


def _install_stop_signals(trainer: Trainer) -> dict:
    """SIGTERM / first Ctrl-C -> checkpoint and stop at the next step; a second Ctrl-C aborts. Returns a dict whose
    ``"signal"`` is the first stop signal received (None until then)."""
    received: dict = {"signal": None}
    if threading.current_thread() is not threading.main_thread():
        return received

    def handler(signum, _frame):
        print(f"\nquartet: signal {signum}: checkpointing at the next step boundary (Ctrl-C again aborts)",
              file=sys.stderr)
        received["signal"] = received["signal"] or signum
        trainer.request_stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return received


def where_config_lives(cfg: DictConfig, config_file: str | Path, overrides: list[str]) -> DictConfig:
    """A run replayed from ``<dir>/config.yaml`` trains in ``<dir>`` when ``<dir>`` is named after the run's id: a
    copied or moved run directory trains (and resumes from its checkpoint) where it is now, not at the path its
    config.yaml recorded. Overrides that make another run put it beside ``<dir>``; explicit ``run.out_dir`` /
    ``run.name`` overrides win. A folder holding a run's files under another name (renamed, or config.yaml edited)
    is refused with one line; a config.yaml elsewhere replays to its recorded ``run.out_dir`` / ``run.name``."""
    path = Path(config_file)
    home = (path if path.is_dir() else path.parent).resolve()
    if any(o.lstrip("+").startswith(("run.out_dir=", "run.name=")) for o in overrides):
        return cfg
    own = run_id(cfg) if not overrides else run_id(load_config_file(config_file))
    if home.name != own:
        if any((home / f).exists() for f in paths.RUN_MARKERS):
            raise QuartetError(f"{home} holds a run's files but its config.yaml is run {own} (was the folder renamed, "
                               f"or config.yaml edited?); rename the folder to {own}, or copy config.yaml to a "
                               f"folder of its own, then run again")
        return cfg
    OmegaConf.set_readonly(cfg.run, False)
    cfg.run.out_dir = str(home.parent.parent)
    cfg.run.name = home.parent.name
    return cfg


def os_error_line(exc: OSError, directory: Path | None) -> str:
    """One line for a file-system error that stopped ``quartet train``: what failed where, and what to do."""
    what = (exc.strerror or str(exc)) + (f": {exc.filename}" if exc.filename else "")
    if exc.errno in (errno.EACCES, errno.EPERM):
        from quartet.paths import permission_hint

        return f"{what}; {permission_hint(exc.filename or directory)}"
    fix = {errno.ENOSPC: "free space on that file system", errno.EDQUOT: "free space within your disk quota",
           errno.EROFS: "the file system is read-only: remount it read-write or set run.out_dir elsewhere"}
    err = directory / paths.ERROR if directory is not None else None
    saved = (f"the run is marked failed, details in {err}" if err is not None and err.is_file() and err.stat().st_size
             else "nothing more could be recorded")
    return (f"{what}; {saved}; {fix.get(exc.errno, 'fix the cause')}, then run the same command again "
            f"(it resumes from the last checkpoint)")


def cli_main(argv: list[str] | None = None) -> int:
    """``quartet train [overrides...] [--print-config] [--config-file DIR/config.yaml]``."""
    from quartet.train_args import parser

    args = parser().parse_intermixed_args(argv)
    cfg = None
    made: list = []  # the folders this call made, deepest first (a bad input then leaves none behind)
    try:
        if args.config_file:
            cfg = load_config_file(args.config_file, args.overrides)
            resolve(cfg, qdist.world_size_from_env())
            cfg = where_config_lives(cfg, args.config_file, args.overrides)
        else:
            cfg = compose(args.overrides)
            resolve(cfg, qdist.world_size_from_env())
        if args.print_config:
            print(to_yaml(cfg), end="")
            print(f"# run_id: {run_id(cfg)}\n# run_dir: {run_dir(cfg)}")
            print(qpar.describe(cfg, qdist.world_size_from_env()))
            return 0
        if qdist.world_size_from_env() == 1:
            # refuse a run that another process trains now before building data and model (seconds to minutes)
            runlock.check_free(run_dir(cfg), what=f"run {run_id(cfg)}")
            # a run directory that cannot be made (another user's folder, a read-only disk) fails here, in one
            # line (below), before the data and the model are built; in a group-shared runs directory it is made
            # group-writable, as everything the run writes
            apply_shared_umask(run_dir(cfg))
            made = [p for p in (run_dir(cfg), *run_dir(cfg).parents) if not p.exists()]
            run_dir(cfg).mkdir(parents=True, exist_ok=True)
        trainer = Trainer(cfg)
        stopped = _install_stop_signals(trainer)
        result = trainer.run()
    except NonFiniteError as exc:
        print(f"quartet: error: {exc}", file=sys.stderr)
        return 1
    except QuartetError as exc:
        for folder in made:  # refused before writing anything (Trainer's checks): the folders made above go again
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: a run that wrote files keeps them
        print(f"quartet: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full or read-only disk, a folder of another user: one line, not a traceback
        print(f"quartet: error: {os_error_line(exc, run_dir(cfg) if cfg is not None else None)}", file=sys.stderr)
        return 1
    if result.get("state") == "completed":
        print(f"val_loss {result['val_loss']:.4f}  run_dir {run_dir(cfg)}")
    else:
        print(f"preempted at step {result.get('step')}/{result.get('steps')}; run the same command again to resume")
        if stopped["signal"] == signal.SIGINT:  # Ctrl-C: the shell's 130, so a script's `train && fit` stops there
            return 130  # (SIGTERM, a scheduler's checkpoint-and-stop, stays a clean preemption: 0)
    return 0
