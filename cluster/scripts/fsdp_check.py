"""FSDP2 and DDP on 2 GPUs (NCCL): loss curves against 1 GPU, sharded checkpoint -> resume on 1 and 2 GPUs,
per-GPU memory against ``quartet.memory``'s estimate, tokens/s per GPU, and the largest model each mode fits.

Every training run is the real :class:`quartet.train.Trainer` (what ``quartet train`` builds), started by
``python -m torch.distributed.run --standalone --nproc_per_node=N`` in its own process group, on a corpus of the
repository's own docs (no network, no corpus package; as ``benchmarks/fsdp_memory.py``). A rank records, besides
the run directory the trainer writes, the wall time and the CUDA memory peaks after every optimizer step, and the
estimate of :func:`quartet.memory.estimate_run` for its world size and mode (written before the model is built, so
a run that runs out of memory has one too).

1. *Equality*: ``--model`` (llama_30m on GPU: every block linear a multiple of 128, so the fused quartet layer runs
   all of them), ``--steps`` steps of ``--batch`` sequences, ``optim.micro_batch_size = batch/2``: 1 GPU
   accumulates two micro-batches, each of 2 GPUs takes one, the same micro-batches (quantized schemes draw their
   random signs per global micro-batch). Per precision: ddp and fsdp on 1 and on 2 GPUs (the two 1-GPU runs at the
   same time, one per GPU; no final checkpoint). Checked: 2 vs 1 GPU in the same mode against ``--tol-ranks``,
   fsdp vs ddp at each world size against ``--tol-modes``.
2. *Resume*: the 2-GPU fsdp run of ``--resume-precision`` stopped after ``--stop-at`` steps (``request_stop``, what
   SIGTERM does: a sharded checkpoint, state ``preempted``), its run directory copied twice and resumed on 1 GPU
   and on 2 GPUs; both curves (steps before the stop come from the interrupted run) against the uninterrupted
   2-GPU fsdp run of part 1, ``--tol-ranks``.
3. *Memory and speed*: for every run, the per-GPU peak of ``torch.cuda.max_memory_allocated`` / ``_reserved``
   (whole process, start-up included) next to the estimate, and tokens/s per GPU (median step after the first 2).
4. *Largest model*: ``--fit-sizes`` in order (a conf/model name, optionally ``:override``s, e.g.
   ``llama_7b:model.n_layer=48``), ``--fit-precision``, ``--fit-steps`` steps of one sequence per GPU, each mode
   stopping at its first size that does not fit (a CUDA out-of-memory error; a run that fails otherwise, or is cut
   off, stops the mode too and is recorded as such). No checkpoint is written; the final evaluation reads one batch.

Tolerances (GPU, ``run.amp=true``, as training runs). 2 vs 1 GPU, same mode, 1e-3: the two runs compute the same
micro-batches and differ only in how two micro-batch gradients are summed (DDP's all-reduce or FSDP2's fp32
reduce-scatter of two ranks, against one rank accumulating them); the halvings are exact, so the expected
difference is ~0 (2 x H200, llama_small, 300 steps: 0 at 6 decimals in bf16 and quartet, docs/cluster.md); 1e-3
leaves room for the odd flipped bf16 rounding, and is half the fsdp-vs-ddp difference of bf16 below. Except FSDP
with a quantized scheme, 2e-2 (``--tol-ranks-fsdp-quantized``): the first 2 x H100 run (benchmarks/results/fsdp2/)
found FSDP2's reduce-scatter is not bitwise the 1-GPU sum (bf16: 0 for 5 steps, then up to 9.3e-5, where DDP stays
at 0), and quartet's FP4 rounding amplifies such last-bit differences about a hundredfold (quartet fsdp: 0 for two
steps, 2.2e-4 at step 3, 1.2e-2 at step 20, as large as its fsdp-vs-ddp difference on one GPU), so that run failed the
1e-3 it was given; the equal step-2 losses show both runs drew the same random signs. fsdp vs ddp,
2e-2: FSDP2 gathers bf16 weights where DDP autocasts fp32 ones; on one H100 that gave 2.0e-3 (bf16) and 9.0e-3
(quartet) for llama_30m over 20 steps (docs/training.md, "Sharded training (FSDP2)"), and each mode is bitwise
reproducible; 2e-2 is benchmarks/fsdp_memory.py's bound. CPU (gloo, fp32 everywhere): 5e-5 for both, as
tests/quartet/test_fsdp_gloo.py.

Each later run is skipped, and recorded as skipped, when less than ``--min-run`` seconds of ``--budget`` are left.
Writes ``--out``/fsdp_check.json (every figure, each run's exact command, versions, devices) after every run and
prints a short table last, ending with ``RESULT PASS`` (every check ran and passed), ``INCOMPLETE`` (none failed,
but something was skipped or cut off) or ``FAIL``. Exit status 1 on FAIL: a check failed, or a run failed other
than by running out of memory.

On a 2-GPU machine whose python lacks hydra/omegaconf: ``bash cluster/scripts/fsdp_check.sh`` (docs/training.md).
On CPU (the test): ``--device cpu`` runs 2 gloo processes on tiny models; there the address space of every run is
capped (``--cpu-mem-limit-gb``) so that a too large size fails with a real allocation error, as on a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from quartet import paths  # noqa: E402  (stdlib only, as quartet.proc)
from quartet.paths import own_corpus_overrides  # noqa: E402
from quartet.proc import pid_alive, process_tree  # noqa: E402  (stdlib only: the parent imports no torch)
GB = 1e9
#: the GPU machine requires NVLink multicast off (NVLS in NCCL, symmetric memory in torch)
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
#: what a rank prints when an allocation fails (CUDA caching allocator; CPU allocator under RLIMIT_AS)
OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "DefaultCPUAllocator: can't allocate memory")
#: per device: model, seq_len, steps, batch, stop step, fit sizes, tolerances, per-run timeout, least seconds a run
DEFAULTS = {
    # llama_7b with 48 / 80 layers (9.8B / 16B): past what FSDP holds on two 80 GB / 141 GB GPUs by the estimate
    "cuda": dict(model="llama_30m", seq=512, steps=20, batch=16, stop_at=10, tol_ranks=1e-3, tol_modes=2e-2,
                 tol_ranks_fsdp_quantized=2e-2,
                 fit_sizes="llama_1600m,llama_3200m,llama_7b,llama_7b:model.n_layer=48,llama_7b:model.n_layer=80",
                 timeout=150, min_run=30),
    # under the 3 GB address-space cap llama_3200m fails allocating its first blocks (~10 s)
    "cpu": dict(model="llama_nano", seq=64, steps=8, batch=8, stop_at=4, tol_ranks=5e-5, tol_modes=5e-5,
                tol_ranks_fsdp_quantized=5e-5,
                fit_sizes="llama_nano,llama_nano:model.n_layer=2,llama_3200m,llama_7b", timeout=240, min_run=15),
}
WARM_STEPS = 2  # steps left out of the tokens/s median (allocator warm-up, Triton JIT)


# ------------------------------------------------------------------------------------------------
# One rank of one run (under torchrun)
# ------------------------------------------------------------------------------------------------


def _child(args: argparse.Namespace) -> int:
    """A Trainer run on this rank; writes ``estimate.json`` (rank 0, before the build) and ``rank<r>.json``."""
    import torch

    from quartet.config import compose, resolve
    from quartet.memory import estimate_run
    from quartet.train import Trainer

    res_dir = Path(args.result)
    cfg = compose(args.overrides)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    ac = bool(cfg.run.activation_checkpointing)
    if rank == 0:
        est = estimate_run(resolve(cfg.copy(), world), parallel=str(cfg.run.parallel), world_size=world,
                           activation_checkpointing=ac)
        gpu = torch.cuda.get_device_properties(0).total_memory / GB if torch.cuda.is_available() else None
        (res_dir / "estimate.json").write_text(json.dumps({
            "estimate_gb": est.total / GB, "estimate_tensors_gb": (est.training - est.overhead) / GB,
            "estimate": est.describe(), "gpu_memory_gb": gpu}))
    trainer = Trainer(cfg)
    cuda = trainer.device.type == "cuda"
    steps: list[dict] = []
    inner = trainer._step

    def timed_step():
        t0 = time.perf_counter()
        out = inner()  # ends with float(loss): the step's kernels are done
        if cuda:
            torch.cuda.synchronize(trainer.device)
        steps.append({"s": time.perf_counter() - t0,
                      "alloc_gb": torch.cuda.max_memory_allocated(trainer.device) / GB if cuda else None,
                      "reserved_gb": torch.cuda.max_memory_reserved(trainer.device) / GB if cuda else None})
        return out

    trainer._step = timed_step
    if args.stop_after:  # what SIGTERM does: request_stop -> sharded checkpoint at the step boundary, "preempted"
        trainer.callbacks.append(lambda tr, row: row["step"] >= args.stop_after and tr.request_stop())
    if args.no_ckpt:  # no checkpoint at the end (a 7B one is ~100 GB): only the interrupted run needs one
        trainer.save_checkpoint = lambda: None
    if args.eval_batches:  # the final evaluation reads this many micro-batches (a 7B one reads all in ~20 s)
        full_eval = trainer.evaluate
        trainer.evaluate = lambda max_batches=None: full_eval(args.eval_batches)
    summary = trainer.run()
    (res_dir / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "world": world, "parallel": trainer.parallel, "state": summary.get("state"),
        "step": summary.get("step", summary.get("steps")), "val_loss": summary.get("val_loss"),
        "implementation": summary.get("implementation"), "run_dir": str(trainer.dir),
        "tokens_per_step": trainer.res.tokens_per_step, "n_params_total": trainer.res.n_params_total,
        "steps": steps, "device_name": torch.cuda.get_device_name(trainer.device) if cuda else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda}))
    return 0


# ------------------------------------------------------------------------------------------------
# The check (parent: standard library only, never touches a GPU)
# ------------------------------------------------------------------------------------------------


def classify(returncode: int | None, log_text: str, timed_out: bool) -> str:
    """``ok`` | ``oom`` | ``timeout`` | ``error`` of a finished run from its exit status and output."""
    if timed_out:
        return "timeout"
    if returncode == 0:
        return "ok"
    return "oom" if any(m in log_text for m in OOM_MARKERS) else "error"


def kill_tree(p: subprocess.Popen, grace: float = 15.0) -> None:
    """End a run this script started and everything it started: SIGTERM, then SIGKILL after ``grace`` s; returns
    once they are gone (their GPU memory freed before the next run starts). The whole tree, not the process group:
    torchrun starts each rank in a session of its own."""
    pids = process_tree(p.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace
        while time.monotonic() < end:
            p.poll()
            if not any(pid_alive(pid) for pid in pids):
                p.wait()
                return
            time.sleep(0.2)
        pids = sorted(set(pids) | set(process_tree(p.pid)))
    p.wait()


def losses(run_dir: Path) -> dict[int, float]:
    """step -> training loss of a run directory's metrics.jsonl."""
    rows = [row for _, _, row in paths.metrics_lines(run_dir) if isinstance(row, dict)]
    return {int(r["step"]): float(r["loss"]) for r in rows if "loss" in r}


