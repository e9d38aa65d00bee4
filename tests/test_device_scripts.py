"""The shell scripts run on bare GPU nodes: they parse, and their shared set-up (cluster/scripts/device_env.sh) does
what the scripts rely on. (The scripts themselves need a GPU; they are run there, not here.)"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*REPO.glob("benchmarks/*.sh"), *REPO.glob("cluster/scripts/*.sh")])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_device_scripts_parse(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


def _bash(cmd: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f". {REPO / 'cluster/scripts/device_env.sh'}; {cmd}"], cwd=cwd,
                          capture_output=True, text=True, env=env)


def test_device_env_sets_out_python_path_and_caches(tmp_path):
    r = _bash('PYTHONPATH=/x; device_env run1; echo "$OUT|$PY|$PYTHONPATH|$PYTHONUNBUFFERED"', tmp_path,
              env={"PATH": "/usr/bin:/bin", "PY": sys.executable})
    out, py, path, unbuf = r.stdout.strip().split("|")
    assert out == str(tmp_path / ".cache/run1") and (tmp_path / ".cache/run1").is_dir()
    assert py == sys.executable and path == f"{tmp_path}:/x" and unbuf == "1"
    line = _bash("stamp corpus ready", tmp_path, env={"PATH": "/usr/bin:/bin"}).stdout.strip()
    assert line.startswith("== ") and line.endswith(" corpus ready") and line[5] == ":" and line[8] == ":"


def test_device_wheels_is_a_no_op_with_hydra_and_refuses_without_wheels(tmp_path):
    assert _bash("device_wheels", tmp_path, env={"PATH": "/usr/bin:/bin", "PY": sys.executable}).returncode == 0
    r = _bash("device_wheels", tmp_path, env={"PATH": "/usr/bin:/bin", "PY": "/bin/false"})
    assert r.returncode == 2 and "no .whl/" in r.stderr
