"""The trainer: one run from a resolved config into its run directory, resumable and preemptible.

Loop per optimizer step (the paper's recipe): take the next ``batch_size`` windows of the seeded
sampler, split them over ranks and micro-batches (gradient accumulation), forward under BF16 autocast
on CUDA (fp32 on CPU), backward, clip the global grad norm to ``optim.grad_clip``, AdamW step, LR
schedule step. A non-finite loss or gradient stops the run before the update and names the step and
the first module whose output (or gradient) went non-finite. Files follow docs/ARCHITECTURE.md.

The LR schedule is torch's OneCycleLR with ``anneal_strategy='cos'``, ``div_factor=100`` and
``final_div_factor=0.1`` as in the paper's code, written out in :func:`lr_at` so it needs no guard for
tiny runs: a cosine-shaped warm-up from ``lr/100`` to ``lr`` over the first ``warmup`` updates, then a
cosine from ``lr`` down to ``lr/10`` at the last update.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import logging
import math
import os
import platform
import random
import secrets
import signal
import socket
import string
import subprocess
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

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
from quartet.paths import REPO_ROOT
from quartet.proc import process_start
from quartet.runs import config_hash, run_dir, run_id

STATES = ("pending", "running", "preempted", "failed", "completed")


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


def param_groups(model: torch.nn.Module, decay_ids: set[int], weight_decay: float) -> list[dict]:
    """Two AdamW groups: weight decay on block-linear weights only; norms, embeddings, lm_head undecayed."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if id(p) in decay_ids else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# ----------------------------------------------------------------------------------------------
