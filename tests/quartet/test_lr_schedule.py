"""The LR schedule equals the paper's OneCycle-cosine recipe at chosen steps."""
from __future__ import annotations

import math

import pytest
import torch

from quartet.config import compose, resolve
from quartet.train import lr_at


def test_schedule_matches_torch_onecycle_for_the_paper_30m():
    res = resolve(compose(["model=llama_30m", "budget=dn25"]))
    lr, steps, warm = res.lr, res.steps, res.warmup_steps
    assert (steps, warm) == (2861, 286)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    # The paper's code: OneCycleLR(anneal_strategy='cos', pct_start=warmup/iters, div_factor=1e2, final_div_factor=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=warm / steps,
                                                anneal_strategy="cos", div_factor=1e2, final_div_factor=0.1,
                                                cycle_momentum=False)
    chosen = {0, 1, 100, 284, 285, 286, 287, 1000, 1500, 2859, 2860}
    for t in range(steps):
        if t in chosen:
            assert lr_at(t, lr=lr, steps=steps, warmup=warm) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9), t
        opt.step()
        sched.step()


def test_schedule_closed_form_values():
    lr, steps, warm = 1.2e-3, 2861, 286
    f = lambda t: lr_at(t, lr=lr, steps=steps, warmup=warm)  # noqa: E731
    assert f(0) == pytest.approx(lr / 100)          # warm-up starts at lr/100
    assert f(warm - 1) == pytest.approx(lr)         # peak at the end of the 10% warm-up
    assert f(steps - 1) == pytest.approx(lr / 10)   # cosine down to lr/10
    # cosine-shaped warm-up: half-way between lr/100 and lr at the warm-up midpoint
    mid = (warm - 1) / 2
    assert lr_at(mid, lr=lr, steps=steps, warmup=warm) == pytest.approx((lr / 100 + lr) / 2)
    # the decay at its midpoint is half-way between lr and lr/10
    t = (warm - 1) + (steps - warm) / 2
    assert lr_at(t, lr=lr, steps=steps, warmup=warm) == pytest.approx((lr + lr / 10) / 2)
    # monotone up then down
    vals = [f(t) for t in range(steps)]
    assert all(a <= b for a, b in zip(vals[:warm - 1], vals[1:warm]))
    assert all(a >= b for a, b in zip(vals[warm - 1:-1], vals[warm:]))
    # formula (cos anneal) at an arbitrary decay step
    t = 2000
    pct = (t - (warm - 1)) / ((steps - 1) - (warm - 1))
    assert f(t) == pytest.approx(lr / 10 + (lr - lr / 10) / 2 * (1 + math.cos(math.pi * pct)))


def test_tiny_runs_without_warmup_do_not_divide_by_zero():
    assert lr_at(0, lr=1.0, steps=5, warmup=0) == 1.0
    assert lr_at(4, lr=1.0, steps=5, warmup=0) == pytest.approx(0.1)
    assert lr_at(0, lr=1.0, steps=1, warmup=0) == 1.0
