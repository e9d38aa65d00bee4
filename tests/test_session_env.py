"""The test session keeps tool caches and pytest's tmp_path folders out of $HOME and /tmp (tests/conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: what wandb / matplotlib write (~/.cache/wandb, ~/.config/wandb, ~/.config/matplotlib, ~/.cache/matplotlib)
_TOOLS = """
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib import font_manager
plt.plot([0, 1], [1, 0]); plt.savefig(r"{out}/f.png")
import wandb
run = wandb.init(project="quartet-session-test", mode="offline", dir=r"{out}")
run.log({{"x": 1.0}}); run.finish()
"""


def test_wandb_and_matplotlib_write_nothing_under_home(tmp_path):
    """A process started from the test session (env inherited, HOME empty) leaves HOME empty."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    env.pop("XDG_CACHE_HOME", None)
    env.pop("XDG_CONFIG_HOME", None)
    proc = subprocess.run([sys.executable, "-c", _TOOLS.format(out=tmp_path)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "MPLCONFIGDIR"):
        assert not Path(os.environ[var]).resolve().is_relative_to(Path.home().resolve() / ".cache"), var


def test_tmp_path_lives_under_the_checkout_cache(tmp_path, request):
    if request.config.option.basetemp or os.environ["PYTEST_DEBUG_TEMPROOT"] != str(REPO / ".cache" / "tests" / "tmp"):
        pytest.skip("the user chose where pytest's temporary folders go")
    assert tmp_path.resolve().is_relative_to((REPO / ".cache" / "tests" / "tmp").resolve())


def test_test_extra_has_what_make_test_uses():
    """`pip install -e .[test]` then `pytest`: pytest-xdist (whose xdist_group marker tests use) is in the
    extra, the marker is registered, and every package of the extra is pinned in requirements/cpu.txt at a
    version the extra allows."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    extra = [Requirement(r) for r in project["project"]["optional-dependencies"]["test"]]
    assert "pytest-xdist" in {r.name for r in extra}
    markers = project["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.split(":")[0].split("(")[0].strip() == "xdist_group" for m in markers)
    pins = dict(line.split("==") for line in (REPO / "requirements" / "cpu.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    for req in extra:
        assert req.name in pins and req.specifier.contains(pins[req.name]), req
