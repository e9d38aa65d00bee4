"""Fixtures of the analysis tests (helpers live in analysis_testdata.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from analysis_testdata import synthetic_rows, write_run


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    """A sweep folder with 27 finished runs plus one unfinished, one failed, one NaN and one diverged run."""
    root = tmp_path / "runs"
    for row in synthetic_rows():
        write_run(root, "demo", row["run_id"], n=row["n_params"], d=row["tokens"], forward=row["forward"],
                  backward=row["backward"], precision=row["precision"], loss=row["loss"])
    write_run(root, "demo", "bf16-running", n=2e5, d=4e6, forward="bf16", backward="bf16", precision="bf16",
              loss=None, state="running")
    write_run(root, "demo", "quartet-failed", n=2e5, d=4e6, forward="quest", backward="rtn_absmax",
              precision="quartet", loss=None, state="failed", error="Traceback ...\nNonFiniteError: loss is nan at step 7")
    write_run(root, "demo", "fp8-nan", n=2e5, d=4e6, forward="fp8", backward="fp8", precision="fp8",
              loss=float("nan"))
    write_run(root, "demo", "fp8-diverged", n=2e5, d=4e6, forward="fp8", backward="fp8", precision="fp8",
              loss=12.0, first_loss=10.0)
    return root


def _benchmark_script(name: str):
    """A script of ``benchmarks/`` loaded as a module (the folder is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def branches_compare():
    return _benchmark_script("branches_compare")


@pytest.fixture(scope="session")
def recipes_table():
    return _benchmark_script("recipes_table")


@pytest.fixture(scope="session")
def design():
    return _benchmark_script("recipes_design")


@pytest.fixture(scope="session")
def oracle_sensitivity():
    return _benchmark_script("oracle_sensitivity")
