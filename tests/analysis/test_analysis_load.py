"""Loading: runs directories (the trainer's on-disk contract), tables, wandb (recorded API + offline files)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from analysis.errors import AnalysisError
from analysis.load import (COLUMNS, frame_from_table, load, load_curve, load_paper, load_runs_dir, load_table, load_wandb,
                           load_wandb_offline)

from analysis_testdata import synthetic_rows, write_run


def test_runs_dir_tidy_frame_and_drop_reasons(runs_dir):
    df = load_runs_dir(runs_dir)
    assert list(df.columns[: len(COLUMNS)]) == list(COLUMNS)
    assert len(df) == 27 and df["run_id"].is_unique
    row = df.set_index("run_id").loc["quartet-200000-20"]
    assert (row["forward"], row["backward"], row["precision"]) == ("quest", "rtn_absmax", "quartet")
    assert row["n_params"] == 2e5 and row["tokens"] == 4e6 and row["tokens_per_s"] == 1e4
    reasons = {d["run_id"]: d["reason"] for d in df.attrs["dropped"]}
    assert reasons["bf16-running"].startswith("unfinished (state running, step 50/100)")
    assert "failed at step" in reasons["quartet-failed"] and "NonFiniteError" in reasons["quartet-failed"]
    assert "NaN" in reasons["fp8-nan"]
    assert reasons["fp8-diverged"].startswith("diverged")
    assert df.attrs["provenance"]["kind"] == "runs" and len(df.attrs["provenance"]["run_ids"]) == 27


def test_runs_dir_logs_drops(runs_dir, caplog):
    with caplog.at_level("WARNING", logger="analysis.load"):
        load(runs_dir)
    assert sum("dropped run" in r.message for r in caplog.records) == 4


def test_loss_curve_on_demand(runs_dir):
    df = load_runs_dir(runs_dir)
    curve = load_curve(df.iloc[0])
    assert {"step", "tokens", "loss"} <= set(curve.columns) and len(curve) == 10
    assert curve["loss"].is_monotonic_decreasing


def test_empty_or_missing_runs_dir(tmp_path):
    with pytest.raises(AnalysisError, match="does not exist"):
        load_runs_dir(tmp_path / "nope")
    write_run(tmp_path / "r", "g", "only-running", n=1e5, d=1e6, forward="bf16", backward="bf16",
              precision="bf16", loss=None, state="running")
    with pytest.raises(AnalysisError, match="no finished runs.*only-running: unfinished"):
        load_runs_dir(tmp_path / "r")


def test_table_csv_and_parquet(tmp_path):
    rows = synthetic_rows()
    df = pd.DataFrame(rows).drop(columns=["run_id", "precision"]).assign(extra="x")
    df.loc[len(df)] = {"n_params": 1e5, "tokens": 1e6, "forward": "lss", "backward": "lss", "loss": float("nan"),
                       "extra": "y"}
    csv, pq = tmp_path / "t.csv", tmp_path / "t.parquet"
    df.to_csv(csv, index=False)
    df.to_parquet(pq, index=False)
    for path in (csv, pq):
        out = load_table(path)
        assert len(out) == 27 and "extra" in out.columns
        assert out.attrs["dropped"] == [{"run_id": "row27", "reason": "loss is nan (NaN/diverged)"}]
        assert len(out.attrs["provenance"]["sha256"]) == 64
    assert set(load_table(csv)["precision"]) == {"bf16", "fp8", "quest:rtn_absmax"}


def test_table_errors(tmp_path):
    p = tmp_path / "bad.csv"
    pd.DataFrame({"n_params": [1e6], "tokens": [1e8], "loss": [3.0]}).to_csv(p, index=False)
    with pytest.raises(AnalysisError, match="missing column\\(s\\) forward, backward"):
        load_table(p)
    pd.DataFrame({"n_params": [1e6], "tokens": [1e8], "forward": ["bf16"], "backward": ["bf16"],
                  "loss": [0.0]}).to_csv(p, index=False)
    with pytest.raises(AnalysisError, match="row 0: loss must be positive"):
        load_table(p)
    with pytest.raises(AnalysisError, match="unsupported extension"):
        (tmp_path / "x.xlsx").write_text("")
        load_table(tmp_path / "x.xlsx")
    with pytest.raises(AnalysisError, match="does not exist"):
        load(str(tmp_path / "missing"))


def test_paper_table():
    df = load_paper()
    assert len(df) == 156 and (df["loss"] > 0).all()
    assert df.attrs["provenance"]["kind"] == "paper"
    assert ((df.forward == "bf16") & (df.backward == "bf16")).sum() == 23


# ------------------------------------------------------------------ wandb through its public API
RECORDED = Path(__file__).with_name("data") / "wandb_runs_response.json"


class RecordedApi:
    """Stands in for ``wandb.Api()`` at the network boundary: ``runs()`` answers from a recorded
    GraphQL response, building real ``wandb.apis.public.Run`` objects from it (no network)."""

    def __init__(self, path: Path):
        self.payload = json.loads(path.read_text())

    def runs(self, path, filters=None):
        from wandb.apis.public import Run

        entity, project = path.split("/")
        nodes = self.payload["data"]["project"]["runs"]["edges"]
        return [Run(None, entity, project, e["node"]["name"], attrs=e["node"]) for e in nodes]


def test_wandb_public_api_recorded_response():
    df = load_wandb("wandb:lab/quartet-tiny", api=RecordedApi(RECORDED))
    assert sorted(df["run_id"]) == ["bf16-a", "fp8-b", "quartet-c"]
    q = df.set_index("run_id").loc["quartet-c"]
    assert (q["forward"], q["backward"], q["precision"]) == ("quest", "rtn_absmax", "quartet")
    assert q["loss"] == pytest.approx(4.1234) and q["n_params"] == 4e5 and q["tokens"] == 1.6e7
    # quartet's trainer puts N in the config's "derived" block, not in the wandb summary
    assert df.set_index("run_id").loc["fp8-b", "n_params"] == 4e5
    reasons = {d["run_id"]: d["reason"] for d in df.attrs["dropped"]}
    assert reasons == {"crashed1": "wandb state 'crashed' (unfinished)",
                       "nokeys1": "run lacks tokens, val_loss in its summary/config"}
    assert df.attrs["provenance"] == {"kind": "wandb", "path": "lab/quartet-tiny",
                                      "run_ids": ["bf16-a", "fp8-b", "quartet-c"]}
    with pytest.raises(AnalysisError, match="entity/project"):
        load_wandb("wandb:justproject", api=RecordedApi(RECORDED))


def test_wandb_offline_run_file_written_by_real_wandb(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    run = wandb.init(project="quartet-test", dir=str(tmp_path), mode="offline",
                     config={"precision": {"name": "quartet", "forward": "quest", "backward": "rtn_absmax"},
                             "model": {"name": "llama_tiny"}}, settings=wandb.Settings(console="off"))
    try:
        for step in range(1, 6):
            run.log({"loss": 6.0 - step * 0.3, "tokens": step * 1000})
        run.summary.update({"val_loss": 4.25, "n_params": 123456, "tokens": 5000, "tokens_per_s": 99.0})
        run.finish()
    finally:
        wandb.teardown()  # stop the wandb service process this test started
    df = load_wandb_offline(tmp_path)
    assert len(df) == 1
    r = df.iloc[0]
    assert (r["forward"], r["backward"], r["precision"]) == ("quest", "rtn_absmax", "quartet")
    assert r["loss"] == pytest.approx(4.25) and r["n_params"] == 123456 and r["tokens"] == 5000
    assert load(tmp_path).iloc[0]["run_id"] == r["run_id"]  # the dispatcher recognises the folder


def test_wandb_offline_preempted_attempt_is_not_a_finished_run(tmp_path, monkeypatch):
    """A quartet run stopped and resumed under its wandb id leaves two files, both with exit code 0: the stopped
    attempt has no final_val_loss (its last val_loss is an interim one) and is dropped; the resumed one is the run."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    config = {"precision": {"name": "bf16", "forward": "bf16", "backward": "bf16"},
              "derived": {"n_params": 123456, "tokens": 6144}}
    try:
        for attempt, (rows, final) in enumerate([([(3072, 6.11)], False), ([(6144, 5.92)], True)]):
            run = wandb.init(project="quartet-test", dir=str(tmp_path), mode="offline", id="run-abc", resume="allow",
                             config=config, settings=wandb.Settings(console="off"))
            for tokens, val in rows:
                run.log({"tokens": tokens, "val_loss": val, **({"final_val_loss": val} if final else {})})
            run.finish()
    finally:
        wandb.teardown()
    df = load_wandb_offline(tmp_path)
    assert len(df) == 1 and df.iloc[0]["loss"] == pytest.approx(5.92) and df.iloc[0]["tokens"] == 6144
    assert any("preempted" in d["reason"] for d in df.attrs["dropped"])


