"""Local GPU pools (``gpus``, ``workers_per_gpu``, ``conf/cluster/local_gpu.yaml``) on a CPU machine.

The device count is faked (``cluster.profiles.visible_cuda_count`` or an explicit ``gpus: N``) and
the runs train on CPU (``run.device=cpu``): what is checked is the pool -- its size, which GPU slot
each worker takes, that no GPU gets more than ``workers_per_gpu`` workers -- plus data preparation in
the launcher and the plan's description. One small end-to-end sweep; the rest are quick unit tests.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cluster import profiles, runstate
from cluster.launch import cli_main as sweep_main
from cluster.launch import local_pool, make_plan
from cluster.plan import calibrate, render_plan
from cluster.profiles import describe_local, load_profile, local_gpus, local_pool_size, resources_for
from cluster.task import gpu_slots
from quartet.errors import ConfigError

# 2 fake GPUs x 2 runs each; 1 torch thread per worker (4 workers on 2 cores)
PROFILE = """
kind: local
description: test pool, 2 fake GPUs x 2 runs each
gpus: 2
workers_per_gpu: 2
workers: 7
threads_per_worker: 1
device_label: GPU
resources:
  - {max_params: .inf, gpus: 1, nodes: 1, cpus_per_task: 1, mem_gb: 2, time_min: 10}
