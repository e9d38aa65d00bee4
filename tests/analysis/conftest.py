"""Fixtures of the analysis tests (helpers live in analysis_testdata.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from analysis_testdata import synthetic_rows, write_run
from repo_scripts import load_script


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


def _script_fixture(script: str, name: str):
    """A session fixture named ``name``: ``benchmarks/<script>.py`` loaded as a module."""
    return pytest.fixture(scope="session", name=name)(lambda: load_script(f"benchmarks/{script}.py"))


branches_compare = _script_fixture("branches_compare", "branches_compare")
recipes_table = _script_fixture("recipes_table", "recipes_table")
oracle_sensitivity = _script_fixture("oracle_sensitivity", "oracle_sensitivity")
