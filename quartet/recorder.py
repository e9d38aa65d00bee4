"""What a run writes about itself: the run directory's bookkeeping, kept out of the training loop.

:class:`RunRecorder` owns every file of docs/ARCHITECTURE.md's run-directory table that the trainer writes
except the checkpoints: ``state.json``, ``metrics.jsonl``, ``summary.json``, ``config.yaml``, ``env.json``,
``quant_map.json``, ``train.log``, ``error.txt`` and the wandb mirror (``wandb_id``). :mod:`quartet.train`
calls it at fixed points (start, each logged step, stop, failure, completion); on ranks other than 0 every
write is a no-op, so the loop calls it the same way on all ranks.

Also here: the summary record of a completed run (:func:`make_summary`) and the diagnosis that names the
first module whose output or gradient went non-finite (:func:`diagnose_non_finite`), which goes into the
run's ``error.txt``.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import platform
import secrets
import socket
import string
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from quartet import distributed as qdist
from quartet.errors import NonFiniteError, QuartetError
from quartet import paths
from quartet.paths import REPO_ROOT, atomic_write_text, write_json_atomic
from quartet.proc import process_start

#: a few KiB the trainer sets aside in its run directory while it trains and frees when it fails, so that on a full
#: disk error.txt and state.json still have room for the reason (``.space-reserve``; removed at every end)
RESERVE_BYTES = 64 * 1024


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def step_ranges(steps: list[int]) -> str:
    """Sorted steps as ranges: ``[1, 2, 3, 7]`` -> ``"1-3,7"``."""
    out, start = [], None
    for i, s in enumerate(steps):
        if start is None:
            start = s
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            out.append(f"{start}-{s}" if s != start else str(s))
            start = None
    return ",".join(out)


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


class _RunLogFile(logging.FileHandler):
    """train.log: a write that fails (full or read-only disk) is dropped silently rather than printing logging's
    "--- Logging error ---" traceback for every later line; the run's own error says what happened."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        pass

    def close(self) -> None:
        with contextlib.suppress(OSError):
            super().close()


def _flush_to_disk(fh) -> None:
    """Flush and fsync an open file, best effort (a full disk: the write that follows says so)."""
    with contextlib.suppress(OSError):
        fh.flush()
        os.fsync(fh.fileno())


class WandbMirror:
    """Mirrors metrics to wandb; every call is guarded so wandb can never stop or hang the run for long."""

    def __init__(self, wcfg, directory: Path, name: str, config: dict, log: logging.Logger):
        self.run = None
        self.log = log
        self.id: str | None = None
        if wcfg.mode == "disabled":
            return
        id_file = directory / paths.WANDB_ID
        if id_file.is_file() and id_file.read_text().strip():
            self.id = id_file.read_text().strip()
        else:
            alphabet = string.ascii_lowercase + string.digits
            self.id = "".join(secrets.choice(alphabet) for _ in range(8))
            atomic_write_text(id_file, self.id + "\n")  # torn or empty, it would split the wandb history
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
        """Send one metrics row; the first failure stops the mirror (with one warning), never the run."""
        if self.run is None:
            return
        try:
            self.run.log(row, step=step)
        except Exception as exc:  # noqa: BLE001
            self.log.warning("wandb log failed, mirror stopped: %s", exc)
            self.run = None

    def finish(self, exit_code: int = 0) -> None:
        """Close the wandb run (exit code 0 = completed or stopped cleanly)."""
        if self.run is None:
            return
        try:
            self.run.finish(exit_code=exit_code)
        except Exception as exc:  # noqa: BLE001
            self.log.warning("wandb finish failed: %s", exc)
        self.run = None