"""


@pytest.fixture()
def files(tmp_path: Path, tiny_sweep) -> tuple[str, str]:
    (tmp_path / "pool2x2.yaml").write_text(PROFILE)
    return str(tmp_path / "pool2x2.yaml"), tiny_sweep("tgpu")


def fake_gpus(monkeypatch, n: int) -> None:
    monkeypatch.setattr(profiles, "visible_cuda_count", lambda: n)


def hold_and_report(hold_s: float) -> tuple[str, str, int, float, float]:
    """Pool task: (CUDA_VISIBLE_DEVICES, slot, pid, start, end) of the worker that ran it."""
    t0 = time.time()
    time.sleep(hold_s)
    return os.environ["CUDA_VISIBLE_DEVICES"], os.environ["QUARTET_GPU_SLOT"], os.getpid(), t0, time.time()


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


# ----------------------------------------------------------------------------------- unit


def test_gpu_slots_round_robin_and_parent_visible_devices():
    assert gpu_slots(2, 2) == [(0, "0"), (1, "1"), (0, "0"), (1, "1")]
    assert gpu_slots(2, 2, "5,7") == [(0, "5"), (1, "7"), (0, "5"), (1, "7")]
    assert gpu_slots(1, 3, " GPU-ab , GPU-cd") == [(0, "GPU-ab")] * 3
    with pytest.raises(ConfigError, match=r"cluster.gpus=3 but CUDA_VISIBLE_DEVICES='5,7' lists 2 device") as err:
        gpu_slots(3, 1, "5,7")
    assert "\n" not in str(err.value)


def test_pool_size_and_gpus_key(files, monkeypatch):
    fake_gpus(monkeypatch, 0)
    prof = load_profile(files[0])
    assert prof.gpus == 2 and local_gpus(prof) == 2
    assert local_pool_size(prof) == 4  # gpus * workers_per_gpu; workers=7 is ignored
    assert local_pool_size(load_profile(files[0], ["gpus=0"])) == 7  # CPU pool: workers, as before
    assert local_pool_size(load_profile("local")) == 2 and local_gpus(load_profile("local")) == 0
    assert load_profile(files[0], ["gpus=auto"]).gpus == "auto"
    for bad in ("gpus=-1", "gpus=many", "workers_per_gpu=0"):
        with pytest.raises(ConfigError) as err:
            load_profile(files[0], [bad])
        assert "\n" not in str(err.value)
    # with real GPUs, more than are visible is an error
    fake_gpus(monkeypatch, 1)
    with pytest.raises(ConfigError, match="gpus=2 but only 1 CUDA device"):
        local_gpus(prof)


def test_auto_without_cuda_is_one_line_error(tmp_path, files, monkeypatch, capsys):
    fake_gpus(monkeypatch, 0)
    prof = load_profile("local_gpu")
    with pytest.raises(ConfigError) as err:
        local_gpus(prof)
    assert str(err.value) == ("cluster profile local_gpu: gpus=auto but no CUDA device is visible; "
                              "use --cluster local (CPU) or cluster.gpus=N")
    # the dry run still plans; a launch stops before claiming anything
    root = tmp_path / "runs"
    assert sweep_main([files[1], "--cluster", "local_gpu", "--runs-dir", str(root), "--dry-run"]) == 0
    assert "gpus=auto (none visible here)" in capsys.readouterr().out
    assert sweep_main([files[1], "--cluster", "local_gpu", "--runs-dir", str(root)]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert err_lines == ["quartet sweep: error: " + str(err.value)]
    assert not root.exists()
    # auto = the visible count
    fake_gpus(monkeypatch, 3)
    assert local_gpus(prof) == 3 and local_pool_size(prof) == 12


def test_local_gpu_profile_loads_and_describes_itself(files, monkeypatch, capsys, tmp_path):
    fake_gpus(monkeypatch, 1)
    prof = load_profile("local_gpu")
    assert prof.kind == "local" and prof.gpus == "auto" and prof.workers_per_gpu == 4
    assert prof.threads_per_worker == 2 and prof.peak_flops_per_gpu == 9.89e14 and 0 < prof.speedup["quartet"] < 1
    assert describe_local(prof) == "local, 1 GPU x 4 runs at once, 2 thread(s) each"
    res = resources_for(prof, 1e6)
    assert (res.nodes, res.tasks_per_node, res.gpus_per_node, res.gpus) == (1, 1, 1, 1)
    assert res.describe(prof) == describe_local(prof)
    # the CPU profile keeps its resources and says what it is
    cpu = load_profile("local")
    assert resources_for(cpu, 1e6).gpus_per_node == 0
    assert describe_local(cpu) == "local, CPU, 2 runs at once, 1 thread(s) each"
    # a local run is one process: a rule asking for several GPUs is refused in one line
    with pytest.raises(ConfigError, match="a local run is one process"):
        resources_for(load_profile("local_gpu", ["resources=[{gpus: 2}]"]), 1e6)
    plan = make_plan(files[1], "local_gpu", [], str(tmp_path / "runs"))
    render_plan(plan)
    out = capsys.readouterr().out
    assert "pool: local, 1 GPU x 4 runs at once, 2 thread(s) each" in out and "GPU-h" in out


def test_pool_pins_each_worker_to_one_slot_and_maps_parent_devices(files, monkeypatch):
    """8 tasks on a 2 GPUs x 2 pool with CUDA_VISIBLE_DEVICES=5,7 in the parent: every worker sees
    one GPU, 5 or 7, keeps it, and no GPU ever has more than 2 tasks at once."""
    fake_gpus(monkeypatch, 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    prof = load_profile(files[0])
    with local_pool(prof, 8) as pool:
        assert pool._max_workers == 4
        rows = list(pool.map(hold_and_report, [0.4] * 8))
    assert {gpu for gpu, *_ in rows} == {"5", "7"}
    assert {(slot, gpu) for gpu, slot, *_ in rows} <= {("0", "5"), ("1", "7")}
    by_pid: dict[int, set[str]] = {}
    for gpu, _, pid, *_ in rows:
        by_pid.setdefault(pid, set()).add(gpu)
    assert len(by_pid) <= 4 and all(len(g) == 1 for g in by_pid.values())
    for want in ("5", "7"):
        assert len([p for p, g in by_pid.items() if g == {want}]) <= 2
        assert max_overlap([(s, e) for gpu, _, _, s, e in rows if gpu == want]) <= 2


# ----------------------------------------------------------------------------------- end to end


def test_sweep_on_gpu_pool_end_to_end(tmp_path, files, monkeypatch, capsys):
    """4 nano runs on a faked 2 GPUs x 2 pool: data prepared once by the launcher, every run records
    its GPU (0 or 1), at most 2 workers per GPU, the done lines name the GPU."""
    fake_gpus(monkeypatch, 0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    root, data = tmp_path / "runs", tmp_path / "data"
    assert sweep_main([files[1], "--cluster", files[0], "--runs-dir", str(root), f"data.dir={data}"]) == 0
    out = capsys.readouterr().out
    assert "pool: local, 2 GPUs x 2 runs at once, 1 thread(s) each" in out
    assert f"preparing data shakespeare_small in {data}" in out
    assert "4 completed, 0 failed" in out and "4 workers, 2 GPUs x 2" in out
    assert out.count("  gpu 0") + out.count("  gpu 1") == 4
    assert (data / "manifest.json").is_file()
    states = [runstate.read_json(d / "state.json") for d in (root / "tgpu").iterdir() if d.is_dir()]
    assert len(states) == 4 and all(s["state"] == "completed" for s in states)
    assert {s["gpu"] for s in states} <= {0, 1}
    gpu_of_pid: dict[int, set[int]] = {}
    for s in states:
        gpu_of_pid.setdefault(s["worker_pid"], set()).add(s["gpu"])
    # a worker keeps its GPU, and a GPU has at most 2 workers (so at most 2 runs at once)
    assert all(len(g) == 1 for g in gpu_of_pid.values())
    for gpu in (0, 1):
        assert sum(1 for g in gpu_of_pid.values() if g == {gpu}) <= 2
    # each run records how many runs shared its GPU: its device-hours are half its wall clock
    assert {s["runs_per_gpu"] for s in states} == {2}
    plan = make_plan(files[1], files[0], [f"data.dir={data}"], str(root))
    cal = calibrate(plan)
    walls = [json.loads((d / "summary.json").read_text())["wall_clock_s"] for d in (root / "tgpu").iterdir() if d.is_dir()]
    assert cal.runs == 4 and cal.measured_h == pytest.approx(sum(walls) / 2 / 3600)
    for d in (root / "tgpu").iterdir():
        if d.is_dir():
            assert not (d / runstate.CLAIM).exists()
            assert "on GPU" in (d / "stdout.log").read_text()
            assert json.loads((d / "summary.json").read_text())["run_id"] == d.name


def test_data_error_on_gpu_pool_is_one_line_nothing_started(tmp_path, files, monkeypatch, capsys):
    fake_gpus(monkeypatch, 0)
    root = tmp_path / "runs"
    code = sweep_main([files[1], "--cluster", files[0], "--runs-dir", str(root), "data.dir=/dev/null/nope"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("quartet sweep: error: preparing data shakespeare_small (/dev/null/nope)")
    assert not root.exists()


def test_a_half_recipe_variant_is_estimated_at_its_recipes_speed():
    """`<recipe>_fwd` / `_bwd` are not listed in a profile's speedup table: the GPU-hour estimate takes the recipe's
    factor (not bf16's 1.0, which would under-count a 4-bit recipe's half several times over)."""
    from cluster.profiles import gpu_hours

    prof = load_profile("local_gpu")
    assert "nvfp4_fwd" not in prof.speedup and prof.speedup["nvfp4"] < 1
    for variant in ("nvfp4_fwd", "nvfp4_bwd"):
        assert gpu_hours(prof, 7e6, 35e6, variant) == gpu_hours(prof, 7e6, 35e6, "nvfp4")
    assert gpu_hours(prof, 7e6, 35e6, "bf16") < gpu_hours(prof, 7e6, 35e6, "nvfp4")
