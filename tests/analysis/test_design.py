"""``quartet design`` (analysis/design.py): the noise model, the costs, the search, and the design's predictions
checked against planted laws and against the committed ladder and recipe fits."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import design as dz
from analysis.errors import AnalysisError
from analysis.laws import predict
from quartet.cli import main

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
#: a planted base law of the ladders' shape (loss 2-4 nats at 1e6-2e7 parameters, D/N 5-80)
LAW = {"A": 300.0, "alpha": 0.43, "B": 1.9e5, "beta": 0.71, "E": 1.0, "gamma": 0.89}
SIZES = {"m3": 3.4e6, "m7": 7.1e6, "m20": 2.05e7}
DNS = (5, 10, 20, 40, 80)


def _cell(model: str, dn: int) -> dz.Cell:
    n = SIZES[model]
    return dz.Cell(model, n, n * dn, int(n * dn / 65536), 65536, f"dn{dn}")


def _speeds() -> dz.StepSpeeds:
    """Two measured sizes per recipe (a recipe 1.5x bf16's step), no compile time."""
    rows = {r: [(7e6, 65536, 16.0 * f, 0.0), (2e8, 262144, 740.0 * f, 0.0)] for r, f in (("bf16", 1.0), ("q", 1.5))}
    return dz.StepSpeeds(rows)


def _bf16_table(noise: dz.NoiseModel, rng) -> pd.DataFrame:
    """Existing bf16 runs at 3 sizes x D/N 10 and 20, three seeds at D/N 10: the planted law plus the noise model's
    misfit (per cell) and seed deviation (per run)."""
    rows = []
    for model, n in SIZES.items():
        for dn in (10, 20):
            sd = noise.sds(n)
            misfit = rng.normal(0, sd["misfit_sd"])
            for s in range(3 if dn == 10 else 1):
                rows.append(dict(n_params=n, tokens=n * dn, forward="bf16", backward="bf16", precision="bf16",
                                 seed=s, model=model, run_id=f"{model}-dn{dn}-bf16-s{s}",
                                 loss=float(predict(LAW, n, n * dn)) + misfit + rng.normal(0, sd["seed_sd"])))
    return pd.DataFrame(rows)


NOISE = dz.NoiseModel(seed_sd={3.4e6: 0.02, 2.05e7: 0.005}, gap_sd={3.4e6: 0.015, 2.05e7: 0.006},
                      misfit_sd={3.4e6: 0.02, 2.05e7: 0.006}, gap_misfit_sd={3.4e6: 0.01, 2.05e7: 0.004})


def test_a_recipe_run_shares_its_bf16_runs_deviation():
    """The pairing: where the bf16 run of a seed exists, a recipe run of that seed is it plus the law's gap (no gap
    noise here); a new cell's runs of one seed share one draw, and the bf16 run the design adds there has it too."""
    existing = _bf16_table(NOISE, np.random.default_rng(1))
    quiet = dz.NoiseModel(seed_sd={1.0: 0.02}, gap_sd={1.0: 0.0}, misfit_sd={1.0: 0.03}, gap_misfit_sd={1.0: 0.0})
    t = dz.Target("q_fwd", "q", "bf16", "q", eff_n=0.6)
    design = dz.Design()
    design.add("q_fwd", _cell("m7", 10), 3)
    design.add("q_fwd", _cell("m7", 40), 2)
    table = dz.simulate_table(existing, design, {"q_fwd": t}, LAW, quiet, np.random.default_rng(0))
    gap10 = float(predict(LAW, 7.1e6, 7.1e7, 0.6) - predict(LAW, 7.1e6, 7.1e7))
    new = table[table["run_id"].str.endswith("-sim")]
    for s in range(3):
        q = new[(new["tokens"] == 7.1e7) & (new["seed"] == s)]["loss"].item()
        b = existing[(existing["tokens"] == 7.1e7) & (existing["seed"] == s)]["loss"].item()
        assert q == pytest.approx(b + gap10)
    at40 = new[new["tokens"] == 7.1e6 * 40]
    assert sorted(at40["precision"]) == ["bf16", "bf16", "q_fwd", "q_fwd"]  # paired: bf16 added at the new cell
    gap40 = float(predict(LAW, 7.1e6, 2.84e8, 0.6) - predict(LAW, 7.1e6, 2.84e8))
    for s in range(2):
        pair = at40[at40["seed"] == s].set_index("precision")["loss"]
        assert pair["q_fwd"] - pair["bf16"] == pytest.approx(gap40)


def test_the_noise_model_reads_seed_noise_and_misfit_from_the_runs():
    """Planted: every cell off the law by +-0.05 (misfit), seeds +-0.01 around it; the model finds both."""
    rows = []
    for i, (n, dn) in enumerate([(n, dn) for n in (3e6, 7e6, 2e7) for dn in (5, 10, 20, 40)]):
        off = 0.05 if i % 2 else -0.05
        for s, dev in enumerate((-0.01, 0.0, 0.01)):
            rows.append(dict(n_params=n, tokens=n * dn, forward="bf16", backward="bf16", precision="bf16", seed=s,
                             loss=float(predict(LAW, n, n * dn)) + off + dev, run_id=f"{n}-{dn}-{s}"))
    df = pd.DataFrame(rows)

    class Fit:  # the point fit, as plant() gives it: here the planted law itself
        base = type("B", (), {"params": LAW, "free": tuple(range(6))})()
        efficiencies = ()

    noise = dz.noise_model(df, Fit())
    for n in (3e6, 7e6, 2e7):
        assert noise.seed_sd[n] == pytest.approx(0.01)
        # RMS 0.05, inflated by sqrt(12 / 6) for the six parameters, less the seed noise of 3-seed means
        assert noise.misfit_sd[n] == pytest.approx(np.sqrt(0.05 ** 2 * 2 - 0.01 ** 2 / 3))


def test_step_times_interpolate_in_flops_and_a_half_costs_like_its_recipe():
    sp = _speeds()
    assert sp.step_ms("q", 7e6, 65536) == pytest.approx(24.0)
    assert sp.step_ms("q", 2e8, 262144) == pytest.approx(1110.0)
    mid = sp.step_ms("bf16", 2.05e7, 65536)
    f = lambda n, t: 6 * n * t  # noqa: E731
    assert mid == pytest.approx(16 + (740 - 16) * (f(2.05e7, 65536) - f(7e6, 65536)) / (f(2e8, 262144) - f(7e6, 65536)))
    c = _cell("m7", 10)
    t = dz.make_target("q_bwd", "bf16", "qb", {"q": (0.6, 0.9)})
    assert (t.recipe, t.eff_n, t.eff_d, t.pin) == ("q", 1.0, 0.9, ("eff_d",))
    assert 24.0 < sp.step_ms("q", c.n_params, 65536) < 25.0
    assert sp.run_hours(t.recipe, c) == pytest.approx(c.steps * sp.step_ms("q", c.n_params, 65536) / 1e3 / 3600)
    with pytest.raises(Exception, match="no measured step time"):
        sp.step_ms("nope", 7e6, 65536)


def test_designs_it_calls_pinned_pin_when_redrawn_with_other_seeds():
    """A planted law and noise model: the search's design for a forward-only and a backward-only precision is
    pinned in its own simulation; fresh draws (other seeds) of the same design, fitted by fit_all, pin it too and
    their intervals hold the planted values."""
    existing = _bf16_table(NOISE, np.random.default_rng(3))
    targets = {"q_fwd": dz.make_target("q_fwd", "q", "bf16", {"q": (0.6, 0.9)}),
               "q_bwd": dz.make_target("q_bwd", "bf16", "qb", {"q": (0.6, 0.9)})}
    cands = [_cell(m, dn) for m in SIZES for dn in DNS]
    opts = dz.FitOptions(bootstrap=30, min_params=0)
    res = dz.search(existing, targets, cands, LAW, NOISE, _speeds(), budget_h=5.0, options=opts, reps=3, seed=0,
                    rounds=3)
    assert set(res.summary["precision"]) == set(targets)
    assert (res.summary["base_fixed_pinned"] >= dz.CONFIDENCE).all(), res.log
    assert res.hours <= 5.0
    again = dz.summarise(dz.simulate(existing, res.design, targets, LAW, NOISE, reps=8, options=opts, seed=101))
    assert (again["base_fixed_pinned"] >= 0.75).all(), again
    # the base-fixed interval holds the base law at its fit, so on a design of four or five cells it misses the
    # planted value more often than 5% (0.50-0.75 coverage over 8 redraws here); far below that would be a fault
    assert (again["base_fixed_covers"] >= 0.5).all(), again


def test_a_budget_too_small_is_not_called_pinned():
    """Four cells of 3.4M at the planted noise leave effN wider than 0.3: the search says so, and what it would take
    beyond the budget costs more than the budget."""
    existing = _bf16_table(NOISE, np.random.default_rng(3))
    noisy = dz.NoiseModel(seed_sd={1.0: 0.05}, gap_sd={1.0: 0.05}, misfit_sd={1.0: 0.08}, gap_misfit_sd={1.0: 0.05})
    targets = {"q_fwd": dz.make_target("q_fwd", "q", "bf16", {"q": (0.6, 0.9)})}
    cands = [_cell("m3", dn) for dn in (10, 20, 40, 80)]
    opts = dz.FitOptions(bootstrap=30, min_params=0)
    res = dz.search(existing, targets, cands, LAW, noisy, _speeds(), budget_h=0.05, options=opts, reps=3, rounds=1)
    assert list(res.summary["precision"]) == ["q_fwd"]  # the budget is spent on it, the best it allows
    assert (res.summary["base_fixed_pinned"] < dz.CONFIDENCE).all()
    assert 0 < res.hours <= 0.05
    _, beyond_h, _ = dz.what_it_takes(res, existing, targets, cands, LAW, noisy, _speeds(), options=opts, reps=2)
    assert beyond_h > 0.05


def _ratios(tag: str, reps: int, bootstrap: int) -> pd.DataFrame:
    df = pd.read_csv(RESULTS / tag / "losses.csv")
    fit = json.loads((RESULTS / tag / "fit.json").read_text())
    return dz.check_committed(df, fit, reps=reps, bootstrap=bootstrap, seed=0)


def test_predicted_widths_of_the_committed_ladder_fit_within_a_factor_1_5():
    """The ladder's fp8 and quartet (15 cells, three seeds at five): every predicted full-bootstrap width (median
    of the simulated fits) within a factor 1.5 of the committed fit.json's."""
    out = _ratios("ladder", reps=4, bootstrap=30)
    assert len(out) == 4
    assert ((out["full_ratio"] > 1 / 1.5) & (out["full_ratio"] < 1.5)).all(), out[["precision", "efficiency",
                                                                                     "full_width", "full_realised"]]


def test_predicted_widths_of_the_committed_recipe_fit():
    """The recipe table (10 recipes x 6 cells, the base law on the ladder's 15 bf16 cells). Every effN interval
    reaches the bound 4 in the committed fit and in the prediction (width within 1.5). The effD widths do NOT hold a
    factor 1.5 recipe by recipe: with 6 draws x 60 resamples (design_sim.csv, docs/analysis.md) luq_int4 and
    quartet are predicted 1.9x and 1.7x wider; with the few draws of this test the ratios scatter more. What is
    checked for effD: the realised width lies within the simulated draws' range (widened by 1.5) for at least 8 of
    the 10 recipes."""
    df = pd.read_csv(RESULTS / "recipes" / "losses.csv")
    fit = json.loads((RESULTS / "recipes" / "fit.json").read_text())
    kept, report = dz.plant(df, dz.FitOptions(bootstrap=25, min_params=0))
    noise = dz.noise_model(kept, report)
    planted = {e["scheme"]: (e["eff_n"], e["eff_d"]) for e in fit["efficiencies"]}
    bf, design, labels = dz.committed_design(kept)
    targets = {p: dz.make_target(p, fw, bw, planted) for p, (fw, bw) in labels.items()}
    sims = dz.simulate(bf, design, targets, report.base.params, noise, reps=3,
                       options=dz.FitOptions(bootstrap=25, min_params=0), seed=0)
    real = {(e["scheme"], k): e[f"{k}_interval"][1] - e[f"{k}_interval"][0] for e in fit["efficiencies"]
            for k in ("eff_n", "eff_d")}
    med = sims.groupby(["precision", "efficiency"])["full_width"].median()
    ratio = pd.Series({k: v / real[k] for k, v in med.items()})
    n = ratio[[k for k in ratio.index if k[1] == "eff_n"]]
    assert ((n > 1 / 1.5) & (n < 1.5)).all(), n
    d = ratio[[k for k in ratio.index if k[1] == "eff_d"]]
    lo = sims.groupby(["precision", "efficiency"])["full_width"].min() / 1.5
    hi = sims.groupby(["precision", "efficiency"])["full_width"].max() * 1.5
    inside = [lo[k] <= real[k] <= hi[k] for k in d.index]
    assert sum(inside) >= 8, dict(zip(d.index, inside))


@pytest.mark.parametrize("args, message", [
    (["--gpu-hours", "-1"], "--gpu-hours must be positive"),
    (["--precisions", "quartet_fwdd"], "precision=quartet_fwdd: unknown precision"),
    (["--models", "llama_9m"], "model=llama_9m: unknown model"),
    (["--models", "llama_1m"], "no candidate cells left"),
    (["--dn", ""], "--dn takes positive"),
    (["--precisions", ""], "--precisions is empty"),
])
def test_bad_input_is_one_line(args, message, capsys):
    base = {"--precisions": "quartet_fwd", "--models": "llama_3m", "--dn": "10", "--gpu-hours": "1"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = ["design", str(RESULTS / "ladder" / "losses.csv"), "--fit", str(RESULTS / "recipes" / "fit.json")]
    argv += [x for kv in base.items() for x in kv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_the_sweep_file_lists_every_run_once():
    """The first run is the sweep's one-point grid; it is not listed again among the includes (a planner would drop
    the twin with a duplicate-point note)."""
    import pandas as pd

    from analysis.design import sweep_yaml

    runs = pd.DataFrame({"model": ["llama_7m"] * 3, "budget": ["dn40"] * 3, "precision": ["bf16"] * 3,
                         "seed": [0, 1, 2]})
    text = sweep_yaml(runs, "s", "d", [])
    assert text.count("{model: llama_7m, budget: dn40, precision: bf16}") == 0
    assert text.count("precision: bf16, run.seed: 1, run.data_seed: 1338}") == 1
    assert "  precision: [bf16]" in text


def test_sweep_file_of_a_non_dn_budget_and_of_no_runs():
    """A budget that is no conf/budget/ name goes in as its key, on the grid line too (Hydra refuses
    ``budget: [tokens_per_param=30]``); a design that adds nothing writes no sweep and says why in one line."""
    import yaml

    runs = pd.DataFrame([{"model": "llama_3m", "budget": "tokens_per_param=30", "precision": "q_fwd", "seed": 0},
                         {"model": "llama_3m", "budget": "tokens_per_param=30", "precision": "q_fwd", "seed": 1},
                         {"model": "llama_7m", "budget": "dn10", "precision": "q_fwd", "seed": 0}])
    sweep = yaml.safe_load(dz.sweep_yaml(runs, "t", "d", ["h"]))
    assert sweep["axes"] == {"model": ["llama_3m"], "budget.tokens_per_param": [30], "precision": ["q_fwd"]}
    assert sweep["include"] == [
        {"model": "llama_3m", "budget.tokens_per_param": 30, "precision": "q_fwd", "run.seed": 1, "run.data_seed": 1338},
        {"model": "llama_7m", "budget": "dn10", "precision": "q_fwd"}]
    with pytest.raises(AnalysisError, match="adds no run"):
        dz.sweep_yaml(runs.iloc[:0], "t", "d", [])


def test_speed_files_read_twice_or_malformed(tmp_path):
    """A size timed twice (the same file passed twice) is one point, not a 0/0 line; rows that are not
    ladder_speed.py's say so in one line."""
    row = {"config": "q:graphs", "n_params": 7e6, "tokens_per_step": 65536, "step_ms_median": 16.0}
    big = {**row, "n_params": 2e8, "step_ms_median": 200.0}
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"rows": [row, big]}))
    once, twice = dz.StepSpeeds.from_json([f]), dz.StepSpeeds.from_json([f, f])
    assert np.isfinite(twice.step_ms("q", 2e7, 65536)) and twice.step_ms("q", 2e7, 65536) == once.step_ms("q", 2e7, 65536)
    for bad in ([row], {"rows": [{"config": "q:graphs", "step_ms_median": 1.0}]}):
        f.write_text(json.dumps(bad))
        with pytest.raises(AnalysisError, match="speed file"):
            dz.StepSpeeds.from_json([f])


def test_a_joint_targets_width_counts_the_other_efficiency_as_unknown():
    """effN and effD fitted together: on cells where N and D grow together their errors correlate, so each one's
    linearised width is wider than if the other were known (the one-parameter formula), never narrower."""
    t = dz.make_target("q", "q", "q", {"q": (0.6, 0.9)})
    assert t.pin == ("eff_n", "eff_d")
    cells = [_cell(m, dn) for m in ("m3", "m7") for dn in (10, 20, 40)]
    terms = [dz._cell_terms(LAW, NOISE, t, c, 2) for c in cells]
    joint = dz._widths_of(terms, t)
    for i, key in enumerate(t.pin):
        alone = dataclasses.replace(t, pin=(key,))
        one = dz._widths_of([((sens[i],), v) for sens, v in terms], alone)
        assert joint[key] > one[key] > 0 and np.isfinite(joint[key])
    assert dz._widths_of(terms[:1], t) == {"eff_n": np.inf, "eff_d": np.inf}  # one cell cannot separate them
