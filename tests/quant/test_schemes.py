"""Every named scheme: a YAML that composes (typed), and a tiny model that trains with falling loss
through the real trainer (``quartet.train``), chosen by name as on the command line."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quartet.errors import ConfigError
from quartet.paths import CONF_DIR
from quartet.quant import SCHEMES, build_scheme
from quartet.quant.schemes import HALF_VARIANTS


LABELS = {
    "bf16": ("bf16", "bf16"), "fp8": ("fp8", "fp8"), "quartet": ("quest", "rtn_absmax"),
    "quartet_sr": ("quest", "sr_absmax"), "quest_fwd": ("quest", "bf16"), "sr_bwd": ("bf16", "sr_absmax"),
    "rtn_bwd": ("bf16", "rtn_absmax"), "sr_fwd": ("sr_absmax", "bf16"), "rtn_fwd": ("rtn_absmax", "bf16"),
    "ms_fp4": ("ms_fp4", "ms_fp4"), "luq_int4": ("luq-int4", "luq-int4"), "nvfp4": ("nvfp4", "nvfp4"),
    "quartet2": ("nvfp4_4o6", "ms_eden"), "mxfp8": ("mxfp8", "mxfp8"),
    "nvfp4_recipe": ("nvfp4_2d", "nvfp4_sr_rht"), "fp8_deepseek": ("fp8_block", "fp8_block"),
}


def _labels(name: str) -> tuple[str, str]:
    """The expected labels; a half-recipe variant's are its recipe's with the unquantized half bf16."""
    if name in HALF_VARIANTS:
        recipe, half = HALF_VARIANTS[name]
        fw, bw = LABELS[recipe]
        return (fw, "bf16") if half == "forward" else ("bf16", bw)
    return LABELS[name]


def test_every_scheme_composes_with_matching_labels():
    """Every registered name composes by name; the YAMLs are the registry less the variants, which compose from
    their recipe's YAML."""
    from quartet.config import compose, group_options

    assert sorted(p.stem for p in (CONF_DIR / "precision").glob("*.yaml")) == sorted(set(SCHEMES) - set(HALF_VARIANTS))
    assert group_options("precision") == sorted(SCHEMES)
    for name in SCHEMES:
        p = compose([f"precision={name}"]).precision
        assert p.name == name and (p.forward, p.backward) == _labels(name)
        s = build_scheme(p)
        assert (s.forward_label, s.backward_label) == _labels(name)


def test_half_recipe_variants_quantize_one_half_of_every_recipe():
    """Two per recipe but bf16, built from the recipe's operands: the forward-only variant keeps the forward GEMM and
    nothing in the backward, the backward-only variant the reverse; the recipe's knobs (YAML) carry over."""
    from quartet.config import compose
    from quartet.quant.schemes import RECIPES, GemmSpec

    assert sorted(HALF_VARIANTS) == sorted(f"{r}_{h}" for r in RECIPES if r != "bf16" for h in ("fwd", "bwd"))
    for variant, (recipe, half) in HALF_VARIANTS.items():
        cfg = compose([f"precision={variant}"]).precision
        whole = build_scheme(compose([f"precision={recipe}"]).precision)
        s = build_scheme(cfg)
        assert s.bwd_source == whole.bwd_source and s.convert
        if half == "forward":
            assert (s.fwd, s.dx, s.dw) == (whole.fwd, GemmSpec(), GemmSpec()), variant
        else:
            assert (s.fwd, s.dx, s.dw) == (GemmSpec(), whole.dx, whole.dw), variant
        ref = compose([f"precision={recipe}"]).precision
        assert {k: cfg[k] for k in cfg if k not in ("name", "forward", "backward")} == \
            {k: ref[k] for k in ref if k not in ("name", "forward", "backward")}
    assert compose(["precision=nvfp4_recipe_bwd"]).precision.keep_bf16 == ["blocks.-1.*"]
    assert compose(["precision=quartet2_fwd"]).precision.hadamard_block == 128
    with pytest.raises(ConfigError, match="unknown precision"):
        compose(["precision=bf16_fwd"])


def test_quartet_variants_are_the_papers_ablations():
    """Derived from the recipe's operands, quartet's halves are the Quartet paper's forward-only QuEST and
    backward-only RTN / SR rows (quest_fwd, rtn_bwd, sr_bwd), operand for operand."""
    def ops(name):
        s = build_scheme(type("P", (), {"name": name})())
        return s.fwd, s.dx, s.dw, s.bwd_source

    assert ops("quartet_fwd") == ops("quest_fwd") == ops("quartet_sr_fwd")
    assert ops("quartet_bwd") == ops("rtn_bwd")
    assert ops("quartet_sr_bwd") == ops("sr_bwd")


def test_rotated_specs_are_each_distinct_quantizer_with_its_rotation():
    from quartet.config import compose

    for name in SCHEMES:
        s = build_scheme(compose([f"precision={name}"]).precision)
        pairs = s.rotated_specs()
        assert len(pairs) == len(set(pairs)) and {spec for spec, _ in pairs} == set(s.specs())
        used = {(spec, g.block if g.transform != "none" else None)
                for g in (s.fwd, s.dx, s.dw) for spec in (g.a, g.b) if spec is not None}
        assert set(pairs) == used, name
    q2 = build_scheme(compose(["precision=quartet2"]).precision).rotated_specs()
    assert [(spec.label(), block) for spec, block in q2] == [("nvfp4_4o6/g16", None), ("ms_eden/g16", 128)]


