"""Budget branches on CPU (issue #32): the WSD schedule, a trunk's kept checkpoints, a branch that starts from them
bitwise where an independent WSD run would be, exact kill/resume of both, and a branch waiting for its trunk."""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from quartet import checkpoint as ckpt_io
from quartet.config import compose, resolve
from quartet.errors import ConfigError
from quartet.runs import run_dir, run_id
from quartet.paths import branch_point
from quartet.train import BranchWaitingError, Trainer, wsd_lr_at

#: 512 tokens a step: a 24-step WSD run (decay from update 19), the trunk to update 19, warm-up 3 for every budget
WSD = ["optim.micro_batch_size=4", "optim.schedule=wsd", "optim.decay_fraction=0.2", "optim.warmup_steps=3",
       "logging.val_every=4", "logging.val_batches=2", "logging.ckpt_every=5"]
D, TRUNK_STEPS, SAVE = 24 * 512, 19, (11, 19)


def rows(d):
    return [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]


def params(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def trunk_cfg(tiny_cfg, *extra):
    return tiny_cfg(*WSD, f"budget.tokens={TRUNK_STEPS * 512}", "optim.decay_fraction=0",
                    f"branch.save_steps=[{','.join(map(str, SAVE))}]", *extra)


def branch_cfg(tiny_cfg, trunk, *extra):
    return tiny_cfg(*WSD, f"budget.tokens={D}", f"branch.trunk={run_id(trunk)}", f"branch.step={TRUNK_STEPS}", *extra)


def crash_at(step):
    def cb(trainer, row):
        if row["step"] == step:
            raise KeyboardInterrupt(f"killed at step {step}")  # no checkpoint: like SIGKILL, the last one is older
    return cb


# -- the schedule ---------------------------------------------------------------------------------------------------

def test_wsd_values_warmup_plateau_decay_to_a_tenth():
    lr, steps, warm = 1e-3, 100, 10
    start = steps - 20
    f = lambda t: wsd_lr_at(t, lr=lr, steps=steps, warmup=warm, decay_start=start)  # noqa: E731
    assert f(0) == pytest.approx(lr / 100) and f(warm - 1) == lr          # the cosine-shaped warm-up of the paper
    assert f((warm - 1) / 2) == pytest.approx((lr / 100 + lr) / 2)
    assert all(f(t) == lr for t in range(warm, start))                     # constant up to the decay start
    assert f(steps - 1) == pytest.approx(lr / 10)                          # decay end = lr/10
    assert f(start) == pytest.approx(lr / 10 + (lr - lr / 10) * (1 - math.sqrt(1 / 20)))  # 1-sqrt
    vals = [f(t) for t in range(start - 1, steps)]
    assert all(a > b for a, b in zip(vals, vals[1:]))
    # nothing before the decay depends on the run's length: every budget shares its LR up to its decay
    assert all(wsd_lr_at(t, lr=lr, steps=1000, warmup=warm, decay_start=800) == f(t) for t in range(start))


def test_wsd_resolve_rules_and_cosine_ids_unchanged():
    res = resolve(compose(["model=llama_30m", "budget=dn25", "optim.schedule=wsd"]))
    assert (res.steps, res.warmup_steps, res.decay_start) == (2861, 286, 2861 - 572)
    cos = compose(["model=llama_30m", "budget=dn25"])
    assert resolve(cos).decay_start is None
    # the new keys at their defaults are no part of the identity: an explicit cosine is the same run
    same = compose(["model=llama_30m", "budget=dn25", "optim.schedule=cosine", "optim.decay_fraction=0.5"])
    assert run_id(same) == run_id(cos)
    assert run_id(compose(["model=llama_30m", "budget=dn25", "optim.schedule=wsd"])) != run_id(cos)
    assert run_id(compose(["model=llama_30m", "budget=dn25", "optim.warmup_steps=286"])) != run_id(cos)
    for bad in (["optim.schedule=linear"], ["optim.schedule=wsd", "optim.decay_fraction=0.95"],
                ["optim.warmup_steps=9999"], ["branch.trunk=x", "branch.step=3"],
                ["optim.schedule=wsd", "branch.trunk=x", "branch.step=3"]):
        with pytest.raises(ConfigError):
            resolve(compose(["model=llama_30m", "budget=dn25", *bad]))


# -- trunk and branch -----------------------------------------------------------------------------------------------

def test_branch_starts_at_the_trunk_state_and_equals_an_independent_wsd_run(tiny_cfg, tmp_path):
    """The trunk's branch_19.pt is bitwise the independent run's state after update 19; the branch trained from it
    starts at update 20 and ends bitwise equal to the independent run (every logged loss, LR, grad norm, val loss)."""
    alone_cfg = tiny_cfg(*WSD, f"budget.tokens={D}", f"run.out_dir={tmp_path / 'alone'}")
    alone, at = Trainer(alone_cfg), {}
    alone.callbacks.append(lambda tr, row: at.update({row["step"]: params(tr.model)}) if row["step"] in SAVE else None)
    assert alone.run()["state"] == "completed"

    trunk = trunk_cfg(tiny_cfg)
    assert Trainer(trunk).run()["state"] == "completed"
    tdir = run_dir(trunk)
    for s in SAVE:  # kept beside last.pt, never rotated into prev.pt
        state = ckpt_io.load(branch_point(tdir, s))
        assert state["step"] == s and state["run_id"] == run_id(trunk)
        for k, v in at[s].items():
            assert torch.equal(state["model"][k], v), (s, k)

    bcfg = branch_cfg(tiny_cfg, trunk)
    first = []
    t = Trainer(bcfg)
    t.callbacks.append(lambda tr, row: first.append(row["step"]))
    summary = t.run()
    assert first[0] == TRUNK_STEPS + 1
    assert summary["branch"] == {"role": "branch", "trunk": run_id(trunk), "step": TRUNK_STEPS}
    assert summary["tokens"] == D and summary["steps"] == 24
    ref, got = rows(run_dir(alone_cfg)), rows(run_dir(bcfg))
    assert [r["step"] for r in got] == [r["step"] for r in ref]  # the trunk's rows up to the branch step, then its own
    for a, b in zip(ref, got):
        for key in ("loss", "lr", "grad_norm", "val_loss"):
            assert a.get(key) == b.get(key), (a["step"], key)
    assert summary["val_loss"] == json.loads((run_dir(alone_cfg) / "summary.json").read_text())["val_loss"]
    assert json.loads((tdir / "summary.json").read_text())["branch"]["role"] == "trunk"


def test_killed_trunk_and_branch_resume_bit_exact(tiny_cfg, tmp_path):
    """A trunk killed after its first branch point (last.pt older) resumes and writes the same branch checkpoints;
    a branch killed mid-decay resumes from its own last.pt; both end equal to uninterrupted runs."""
    ref_trunk = trunk_cfg(tiny_cfg, f"run.out_dir={tmp_path / 'ref'}")
    Trainer(ref_trunk).run()
    ref_branch = branch_cfg(tiny_cfg, ref_trunk, f"run.out_dir={tmp_path / 'ref'}")
    ref_val = Trainer(ref_branch).run()["val_loss"]

    trunk = trunk_cfg(tiny_cfg)
    t = Trainer(trunk)
    t.callbacks.append(crash_at(13))  # after branch_11.pt; last.pt is at step 10
    with pytest.raises(KeyboardInterrupt):
        t.run()
    tdir = run_dir(trunk)
    assert ckpt_io.load(tdir / "ckpt" / "last.pt")["step"] == 10 and branch_point(tdir, 11).is_file()
    seen = []
    t = Trainer(trunk)
    t.callbacks.append(lambda tr, row: seen.append(row["step"]))
    assert t.run()["state"] == "completed" and seen[0] == 11
    for s in SAVE:
        a, b = ckpt_io.load(branch_point(run_dir(ref_trunk), s)), ckpt_io.load(branch_point(tdir, s))
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), s

    bcfg = branch_cfg(tiny_cfg, trunk)
    b = Trainer(bcfg)
    b.callbacks.append(crash_at(22))  # its own last.pt: step 20
    with pytest.raises(KeyboardInterrupt):
        b.run()
    seen = []
    b = Trainer(bcfg)
    b.callbacks.append(lambda tr, row: seen.append(row["step"]))
    assert b.run()["val_loss"] == ref_val and seen[0] == 21


