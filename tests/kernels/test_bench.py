"""``benchmarks/bench.py``'s CPU-testable parts: the timing rule (fake clock), the layers and models it compares,
the JSON it writes. No test here times real speed."""
import json
import statistics

import pytest
import torch

from quartet.kernels.timing import input_sets, percentile, rotating, time_callable, time_interleaved
from repo_scripts import load_script

B = load_script("benchmarks/bench.py")


def fake_clock(durations):
    """A chunk runner that calls ``fn`` for real but reports the next value of ``durations(i)`` as its time."""
    calls = []

    def run(fn, k):
        out = []
        for _ in range(k):
            fn()
            out.append(durations(len(calls)))
            calls.append(out[-1])
        return out

    return run, calls


def test_fast_callable_runs_until_two_seconds_of_work():
    run, calls = fake_clock(lambda i: 1e-3)
    t = time_callable(lambda: None, min_reps=20, min_seconds=2.0, run_chunk=run)
    assert t.n >= 2000 and t.total_s >= 2.0 - 1e-9
    assert t.total_s < 2.0 + 0.5 + 1e-9  # chunks of at most ~0.5 s: it stops soon after both minima
    assert t.median_ms == pytest.approx(1.0) and t.spread == 0
    assert len(calls) == t.n + t.warmup_n  # every timed repeat called the function once


def test_interleaved_variants_share_the_clock_history():
    """Two variants of equal work under a clock that slows down halfway (a GPU reaching its power cap): timed one
    after the other they would differ by the slowdown; interleaved, each sees both phases and their ratio is 1."""
    order = []

    def run(fn, k):
        out = []
        for _ in range(k):
            fn()
            slow = len(order) >= 4000
            out.append(1e-3 * (1.5 if slow else 1.0))
            order.append(fn)
        return out

    a, b = (lambda: None), (lambda: None)
    t = time_interleaved({"a": a, "b": b}, min_reps=20, min_seconds=2.0, chunk_seconds=0.05, settle_seconds=0.05,
                         run_chunk=run)
    assert min(t["a"].n, t["b"].n) >= 20 and min(t["a"].total_s, t["b"].total_s) >= 2.0
    # both variants ran in many alternating slices, before and after the slowdown
    switches = sum(1 for x, y in zip(order, order[1:]) if x is not y)
    assert switches > 50
    slow_share = [sum(1 for i, f in enumerate(order) if f is v and i >= 4000) / len([f for f in order if f is v])
                  for v in (a, b)]
    assert 0.2 < slow_share[0] < 0.8 and abs(slow_share[0] - slow_share[1]) < 0.05
    # the settling calls before each slice are run but not timed; every call is either warm-up or a repeat
    assert t["a"].warmup_n > 3 and t["a"].warmup_n + t["b"].warmup_n + t["a"].n + t["b"].n == len(order)
    # the order of the variants changes from round to round (no variant always follows the same one)
    firsts = [order[i] for i in range(6, len(order), 100)]
    assert a in firsts and b in firsts
    with pytest.raises(ValueError):
        time_interleaved({})


def test_slow_callable_runs_at_least_twenty_repeats():
    run, calls = fake_clock(lambda i: 0.28)  # a ~280 ms training step
    t = time_callable(lambda: None, min_reps=20, min_seconds=2.0, run_chunk=run)
    assert t.n == 20 and t.total_s == pytest.approx(5.6)
    assert t.warmup_n == 3


def test_warmup_is_discarded_and_spread_is_reported():
    # the first call compiles (10 s); then durations cycle 1..10 ms
    run, _ = fake_clock(lambda i: 10.0 if i == 0 else 1e-3 * (1 + i % 10))
    t = time_callable(lambda: None, min_reps=30, min_seconds=0.05, warmup_reps=1, warmup_seconds=0.0, run_chunk=run)
    assert t.max_ms <= 10.0 + 1e-9  # the 10 s compile is not a timed repeat
    ms = [1.0 * (1 + i % 10) for i in range(1, 1 + t.n)]
    assert t.median_ms == pytest.approx(statistics.median(ms))
    assert t.p10_ms == pytest.approx(percentile(ms, 0.1)) and t.p90_ms == pytest.approx(percentile(ms, 0.9))
    assert t.p10_ms < t.median_ms < t.p90_ms and t.spread == pytest.approx((t.p90_ms - t.p10_ms) / t.median_ms)
    d = t.as_dict()
    assert all(k in d for k in B.FIGURE_KEYS)


def test_a_callable_that_takes_no_time_stops_at_max_reps():
    run, _ = fake_clock(lambda i: 0.0)
    t = time_callable(lambda: None, min_reps=5, min_seconds=1.0, max_reps=500, run_chunk=run)
    assert t.n == 500


