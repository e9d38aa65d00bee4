"""Test data helpers: run directories in the exact on-disk format of docs/ARCHITECTURE.md, and synthetic grids."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from analysis.laws import predict

#: The paper's base law (Table 6): used to plant synthetic losses.
PAPER_PARAMS = {"A": 152374.8, "alpha": 0.588576, "B": 525459.0, "beta": 0.544039, "E": 1.348141,
                "gamma": 0.273929}


def write_run(root: Path, group: str, run_id: str, *, n: float, d: float, forward: str, backward: str,
              precision: str, loss: float | None, state: str = "completed", seed: int = 0, step_total: int = 100,
              first_loss: float = 10.0, error: str | None = None) -> Path:
    """One run folder: config.yaml, state.json, metrics.jsonl and (if completed) summary.json."""
    run = root / group / run_id
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(
        f"model:\n  name: llama_tiny\nprecision:\n  name: {precision}\n  forward: {forward}\n  backward: {backward}\n"
        f"  backend: reference\nrun:\n  name: {group}\n  seed: {seed}\n")
    done_steps = step_total if state == "completed" else step_total // 2
    with open(run / "metrics.jsonl", "w") as fh:
        for s in range(1, done_steps + 1, 10):
            cur = first_loss - (first_loss - (loss if loss and np.isfinite(loss) else 4.0)) * s / step_total
            fh.write(json.dumps({"step": s, "tokens": int(d * s / step_total), "loss": cur, "lr": 1e-3,
                                 "grad_norm": 1.0, "tokens_per_s": 1e4, "elapsed_s": s * 0.1}) + "\n")
    (run / "state.json").write_text(json.dumps({"state": state, "step": done_steps, "total_steps": step_total,
                                                "updated": "2026-01-01T00:00:00", "error": error, "job_id": None,
                                                "host": "test"}))
    if state == "completed":
        (run / "summary.json").write_text(json.dumps({
            "run_id": run_id, "name": group, "model": f"tiny{int(n)}", "n_params": int(n), "n_params_total": int(n) + 4096,
            "tokens": int(d), "steps": step_total, "precision": precision, "forward": forward, "backward": backward,
            "seed": seed, "val_loss": loss if loss is None or np.isfinite(loss) else float("nan"),
            "train_loss": loss, "wall_clock_s": 12.0, "tokens_per_s": 1.0e4, "finished_at": "2026-01-01T00:00:00",
            "config_hash": "deadbeef"}, allow_nan=True))
    return run


#: The demo-like grid: tiny models, three sizes × three budgets, bf16 + fp8 + quartet.
SIZES = (2.0e5, 4.0e5, 8.0e5)
RATIOS = (20.0, 40.0, 80.0)
SCHEMES = {"bf16": ("bf16", "bf16", 1.0, 1.0), "fp8": ("fp8", "fp8", 0.97, 0.99),
           "quartet": ("quest", "rtn_absmax", 0.65, 0.9)}


def synthetic_rows(noise: float = 0.002, seed: int = 0, params=PAPER_PARAMS):
    rng = np.random.default_rng(seed)
    rows = []
    for name, (fw, bw, en, ed) in SCHEMES.items():
        for n in SIZES:
            for r in RATIOS:
                d = n * r
                clean = float(predict(params, n, d, en, ed))
                rows.append({"run_id": f"{name}-{int(n)}-{int(r)}", "n_params": n, "tokens": d, "forward": fw,
                             "backward": bw, "precision": name, "loss": clean * float(np.exp(rng.normal(0, noise)))})
    return rows