# Small file helpers
# ----------------------------------------------------------------------------------------------


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, obj) -> None:
    """JSON written to a tmp file and os.replace'd (readers never see a partial file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def environment_info(device: torch.device) -> dict:
    """Versions and host recorded in env.json (python, torch, CUDA, Triton, git commit...)."""
    from importlib import metadata

    def version(pkg: str):
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    def git(*args: str):
        try:
            out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
            return out.stdout.strip() if out.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    from quartet import __version__

    info = {
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "triton": version("triton") or version("pytorch-triton"), "numpy": np.__version__,
        "quartet": __version__, "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "host": socket.gethostname(), "platform": platform.platform(), "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "torch_threads": torch.get_num_threads(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "world_size": qdist.world_size_from_env(), "recorded": _now(),
    }
    return info


class WandbMirror:
    """Mirrors metrics to wandb; every call is guarded so wandb can never stop or hang the run for long."""

    def __init__(self, wcfg, directory: Path, name: str, config: dict, log: logging.Logger):
        self.run = None
        self.log = log
        self.id: str | None = None
        if wcfg.mode == "disabled":
            return
        id_file = directory / "wandb_id"
        if id_file.is_file() and id_file.read_text().strip():
            self.id = id_file.read_text().strip()
        else:
            alphabet = string.ascii_lowercase + string.digits
            self.id = "".join(secrets.choice(alphabet) for _ in range(8))
            id_file.write_text(self.id + "\n")
        try:
            import wandb

            settings = wandb.Settings(init_timeout=float(wcfg.init_timeout), silent=True, console="off")
            self.run = wandb.init(project=wcfg.project, entity=wcfg.entity, name=name, id=self.id, resume="allow",
                                  dir=str(directory), mode=wcfg.mode, config=config, tags=list(wcfg.tags),
                                  settings=settings, reinit="finish_previous")
        except Exception as exc:  # noqa: BLE001 - an unreachable or broken wandb must not stop training
            log.warning("wandb disabled for this run: %s: %s", type(exc).__name__, str(exc).splitlines()[0][:200])
            self.run = None

    def log_row(self, row: dict, step: int) -> None:
        if self.run is None:
            return
        try:
            self.run.log(row, step=step)
        except Exception as exc:  # noqa: BLE001
            self.log.warning("wandb log failed, mirror stopped: %s", exc)
            self.run = None

    def finish(self, exit_code: int = 0) -> None:
        if self.run is None:
            return
        try:
            self.run.finish(exit_code=exit_code)
        except Exception as exc:  # noqa: BLE001
            self.log.warning("wandb finish failed: %s", exc)
        self.run = None


# ----------------------------------------------------------------------------------------------
# Trainer
# ----------------------------------------------------------------------------------------------


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
        if int(cfg.run.threads) > 0:
            torch.set_num_threads(int(cfg.run.threads))
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
        self._pid_start = process_start(os.getpid())  # recorded in state.json: status tells pid reuse apart
        self.step = 0
        self.elapsed_prev = 0.0
        self.log = logging.getLogger(f"quartet.train.{self.run_id}.{id(self)}")
        self.log.propagate = False
        self.log.setLevel(logging.INFO)

        progress = bool(cfg.logging.progress) and self.is_main
        self.data = open_data(cfg.data, progress=progress and sys.stderr.isatty())
        self.sampler = WindowSampler(self.data.train, self.res.seq_len, int(cfg.run.data_seed))
        self.val_windows = val_windows(self.data.val, self.res.seq_len)

        torch.manual_seed(int(cfg.run.seed))
        self.model = Llama.from_config(cfg.model, self.res.vocab_size, device=self.device)
        # by name: FSDP2 replaces the parameter objects (ids) but keeps their names
        decay = {f"{n}.weight" for n, m in self.model.named_modules() if isinstance(m, BlockLinear)}
        from quartet import quant

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
        div, end_div = float(o.div_factor), float(o.end_div)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda t: lr_at(t, lr=r.lr, steps=r.steps, warmup=r.warmup_steps, div_factor=div,
                                            end_div=end_div) / r.lr)
        #: the compiled step is replayed as CUDA graphs (run.compile_mode=reduce-overhead)
        self.cuda_graphs = bool(cfg.run.compile) and str(cfg.run.compile_mode) == "reduce-overhead"
        if bool(cfg.run.compile):
            # bf16, the FP8 layer and the fused Quartet layer (as registered operators) compile whole; the
            # operand-by-operand QuantLinear of other schemes runs eagerly between compiled regions.
            self.train_model = torch.compile(self.train_model, mode=str(cfg.run.compile_mode))
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.amp = self.device.type == "cuda" and bool(cfg.run.amp)
        self.accum = r.accum_steps(self.dist.world_size)

    # -- public API --------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Thread-safe: checkpoint at the next step boundary, mark the run "preempted" and return."""
        self._stop.set()

    @property
    def ckpt_path(self) -> Path:
        """ckpt/last.pt, or the folder ckpt/last of a sharded (FSDP) checkpoint."""
        return self.dir / "ckpt" / ("last" if self.parallel == "fsdp" else "last.pt")

    def save_checkpoint(self) -> None:
        """Write ckpt/last.pt atomically with a checksum, the old one kept as ckpt/prev.pt (rank 0; all ranks wait);
        under FSDP every rank writes its shards into the folder ckpt/last (old one: ckpt/prev)."""
        if self.is_main or self.parallel == "fsdp":
            state = {
                "step": self.step, "run_id": self.run_id, "config_hash": self.config_hash,
                "scheduler": self.scheduler.state_dict(), "sampler": self.sampler.state_dict(),
                "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                "elapsed_s": self.elapsed_prev + (time.time() - self._t_start if hasattr(self, "_t_start") else 0.0),
            }
            if self.parallel == "fsdp":  # collective: every rank writes its shards
                ckpt_io.save_sharded(self.model, self.optimizer, state, self.ckpt_path)
            else:
                ckpt_io.save_atomic({**state, "model": self.model.state_dict(),
                                     "optimizer": self.optimizer.state_dict()}, self.ckpt_path)
        qdist.barrier(self.dist)

    def _check_ckpt_kind(self) -> None:
        """Refuse (one line) a checkpoint written under the other parallelism rather than restart from step 0."""
        ckpt = self.dir / "ckpt"
        ours = ckpt_io.sharded_exists(ckpt / "last") if self.parallel == "fsdp" else ckpt_io.exists(ckpt / "last.pt")
        theirs = ckpt_io.exists(ckpt / "last.pt") if self.parallel == "fsdp" else ckpt_io.sharded_exists(ckpt / "last")
        if theirs and not ours:
            other = "ddp" if self.parallel == "fsdp" else "fsdp"
            raise QuartetError(f"{ckpt} holds a run.parallel={other} checkpoint; resume with run.parallel={other}")

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
            torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]])
        self.step = int(state["step"])
        self.elapsed_prev = float(state.get("elapsed_s", 0.0))

    # -- files -------------------------------------------------------------------------------
    def _write_state(self, state: str, error: str | None = None, keep_step: bool = False) -> None:
        """Replace state.json; ``keep_step`` keeps its recorded step (the checkpoint could not be loaded)."""
        if not self.is_main:
            return
        path = self.dir / "state.json"
        prev = {}
        if path.is_file():
            with contextlib.suppress(Exception):
                prev = json.loads(path.read_text())
        write_json_atomic(path, {
            "state": state, "step": prev.get("step", self.step) if keep_step else self.step,
            "total_steps": self.res.steps, "updated": _now(), "error": error,
            "job_id": os.environ.get("SLURM_JOB_ID") or prev.get("job_id"), "host": socket.gethostname(),
            "run_id": self.run_id, "pid": os.getpid(), "pid_start": self._pid_start,
        })

    def _setup_logging(self) -> None:
        fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")
        self._handlers = []
        if self.is_main:
            for h in (logging.FileHandler(self.dir / "train.log"), logging.StreamHandler(sys.stdout)):
                h.setFormatter(fmt)
                self.log.addHandler(h)
                self._handlers.append(h)
        else:
            self.log.setLevel(logging.WARNING)

    def _close_logging(self) -> None:
        for h in getattr(self, "_handlers", []):
            self.log.removeHandler(h)
            h.close()

    def _metrics_rows(self) -> list[tuple[str, dict]]:
        """(line, row) of each complete row of metrics.jsonl; QuartetError naming a line that is not a row.

        A torn last line (a crash mid-write) is not JSON and is skipped; valid JSON that is not an object
        with a numeric step was put there by something else, and the file is left as it is.
        """
        path = self.dir / "metrics.jsonl"
        if not path.is_file():
            return []
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(row, dict) or not isinstance(row.get("step", 0), (int, float)):
                raise QuartetError(f"{path}: line {number} is {line.strip()[:40]!r}, not a metrics row (a JSON object "
                                   f"with a numeric step); delete or fix that line, then run the same command again")
            rows.append((line, row))
        return rows

    def _truncate_metrics(self) -> None:
        """Drop metric rows newer than the checkpoint (written before a crash, recomputed on resume)."""
        path = self.dir / "metrics.jsonl"
        if not path.is_file():
            return
        keep = [line for line, row in self._metrics_rows() if row.get("step", 0) <= self.step]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(k + "\n" for k in keep))
        os.replace(tmp, path)

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

    # -- non-finite diagnosis ----------------------------------------------------------------
    def _diagnose(self, batches: list[tuple[torch.Tensor, torch.Tensor]], what: str) -> str:
        """Re-run the step's micro-batches with hooks; name the first module whose output / gradient is non-finite."""
        model = self.model
        found: dict[str, str] = {}
        handles = []

        def bad(t) -> bool:
            return isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())

        def fwd_hook(name):
            def hook(_mod, _inp, out):
                if "forward" not in found and any(bad(o) for o in (out if isinstance(out, (tuple, list)) else (out,))):
                    found["forward"] = name
            return hook

        def bwd_hook(name):
            def hook(_mod, _gin, gout):
                if "backward" not in found and any(bad(g) for g in gout):
                    found["backward"] = name
            return hook

        for name, mod in model.named_modules():
            if name:
                handles.append(mod.register_forward_hook(fwd_hook(name)))
                handles.append(mod.register_full_backward_hook(bwd_hook(name)))
        try:
            for i, (x, y) in enumerate(batches):
                self.quant.begin_micro_batch(model, i)  # the same draws as the failed step
                self.optimizer.zero_grad(set_to_none=True)
                with self._autocast():
                    loss = model(x, y)
                if "forward" not in found and bad(loss):
                    found["forward"] = "loss (cross-entropy)"
                if "forward" not in found:
                    with warnings.catch_warnings():  # "no inputs require gradients" on the first module: expected
                        warnings.simplefilter("ignore", UserWarning)
                        loss.backward()
                if found:
                    break
        except RuntimeError as exc:  # hooks on exotic modules may refuse; report what we have
            found.setdefault("note", f"diagnosis stopped: {exc}".splitlines()[0])
        finally:
            for h in handles:
                h.remove()
        bad_params = [n for n, p in model.named_parameters() if p.grad is not None and bad(p.grad)]
        self.optimizer.zero_grad(set_to_none=True)
        if "forward" in found:
            where = f"first non-finite forward output in module '{found['forward']}'"
        elif "backward" in found:
            where = f"first non-finite gradient (backward order) at module '{found['backward']}'"
        else:
            where = "not reproduced when re-running this rank's micro-batches with hooks"
        if bad_params:
            where += f"; parameters with non-finite grads: {', '.join(bad_params[:5])}" + (" ..." if len(bad_params) > 5 else "")
        return f"non-finite {what} at step {self.step + 1}: {where}"

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
            raise NonFiniteError(self._diagnose(batches, what))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return loss_v, gn_v

    def _data_identity(self) -> dict:
        """What the run trained on, as the data manifest states it (corpus content hash, tokens)."""
        man = self.data.manifest
        ident = {"key": man.get("key"), "train_tokens": man.get("splits", {}).get("train", {}).get("tokens"),
                 "tokenizer_sha256": man.get("tokenizer", {}).get("sha256")}
        corpus = man.get("corpus")
        if isinstance(corpus, dict):
            ident.update(corpus_sha256=corpus.get("sha256"), corpus_files=corpus.get("files"),
                         corpus_bytes=corpus.get("bytes"))
        return ident

    def _device_name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"

    def _completed_summary(self) -> dict | None:
        """The run's summary.json (None when absent); QuartetError when it exists but is not a JSON object,
        so a finished run is never silently trained again (and its metrics never get a second final row)."""
        path = self.dir / "summary.json"
        if not path.is_file():
            return None
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # ValueError: JSONDecodeError and UnicodeDecodeError
            summary = None
        if not isinstance(summary, dict):
            raise QuartetError(f"{path} is corrupt (not a JSON object) and marks the run as finished; restore it, "
                               f"or delete it to train the run again")
        return summary

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
            done = self._completed_summary()
            if done is None:
                self._metrics_rows()
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
                                                    f"process (see {self.dir / runlock.LOCK_FILE})")
        return lock

    def _run_locked(self) -> dict:
        if self.is_main:
            (self.dir / "ckpt").mkdir(parents=True, exist_ok=True)
        qdist.barrier(self.dist)
        self._setup_logging()
        wandb = None
        resuming = False
        try:
            if self.is_main:
                OmegaConf.save(self.cfg, self.dir / "config.yaml", resolve=True)
                write_json_atomic(self.dir / "env.json", environment_info(self.device))
                write_json_atomic(self.dir / "quant_map.json", self.plan.to_dict())
            self._check_ckpt_kind()
            if (ckpt_io.sharded_exists if self.parallel == "fsdp" else ckpt_io.exists)(self.ckpt_path):
                resuming = True  # until loaded, self.step (0) is not the run's step: keep the recorded one
                self._load_checkpoint()
                resuming = False
                self.log.info("resuming %s from step %d/%d", self.run_id, self.step, self.res.steps)
            if self.is_main:
                self._truncate_metrics()
                self._write_state("running")
                wandb = WandbMirror(self.cfg.logging.wandb, self.dir, self.run_id,
                                    {**to_container(self.cfg), "run_id": self.run_id}, self.log)
            r = self.res
            self.log.info("run %s -> %s", self.run_id, self.dir)
            self.log.info("model %s: N=%s non-embedding (%s total), D=%s tokens, %d steps (warm-up %d) of %d x %d "
                          "tokens, lr %.3g, precision %s, device %s x%d", self.cfg.model.name, f"{r.n_params:,}",
                          f"{r.n_params_total:,}", f"{r.tokens:,}", r.steps, r.warmup_steps, r.batch_size, r.seq_len,
                          r.lr, self.cfg.precision.name, self.device, self.dist.world_size)
            for line in self.plan.summary().splitlines():  # a few lines; the whole map is in quant_map.json
                self.log.info("%s", line)
            result = self._loop(wandb)
            if wandb is not None:
                wandb.finish(0)
            return result
        except BaseException as exc:
            failed = not isinstance(exc, KeyboardInterrupt)
            if self.is_main:
                (self.dir / "error.txt").write_text(
                    (str(exc) + "\n\n" if isinstance(exc, NonFiniteError) else "") + traceback.format_exc())
                self._write_state("failed" if failed else "preempted",
                                  error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                                  keep_step=resuming)
                self.log.error("run failed: %s", exc)
            if wandb is not None:
                wandb.finish(1)
            raise
        finally:
            self._close_logging()
            qdist.teardown(self.dist)

    def _loop(self, wandb: WandbMirror | None) -> dict:
        from tqdm.auto import tqdm

        cfg, r = self.cfg, self.res
        lcfg = cfg.logging
        metrics = open(self.dir / "metrics.jsonl", "a") if self.is_main else None
        # a live bar on a terminal; in a file, a clean log line per metrics row instead of bar frames
        live = self.is_main and bool(lcfg.progress) and sys.stderr.isatty()
        plain = self.is_main and bool(lcfg.progress) and not live
        bar = tqdm(total=r.steps, initial=self.step, disable=not live, unit="step", desc=self.run_id,
                   dynamic_ncols=True, leave=False)
        self._t_start = time.time()
        t_last, step_last = time.time(), self.step
        loss_v = float("nan")
        try:
            while self.step < r.steps:
                if qdist.any_rank(self._stop.is_set(), self.dist, self.device):
                    self.save_checkpoint()
                    self._write_state("preempted")
                    self.log.info("stop requested: checkpointed at step %d/%d", self.step, r.steps)
                    return {"state": "preempted", "run_id": self.run_id, "step": self.step, "steps": r.steps,
                            "run_dir": str(self.dir)}
                lr = self.optimizer.param_groups[0]["lr"]
                loss_v, gn_v = self._step()
                s = self.step
                row = None
                if s % int(lcfg.log_every) == 0 or s == r.steps or s == 1:
                    now = time.time()
                    row = {"step": s, "tokens": s * r.tokens_per_step, "loss": loss_v, "lr": lr, "grad_norm": gn_v,
                           "tokens_per_s": (s - step_last) * r.tokens_per_step / max(now - t_last, 1e-9),
                           "elapsed_s": self.elapsed_prev + now - self._t_start}
                    t_last, step_last = now, s
                    if int(lcfg.val_every) > 0 and s % int(lcfg.val_every) == 0 and s != r.steps:
                        row["val_loss"] = self.evaluate(int(lcfg.val_batches))
                    stats_every = int(getattr(cfg.precision, "stats_every", 0) or 0)
                    if stats_every and s % stats_every == 0:
                        row.update(self.quant.collect_stats(self.model))
                elif int(lcfg.val_every) > 0 and s % int(lcfg.val_every) == 0 and s != r.steps:
                    row = {"step": s, "tokens": s * r.tokens_per_step, "loss": loss_v, "lr": lr, "grad_norm": gn_v,
                           "tokens_per_s": None, "elapsed_s": self.elapsed_prev + time.time() - self._t_start,
                           "val_loss": self.evaluate(int(lcfg.val_batches))}
                if row is not None and self.is_main:
                    metrics.write(json.dumps(row) + "\n")
                    metrics.flush()
                    if wandb is not None:
                        wandb.log_row(row, s)
                    bar.set_postfix(loss=f"{loss_v:.4f}", lr=f"{lr:.2e}", refresh=False)
                    if plain:
                        tps = row.get("tokens_per_s")
                        self.log.info("step %d/%d  loss %.4f  lr %.3g%s", s, r.steps, loss_v, lr,
                                      f"  {tps:,.0f} tokens/s" if tps else "")
                bar.update(1)
                if self.is_main:
                    for fn in self.callbacks:
                        fn(self, {"step": s, "loss": loss_v, "grad_norm": gn_v, "lr": lr})
                if int(lcfg.ckpt_every) > 0 and s % int(lcfg.ckpt_every) == 0 and s != r.steps:
                    self.save_checkpoint()
                    self._write_state("running")
        finally:
            bar.close()
            if metrics is not None:
                metrics.close()

        val_loss = self.evaluate(None)
        elapsed = self.elapsed_prev + time.time() - self._t_start
        self.save_checkpoint()
        summary = {
            "run_id": self.run_id, "name": str(cfg.run.name), "model": str(cfg.model.name), "n_params": r.n_params,
            "n_params_total": r.n_params_total, "nominal_params": r.nominal_params, "tokens": r.tokens,
            "tokens_per_param": r.tokens / r.nominal_params, "steps": r.steps, "precision": str(cfg.precision.name),
            "forward": str(cfg.precision.forward), "backward": str(cfg.precision.backward), "seed": int(cfg.run.seed),
            "val_loss": val_loss, "train_loss": loss_v, "wall_clock_s": elapsed,
            "tokens_per_s": (r.tokens / elapsed) if elapsed > 0 else None, "lr": r.lr, "batch_size": r.batch_size,
            "seq_len": r.seq_len, "data": str(cfg.data.name), "finished_at": _now(), "config_hash": self.config_hash,
            "data_identity": self._data_identity(), "device_name": self._device_name(),
            "world_size": self.dist.world_size, "compile": bool(cfg.run.compile),
            "compile_mode": str(cfg.run.compile_mode) if bool(cfg.run.compile) else None,
            "implementation": self.plan.implementation, "traceable": self.plan.traceable,
        }
        if self.is_main:
            with open(self.dir / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps({"step": r.steps, "tokens": r.tokens, "val_loss": val_loss, "final": True}) + "\n")
            if wandb is not None:
                wandb.log_row({"val_loss": val_loss, "final_val_loss": val_loss}, r.steps)
            write_json_atomic(self.dir / "summary.json", summary)
            self._write_state("completed")
            self.log.info("completed %s: val_loss %.4f after %d steps (%.0f s)", self.run_id, val_loss, r.steps, elapsed)
        return {**summary, "state": "completed"}


