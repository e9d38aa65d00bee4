"""cluster/scripts/fsdp_check.py (the 2-GPU FSDP2 / DDP check) end to end on CPU: 2 gloo processes under torchrun,
tiny models, every part, started through its shell wrapper as on the GPU machine; then what its JSON says."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_scripts import load_script

REPO = Path(__file__).resolve().parents[2]


def _module():
    return load_script("cluster/scripts/fsdp_check.py")


#: The script's own limits in the tests: hang guards for a loaded machine (its defaults, 240 s a run, 480 s in all
#: and fsdp_check.sh's 520 s, fit an idle one); a test that needs runs cut passes its own.
LIMITS = ("--timeout", "1200", "--budget", "3000")
HARD_S = "3300"


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out"
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PY": sys.executable, "OUT": str(out), "WANDB_MODE": "offline", "FSDP_CHECK_HARD_S": HARD_S}
    env.pop("QUARTET_CACHE", None)  # the script's own cache, in a temporary folder
    res = subprocess.run(["bash", str(REPO / "cluster/scripts/fsdp_check.sh"), "--device", "cpu", *LIMITS, *args],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600)
    report = out / "fsdp_check.json"
    assert report.is_file(), res.stdout[-3000:] + res.stderr[-3000:]
    return res, json.loads(report.read_text())


def _leftovers(marker: str) -> list[str]:
    """Command lines of live processes that mention ``marker`` (a run's output folder)."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if d.name.isdigit() and marker in cmd and "pytest" not in cmd:
            found.append(cmd)
    return found


def test_classify_and_compare():
    m = _module()
    assert m.classify(0, "anything", False) == "ok"
    assert m.classify(None, "", True) == "timeout"
    assert m.classify(1, "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", False) == "oom"
    assert m.classify(1, "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried", False) == "oom"
    assert m.classify(1, "quartet.errors.ConfigError: bad overrides", False) == "error"
    a = {"label": "a", "losses": {1: 2.0, 2: 1.5, 3: 1.25}, "val_loss": 1.2}
    b = {"label": "b", "losses": {1: 2.0, 2: 1.5004, 3: 1.25}, "val_loss": 1.2001}
    got = m.compare(a, b, 1e-3, 3)
    assert got["ok"] and got["max_dloss"] == pytest.approx(4e-4) and got["at_step"] == 2
    assert got["dval"] == pytest.approx(1e-4)
    assert not m.compare(a, b, 1e-4, 3)["ok"]
    short = {**b, "losses": {1: 2.0, 2: 1.5}}
    assert m.compare(a, short, 1.0, 3)["ok"] is False  # a missing step is a failure, whatever the tolerance
    assert m.compare(a, a, 0.0, 4)["ok"] is False  # fewer steps than the run should have had


def test_timeouts_and_the_budget_are_recorded_and_leave_no_process(tmp_path):
    """Every run cut off after 0.5 s: recorded as timeout (its whole process tree ended), the checks as not checked;
    RESULT INCOMPLETE, exit status 0. (0.5 s is less than starting the interpreter and torch takes, so no run can
    finish in it: a 4 s limit let an idle machine finish one.) With no budget left every run and part is skipped and
    says why. Two invocations, so neither outcome depends on how fast this machine is."""
    res, r = _run(tmp_path / "cut", "--precisions", "bf16", "--timeout", "0.5", "--min-run", "0.4", "--budget", "3000",
                  "--fit-sizes", "llama_nano")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    tail = res.stdout.strip().splitlines()
    assert tail[-1].startswith("RESULT INCOMPLETE: 0 checks passed, 0 failed")
    assert r["runs"] and all(v["status"] == "timeout" for v in r["runs"].values()), \
        {k: v["status"] for k, v in r["runs"].items()}
    assert {e["ok"] for e in r["equality"]} <= {None}
    assert r["verdict"] == "INCOMPLETE" and r["ok"] is True and not r["problems"]
    assert _leftovers(str(tmp_path / "cut" / "out")) == []
    res, r = _run(tmp_path / "none", "--precisions", "bf16", "--timeout", "0.5", "--min-run", "0.4", "--budget", "0",
                  "--fit-sizes", "llama_nano")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert not [v for v in r["runs"].values() if v["status"] != "skipped"]
    later = [s["why"] for s in r["skipped"]] + [v["why"] for v in r["runs"].values() if v["status"] == "skipped"]
    assert later and all("of the --budget left" in w for w in later), r["runs"].keys()
    assert r["verdict"] == "INCOMPLETE"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_fsdp_check_on_cpu_passes_every_part(tmp_path):
    res, r = _run(tmp_path, "--tol-ranks-fsdp-quantized", "4e-5")
    out = tmp_path / "out"
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]
    last = res.stdout.strip().splitlines()[-1]
    assert last == "RESULT PASS: 11 checks passed, 0 failed, 0 not checked", res.stdout[-3000:]
    assert r["verdict"] == "PASS" and r["ok"] and not r["problems"] and not r["skipped"]
    assert r["tolerances"] == {"ranks": 5e-5, "modes": 5e-5, "ranks_fsdp_quantized": 4e-5}
    # quantized FSDP 2 vs 1 GPU is held to its own tolerance (GPU: FSDP2's reduce-scatter is not the 1-GPU sum bitwise,
    # and FP4 rounding amplifies that); every other pair to its usual one
    tol = {(e["precision"], e["what"]): e["tol"] for e in r["equality"]}
    assert tol[("quartet", "fsdp: 2 GPUs vs 1")] == 4e-5 and tol[("bf16", "fsdp: 2 GPUs vs 1")] == 5e-5
    assert tol[("quartet", "ddp: 2 GPUs vs 1")] == 5e-5

    # 1. every run real: torchrun with its world size, the multicast switches off, the mode it asked for, 8 steps
    for precision in ("bf16", "quartet"):
        for mode in ("ddp", "fsdp"):
            for world in (1, 2):
                run = r["runs"][f"{precision}-{mode}-{world}gpu"]
                assert run["status"] == "ok" and run["state"] == "completed" and run["parallel"] == mode
                assert run["run_env"]["world_size"] == world and run["devices"] == ["cpu"] * world
                assert f"-m torch.distributed.run --standalone --nproc_per_node={world} " in run["command"]
                assert "NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1" in run["command"]
                assert f"run.parallel={mode}" in run["command"] and f"precision={precision}" in run["command"]
                # the curve in the report is the run directory's, and it is a training curve: the loss falls
                metrics = Path(run["run_dir"]) / "metrics.jsonl"
                rows = [json.loads(x) for x in metrics.read_text().splitlines()]
                logged = {str(x["step"]): x["loss"] for x in rows if "loss" in x}
                assert run["losses"] == logged and list(logged) == [str(s) for s in range(1, 9)]
                assert logged["8"] < logged["1"] - 0.05
                assert run["tokens_per_s_per_gpu"] > 0 and run["estimate_gb"] > 2.0
    assert "quartet.quant.linear" in r["runs"]["quartet-fsdp-2gpu"]["implementation"]
    pairs = {(e["precision"], e["what"]) for e in r["equality"]}
    assert pairs == {(p, w) for p in ("bf16", "quartet") for w in ("ddp: 2 GPUs vs 1", "fsdp: 2 GPUs vs 1",
                                                                    "1 GPU: fsdp vs ddp", "2 GPUs: fsdp vs ddp")}
    for e in r["equality"]:
        assert e["ok"] is True and e["steps"] is True and e["max_dloss"] <= 5e-5 and e["dval"] <= 5e-5, e
    # the two runs of a comparison are different runs: 2 ranks against 1
    ddp21 = next(e for e in r["equality"] if e["what"] == "ddp: 2 GPUs vs 1" and e["precision"] == "quartet")
    assert (ddp21["a"], ddp21["b"]) == ("quartet-ddp-1gpu", "quartet-ddp-2gpu")

    # 2. stopped after step 4 with a sharded checkpoint of 2 ranks, resumed on 2 and on 1: the uninterrupted curve
    res_ = r["resume"]
    assert res_["interrupted"] == {"state": "preempted", "step": 4, "ok": True,
                                   "checkpoint_files": [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]}
    for key, world in (("on_2gpu", 2), ("on_1gpu", 1)):
        assert res_[key]["ok"] and res_[key]["resumed"] and res_[key]["steps"], res_[key]
        assert res_[key]["a"] == "quartet-fsdp-2gpu" and res_[key]["max_dloss"] <= 5e-5
        run = r["runs"][f"quartet-fsdp-resume-{world}gpu"]
        assert run["run_env"]["world_size"] == world
        log = (Path(run["run_dir"]) / "train.log").read_text()
        assert "resuming" in log and "from step 4/8" in log
    assert not list((out / "runs").glob("*/*/*/ckpt")), "checkpoints are removed from --out"

    # 3. memory: a row per finished run with the estimate; no CUDA peaks on CPU, and it says so
    assert len(r["memory"]) == 15
    for row in r["memory"]:
        assert row["estimate_gb"] > 2.0 and row["peak"].startswith("skipped: no CUDA")

    # 4. largest size: each mode stops at its first size that fails allocating (address space capped at 3 GB)
    for mode in ("ddp", "fsdp"):
        f = r["fits"][mode]
        assert [(x["model"], x["status"]) for x in f["attempts"]] == [
            ("llama_nano", "ok"), ("llama_nano:model.n_layer=2", "ok"), ("llama_3200m", "oom"), ("llama_7b", "skipped")]
        assert f["largest"] == "llama_nano:model.n_layer=2"
        oom = r["runs"][f"fit-{mode}-llama_3200m"]
        assert "can't allocate memory" in oom["reason"] and oom["estimate_gb"] > 20  # far past the 3 GB cap
        assert r["runs"][f"fit-{mode}-llama_nano+n_layer2"]["n_params_total"] > \
            r["runs"][f"fit-{mode}-llama_nano"]["n_params_total"]
    assert _leftovers(str(out)) == []


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_failing_check_exits_1(tmp_path):
    """fsdp vs ddp held to a tolerance no difference meets (-1): those checks fail, 2 vs 1 passes; exit status 1."""
    res, r = _run(tmp_path, "--precisions", "bf16", "--resume-precision", "bf16", "--tol-modes", "-1",
                  "--fit-sizes", "")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    runs = {k: (v["status"], v.get("reason"), v.get("seconds")) for k, v in r["runs"].items()}
    assert res.stdout.strip().splitlines()[-1].startswith("RESULT FAIL: 5 checks passed, 2 failed"), \
        (runs, r["problems"], r["skipped"], res.stdout[-3000:])
    verdicts = {e["what"]: e["ok"] for e in r["equality"]}
    assert verdicts == {"ddp: 2 GPUs vs 1": True, "fsdp: 2 GPUs vs 1": True, "1 GPU: fsdp vs ddp": False,
                        "2 GPUs: fsdp vs ddp": False}
    assert r["verdict"] == "FAIL" and r["ok"] is False