def test_branch_without_its_trunk_checkpoint_waits_and_writes_nothing(tiny_cfg, tmp_path):
    trunk = trunk_cfg(tiny_cfg)
    bcfg = branch_cfg(tiny_cfg, trunk)
    with pytest.raises(BranchWaitingError, match=f"waits for its trunk {run_id(trunk)} to save step 19"):
        Trainer(bcfg)
    assert not run_dir(bcfg).exists()


def test_a_waiting_branch_launched_from_the_cli_leaves_no_folder(tiny_cfg, tiny_overrides, capsys):
    """``quartet train`` makes the run folder before the trainer checks its inputs (to fail early on one it cannot
    make); a refused branch takes the folders it made away again: one error line, nothing on disk."""
    from quartet.train import cli_main

    trunk = trunk_cfg(tiny_cfg)
    bcfg = branch_cfg(tiny_cfg, trunk)
    root = Path(str(bcfg.run.out_dir))
    over = [*WSD, f"budget.tokens={D}", f"branch.trunk={run_id(trunk)}", f"branch.step={TRUNK_STEPS}"]
    assert cli_main([*tiny_overrides, f"run.out_dir={root}", *over]) == 2
    assert "waits for its trunk" in capsys.readouterr().err
    assert not root.exists() or not any(root.iterdir())