class RunRecorder:
    """The run directory ``directory`` of run ``run_id`` (``total_steps`` updates), as the trainer writes it.

    Writes only where ``is_main`` (rank 0). ``log`` is the run's logger (``train.log`` and stdout between
    :meth:`open_log` and :meth:`close_log`).
    """

    def __init__(self, directory: Path, run_id: str, total_steps: int, is_main: bool):
        self.dir = directory
        self.run_id = run_id
        self.total_steps = total_steps
        self.is_main = is_main
        self.wandb: WandbMirror | None = None
        #: rows of steps 1..(the resumed step) that were lost before a resume (``{"rows", "steps"}``), else None;
        #: recorded in state.json and summary.json, so a completed run's curve is whole or says it is not
        self.metrics_gap: dict | None = None
        self._metrics_fh = None  # metrics.jsonl while the loop appends to it
        self._pid_start = process_start(os.getpid())  # recorded in state.json: status tells pid reuse apart
        self._handlers: list[logging.Handler] = []
        self.log = logging.getLogger(f"quartet.train.{run_id}.{id(self)}")
        self.log.propagate = False
        self.log.setLevel(logging.INFO)

    # -- reading what an earlier attempt left ------------------------------------------------
    def completed_summary(self) -> dict | None:
        """The run's summary.json (None when absent); QuartetError when it exists but is not a JSON object,
        so a finished run is never silently trained again (and its metrics never get a second final row)."""
        path = self.dir / paths.SUMMARY
        if not path.is_file():
            return None
        summary = paths.read_summary(self.dir)
        if summary is None:
            raise QuartetError(f"{path} is corrupt (not a JSON object) and marks the run as finished; restore it, "
                               f"or delete it to train the run again")
        return summary

    def metrics_rows(self) -> list[tuple[str, dict]]:
        """(line, row) of each complete row of metrics.jsonl; QuartetError naming a line that is not a row.

        A torn last line (a crash mid-write) is not JSON and is skipped; valid JSON that is not an object
        with a numeric step was put there by something else, and the file is left as it is.
        """
        return self._read_metrics()[0]

    def _read_metrics(self) -> tuple[list[tuple[str, dict]], int]:
        """(:meth:`metrics_rows`, the number of lines skipped as torn)."""
        rows, torn = [], 0
        for number, line, row in paths.metrics_lines(self.dir):
            if row is None:
                torn += 1
                continue
            if not paths.is_metrics_row(row):
                raise QuartetError(f"{self.dir / paths.METRICS}: line {number} is {line.strip()[:40]!r}, not a metrics "
                                   f"row (a JSON object with a numeric step); delete or fix that line, then run the "
                                   f"same command again")
            rows.append((line, row))
        return rows, torn

    def metrics_lines(self, step: int) -> list[str]:
        """The lines of metrics.jsonl's rows of steps 1..``step`` (no final row), as a trunk keeps them with a branch
        point."""
        return [line for line, row in self.metrics_rows() if row.get("step", 0) <= step and not row.get("final")]

    def write_metrics_lines(self, lines: list[str]) -> None:
        """Replace metrics.jsonl by ``lines`` atomically (a branch's first start: its trunk's rows)."""
        if self.is_main:
            atomic_write_text(self.dir / paths.METRICS, "".join(line + "\n" for line in lines))

    def sync_metrics(self) -> None:
        """Flush metrics.jsonl to disk (before a checkpoint: a power loss must not keep the checkpoint of step s and
        lose rows up to s)."""
        if self._metrics_fh is not None:
            _flush_to_disk(self._metrics_fh)

    # -- start ------------------------------------------------------------------------------
    def open_log(self) -> None:
        """Send the run's log to ``train.log`` and stdout (rank 0); other ranks log warnings only."""
        fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")
        if self.is_main:
            for h in (_RunLogFile(self.dir / paths.TRAIN_LOG), logging.StreamHandler(sys.stdout)):
                h.setFormatter(fmt)
                self.log.addHandler(h)
                self._handlers.append(h)
        else:
            self.log.setLevel(logging.WARNING)

    def close_log(self) -> None:
        """Detach and close the handlers :meth:`open_log` added."""
        for h in self._handlers:
            self.log.removeHandler(h)
            h.close()
        self._handlers = []

    def write_start_files(self, cfg: DictConfig, device: torch.device, plan) -> None:
        """config.yaml (the resolved config), env.json (versions, host) and quant_map.json (the quant plan)."""
        if not self.is_main:
            return
        # atomically: a kill while it is written must not leave a torn config.yaml for the requeued job to read
        atomic_write_text(self.dir / paths.CONFIG, OmegaConf.to_yaml(cfg, resolve=True))
        write_json_atomic(self.dir / paths.ENV, environment_info(device))
        write_json_atomic(self.dir / paths.QUANT_MAP, plan.to_dict())

    def begin(self, step: int, wcfg, config: dict, logged: list[int] = ()) -> None:
        """Training starts (or resumes) at ``step``: drop metrics rows past it (and torn lines), check that the rows of
        the steps in ``logged`` (those written up to ``step``) are there, state "running", open the wandb mirror."""
        if not self.is_main:
            return
        present = self._truncate_metrics(step)
        self._check_rows(step, logged, present)
        self._reserve_space()
        self.write_state("running", step)
        self.wandb = WandbMirror(wcfg, self.dir, self.run_id, config, self.log)

    def _truncate_metrics(self, step: int) -> set[int]:
        """Drop metric rows newer than the checkpoint (written before a crash, recomputed on resume), any final row
        (a run being trained has no summary.json, so a final row is one whose summary was never written: the final
        evaluation writes it again), torn lines and a second row of one step, so that each step appears once. Returns
        the steps whose rows it kept."""
        path = self.dir / paths.METRICS
        if not path.is_file():
            return set()
        keep, seen = [], set()
        rows, torn = self._read_metrics()
        for line, row in rows:
            s = row.get("step", 0)
            if s > step or row.get("final") or s in seen:
                continue
            seen.add(s)
            keep.append(line)
        if torn:
            self.log.warning("metrics.jsonl: dropped %d torn line(s) (a write cut short by a crash or power loss)", torn)
        atomic_write_text(path, "".join(k + "\n" for k in keep))
        return seen

    def _check_rows(self, step: int, logged, present: set) -> None:
        """Record the rows of steps 1..``step`` in ``logged`` that metrics.jsonl lacks (:attr:`metrics_gap`), with one
        warning line: they cannot be recomputed without training again from step 0."""
        missing = sorted({int(s) for s in logged} - set(present))
        self.metrics_gap = {"rows": len(missing), "steps": step_ranges(missing)} if missing else None
        if missing:
            self.log.warning("metrics.jsonl lacks %d row(s) of steps 1..%d (steps %s), lost before this start (a torn "
                             "write after a power loss, or the file deleted or edited); training goes on exactly, the "
                             "curve keeps this gap (metrics_gap in state.json and summary.json)", len(missing), step,
                             self.metrics_gap["steps"])

    def _reserve_space(self) -> None:
        """Set :data:`RESERVE_BYTES` aside in the run directory (best effort; see :data:`quartet.paths.RESERVE`)."""
        with contextlib.suppress(OSError):
            with open(self.dir / paths.RESERVE, "wb") as fh:
                fh.write(b"\0" * RESERVE_BYTES)
                fh.flush()
                os.fsync(fh.fileno())

    def free_reserve(self) -> None:
        """Give the reserved space back (at every end of the run, first thing on a failure)."""
        if self.is_main:
            with contextlib.suppress(OSError):
                (self.dir / paths.RESERVE).unlink()

    # -- during the run ---------------------------------------------------------------------
    def write_state(self, state: str, step: int, error: str | None = None, keep_step: bool = False) -> None:
        """Replace state.json; ``keep_step`` keeps its recorded step (the checkpoint could not be loaded)."""
        if not self.is_main:
            return
        path = self.dir / paths.STATE
        prev = paths.read_state(self.dir)
        write_json_atomic(path, {
            "state": state, "step": prev.get("step", step) if keep_step else step,
            "total_steps": self.total_steps, "updated": _now(), "error": error,
            "job_id": os.environ.get("SLURM_JOB_ID") or prev.get("job_id"), "host": socket.gethostname(),
            "run_id": self.run_id, "pid": os.getpid(), "pid_start": self._pid_start,
            **({"metrics_gap": self.metrics_gap} if self.metrics_gap else {}),
        })

    @contextlib.contextmanager
    def progress(self, step: int, show: bool):
        """The loop's metrics sink from ``step`` on: yields ``record(row, step, loss, lr)``, called on every rank
        after every update (``row`` None when the step logs nothing). Rank 0 appends the row to metrics.jsonl,
        mirrors it to wandb and shows it: a live bar on a terminal, a log line per row otherwise (``show``)."""
        from quartet.progress import Bar

        metrics = self._metrics_fh = open(self.dir / paths.METRICS, "a") if self.is_main else None
        live = self.is_main and show and sys.stderr.isatty()
        plain = self.is_main and show and not live
        bar = Bar(self.total_steps, self.run_id, "steps", initial=step, live=live)

        def record(row: dict | None, s: int, loss: float, lr: float) -> None:
            if row is not None and metrics is not None:
                metrics.write(json.dumps(row) + "\n")
                metrics.flush()
                if self.wandb is not None:
                    self.wandb.log_row(row, s)
                bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}")
                if plain:
                    tps = row.get("tokens_per_s")
                    self.log.info("step %d/%d  loss %.4f  lr %.3g%s", s, self.total_steps, loss, lr,
                                  f"  {tps:,.0f} tokens/s" if tps else "")
            bar.update(1)

        try:
            yield record
        finally:
            bar.close()
            self.sync_metrics()  # on disk before the final checkpoint that follows, as before every other one
            self._metrics_fh = None
            if metrics is not None:
                with contextlib.suppress(OSError):  # a full disk: the run's own error says so
                    metrics.close()

    # -- the end ----------------------------------------------------------------------------
    def complete(self, summary: dict) -> None:
        """The run finished: the final metrics row, summary.json (the completion marker), state "completed"."""
        if not self.is_main:
            return
        steps, val_loss = summary["steps"], summary["val_loss"]
        with open(self.dir / paths.METRICS, "a") as fh:
            fh.write(json.dumps({"step": steps, "tokens": summary["tokens"], "val_loss": val_loss, "final": True}) + "\n")
            _flush_to_disk(fh)  # every row on disk before the marker that says the run is complete
        if self.wandb is not None:
            self.wandb.log_row({"val_loss": val_loss, "final_val_loss": val_loss}, steps)
        if self.metrics_gap:
            summary["metrics_gap"] = self.metrics_gap
        write_json_atomic(self.dir / paths.SUMMARY, summary, durable=True)  # never empty after a power loss
        self.write_state("completed", steps)
        self.log.info("completed %s: val_loss %.4f after %d steps (%.0f s)", self.run_id, val_loss, steps,
                      summary["wall_clock_s"])

    def fail(self, exc: BaseException, step: int, keep_step: bool) -> None:
        """The run stopped on ``exc`` (called inside its ``except``): error.txt with the traceback, state
        "failed" ("preempted" for Ctrl-C) with the error's first line."""
        if not self.is_main:
            return
        failed = not isinstance(exc, KeyboardInterrupt)
        self.free_reserve()  # on a full disk, the room for what follows
        line = error_line(exc)
        # best effort, each on its own: a full or read-only disk must not turn the run's one error into three
        with contextlib.suppress(OSError):
            text = (str(exc) + "\n\n" if isinstance(exc, NonFiniteError) else "") + traceback.format_exc()
            try:
                (self.dir / paths.ERROR).write_text(text)
            except OSError:  # no room for the traceback: the reason alone, never an empty file
                (self.dir / paths.ERROR).write_text(line + "\n")
        with contextlib.suppress(OSError):
            # "preempted" means "resumes from the step it names": a hard stop (Ctrl-C mid-step) keeps the recorded
            # step, the last checkpoint's (state.json is written at each one), not the step it was stopped at
            self.write_state("failed" if failed else "preempted", step, error=line, keep_step=keep_step or not failed)
        self.log.error("run failed: %s", exc)

    def finish_mirror(self, exit_code: int) -> None:
        """Close the wandb mirror, if any (0 = the run ended cleanly)."""
        if self.wandb is not None:
            self.wandb.finish(exit_code)


