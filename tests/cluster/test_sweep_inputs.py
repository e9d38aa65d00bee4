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