def test_bad_minima_are_refused():
    with pytest.raises(ValueError):
        time_callable(lambda: None, min_reps=0)


def test_inputs_are_rotated_only_when_they_fit_the_l2():
    l2 = 50 * 2**20
    assert input_sets(128 * 2**20, l2) == 1  # 16384 x 4096 bf16: streams from memory
    assert input_sets(30 * 2**20, l2) == 4  # 4 x 30 MiB > 2 x 50 MiB
    assert input_sets(2**10, l2) == 16  # capped
    seen = []
    f = rotating([lambda i=i: seen.append(i) for i in range(3)])
    for _ in range(7):
        f()
    assert seen == [0, 1, 2, 0, 1, 2, 0]


def test_both_backward_recipes_and_bf16_get_the_training_weight_dtype():
    from quartet.kernels.linear import FUSED_SCHEMES, QuartetLinear
    from quartet.model import BlockLinear, Llama

    layers = B.build_linears(64, 96, "cpu", engine="triton")
    assert set(layers) == {"bf16", "quartet", "quartet_sr"}
    assert {k: v for k, v in B.PRECISIONS.items() if v is not None} == FUSED_SCHEMES
    assert isinstance(layers["quartet"], QuartetLinear) and layers["quartet"].state.stochastic is False
    assert isinstance(layers["quartet_sr"], QuartetLinear) and layers["quartet_sr"].state.stochastic is True
    # the dtype training keeps its weights in: the Llama's block linears as the Trainer builds them
    train_dtype = next(m for m in Llama(1, 64, 2, 128, 32).modules() if isinstance(m, BlockLinear)).weight.dtype
    assert B.WEIGHT_DTYPE == train_dtype
    for lin in layers.values():
        assert lin.weight.dtype == train_dtype
        assert torch.equal(lin.weight, layers["bf16"].weight)  # the same draw on every side
    assert layers["quartet"].weight is not layers["quartet_sr"].weight


@pytest.mark.parametrize("precision", ["bf16", "quartet", "quartet_sr"])
def test_step_models_keep_one_weight_dtype_and_the_backward_recipe(precision):
    from quartet.kernels.linear import QuartetLinear

    spec = B.model_spec("smoke")
    model = B._build_model(spec, precision, "cpu", engine="triton")
    assert {p.dtype for p in model.parameters()} == {B.WEIGHT_DTYPE}
    fused = [m for m in model.modules() if isinstance(m, QuartetLinear)]
    if precision == "bf16":
        assert not fused
    else:
        assert fused and {m.state.stochastic for m in fused} == {B.PRECISIONS[precision]}
    # 6 x (block linears + lm_head) x tokens + causal attention
    tokens = spec["batch"] * spec["seq"]
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert B.step_flops(spec, model) == 6 * linears * tokens + 6 * spec["n_layer"] * spec["seq"] * spec["d_model"] * tokens


def test_ladder_sizes_are_read_from_the_model_configs():
    yaml = pytest.importorskip("yaml")
    for size in B.LADDER:
        cfg = yaml.safe_load((B.REPO / "conf" / "model" / f"llama_{size}.yaml").read_text())
        spec = B.model_spec(size)
        assert (spec["n_layer"], spec["d_model"], spec["n_head"], spec["seq"], spec["batch"]) == (
            cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["seq_len"], cfg["batch_size"])
    with pytest.raises(ValueError, match="unknown step model"):
        B.model_spec("nope")