def test_unreadable_inputs_are_one_line_errors(tmp_path):
    """Empty, header-only, ragged and non-UTF-8 tables, and a missing path: AnalysisError naming the file, exit 2."""
    from analysis.cli import fit_main

    cases = {"empty.csv": b"", "header.csv": b"n_params,tokens,forward,backward,loss\n",
             "ragged.csv": b"n_params,tokens,forward,backward,loss\n1e6,1e7,bf16,bf16,3.0\n1,2,3,4,5,6\n",
             "latin1.csv": "n_params,tokens,forward,backward,loss\n1e6,1e7,bf16,bf16,3.0 \xe9\n".encode("latin-1")}
    expect = {"empty.csv": "the file is empty", "header.csv": "no rows", "ragged.csv": "not a well-formed table",
              "latin1.csv": "not UTF-8"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(AnalysisError, match=expect[name]):
            load(tmp_path / name)
        assert fit_main([str(tmp_path / name)]) == 2
    with pytest.raises(AnalysisError, match="does not exist"):
        load(tmp_path / "nope.csv")


def test_mixed_units_duplicates_and_label_case(tmp_path):
    rows = [{"n_params": n, "tokens": n * r, "forward": "BF16", "backward": "Bf16", "loss": 3.0 + 1 / r}
            for n in (1e6, 2e6) for r in (10, 20)]
    df = frame_from_table(pd.DataFrame(rows + [dict(rows[0])]))
    assert set(df["forward"]) == {"bf16"} and set(df["precision"]) == {"bf16"}  # matched case-insensitively
    assert len(df) == 4 and any("duplicate of" in d["reason"] for d in df.attrs["dropped"])
    billions = dict(rows[1], tokens=rows[1]["tokens"] / 1e6)  # D written in millions beside N in units
    with pytest.raises(AnalysisError, match="tokens/n_params outside the plausible"):
        frame_from_table(pd.DataFrame(rows + [billions]))
    # in a runs folder the bad run is dropped with the reason instead, and the others load
    for i, r in enumerate(rows + [billions]):
        write_run(tmp_path, "g", f"r{i}", n=r["n_params"], d=r["tokens"], forward="bf16", backward="bf16",
                  precision="bf16", loss=r["loss"])
    runs = load_runs_dir(tmp_path)
    assert len(runs) == 4 and any("outside the plausible" in d["reason"] for d in runs.attrs["dropped"])
    (tmp_path / "g" / "bad").mkdir()
    (tmp_path / "g" / "bad" / "summary.json").write_bytes(b"\xff\xfe[]")
    (tmp_path / "g" / "list").mkdir()
    (tmp_path / "g" / "list" / "summary.json").write_text("[]")
    runs = load_runs_dir(tmp_path)
    assert len(runs) == 4 and sum("unreadable" in d["reason"] for d in runs.attrs["dropped"]) == 2


def test_corrupt_config_or_metrics_of_a_finished_run_do_not_crash(tmp_path):
    """A finished run whose config.yaml is not UTF-8 / not a mapping, or whose first metrics line is valid JSON
    but not an object, used to crash the loader (UnicodeDecodeError / AttributeError); the summary suffices."""
    runs = tmp_path / "runs"
    for i, (config, metrics) in enumerate(((b"\xff\xfe", None), (b"[1, 2]\n", b"[1,2]\n3\n"))):
        run = write_run(runs, "g", f"r{i}", n=2e5 * (i + 1), d=4e6, forward="bf16", backward="bf16", precision="bf16",
                        loss=3.0)
        (run / "config.yaml").write_bytes(config)
        if metrics is not None:
            (run / "metrics.jsonl").write_bytes(metrics)
    df = load_runs_dir(runs)
    assert sorted(df["run_id"]) == ["r0", "r1"] and set(df["loss"]) == {3.0}


@pytest.mark.parametrize("edit,message", [
    ({"precision": "quartet", "forward": "bf16", "backward": "bf16"},
     "row 2 (row2): precision 'quartet' contradicts forward=bf16, backward=bf16 (forward = backward = bf16 is the base"),
    ({"precision": "BF16", "forward": "quest", "backward": "bf16"},
     "row 2 (row2): precision 'BF16' contradicts forward=quest, backward=bf16 (the base precision's rows have"),
    ({"precision": "q", "forward": "quest", "backward": "sr_absmax"},
     "row 2 (row2): precision 'q' has forward=quest, backward=sr_absmax, but row 1 gives it forward=quest, "
     "backward=rtn_absmax; a precision has one pair of labels"),
])
def test_a_row_whose_precision_contradicts_its_labels_is_one_line(tmp_path, edit, message, capsys):
    from analysis.cli import fit_main

    rows = [{"n_params": 1e6, "tokens": 1e7, "forward": "bf16", "backward": "bf16", "precision": "bf16", "loss": 3.2},
            {"n_params": 1e6, "tokens": 1e7, "forward": "quest", "backward": "rtn_absmax", "precision": "q",
             "loss": 3.3},
            {"n_params": 2e6, "tokens": 2e7, "forward": "quest", "backward": "rtn_absmax", "precision": "q",
             "loss": 3.1}]
    rows[2].update(edit)
    path = tmp_path / "losses.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    with pytest.raises(AnalysisError, match=re.escape(message)):
        load(path)
    assert fit_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