def compare(a: dict, b: dict, tol: float, steps: int) -> dict:
    """max |loss difference| over the steps and |val loss difference| of two finished runs, against ``tol``."""
    la, lb = a["losses"], b["losses"]
    row = {"a": a["label"], "b": b["label"], "tol": tol, "steps": sorted(la) == sorted(lb) == list(range(1, steps + 1))}
    if not row["steps"]:
        return {**row, "ok": False, "why": f"logged steps differ: {len(la)} vs {len(lb)}, expected 1..{steps}"}
    row["max_dloss"] = max(abs(la[s] - lb[s]) for s in la)
    row["at_step"] = max(la, key=lambda s: abs(la[s] - lb[s]))
    row["dval"] = abs(a["val_loss"] - b["val_loss"])
    row["ok"] = row["max_dloss"] <= tol and row["dval"] <= tol
    return row


class Check:
    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.t0 = time.monotonic()
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="fsdp_check_"))
        self.cache = os.environ.get("QUARTET_CACHE") or str(self.work / "cache")
        self.cuda = args.device == "cuda"
        #: the two GPUs the runs use (CUDA_VISIBLE_DEVICES of this process, if it names any, else 0 and 1)
        self.gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(",") if g.strip()][:2]
        self.data = own_corpus_overrides()
        self.runs: dict[str, dict] = {}
        self.r: dict = {
            "script": "cluster/scripts/fsdp_check.py", "argv": args.argv, "device": args.device,
            "budget_s": args.budget, "tolerances": {"ranks": args.tol_ranks, "modes": args.tol_modes,
                                                    "ranks_fsdp_quantized": args.tol_ranks_fsdp_quantized},
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "env": self._env_info(), "runs": self.runs,
            "equality": [], "resume": {}, "memory": [], "fits": {}, "skipped": [], "problems": [],
        }

    # -- bookkeeping -------------------------------------------------------------------------------
    def left(self) -> float:
        return self.a.budget - (time.monotonic() - self.t0)

    def _env_info(self) -> dict:
        info = {"python": platform.python_version(), "host": platform.node(), "executable": sys.executable,
                "git_commit": os.environ.get("QUARTET_GIT_COMMIT") or self._cmd(["git", "rev-parse", "HEAD"]),
                "child_env": {**NCCL_ENV, "OMP_NUM_THREADS": self._threads()}}
        if self.cuda:
            info["nvidia_smi"] = self._cmd(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                            "--format=csv,noheader"])
        return info

    @staticmethod
    def _cmd(cmd: list[str]) -> str | None:
        try:
            out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=20)
            return out.stdout.strip() if out.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    def _threads(self) -> str:
        return "4" if self.cuda else "1"

    def save(self) -> None:
        self.r["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        tmp = self.out / "fsdp_check.json.tmp"
        tmp.write_text(json.dumps(self.r, indent=1, default=str))
        os.replace(tmp, self.out / "fsdp_check.json")

    def problem(self, text: str) -> None:
        self.r["problems"].append(text)

    # -- runs -------------------------------------------------------------------------------------
    def overrides(self, *, model: str, precision: str, mode: str, steps: int, batch: int, micro: int,
                  label: str, extra: tuple[str, ...] = ()) -> list[str]:
        a = self.a
        return [*self.data, f"model={model}", f"model.seq_len={a.seq}", *extra, f"precision={precision}",
                f"run.parallel={mode}", "budget=tokens", f"budget.tokens={steps * batch * a.seq}",
                f"optim.batch_size={batch}", f"optim.micro_batch_size={micro}", "logging=quiet",
                "logging.log_every=1", "logging.val_every=0", "logging.ckpt_every=0", "logging.progress=false",
                f"run.device={a.device}", "run.compile=false", *([] if self.cuda else ["run.threads=1"]),
                "run.name=fsdp_check", f"run.out_dir={self.out / 'runs' / label}", *a.overrides]

    def _spec(self, label: str, world: int, overrides: list[str], gpu_index: int = 0, stop_after: int = 0,
              no_ckpt: bool = False, eval_batches: int = 0, **meta) -> dict:
        """A run of ``world`` ranks (a 1-GPU run on the first or second of the two GPUs: ``gpu_index``); the child's
        flags are in main()."""
        res = self.work / "results" / label
        res.mkdir(parents=True, exist_ok=True)
        flags = [*(["--stop-after", str(stop_after)] if stop_after else []), *(["--no-ckpt"] if no_ckpt else []),
                 *(["--eval-batches", str(eval_batches)] if eval_batches else [])]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
               str(Path(__file__).resolve()), "--child", "--result", str(res), *flags, "--", *overrides]
        env = {**NCCL_ENV, "OMP_NUM_THREADS": self._threads(), "QUARTET_CACHE": self.cache}
        if self.cuda:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus) if world > 1 else self.gpus[gpu_index]
        meta.update(final_checkpoint=not no_ckpt, final_eval_batches=eval_batches or "all")
        return {"label": label, "world": world, **meta, "res_dir": res, "env": env, "cmd": cmd,
                "command": " ".join(f"{k}={v}" for k, v in env.items()) + " " + shlex.join(cmd)}

    def _child_env(self, spec: dict) -> dict:
        env = {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"), "PYTHONUNBUFFERED": "1",
               **spec["env"]}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
        return env

    def _limit(self):
        """preexec_fn of a CPU run: cap the address space, so a size too large fails allocating (no OOM killer)."""
        if self.cuda or not self.a.cpu_mem_limit_gb:
            return None
        cap = int(self.a.cpu_mem_limit_gb * 2**30)
        return lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    def launch(self, *specs: dict) -> list[dict]:
        """Run ``specs`` at the same time (each in its own process group), at most ``--timeout`` s and what the
        budget leaves; returns each one's record (also kept in ``self.runs``)."""
        limit = min(self.a.timeout, self.left())
        if limit < self.a.min_run:
            why = f"skipped: {self.left():.0f} s of the --budget left, a run needs {self.a.min_run} s"
            for s in specs:
                self.runs[s["label"]] = {**self._public(s), "status": "skipped", "why": why}
            self.save()
            return [self.runs[s["label"]] for s in specs]
        procs = []
        for s in specs:
            log = open(self.out / "logs" / f"{s['label']}.log", "w")
            log.write(f"$ {s['command']}\n")
            log.flush()
            p = subprocess.Popen(s["cmd"], cwd=REPO, env=self._child_env(s), stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, preexec_fn=self._limit())
            s["ran_alongside"] = [x["label"] for x in specs if x is not s] or None  # sharing the host's CPUs
            procs.append({"spec": s, "p": p, "log": log, "start": time.monotonic(), "end": None})
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and any(x["end"] is None for x in procs):
            time.sleep(0.2)
            for x in procs:
                if x["end"] is None and x["p"].poll() is not None:
                    x["end"] = time.monotonic()
        out = []
        for x in procs:
            timed_out = x["end"] is None
            if timed_out:
                kill_tree(x["p"])
            x["log"].close()
            rec = self._record(x["spec"], x["p"].returncode, timed_out, (x["end"] or time.monotonic()) - x["start"])
            print(f"[{time.monotonic() - self.t0:4.0f} s] {rec['label']}: {rec['status']} in {rec['seconds']:.0f} s",
                  flush=True)
            out.append(rec)
        self.save()
        return out

    @staticmethod
    def _public(s: dict) -> dict:
        return {k: v for k, v in s.items() if k not in ("res_dir", "cmd", "env")}

    def _record(self, s: dict, rc: int | None, timed_out: bool, seconds: float) -> dict:
        text = (self.out / "logs" / f"{s['label']}.log").read_text(errors="replace")
        rec = {**self._public(s), "status": classify(rc, text, timed_out), "returncode": rc,
               "seconds": round(seconds, 1), "log": f"logs/{s['label']}.log"}
        est = s["res_dir"] / "estimate.json"
        if est.is_file():
            rec.update(json.loads(est.read_text()))
        ranks = [json.loads((s["res_dir"] / f"rank{r}.json").read_text()) for r in range(s["world"])
                 if (s["res_dir"] / f"rank{r}.json").is_file()]
        if rec["status"] == "ok" and len(ranks) != s["world"]:
            rec["status"] = "error"  # exit 0 without every rank's record
        if rec["status"] == "ok":
            r0 = ranks[0]
            rec.update({k: r0[k] for k in ("parallel", "state", "step", "val_loss", "implementation", "run_dir",
                                           "n_params_total", "device_name", "torch", "cuda")})
            rec["devices"] = [r["device_name"] for r in ranks]
            if self.cuda and all(r["steps"] for r in ranks):  # the process's peak after its last step, per GPU
                rec["peak_allocated_gb"] = [r["steps"][-1]["alloc_gb"] for r in ranks]
                rec["peak_reserved_gb"] = [r["steps"][-1]["reserved_gb"] for r in ranks]
            times = [x["s"] for x in r0["steps"]][WARM_STEPS:] or [x["s"] for x in r0["steps"]]
            if times:
                rec["step_s_median"] = statistics.median(times)
                rec["tokens_per_s_per_gpu"] = r0["tokens_per_step"] / s["world"] / rec["step_s_median"]
            run_dir = Path(r0["run_dir"])
            rec["losses"] = losses(run_dir)
            env_json = run_dir / paths.ENV
            if env_json.is_file():
                rec["run_env"] = json.loads(env_json.read_text())
        else:
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            said = [ln for ln in lines if any(m in ln for m in OOM_MARKERS)] or \
                [ln for ln in lines if "Error" in ln or "error:" in ln]
            rec["reason"] = said[0][:400] if said else (lines[-1][:400] if lines else "")
            rec["tail"] = lines[-8:]
            if rec["status"] == "error":
                self.problem(f"run {s['label']} failed (exit {rc}): {rec['reason'][:200]}")
        self.runs[s["label"]] = rec
        return rec

    # -- the parts ---------------------------------------------------------------------------------
    def prepare_data(self) -> bool:
        if self.left() < self.a.min_run:  # no run fits in what is left: none would read the data, so skip preparing it
            self.r["skipped"].append({"part": "data prepare",
                                      "why": f"{self.left():.1f} s of the --budget left (< {self.a.min_run:g})"})
            return True
        cmd = [sys.executable, "-m", "quartet.cli", "data", "prepare", *self.data]
        t = time.monotonic()
        spec = {"env": {"QUARTET_CACHE": self.cache}}
        try:
            out = subprocess.run(cmd, cwd=REPO, env=self._child_env(spec), capture_output=True, text=True,
                                 timeout=max(10.0, min(300.0, self.left())))
        except subprocess.TimeoutExpired:
            self.problem("data prepare timed out")
            return False
        self.r["data"] = {"overrides": self.data, "command": shlex.join(cmd), "seconds": round(time.monotonic() - t, 1),
                          "output": (out.stdout + out.stderr).strip().splitlines()[-2:]}
        if out.returncode != 0:
            self.problem(f"data prepare failed: {(out.stderr or out.stdout).strip()[-300:]}")
        return out.returncode == 0

    def equality(self) -> None:
        a = self.a
        for precision in a.precisions.split(","):
            recs = {}
            for world in (1, 2):
                specs = [self._spec(f"{precision}-{mode}-{world}gpu", world,
                                    self.overrides(model=a.model, precision=precision, mode=mode, steps=a.steps,
                                                   batch=a.batch, micro=a.batch // 2,
                                                   label=f"{precision}-{mode}-{world}gpu"),
                                    gpu_index=0 if mode == "ddp" else 1, no_ckpt=True, model=a.model,
                                    precision=precision, mode=mode, part="equality")
                         for mode in ("ddp", "fsdp")]
                if world == 1 and a.concurrent_1gpu:  # one 1-GPU run per GPU at the same time
                    got = self.launch(*specs)
                else:
                    got = [self.launch(s)[0] for s in specs]
                recs.update({(r["mode"], world): r for r in got})
            pairs = [("ddp: 2 GPUs vs 1", "ddp", 1, "ddp", 2, a.tol_ranks),
                     ("fsdp: 2 GPUs vs 1", "fsdp", 1, "fsdp", 2,
                      a.tol_ranks if precision == "bf16" else a.tol_ranks_fsdp_quantized),
                     ("1 GPU: fsdp vs ddp", "ddp", 1, "fsdp", 1, a.tol_modes),
                     ("2 GPUs: fsdp vs ddp", "ddp", 2, "fsdp", 2, a.tol_modes)]
            for what, m1, w1, m2, w2, tol in pairs:
                x, y = recs[(m1, w1)], recs[(m2, w2)]
                if x["status"] != "ok" or y["status"] != "ok":
                    row = {"precision": precision, "what": what, "ok": None,
                           "why": f"not checked: {x['label']} {x['status']}, {y['label']} {y['status']}"}
                else:
                    row = {"precision": precision, "what": what, **compare(x, y, tol, a.steps)}
                self.r["equality"].append(row)
            self.save()

    def resume(self) -> None:
        a = self.a
        p = a.resume_precision
        label = f"{p}-fsdp-2gpu"
        full = self.runs.get(label)

        def over(lab: str) -> list[str]:
            return self.overrides(model=a.model, precision=p, mode="fsdp", steps=a.steps, batch=a.batch,
                                  micro=a.batch // 2, label=lab)

        meta = {"model": a.model, "precision": p, "mode": "fsdp", "part": "resume"}
        if full is None or full["status"] != "ok":  # part 1 did not run it: the uninterrupted reference
            full = self.launch(self._spec(f"{label}-uninterrupted", 2, over(f"{label}-uninterrupted"), no_ckpt=True,
                                          **meta))[0]
        res = self.r["resume"]
        res.update({"precision": p, "stop_at": a.stop_at, "steps": a.steps, "uninterrupted": full["label"]})
        stop = self.launch(self._spec(f"{p}-fsdp-2gpu-stopped", 2, over(f"{p}-fsdp-2gpu-stopped"),
                                      stop_after=a.stop_at, **meta))[0]
        if stop["status"] != "ok":
            res["why"] = f"not checked: the interrupted run is {stop['status']}"
            return
        src = Path(stop["run_dir"])
        ckpt = paths.last_checkpoint(src, sharded=True)
        res["interrupted"] = {"state": stop["state"], "step": stop["step"],
                              "checkpoint_files": sorted(x.name for x in ckpt.iterdir()) if ckpt.is_dir() else []}
        want = [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
        res["interrupted"]["ok"] = (stop["state"] == "preempted" and stop["step"] == a.stop_at
                                    and res["interrupted"]["checkpoint_files"] == want)
        if not res["interrupted"]["ok"]:
            self.problem(f"interrupted run: state {stop['state']} at step {stop['step']}, checkpoint "
                         f"{res['interrupted']['checkpoint_files']} (expected preempted at {a.stop_at}, {want})")
        for world in (2, 1):
            lab = f"{p}-fsdp-resume-{world}gpu"
            dest = self.out / "runs" / lab / src.relative_to(self.out / "runs" / stop["label"])
            shutil.copytree(src, dest)
            rec = self.launch(self._spec(lab, world, over(lab), no_ckpt=True, **meta))[0]
            key = f"on_{world}gpu"
            if rec["status"] != "ok" or full["status"] != "ok":
                res[key] = {"ok": None, "why": f"not checked: {lab} {rec['status']}, {full['label']} {full['status']}"}
                continue
            log = (Path(rec["run_dir"]) / paths.TRAIN_LOG).read_text()
            res[key] = {**compare(full, rec, a.tol_ranks, a.steps), "resumed": f"from step {a.stop_at}/" in log}
            res[key]["ok"] = res[key]["ok"] and res[key]["resumed"]
        self.save()

    def fits(self) -> None:
        a = self.a
        sizes = [s for s in a.fit_sizes.split(",") if s]
        self.r["fits"] = {"precision": a.fit_precision, "sizes": sizes, "steps": a.fit_steps,
                          "micro_batch": f"1 x {a.seq} tokens per GPU"}
        stopped: dict[str, str] = {}
        for size in sizes:
            name, *extra = size.split(":")  # e.g. llama_7b:model.n_layer=48, a size between those of conf/model
            for mode in ("ddp", "fsdp"):
                info = self.r["fits"].setdefault(mode, {"largest": None, "attempts": []})
                label = f"fit-{mode}-{name}" + "".join(f"+{x.replace('model.', '').replace('=', '')}" for x in extra)
                if mode in stopped:
                    info["attempts"].append({"model": size, "status": "skipped", "why": stopped[mode]})
                    continue
                over = self.overrides(model=name, precision=a.fit_precision, mode=mode, steps=a.fit_steps, batch=2,
                                      micro=1, label=label, extra=tuple(extra))
                rec = self.launch(self._spec(label, 2, over, no_ckpt=True, eval_batches=1, model=size,
                                             precision=a.fit_precision, mode=mode, part="fits"))[0]
                info["attempts"].append({"model": size, "status": rec["status"], "label": label,
                                         **{k: rec[k] for k in ("estimate_gb", "gpu_memory_gb") if k in rec},
                                         **({"peak_allocated_gb": max(rec["peak_allocated_gb"])}
                                            if "peak_allocated_gb" in rec else {})})
                if rec["status"] == "ok":
                    info["largest"] = size
                else:
                    stopped[mode] = f"{size} did not fit" if rec["status"] == "oom" else \
                        f"{size} ended {rec['status']}: larger sizes not tried"
        for mode in ("ddp", "fsdp"):
            info = self.r["fits"].get(mode)
            if info and sizes and info["largest"] == sizes[-1]:
                info["note"] = f"the largest size tried fits: the limit is at {sizes[-1]} or above"
        self.save()

    def memory(self) -> None:
        """One row per finished run: estimate next to the measured per-GPU peaks, tokens/s per GPU."""
        for rec in self.runs.values():
            if rec.get("status") != "ok":
                continue
            row = {k: rec.get(k) for k in ("label", "world", "mode", "model", "precision", "estimate_gb",
                                           "estimate_tensors_gb", "gpu_memory_gb", "tokens_per_s_per_gpu")}
            if "peak_allocated_gb" in rec:
                row["peak_allocated_gb"] = max(rec["peak_allocated_gb"])
                row["peak_reserved_gb"] = max(rec["peak_reserved_gb"])
                if rec.get("estimate_gb"):
                    row["alloc_over_estimate"] = row["peak_allocated_gb"] / rec["estimate_gb"]
            elif self.cuda:
                row["peak"] = "not measured: the run trained no step here"
            else:
                row["peak"] = "skipped: no CUDA memory statistics on CPU"
            self.r["memory"].append(row)
        self.save()

    def part(self, name: str, fn, need: float) -> None:
        if self.left() < need:
            self.r["skipped"].append({"part": name, "why": f"{self.left():.1f} s of the --budget left (< {need:g})"})
            self.save()
            return
        try:
            fn()
        except Exception as exc:  # a bug here must not cost the other parts' results
            import traceback

            self.problem(f"part {name} stopped: {exc!r}")
            self.r.setdefault("tracebacks", {})[name] = traceback.format_exc()
            self.save()

    def run(self) -> int:
        a = self.a
        self.save()
        if self.cuda and len(self.gpus) < 2:
            self.problem(f"needs 2 GPUs; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")
        if self.r["problems"] or not self.prepare_data():
            self.r.update(ok=False, verdict="FAIL")
            self.save()
            shutil.rmtree(self.work, ignore_errors=True)
            print(self.table())
            return 1
        self.part("equality", self.equality, a.min_run)
        self.part("resume", self.resume, 3 * a.min_run)
        self.part("fits", self.fits, a.min_run)
        self.memory()
        checks = [r["ok"] for r in self.r["equality"]]
        res = self.r["resume"]
        checks += [res[k]["ok"] for k in ("on_2gpu", "on_1gpu") if k in res]
        if "interrupted" in res:
            checks.append(res["interrupted"]["ok"])
        failed = [c for c in checks if c is False]
        self.r["checks"] = {"passed": sum(c is True for c in checks), "failed": len(failed),
                            "not_checked": sum(c is None for c in checks)}
        self.r["ok"] = not failed and not self.r["problems"]
        cut = [k for k, v in self.runs.items() if v.get("status") in ("skipped", "timeout")]
        incomplete = self.r["skipped"] or cut or self.r["checks"]["not_checked"] or not checks
        self.r["verdict"] = "FAIL" if not self.r["ok"] else ("INCOMPLETE" if incomplete else "PASS")
        self.save()
        shutil.rmtree(self.work, ignore_errors=True)
        for d in (self.out / "runs").glob("*/*/*/ckpt"):  # checkpoints are not results: --out stays small
            shutil.rmtree(d, ignore_errors=True)
        print(self.table())
        return 0 if self.r["ok"] else 1

    # -- the table (printed last: the caller sees the tail) --------------------------------------------
    def table(self) -> str:
        r, L = self.r, []
        devs = sorted({d for x in self.runs.values() for d in x.get("devices", [])})
        torch_v = next((x["torch"] for x in self.runs.values() if x.get("torch")), "?")
        L.append(f"== fsdp_check on {r['device']} ({', '.join(devs) or '?'}; torch {torch_v}), "
                 f"{r.get('elapsed_s', 0):.0f} s of a {r['budget_s']:.0f} s budget; {self.out / 'fsdp_check.json'}")
        impl = {x["precision"]: x["implementation"] for x in self.runs.values() if x.get("implementation")}
        L.append(f"equality: {self.a.model}, {self.a.steps} steps of {self.a.batch} x {self.a.seq} tokens "
                 f"(max |dloss| / |dval|)" + "".join(f"; {k}: {v}" for k, v in impl.items()))
        for e in r["equality"]:
            verdict = "ok" if e["ok"] else ("FAIL" if e["ok"] is False else e.get("why", "not checked"))
            nums = (f"{e['max_dloss']:.2e} / {e['dval']:.2e} (tol {e['tol']:g})" if "max_dloss" in e
                    else e.get("why", ""))
            L.append(f"  {e['precision']:8} {e['what']:26} {nums}  {verdict if e['ok'] is not None else ''}")
        res = r["resume"]
        if res:
            parts = []
            if "interrupted" in res:
                x = res["interrupted"]
                parts.append(f"stopped at {x['step']} ({'ok' if x['ok'] else 'FAIL'})")
            for k in ("on_2gpu", "on_1gpu"):
                if k in res:
                    x = res[k]
                    parts.append(f"{k.replace('_', ' ')}: " + (f"{x['max_dloss']:.2e} / {x['dval']:.2e} "
                                                              f"{'ok' if x['ok'] else 'FAIL'}" if "max_dloss" in x
                                                              else x.get("why", "?")))
            L.append(f"resume ({res.get('precision')} fsdp, 2 GPUs -> 1 / 2): "
                     + "; ".join(parts or [res.get("why", "")]))
        if r["memory"]:
            L.append(f"{'run (per GPU; GB = 1e9 B)':36} {'est GB':>7} {'alloc':>7} {'resv':>7} {'tok/s/GPU':>10}")
            for m in r["memory"]:
                alloc = f"{m['peak_allocated_gb']:7.2f} {m['peak_reserved_gb']:7.2f}" if "peak_allocated_gb" in m \
                    else f"{'-':>7} {'-':>7}"
                tps = f"{m['tokens_per_s_per_gpu']:10.0f}" if m.get("tokens_per_s_per_gpu") else f"{'-':>10}"
                L.append(f"  {m['label']:34} {m['estimate_gb'] or 0:7.2f} {alloc} {tps}")
        fits = r["fits"]
        for mode in ("ddp", "fsdp"):
            if mode in fits:
                tried = ", ".join(f"{x['model']} {x['status']}" for x in fits[mode]["attempts"])
                L.append(f"fits {mode:4}: largest {fits[mode]['largest']} ({tried})")
        for s in r["skipped"]:
            L.append(f"SKIPPED {s['part']}: {s['why']}")
        skipped_runs = [k for k, v in self.runs.items() if v.get("status") in ("skipped", "timeout")]
        if skipped_runs:
            L.append(f"runs skipped or cut off: {', '.join(skipped_runs)}")
        for p in r["problems"]:
            L.append(f"PROBLEM {p}")
        c = r.get("checks", {})
        L.append(f"RESULT {r.get('verdict', 'FAIL')}: {c.get('passed', 0)} checks passed, "
                 f"{c.get('failed', 0)} failed, {c.get('not_checked', 0)} not checked")
        return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--stop-after", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--no-ckpt", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--eval-batches", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: 2 GPUs, NCCL; cpu: 2 gloo processes, tiny models (the test)")
    p.add_argument("--out", default=str(REPO / ".cache" / "fsdp_check"), help="results folder (JSON, logs, runs)")
    p.add_argument("--budget", type=float, default=480, help="seconds for everything; later runs are skipped")
    p.add_argument("--model", help="model of parts 1-2 (cuda: llama_30m, cpu: llama_nano)")
    p.add_argument("--seq", type=int, help="model.seq_len (cuda: 512, cpu: 64)")
    p.add_argument("--steps", type=int, help="optimizer steps of parts 1-2 (cuda: 20, cpu: 8)")
    p.add_argument("--batch", type=int, help="sequences per step, split in 2 micro-batches (cuda: 16, cpu: 8)")
    p.add_argument("--precisions", default="bf16,quartet", help="precisions of part 1")
    p.add_argument("--resume-precision", default="quartet")
    p.add_argument("--stop-at", type=int, help="step after which the interrupted run stops (cuda: 10, cpu: 4)")
    p.add_argument("--fit-sizes", help="models of part 4, smallest first, each NAME[:OVERRIDE...] (cuda: llama_1600m, "
                   "llama_3200m, llama_7b, then llama_7b with 48 and 80 layers; cpu: see DEFAULTS)")
    p.add_argument("--fit-precision", default="bf16")
    p.add_argument("--fit-steps", type=int, default=3)
    p.add_argument("--tol-ranks", type=float, help="2 vs 1 GPU, same mode (cuda: 1e-3, cpu: 5e-5)")
    p.add_argument("--tol-modes", type=float, help="fsdp vs ddp (cuda: 2e-2, cpu: 5e-5)")
    p.add_argument("--tol-ranks-fsdp-quantized", type=float,
                   help="2 vs 1 GPU under fsdp with a quantized scheme (cuda: 2e-2, cpu: 5e-5; see the docstring)")
    p.add_argument("--timeout", type=float, help="seconds per run at most (cuda: 150, cpu: 240)")
    p.add_argument("--min-run", type=float, help="skip a run when fewer seconds are left (cuda: 30, cpu: 15)")
    p.add_argument("--concurrent-1gpu", action=argparse.BooleanOptionalAction, default=None,
                   help="run the 1-GPU ddp and fsdp runs at the same time, on GPU 0 and GPU 1 (cuda: on)")
    p.add_argument("--cpu-mem-limit-gb", type=float, default=3.0,
                   help="cpu: address-space cap (RLIMIT_AS) of every run, 0 for none")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (after --)")
    args = p.parse_args(argv)
    args.argv = argv
    if args.child:  # a rank under torchrun: ends without the interpreter's teardown (exit_process says why)
        from quartet.distributed import exit_process

        exit_process(_child(args))
    for k, v in DEFAULTS[args.device].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.concurrent_1gpu is None:
        args.concurrent_1gpu = args.device == "cuda"
    if args.batch % 2:
        p.error(f"--batch {args.batch}: must split into 2 micro-batches")
    return Check(args).run()


if __name__ == "__main__":
    sys.exit(main())