def test_cli_writes_provenance_ceilings_and_spread(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert B.cli_main(["ceilings", "--device", "cpu", "--min-reps", "3", "--min-seconds", "0.01",
                       "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert all(k in r["meta"] for k in B.META_KEYS)
    assert r["meta"]["command"] == "python benchmarks/bench.py ceilings --device cpu --min-reps 3 --min-seconds 0.01 --out " + str(out)
    assert r["meta"]["torch"] == torch.__version__ and r["meta"]["device"] == "cpu"
    assert r["meta"]["timing"] == {**r["meta"]["timing"], "min_reps": 3, "min_seconds": 0.01}
    c = r["ceilings"]
    assert "gpu_before" in c and "gpu_after" in c  # readings, or why nvidia-smi gave none
    assert c["copy"]["n"] >= 3 and c["copy"]["total_s"] >= 0.01 and "spread" in c["copy"]
    assert c["copy"]["bytes"] == 2 * 2**20 and c["copy_GBps"] > 0 and c["peak_bf16_TFLOPs"] > 0
    assert r["problems"] == []
    # consistent with its own rule, but 3 repeats / 0.01 s are below the project's standard: not to be quoted
    printed = capsys.readouterr().out
    assert r["quotable"] is False and "not quotable" in printed
    r["meta"]["timing"].update(min_reps=20, min_seconds=2.0)  # claiming the standard rule exposes the short figures
    assert not B.quotable(r) and any("timed <" in p or "repeats <" in p for p in B.check_result(r))
    for fig in (c["copy"], *c["bf16_gemm"].values()):
        fig.update(n=20, total_s=2.0)
    assert B.check_result(r) == [] and B.quotable(r)
    assert "copy" in printed.splitlines()[-1]  # the short table comes last


def test_check_result_flags_incomplete_figures():
    good = {"median_ms": 1.0, "p10_ms": 1.0, "p90_ms": 1.0, "n": 20, "total_s": 2.0, "spread": 0.0}
    meta = {k: None for k in B.META_KEYS} | {"timing": {"min_reps": 20, "min_seconds": 2.0}}
    sec = {"gpu_before": {}, "gpu_after": {}}
    assert B.check_result({"meta": meta, "quant": {**sec, "recipes": {"a": good}}}) == []
    bad = {k: v for k, v in good.items() if k != "spread"} | {"n": 3}
    problems = B.check_result({"meta": {"timing": meta["timing"]}, "quant": {"recipes": {"a": bad}}})
    assert "meta lacks git_commit" in problems and "quant.recipes.a lacks spread" in problems
    assert "quant.recipes.a: 3 repeats < 20" in problems and "quant lacks its nvidia-smi readings" in problems


def test_cli_refuses_unknown_models_and_bad_minima(capsys):
    assert B.cli_main(["step", "--device", "cpu", "--models", "nope"]) == 2
    assert B.cli_main(["quant", "--device", "cpu", "--min-reps", "0"]) == 2


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke run needs Triton's interpreter (CPU-only machines)")
def test_every_section_runs_end_to_end_on_the_cpu(tmp_path):
    """The smoke run the GPU call relies on: every section on tiny shapes (Triton interpreter), no errors."""
    out = tmp_path / "all.json"
    assert B.cli_main(["all", "--device", "cpu", "--models", "smoke", "--min-reps", "2", "--min-seconds", "0",
                       "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["problems"] == []
    for name in ("ceilings", "quant", "linear", "step"):
        assert "error" not in r[name], r[name].get("error")
    lin = r["linear"]["shapes"][0]
    assert {"bf16_eager", "quartet_eager", "quartet_sr_eager"} <= set(lin["figures"])
    assert lin["weight_dtype"] == "torch.float32"
    step = r["step"]["models"][0]
    assert {"bf16_eager", "quartet_eager", "quartet_sr_eager"} <= set(step["figures"]) and not step["errors"]


def test_step_models_past_the_budget_are_skipped_and_recorded():
    bench = B.Bench("cpu", min_reps=1, min_seconds=0.0, budget_s=0.0)
    written = []
    bench.checkpoint = lambda: written.append(1)
    live = {}
    out = B.bench_step(bench, ("smoke", "1m"), live=live)
    assert out is live and [r["model"] for r in out["models"]] == ["smoke", "1m"]
    assert all("time budget" in r["skipped"] for r in out["models"])
    assert B.summary_table({"step": out}).splitlines()[0].startswith("step smoke skipped")


def test_meta_records_the_commit_it_was_given_over_the_copy_s_git_head(monkeypatch):
    """A device copy can hold a .git whose HEAD is older than its files: QUARTET_GIT_COMMIT must win."""
    bench = B.Bench("cpu")
    monkeypatch.setenv("QUARTET_GIT_COMMIT", "f" * 40)
    m = B.meta([], bench)
    assert m["git_commit"] == "f" * 40 and m["git_commit_from"] == "QUARTET_GIT_COMMIT" and m["git_dirty"] is None
    monkeypatch.delenv("QUARTET_GIT_COMMIT")
    m = B.meta([], bench)
    assert m["git_commit_from"] == "git" and m["git_commit"] == B._git("rev-parse", "HEAD")


def _benchmark(name: str):
    """A script of ``benchmarks/`` loaded as a module (the folder is not a package)."""
    return load_script(f"benchmarks/{name}.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke run needs Triton's interpreter (CPU-only machines)")
def test_layer_variants_smoke_run_restores_the_layer_flags(tmp_path):
    """benchmarks/layer_variants.py end to end on the CPU (tiny shape, eager, Triton interpreter): every variant and
    BF16 get a figure and a ratio, and the layer's module flags are what they were before (each variant sets them only
    while it is built and run)."""
    from quartet.kernels import linear as L

    lv = _benchmark("layer_variants")
    from quartet.kernels import triton_quant as tq

    def flags():
        return L.RIGHT_BLOCK, L.MASK_BITS, dict(tq.MAXNREG), dict(tq.BLOCK128_SPLIT), tq.BLOCK128_SPLIT_WARPS

    before = flags()
    out = tmp_path / "lv.json"
    sections = "caps,layer,warps,inscale,split,slicewarps"
    assert lv.main(["--device", "cpu", "--smoke", "--out", str(out), "--sections", sections,
                    "--variants", "r128_bool,r1_bits,cap96_64,tuned,default", "--caps", "96,64"]) == 0
    assert flags() == before
    r = json.loads(out.read_text())
    (row,) = r["shapes"]
    assert set(row["figures"]) == {"bf16", "r128_bool", "r1_bits", "cap96_64", "tuned", "default"}
    assert set(row["ratio_to_bf16"]) == {"r128_bool", "r1_bits", "cap96_64", "tuned", "default"}
    assert r["variants"]["cap96_64"]["maxnreg"] == {"1x128": 96, "1x128 T": 96, "128x128": 64, "128x128 T": 64}
    assert r["variants"]["default"]["maxnreg"] == tq.MAXNREG_MEASURED
    assert r["variants"]["default"]["block128_split"] == tq.BLOCK128_SPLIT_MEASURED
    assert set(r["variants"]["tuned"]["block128_split"].values()) == {1}
    # the caps section: every quantizer call of the layer under every cap, and its table lines
    calls = ("x_fwd", "w_fwd", "e_rtn", "e_sr", "et_rtn", "wt_bwd", "xt_bwd")
    (caps_row,) = r["caps"]
    assert set(caps_row["figures"]) == {f"{c}@{cap}" for c in calls for cap in ("free", 96, 64)}
    assert any(line.strip().startswith("xt_bwd") for line in r["table"])
    # the warps section: the three 128x128 calls under each launch setting, outputs checked bitwise
    assert set(r["warps"]["figures"]) == {f"{c}@w{w}c{cap}" for c in ("w_fwd", "wt_bwd", "xt_bwd")
                                          for w, cap in lv.BLOCK128_LAUNCHES}
    assert len(r["warps"]["bitwise"]) == 3 * (len(lv.BLOCK128_LAUNCHES) - 1) and all(r["warps"]["bitwise"].values())
    # the split section: the 128x128-block calls in one piece and in row slices, outputs checked bitwise
    launches = (*lv.SPLIT_LAUNCHES, ("default", None))
    calls128 = ("w_fwd", "wt_bwd", "wt_bwd_sr", "xt_bwd", "xt_bwd_sr")
    assert set(r["split"]["figures"]) == {f"{c}@s{s}c{cap}" for c in calls128 for s, cap in launches}
    assert len(r["split"]["bitwise"]) == 5 * (len(launches) - 1) and all(r["split"]["bitwise"].values())
    assert set(r["slice_warps"]["figures"]) == {f"{c}@s{s}w{w}" for c in ("w_fwd", "wt_bwd_sr", "xt_bwd", "xt_bwd_sr")
                                                for s, w in lv.SLICE_WARPS}
    assert len(r["slice_warps"]["bitwise"]) == 4 * len(lv.SLICE_WARPS) and all(r["slice_warps"]["bitwise"].values())
    assert set(r["in_scale"]["figures"]) == {f"{c}@{how}" for c in ("wt_bwd", "xt_bwd", "xt_bwd_r1")
                                             for how in ("element", "row")}
    # the floor chart reads this JSON: each call's tuned figure is its per-kind cap's, times the per-row ratio for the
    # FP8 inputs; the floor is its bytes over the copy bandwidth
    pq = _benchmark("plot_quantizer_floor")
    png = tmp_path / "floor.png"
    assert pq.main(["--caps", str(out), "--inscale", str(out), "--shape", "128,128,128", "--copy-gbps", "1000",
                    "--out", str(png)]) == 0
    assert png.stat().st_size > 10_000
    calls = {d["call"]: d for d in json.loads(png.with_suffix(".json").read_text())["calls"]}
    f, g = caps_row["figures"], r["in_scale"]["figures"]
    ratio = g["xt_bwd@row"]["median_ms"] / g["xt_bwd@element"]["median_ms"]
    assert calls["xt_bwd"]["tuned_us"] == pytest.approx(f["xt_bwd@64"]["median_ms"] * ratio * 1e3)
    assert calls["x_fwd"]["tuned_us"] == pytest.approx(f["x_fwd@96"]["median_ms"] * 1e3)
    assert calls["w_fwd"]["uncapped_us"] == calls["w_fwd"]["tuned_us"] == pytest.approx(f["w_fwd@free"]["median_ms"] * 1e3)
    assert calls["x_fwd"]["floor_us"] == pytest.approx(lv.call_bytes(128, 128, 128)["x_fwd"] / 1000 / 1e3)
    with pytest.raises(SystemExit):  # no figures at that shape: a one-line error
        pq.main(["--caps", str(out), "--shape", "1,2,3", "--copy-gbps", "1000", "--out", str(png)])
    with pytest.raises(SystemExit):
        lv.main(["--device", "cpu", "--smoke", "--variants", "nope"])
    assert all(f["n"] >= 2 and f["median_ms"] > 0 for f in row["figures"].values())
    assert r["meta"]["timing"]["order"].startswith("interleaved") and r["table"]
    # a variant's flags are in force while it runs: the packed-mask layer saves int32 words
    seen, caps = [], []
    orig = L._forward_gemm

    def spy(*a, **k):
        y, saved = orig(*a, **k)
        seen.append(saved[2].dtype)
        caps.append(dict(tq.MAXNREG))
        return y, saved

    L._forward_gemm = spy
    try:
        lin = lv._variant_layer("r1_bits", 64, 96, torch.randn(96, 64), "cpu", "triton", graph=False)
        x = torch.randn(64, 64, requires_grad=True)
        lv._with_flags("r1_bits", lv._layer_step(lin, x, torch.randn(64, 96), "cpu"))
        lv._with_flags("r128_bool", lv._layer_step(lin, x, torch.randn(64, 96), "cpu"))
        lv._with_flags("cap80_64", lv._layer_step(lin, x, torch.randn(64, 96), "cpu"))
    finally:
        L._forward_gemm = orig
    assert seen == [torch.int32, torch.bool, torch.int32]
    free = tq.caps_table(None, None)
    assert caps == [free, free, {"1x128": 80, "1x128 T": 80, "128x128": 64, "128x128 T": 64}] and flags() == before


def test_layer_call_bytes_are_each_call_s_byte_floor():
    """``layer_variants.call_bytes``: each quantizer call's byte floor at 16384×4096×4096 (MiB, inputs read once,
    outputs written once, packed masks); X̂ᵀ with its float32 scales (130 MiB)."""
    lv = _benchmark("layer_variants")
    mib = {k: round(v / 2**20) for k, v in lv.call_bytes(16384, 4096, 4096).items()}
    assert mib == {"x_fwd": 202, "w_fwd": 82, "e_rtn": 194, "e_sr": 194, "et_rtn": 194, "wt_bwd": 32, "xt_bwd": 130}


def test_step_profile_floor_covers_every_block_linear_and_plots(tmp_path, capsys):
    """``benchmarks/plot_step_profile.py``: the byte floor counts exactly the model's block linears (the layers the
    fused Quartet layer replaces), scales with depth and tokens, gives the 800M floor docs/kernels.md quotes (17.4 ms a
    step at the H200's 4246 GB/s copy), and the chart is drawn from the committed H200 profiles."""
    from quartet.model import BlockLinear, Llama

    ps = _benchmark("plot_step_profile")
    spec = {"n_layer": 2, "d_model": 128, "n_head": 2, "ffn_multiple_of": 128}
    model = Llama(2, 128, 2, vocab_size=64, seq_len=16, ffn_multiple_of=128, device="meta")
    shapes = sorted((m.in_features, m.out_features) for m in model.modules() if isinstance(m, BlockLinear))
    assert sorted(ps.block_linears(spec) * 2) == shapes
    one = ps.quantizer_floor_bytes({**spec, "n_layer": 1}, 512)
    assert ps.quantizer_floor_bytes(spec, 512) == pytest.approx(2 * one)
    assert ps.quantizer_floor_bytes(spec, 1024) > ps.quantizer_floor_bytes(spec, 512)
    assert ps.quantizer_floor_bytes(B.model_spec("800m"), 16384) / 4246e9 * 1e3 == pytest.approx(17.4, abs=0.05)
    prof = B.REPO / "benchmarks" / "results" / "kernels"
    png = tmp_path / "profile.png"
    assert ps.main([str(prof / "profile_800m_h200.json"), str(prof / "profile_20m_h200.json"), "--copy-gbps", "4246",
                    "--out", str(png)]) == 0
    assert png.stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "800m quartet" in printed and "byte floor 17.4 ms" in printed and "20m bf16" in printed