def error_line(exc: BaseException) -> str:
    """``Type: first line`` of an error (what state.json's ``error`` holds)."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def data_identity(manifest: dict) -> dict:
    """What the run trained on, as the data manifest states it (corpus content hash, tokens)."""
    ident = {"key": manifest.get("key"), "train_tokens": manifest.get("splits", {}).get("train", {}).get("tokens"),
             "tokenizer_sha256": manifest.get("tokenizer", {}).get("sha256")}
    corpus = manifest.get("corpus")
    if isinstance(corpus, dict):
        ident.update(corpus_sha256=corpus.get("sha256"), corpus_files=corpus.get("files"),
                     corpus_bytes=corpus.get("bytes"))
    return ident


def make_summary(cfg: DictConfig, res, *, run_id: str, config_hash: str, manifest: dict, device: torch.device,
                 world_size: int, plan, val_loss: float, train_loss: float, elapsed: float) -> dict:
    """summary.json of a completed run (keys in docs/ARCHITECTURE.md); ``res`` is the run's ResolvedRun."""
    r = res
    node = cfg.get("branch")
    branch = {k: v for k, v in (OmegaConf.to_container(node) if node is not None else {}).items() if v not in (None, [])}
    # a budget branch trained only the updates after its branch step: its throughput is theirs
    trained = r.tokens - int(branch.get("step") or 0) * r.tokens_per_step
    out = {
        "run_id": run_id, "name": str(cfg.run.name), "model": str(cfg.model.name), "n_params": r.n_params,
        "n_params_total": r.n_params_total, "nominal_params": r.nominal_params, "tokens": r.tokens,
        "tokens_per_param": r.tokens / r.nominal_params, "steps": r.steps, "precision": str(cfg.precision.name),
        "forward": str(cfg.precision.forward), "backward": str(cfg.precision.backward), "seed": int(cfg.run.seed),
        "val_loss": val_loss, "train_loss": train_loss, "wall_clock_s": elapsed,
        "tokens_per_s": (trained / elapsed) if elapsed > 0 else None, "lr": r.lr, "batch_size": r.batch_size,
        "seq_len": r.seq_len, "data": str(cfg.data.name), "finished_at": _now(), "config_hash": config_hash,
        "data_identity": data_identity(manifest),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "world_size": world_size, "compile": bool(cfg.run.compile),
        "compile_mode": str(cfg.run.compile_mode) if bool(cfg.run.compile) else None,
        "implementation": plan.implementation, "traceable": plan.traceable,
    }
    if branch:  # a trunk (its save steps: analysis leaves it out of fits) or a branch (its trunk and branch step)
        out["branch"] = {"role": "branch" if branch.get("trunk") else "trunk", **branch}
    return out


