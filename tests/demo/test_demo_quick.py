"""`quartet demo --quick`: the smaller demo, checked at the plan (its training is the demo's, tested there)."""
from __future__ import annotations

import pytest

from cluster.launch import make_plan
from quartet import cli_demo
from quartet.errors import QuartetError


def test_quick_is_a_third_of_the_demo_and_still_measures_noise(tmp_path):
    quick = make_plan("demo_quick", None, [], str(tmp_path), with_state=False)
    full = make_plan("demo", None, [], str(tmp_path), with_state=False)
    assert len(quick.runs) == 24 and {r.run_id for r in quick.runs} < {r.run_id for r in full.runs}
    assert sum(r.hours for r in quick.runs) < 0.35 * sum(r.hours for r in full.runs)
    cells = {}
    for r in quick.runs:
        cells.setdefault((r.precision, r.n_params, r.tokens), set()).add(int(r.cfg.run.seed))
    assert sum(p == "bf16" for p, _, _ in cells) == 6  # the base law's cells
    (cell,) = {(n, d) for (p, n, d), seeds in cells.items() if seeds == {0, 1, 2}}  # one cell with seeds 0-2 ...
    assert all(cells[(p, *cell)] == {0, 1, 2} for p in ("bf16", "quartet", "luq_int4"))  # ... for every precision


def test_demo_quick_runs_the_quick_sweep_into_its_own_results(tmp_path, monkeypatch, capsys):
    seen = {}

    def stop(sweep, runs_dir):
        seen["sweep"] = sweep
        raise QuartetError("stopped before training")

    monkeypatch.setattr(cli_demo, "prepare_corpus", lambda data: seen.setdefault("data", data) and {})
    monkeypatch.setattr(cli_demo, "run_sweep", stop)
    assert cli_demo.cli_main(["--quick", "--runs-dir", str(tmp_path)]) == 2
    assert seen == {"data": "shakespeare_demo", "sweep": "demo_quick"}
    with pytest.raises(SystemExit):
        cli_demo.cli_main(["--quick", "--sweep", "demo"])
    assert "give --quick or --sweep, not both" in capsys.readouterr().err