def test_typo_in_a_precision_yaml_fails_at_compose_time(tmp_path):
    from quartet.config import compose

    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "precision" / "broken.yaml").write_text("name: quartet\nforward: quest\nbackward: rtn_absmax\n"
                                                    "hadamard_blok: 32\n")
    with pytest.raises(ConfigError, match="hadamard_blok"):
        compose(["precision=broken"], conf_dir=conf)
    with pytest.raises(ConfigError):
        compose(["precision.stats_every=often"])


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


@pytest.mark.parametrize("name", SCHEMES)
def test_scheme_trains_tiny_model(name, tmp_path, tiny_overrides):
    from quartet.config import compose
    from quartet.runs import run_dir
    from quartet.train import train

    # the one-block nano model would keep everything in BF16 under nvfp4_recipe's default keep_bf16 (the last
    # block): quantize all of it here; test_keep_bf16_trains_with_the_last_block_unquantized covers the default
    cfg = compose([*tiny_overrides, "budget.tokens=12288", f"precision={name}", "precision.stats_every=8",
                   f"run.out_dir={tmp_path}", "precision.keep_bf16=[]"])  # 24 steps
    summary = train(cfg)
    d = run_dir(cfg)
    losses = _losses(d)
    assert len(losses) == 24 and all(l == l and l < 1e3 for l in losses)  # finite
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first - 0.2, (name, losses)
    assert summary["precision"] == name and summary["val_loss"] == summary["val_loss"]
    assert (summary["forward"], summary["backward"]) == _labels(name)  # what the fit reads (effN / effD / both)
    qmap = json.loads((d / "quant_map.json").read_text())
    assert qmap["scheme"] == name
    assert set(qmap["high_precision"]) >= {"tok_emb", "lm_head"}
    if name == "bf16":
        assert qmap["modules"] == {}
    else:
        assert len(qmap["modules"]) == 4 and all(m["backend"] == qmap["backend"] for m in qmap["modules"].values())
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        assert any(k.startswith("q/blocks.0.") for r in rows for k in r)  # stats reached the metrics file


def test_cli_chooses_scheme_by_name(tmp_path, tiny_overrides):
    from quartet.cli import main

    code = main(["train", *tiny_overrides, "budget.tokens=2048", "precision=quartet", f"run.out_dir={tmp_path}"])
    assert code == 0
    (qmap,) = list(tmp_path.rglob("quant_map.json"))
    assert json.loads(qmap.read_text())["scheme"] == "quartet"
    assert json.loads((qmap.parent / "summary.json").read_text())["forward"] == "quest"


@pytest.mark.parametrize("name", ["quartet2", "mxfp8"])
def test_round2_schemes_on_the_reference_backend_track_the_true_gradient(name):
    """Named ``backend=reference``, quartet2 (NVFP4 4/6 forward, MS-EDEN backward after a random 128-Hadamard) and
    mxfp8 give gradients close to the unquantized ones, reproducible for a fixed run seed, and fresh draws on the
    next step (quartet2's random signs and scale rounding; mxfp8 is deterministic)."""
    import torch
    from torch import nn

    from quartet.model import BlockLinear
    from quartet.quant import apply_precision, set_step
    from quartet.quant.config import PrecisionConfig

    def grads(precision, step=1):
        torch.manual_seed(0)
        m = nn.Sequential(BlockLinear(96, 200), BlockLinear(200, 64))  # 200: padded to 208 / 256 along N
        if precision is not None:
            plan = apply_precision(m, precision, seed=3)
            assert plan.backend == "reference" and len(plan.modules) == 2
            set_step(m, step)
        x = torch.randn(4, 40, 96, generator=torch.Generator().manual_seed(1))
        m(x).square().mean().backward()
        return torch.cat([p.grad.flatten() for p in m.parameters()])

    cfg = PrecisionConfig(name=name, backend="reference", hadamard_block=128 if name == "quartet2" else 32)
    ref, a, b = grads(None), grads(cfg), grads(cfg)
    assert torch.isfinite(a).all() and torch.equal(a, b)
    cos = torch.nn.functional.cosine_similarity(a, ref, dim=0)
    assert cos > (0.995 if name == "mxfp8" else 0.95), cos  # 3 mantissa bits vs 1 (and unbiased noise)
    assert torch.equal(a, grads(cfg, step=2)) == (name == "mxfp8")


def test_keep_bf16_trains_with_the_last_block_unquantized(tmp_path, tiny_overrides):
    """nvfp4_recipe as its YAML ships it (keep_bf16: [blocks.-1.*]) on a two-block model: block 0 quantized,
    block 1 left BF16, written to quant_map.json with the pattern that kept each module."""
    from quartet.config import compose
    from quartet.runs import run_dir
    from quartet.train import train

    cfg = compose([*tiny_overrides, "model=llama_micro", "budget.tokens=4096", "precision=nvfp4_recipe",
                   f"run.out_dir={tmp_path}"])
    train(cfg)
    d = run_dir(cfg)
    assert all(l == l and l < 1e3 for l in _losses(d))
    qmap = json.loads((d / "quant_map.json").read_text())
    assert sorted(qmap["modules"]) == sorted(f"blocks.0.{m}" for m in ("attn.qkv", "attn.proj", "mlp.w12", "mlp.c_proj"))
    assert qmap["keep_bf16"] == {f"blocks.1.{m}": "blocks.-1.*" for m in ("attn.qkv", "attn.proj", "mlp.w12", "mlp.c_proj")}
    assert set(qmap["high_precision"]) >= set(qmap["keep_bf16"]) | {"tok_emb", "lm_head"}