def diagnose_non_finite(model: torch.nn.Module, optimizer: torch.optim.Optimizer, quant, autocast,
                        batches: list[tuple[torch.Tensor, torch.Tensor]], what: str, step: int) -> str:
    """Re-run a failed update's micro-batches with hooks; name the first module whose output / gradient is non-finite.

    ``quant`` is :mod:`quartet.quant` (its ``begin_micro_batch`` replays the same random draws), ``autocast`` a
    callable giving the step's autocast context, ``step`` the number of the update that failed (1-based). The
    gradients are cleared afterwards. Returns the one-paragraph message of the run's NonFiniteError.
    """
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
            quant.begin_micro_batch(model, i)  # the same draws as the failed step
            optimizer.zero_grad(set_to_none=True)
            with autocast():
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
    optimizer.zero_grad(set_to_none=True)
    if "forward" in found:
        where = f"first non-finite forward output in module '{found['forward']}'"
    elif "backward" in found:
        where = f"first non-finite gradient (backward order) at module '{found['backward']}'"
    else:
        where = "not reproduced when re-running this rank's micro-batches with hooks"
    if bad_params:
        where += f"; parameters with non-finite grads: {', '.join(bad_params[:5])}" + (" ..." if len(bad_params) > 5 else "")
    return f"non-finite {what} at step {step}: {where}"