def train(cfg: DictConfig) -> dict:
    """Build a Trainer for ``cfg`` and run it; returns the summary dict."""
    return Trainer(cfg).run()


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def _install_stop_signals(trainer: Trainer) -> None:
    """SIGTERM / first Ctrl-C -> checkpoint and stop at the next step; a second Ctrl-C aborts."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, _frame):
        print(f"\nquartet: signal {signum}: checkpointing at the next step boundary (Ctrl-C again aborts)",
              file=sys.stderr)
        trainer.request_stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def cli_main(argv: list[str] | None = None) -> int:
    """``quartet train [overrides...] [--print-config] [--config-file DIR/config.yaml]``."""
    parser = argparse.ArgumentParser(prog="quartet train", description="Train one run (Hydra overrides, e.g. "
                                     "model=llama_30m precision=quartet budget=dn100 run.name=mysweep).")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides key=value / group=option")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config (with derived values) and exit")
    parser.add_argument("--config-file", help="replay a run from its config.yaml (or run directory); overrides still apply")
    args = parser.parse_intermixed_args(argv)
    try:
        cfg = load_config_file(args.config_file, args.overrides) if args.config_file else compose(args.overrides)
        resolve(cfg, qdist.world_size_from_env())
        if args.print_config:
            print(to_yaml(cfg), end="")
            print(f"# run_id: {run_id(cfg)}\n# run_dir: {run_dir(cfg)}")
            print(qpar.describe(cfg, qdist.world_size_from_env()))
            return 0
        trainer = Trainer(cfg)
        _install_stop_signals(trainer)
        result = trainer.run()
    except NonFiniteError as exc:
        print(f"quartet: error: {exc}", file=sys.stderr)
        return 1
    except QuartetError as exc:
        print(f"quartet: error: {exc}", file=sys.stderr)
        return 2
    if result.get("state") == "completed":
        print(f"val_loss {result['val_loss']:.4f}  run_dir {run_dir(cfg)}")
    else:
        print(f"preempted at step {result.get('step')}/{result.get('steps')}; run the same command again to resume")
    return 0
