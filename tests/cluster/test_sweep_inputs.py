"""What a launch is given: runs folders that cannot be one, names that are paths, the same run twice, two sweep files
of one name, very large grids, and dry runs that must leave every file as it was."""
from __future__ import annotations

import os
from pathlib import Path

from cluster.launch import cli_main as sweep_main
from cluster.status import cli_main as status_main


def _tree(root: Path) -> dict[str, tuple[bytes, float]]:
    """Every file under ``root``: its bytes and modification time (a rewrite with the same bytes changes the time)."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_dry_run_with_a_file_as_runs_dir_says_what_the_launch_says(tmp_path, tiny_sweep, capsys):
    sweep = tiny_sweep("f")
    runs = tmp_path / "not-a-folder"
    runs.write_text("x\n")
    assert sweep_main([sweep, "--runs-dir", str(runs)]) == 2
    launch_err = capsys.readouterr().err.strip()
    assert sweep_main([sweep, "--runs-dir", str(runs), "--dry-run"]) == 2
    dry = capsys.readouterr()
    assert dry.err.strip() == launch_err and "\n" not in launch_err, (dry.err, launch_err)
    assert f"{runs} is not a folder" in launch_err
    assert "dry run: nothing written" not in dry.out
    assert runs.read_text() == "x\n"


def test_status_refuses_a_path_for_a_sweep_name(tmp_path, capsys):
    runs = tmp_path / "runs"
    (runs / "s" / "a").mkdir(parents=True)
    (runs / "s" / "a" / "config.yaml").write_text("x: 1\n")
    for arg in ("/etc", str(runs / "s"), "..", "a/b"):
        assert status_main([arg, "--runs-dir", str(runs)]) == 2, arg
        captured = capsys.readouterr()
        err = captured.err.strip()
        assert "\n" not in err and f"{arg!r} is a path, not a sweep name" in err, err
        assert "sweep /etc" not in captured.out and not captured.out.strip()
    # a path to the sweep's folder gets the command meant, which works
    assert status_main([str(runs / "s")]) == 2
    assert f"quartet status s --runs-dir {runs}" in capsys.readouterr().err
    assert status_main(["s", "--runs-dir", str(runs)]) == 0


def test_an_axis_listing_a_value_twice_is_refused_in_one_line(tmp_path, tiny_sweep, capsys):
    path = Path(tiny_sweep("twice"))
    path.write_text(path.read_text().replace("precision: [bf16, fp8]", "precision: [bf16, bf16]"))
    assert sweep_main([str(path), "--runs-dir", str(tmp_path / "runs"), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "axes.precision lists bf16 twice" in err, err


def test_an_include_equal_to_a_grid_point_is_named_in_one_note(tmp_path, tiny_sweep, capsys):
    path = Path(tiny_sweep("inc"))
    path.write_text(path.read_text() + "include:\n  - {budget.tokens: 4096, precision: fp8}\n")
    assert sweep_main([str(path), "--runs-dir", str(tmp_path / "runs"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "duplicate" in line]
    assert notes == ["note: 1 duplicate grid point(s) dropped, each the same run as an earlier one: run "
                     "[budget.tokens=4096 precision=fp8] = run [budget.tokens=4096 precision=fp8]"], out
    assert "4 runs" in out


def test_a_second_sweep_file_of_the_same_name_is_refused(tmp_path, tiny_sweep, capsys, monkeypatch):
    from cluster import launch

    runs = tmp_path / "runs"
    first = Path(tiny_sweep("same"))
    other = tmp_path / "elsewhere" / "same.yaml"  # a copy with another grid, its name left as it was
    other.parent.mkdir()
    other.write_text(first.read_text().replace("precision: [bf16, fp8]", "precision: [bf16, quartet]"))
    # the first launch records its file in the group folder (training itself is not needed for that)
    monkeypatch.setattr(launch, "run_local", lambda plan, runs, console=None: (0, 0, len(runs)))
    assert sweep_main([str(first), "--runs-dir", str(runs)]) == 0
    record = runs / "same" / launch.SWEEP_RECORD
    assert record.is_file()
    capsys.readouterr()
    before = _tree(runs)
    for extra in (["--dry-run"], []):
        assert sweep_main([str(other), "--runs-dir", str(runs), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"holds the runs of sweep file {first.resolve()}, not of {other.resolve()}" in err
    assert _tree(runs) == before
    # the first file again, and the second one under its own name, go ahead
    assert sweep_main([str(first), "--runs-dir", str(runs), "--dry-run"]) == 0
    assert sweep_main([str(other), "--runs-dir", str(runs), "--dry-run", "sweep.name=same2"]) == 0
    # a shipped sweep is recorded by its name in sweeps/, wherever the checkout is
    assert launch.sweep_origin("smoke") == "sweeps/smoke.yaml"


def test_a_dry_run_writes_nothing(tmp_path, tiny_sweep, monkeypatch):
    """A run whose trainer died without an end marker: the dry run shows it failed but records nothing."""
    import json
    import socket
    import subprocess
    import sys

    from cluster.launch import make_plan

    sweep, runs = tiny_sweep("dry"), tmp_path / "runs"
    plan = make_plan(sweep, None, [], str(runs), with_state=False)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    d = plan.runs[0].run_dir
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("x: 1\n")
    (d / "state.json").write_text(json.dumps({"state": "running", "step": 3, "total_steps": 8, "pid": dead.pid,
                                              "pid_start": 1.0, "host": socket.gethostname()}))
    (d / "metrics.jsonl").write_text(json.dumps({"step": 3, "loss": 5.0}) + "\n")
    old = 1_000_000_000
    for f in d.iterdir():
        os.utime(f, (old, old))
    before = _tree(runs)
    assert sweep_main([sweep, "--runs-dir", str(runs), "--dry-run"]) == 0
    assert _tree(runs) == before
    assert make_plan(sweep, None, [], str(runs), reconcile=False).runs[0].state == "failed"


def test_a_large_plan_says_its_size_and_an_estimate_before_the_work(capsys):
    """10^5 runs take many minutes to compose: the count comes before any, an estimate after the first few."""
    from cluster.plan import _progress

    ticks = iter(range(10**7))
    runs = _progress(list(range(100_000)), "planning sweep big", clock=lambda: next(ticks) * 0.01)  # 10 ms a run
    next(runs)
    assert capsys.readouterr().err == "planning sweep big: 100000 runs to compose and resolve\n"
    for done in range(2, 101):
        next(runs)
        err = capsys.readouterr().err
        if err:
            break
    # printed when the 51st run is asked for, after timing the first 50
    assert done == 51 and err == "planning sweep big: about 17 min for all 100000 runs (the first 50 took 0.5 s)\n"
    assert sum(1 for _ in runs) == 100_000 - done
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "planning sweep big: 500/100000 runs composed and resolved (5 s, about 17 min left)"
    assert lines[-1] == "planning sweep big: 100000/100000 runs composed and resolved (1000 s)"


def test_a_long_plan_table_is_cut_with_a_line(tmp_path, tiny_sweep, monkeypatch):
    from rich.console import Console

    from cluster import plan as plan_mod
    from cluster.launch import make_plan

    plan = make_plan(tiny_sweep("long"), None, [], str(tmp_path / "runs"))
    monkeypatch.setattr(plan_mod, "TABLE_ROWS", 3)
    console = Console(width=250, record=True)
    plan_mod.render_plan(plan, console)
    text = console.export_text()
    assert "... 1 more runs (--max-rows N shows N)" in text and sum(r.run_id in text for r in plan.runs) == 3


def test_run_out_dir_and_run_name_place_a_sweep_as_they_place_a_train(tmp_path, tiny_sweep):
    """The keys that say where `quartet train` puts a run say it for a sweep too: plan, claims and status agree."""
    import pytest

    from cluster.launch import make_plan
    from quartet.errors import QuartetError

    sweep, root = tiny_sweep("place"), tmp_path / "elsewhere"
    plan = make_plan(sweep, None, ["run.out_dir=" + str(root), "run.name=mine"], None)
    assert plan.runs_root == root.resolve() and plan.group_dir == root.resolve() / "mine"
    assert all(r.run_dir.parent == plan.group_dir for r in plan.runs)
    assert [r.run_id for r in plan.runs] == [r.run_id for r in make_plan(sweep, None, [], str(root)).runs]
    same = make_plan(sweep, None, ["run.out_dir=" + str(root)], str(root))
    assert same.group_dir == root.resolve() / "place"
    with pytest.raises(QuartetError, match="name two runs folders; give one"):
        make_plan(sweep, None, ["run.out_dir=" + str(root)], str(tmp_path / "other"))
