"""Sweeps with budget branches (issue #32): expansion and ids, the plan's GPU-hours with and without, a local pool that
trains a trunk and its branches (each equal to the same WSD run trained alone), and a branch waiting for its trunk."""
from __future__ import annotations

import json
from pathlib import Path

from cluster import status
from cluster.launch import cli_main as sweep_main
from cluster.launch import make_plan
from cluster.plan import write_run_config
from cluster.task import execute_run

# 8 / 12 / 16 steps of 512 tokens; decay over the last quarter; warm-up of the 8-step run (0 by the 10% rule)
SWEEP = """
name: {name}
cluster: local
branches: {branches}
axes:
  budget.tokens: [4096, 6144, 8192]
  precision: [bf16]
fixed:
  model: llama_nano
  budget: tokens
  data: shakespeare_small
  logging: quiet
  optim.micro_batch_size: 4
  optim.decay_fraction: 0.25
  run.device: cpu
"""


def sweep(tmp_path: Path, name: str, branches: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(SWEEP.format(name=name, branches=branches))
    return str(path)


def test_expansion_ids_stable_distinct_trunk_recorded(tmp_path):
    plan = make_plan(sweep(tmp_path, "br", "true"), None, [], str(tmp_path / "runs"), with_state=False)
    trunk, *branches = plan.runs
    assert trunk.role == "trunk" and [b.role for b in branches] == ["branch"] * 3
    assert list(trunk.cfg.branch.save_steps) == [6, 9, 12] and trunk.steps == 12 and trunk.run_id.startswith(
        "llama_nano-trunk6.144k-bf16-s0-")
    assert [(b.cfg.branch.trunk, b.cfg.branch.step, b.steps) for b in branches] == [
        (trunk.run_id, 6, 8), (trunk.run_id, 9, 12), (trunk.run_id, 12, 16)]
    assert {str(r.cfg.optim.schedule) for r in plan.runs} == {"wsd"}
    assert {int(r.cfg.optim.warmup_steps) for r in plan.runs} == {0}
    again = make_plan(sweep(tmp_path, "br", "true"), None, [], str(tmp_path / "runs"), with_state=False)
    assert [r.run_id for r in again.runs] == [r.run_id for r in plan.runs]  # stable
    alone = make_plan(sweep(tmp_path, "br", "independent"), None, [], str(tmp_path / "runs"), with_state=False)
    cosine = make_plan(sweep(tmp_path, "br", "false"), None, [], str(tmp_path / "runs"), with_state=False)
    (tmp_path / "plain.yaml").write_text(SWEEP.format(name="br", branches="false").replace("branches: false\n", ""))
    plain = make_plan(str(tmp_path / "plain.yaml"), None, [], str(tmp_path / "runs"), with_state=False)
    ids = [{r.run_id for r in p.runs} for p in (plan, alone, cosine)]
    assert len(ids[1]) == len(ids[2]) == 3 and not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert [r.run_id for r in plain.runs] == [r.run_id for r in cosine.runs]
    assert [r.hours_alone for r in branches] == [r.hours for r in alone.runs]  # from scratch = the independent runs
    assert trunk.hours_alone == 0 and sum(r.hours for r in plan.runs) < sum(r.hours for r in alone.runs)


def test_dry_run_prints_gpu_hours_with_and_without_branches(tmp_path, capsys):
    assert sweep_main([sweep(tmp_path, "br", "true"), "--dry-run", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "budget branches: 1 trunks + 3 branches" in out and "without (every budget from scratch)" in out
    assert "saved (planned, not measured)" in out and not (tmp_path / "runs").exists()


def test_branch_waiting_for_its_trunk_shows_in_status(tmp_path, capsys):
    plan = make_plan(sweep(tmp_path, "br", "true"), None, [], str(tmp_path / "runs"), with_state=False)
    branch = plan.runs[1]
    write_run_config(branch, plan.profile)
    assert execute_run(branch.run_dir, "local-1")["state"] == "waiting"
    view, = status.collect(plan.group_dir)
    assert view.state == "waiting" and f"waits for its trunk {plan.runs[0].run_id} to save step 6" in view.note
    assert status.cli_main(["br", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert "1 runs: 1 waiting" in capsys.readouterr().out
    again = make_plan(sweep(tmp_path, "br", "true"), None, [], str(tmp_path / "runs"))
    assert again.runs[1].state == "new" and again.runs[1].to_submit  # a relaunch submits it again


def test_local_pool_trains_trunk_then_branches_equal_to_independent_runs(tmp_path):
    root = tmp_path / "runs"
    assert sweep_main([sweep(tmp_path, "br", "true"), "--runs-dir", str(root)]) == 0
    assert sweep_main([sweep(tmp_path, "alone", "independent"), "--runs-dir", str(root)]) == 0
    plan = make_plan(sweep(tmp_path, "br", "true"), None, [], str(root))
    alone = make_plan(sweep(tmp_path, "alone", "independent"), None, [], str(root))
    assert {r.state for r in plan.runs} == {"done"} and {r.state for r in alone.runs} == {"done"}
    for b, a in zip(plan.runs[1:], alone.runs):
        got, want = (json.loads((r.run_dir / "summary.json").read_text()) for r in (b, a))
        assert got["val_loss"] == want["val_loss"] and got["tokens"] == want["tokens"], b.run_id
    from analysis.load import load_runs_dir

    df = load_runs_dir(root / "br")  # what fit and ladder read: the branches, not the trunk
    assert sorted(df["run_id"]) == sorted(r.run_id for r in plan.runs[1:])
    assert [d["run_id"] for d in df.attrs["dropped"] if "trunk" in d["reason"]] == [plan.runs[0].run_id]


def test_branch_of_a_finished_trunk_without_its_checkpoints_fails_saying_why(tmp_path):
    """R2: a relaunch neither holds such a branch back as waiting (its trunk will never save the step again) nor
    says its trunk has not saved it: the branch fails with the reason and the ways back."""
    import shutil

    from cluster.launch import waits_for_trunk

    spec, root = sweep(tmp_path, "br", "true"), tmp_path / "runs"
    plan = make_plan(spec, None, [], str(root), with_state=False)
    trunk = plan.runs[0]
    write_run_config(trunk, plan.profile)
    assert execute_run(trunk.run_dir, "local-1")["val_loss"] > 0
    shutil.rmtree(trunk.run_dir / "ckpt")
    assert not any(waits_for_trunk(b) for b in plan.runs[1:])
    assert sweep_main([spec, "--runs-dir", str(root)]) != 0
    views = {v.run_id: v for v in status.collect(plan.group_dir)}
    for b in plan.runs[1:]:
        v = views[b.run_id]
        assert v.state == "failed" and f"its trunk {trunk.run_id} is finished but" in v.error, (v.state, v.error)
        assert "branch.trunk=null branch.step=null" in v.error and "waits" not in v.error