#: a budget whose decay starts at the trunk's first branch point (14 updates, 3 decaying: decay start 11)
SHORT_D, SHORT_STEP = 14 * 512, SAVE[0]


def test_branch_starting_while_its_trunk_resumes_keeps_the_trunks_rows(tiny_cfg):
    """R1: a trunk killed after its branch point 11 (last.pt at 10) is relaunched; the branch of step 11 starts just
    after the trunk's resume cut its live metrics back to step 10. The branch's rows 1..11 are still the trunk's
    rows 1..11 (taken from the branch point, not from the trunk's live file)."""
    trunk = trunk_cfg(tiny_cfg)
    t = Trainer(trunk)
    t.callbacks.append(crash_at(13))
    with pytest.raises(KeyboardInterrupt):
        t.run()
    tdir = run_dir(trunk)
    assert [r["step"] for r in rows(tdir)] == list(range(1, 14))
    bcfg = tiny_cfg(*WSD, f"budget.tokens={SHORT_D}", f"branch.trunk={run_id(trunk)}", f"branch.step={SHORT_STEP}")
    resumed = Trainer(trunk)
    begin, branch = resumed.record.begin, {}

    def begin_then_branch(step, *args, **kwargs):  # the concurrent start, at its worst moment
        begin(step, *args, **kwargs)
        assert step == 10 and max(r["step"] for r in rows(tdir)) == 10
        branch.update(Trainer(bcfg).run())

    resumed.record.begin = begin_then_branch
    assert resumed.run()["state"] == "completed" and branch["state"] == "completed"
    got = [r for r in rows(run_dir(bcfg)) if r["step"] <= SHORT_STEP]
    ref = [r for r in rows(tdir) if r["step"] <= SHORT_STEP]
    assert [r["step"] for r in got] == list(range(1, SHORT_STEP + 1))
    for a, b in zip(ref, got):
        for key in ("loss", "lr", "grad_norm", "val_loss"):
            assert a.get(key) == b.get(key), (a["step"], key)
    assert "metrics_gap" not in branch


def _follow(message: str, pattern: str) -> re.Match:
    m = re.search(pattern, message)
    assert m, (pattern, message)
    return m


def test_branch_of_a_finished_trunk_without_its_branch_point_says_so_and_both_ways_back_work(tiny_cfg):
    """R2: the trunk finished, then its ckpt/ was deleted (or its branch point damaged): the branch is not told to
    wait for a step the trunk will never save again; it is told what happened and given two commands, each of
    which ends in a completed run of that budget."""
    from quartet.config import load_config_file, to_yaml
    from quartet.train import BranchSourceLostError, cli_main

    trunk = trunk_cfg(tiny_cfg)
    Trainer(trunk).run()
    tdir = run_dir(trunk)
    bcfg = branch_cfg(tiny_cfg, trunk)
    point = branch_point(tdir, TRUNK_STEPS)
    point.write_bytes(point.read_bytes()[:-100])
    with pytest.raises(BranchSourceLostError, match=f"its trunk {run_id(trunk)} is finished but .*branch_19.pt is "
                                                    f"unusable \\(truncated"):
        Trainer(bcfg).run()
    shutil.rmtree(tdir / "ckpt")  # what a user reclaiming disk does
    bdir = run_dir(bcfg)
    resolve(bcfg)
    (bdir / "config.yaml").write_text(to_yaml(bcfg))  # as a sweep launch leaves it
    with pytest.raises(BranchSourceLostError) as err:
        Trainer(bcfg)
    msg = str(err.value)
    assert "\n" not in msg and "is missing" in msg and "waits" not in msg

    # way 1: this budget from scratch, beside the branch
    cmd = _follow(msg, r"from scratch \(the same WSD run, its own run id\): quartet train ([^;]+);").group(1)
    assert cli_main(shlex.split(cmd)) == 0
    alone = load_config_file(bdir / "config.yaml", ["branch.trunk=null", "branch.step=null"])
    assert (bdir.parent / run_id(alone) / "summary.json").is_file()
    assert run_id(alone) == run_id(tiny_cfg(*WSD, f"budget.tokens={D}"))  # the independent WSD run of the budget

    # way 2: retrain the trunk, then the branch starts from it
    mv_from, mv_to, ckpt, cmd = _follow(msg, r"mv (\S+) (\S+) && rm -r (\S+) && quartet train ([^,]+), then").groups()
    os.rename(mv_from, mv_to)
    assert not os.path.exists(ckpt)
    assert cli_main(shlex.split(cmd)) == 0 and point.is_file()
    assert Trainer(bcfg).run()["state"] == "completed"
