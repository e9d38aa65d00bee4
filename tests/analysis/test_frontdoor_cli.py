"""What a new user hit at the front door of `quartet fit` / `figures` / `ladder` / `sweep`: each a clear line."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analysis_testdata import PAPER_PARAMS, synthetic_rows, write_run

from analysis.cli import figures_main, fit_main
from analysis.errors import AnalysisError
from analysis.ladder import cli_main as ladder_main
from analysis.ladder import markdown_table
from analysis.load import load, load_runs_dir, load_table, load_wandb
from analysis.speed import headline

READ_ONLY = Path("/proc/sys")  # not writable, even by root


@pytest.fixture
def table(tmp_path) -> Path:
    path = tmp_path / "losses.csv"
    pd.DataFrame(synthetic_rows()).to_csv(path, index=False)
    return path


def _one_line(capsys, code: int, fn, argv) -> str:
    assert fn(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_headline_says_cost_for_a_data_cost_beside_a_parameter_gain():
    text = headline("q", PAPER_PARAMS, 1.02, 0.9726, 1e8, 100)["text"]
    assert "gains 2.0% effective parameters and costs 2.7% effective data" in text
    both = headline("q", PAPER_PARAMS, 0.9, 0.95, 1e8, 100)["text"]
    assert "costs 10.0% effective parameters and 5.0% effective data" in both


@pytest.mark.parametrize("argv,message", [
    (["--bootstrap", "-5"], "--bootstrap must be >= 0"),
    (["--seed", "-1"], "--seed must be >= 0 (got -1)"),
    (["--seed", "-1", "--bootstrap", "3"], "--seed must be >= 0 (got -1)"),
    (["--optimal", "1e20,abc"], "--optimal takes FLOPs"),
    (["--optimal", "1e20", "--speedup", "quartet:1.8"], "--speedup takes PRECISION=S"),
    (["--optimal", "1e20", "--speedup", "quartet=-2"], "--speedup takes PRECISION=S"),
    (["--speedup", "fp8=1.5"], "give --optimal"),
    (["--json", str(READ_ONLY / "fit.json")], "is not writable"),
])
def test_fit_options_are_refused_before_the_data_is_read(argv, message, table, capsys, monkeypatch):
    import importlib

    loader = importlib.import_module("analysis.load")  # the module (analysis.load the attribute is its function)
    monkeypatch.setattr(loader, "load", lambda *_: pytest.fail("the data was read before the options"))
    assert message in _one_line(capsys, 2, fit_main, [str(table), *argv])


def test_a_speedup_naming_no_fitted_precision_is_an_error(table, capsys):
    err = _one_line(capsys, 2, fit_main, [str(table), "--optimal", "1e18", "--speedup", "quartte=1.8"])
    assert "--speedup quartte: no precision of that name" in err and "fp8" in err
    assert fit_main([str(table), "--optimal", "1e18", "--speedup", "FP8=1.5"]) == 0
    assert "1.5" in capsys.readouterr().out


def test_read_only_outputs_are_refused_before_the_work(table, capsys):
    assert "is not writable" in _one_line(capsys, 2, figures_main, [str(table), "--out", str(READ_ONLY / "figs")])
    assert "is not writable" in _one_line(capsys, 2, ladder_main, [str(table), "--out", str(READ_ONLY / "lad")])
    blocker = table  # a file where a folder should be
    assert "is not a folder" in _one_line(capsys, 2, figures_main, [str(table), "--out", str(blocker / "figs")])


def test_wandb_without_a_login_is_one_line():
    class NoLogin:
        def runs(self, *_a, **_k):
            raise RuntimeError("No API key configured. Use `wandb login` to log in.")

    with pytest.raises(AnalysisError, match=r"wandb:me/proj: cannot read the project \(RuntimeError: No API key"):
        load_wandb("wandb:me/proj", api=NoLogin())


def test_ladder_on_a_table_without_seeds_is_one_line(tmp_path, capsys):
    path = tmp_path / "noseed.csv"
    pd.DataFrame(synthetic_rows()).drop(columns=["seed"], errors="ignore").to_csv(path, index=False)
    assert "have no seed" in _one_line(capsys, 2, ladder_main, [str(path), "--out", str(tmp_path / "out")])


def test_a_negative_val_loss_is_dropped_with_its_reason(tmp_path):
    for i, loss in enumerate((3.1, 3.0, -1.5)):
        write_run(tmp_path, "g", f"r{i}", n=1e6 * (i + 1), d=2e7, forward="bf16", backward="bf16", precision="bf16",
                  loss=loss)
    df = load_runs_dir(tmp_path)
    assert len(df) == 2
    (drop,) = df.attrs["dropped"]
    assert drop["run_id"] == "r2" and "not positive" in drop["reason"]


def test_a_truncated_csv_row_is_called_ragged(tmp_path):
    path = tmp_path / "t.csv"
    text = pd.DataFrame(synthetic_rows()).to_csv(index=False)
    path.write_text(text + "200000.0,4000000.0,bf16\n")
    df = load_table(path)
    reasons = [d["reason"] for d in df.attrs["dropped"]]
    assert len(reasons) == 1 and reasons[0].startswith("ragged row: 3 of ") and "NaN" not in reasons[0]


def test_small_figures_keep_their_digits_in_markdown_tables():
    assert "2.012e-05" in markdown_table(pd.DataFrame({"E": [0.35], "cost": [2.0122e-05]}))


def test_a_missing_runs_path_names_where_runs_go(tmp_path, monkeypatch):
    monkeypatch.setenv("QUARTET_RUNS", str(tmp_path / "root"))
    write_run(tmp_path / "root", "mysweep", "r0", n=1e6, d=2e7, forward="bf16", backward="bf16", precision="bf16",
              loss=3.0)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AnalysisError, match=r"runs are under .*root \(QUARTET_RUNS, else <checkout>/runs\): "
                                            r"quartet fit .*root/mysweep"):
        load("runs/mysweep")


def test_sweep_refuses_an_unwritable_runs_folder_before_claiming(capsys, tmp_path):
    from cluster.launch import cli_main as sweep_main

    assert sweep_main(["smoke", "--runs-dir", str(READ_ONLY / "runs")]) == 2
    err = capsys.readouterr().err
    assert "runs folder" in err and "is not writable; nothing was submitted" in err


def test_the_cli_keeps_wandb_and_matplotlib_caches_in_the_project_cache(tmp_path, monkeypatch):
    from quartet.cli import keep_caches_inside

    monkeypatch.setenv("QUARTET_CACHE", str(tmp_path / "cache"))
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "MPLCONFIGDIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", "/elsewhere")  # set by the user: kept
    keep_caches_inside()
    assert os.environ["WANDB_CACHE_DIR"] == str(tmp_path / "cache" / "wandb" / "cache")
    assert os.environ["MPLCONFIGDIR"] == str(tmp_path / "cache" / "matplotlib")
    assert os.environ["WANDB_CONFIG_DIR"] == "/elsewhere"


def test_plain_train_threads_do_not_oversubscribe(monkeypatch):
    from quartet.train import AUTO_THREADS_MAX, cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert cpu_threads(0) == max(1, min(AUTO_THREADS_MAX, cores)) and cpu_threads(3) == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(2 * cores))
    assert cpu_threads(0) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # a sweep worker: torch's default follows it
    assert cpu_threads(0) == 0


def test_fit_json_round_trips_through_the_number_list_compaction(table, tmp_path):
    assert fit_main([str(table), "--bootstrap", "5", "--json", str(tmp_path / "f.json")]) == 0
    data = json.loads((tmp_path / "f.json").read_text())
    assert len(data["bootstrap"]["draws"]["params"]) == data["bootstrap"]["used"]
    assert np.isfinite(data["base"]["params"]["A"])
