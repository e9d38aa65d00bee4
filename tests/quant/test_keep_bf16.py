"""precision.keep_bf16, the per-module precision map: which block linears stay high precision under any scheme,
checked at compose/resolve time and at conversion, recorded in the quant map, part of the run id when set."""
from __future__ import annotations

import pytest
import torch

from quartet.errors import ConfigError
from quartet.model import BlockLinear, Llama, block_linear_names
from quartet.quant import QuantLinear, apply_precision
from quartet.quant.config import PrecisionConfig


def _model(n_layer=3):
    torch.manual_seed(0)
    return Llama(n_layer, 64, 2, 128, 32, ffn_multiple_of=32)


def test_block_linear_names_are_the_models():
    for n in (1, 3):
        assert block_linear_names(n) == list(_model(n).block_linears())


def test_kept_modules_stay_unconverted_and_the_rest_keep_their_layer_index():
    model = _model()
    cfg = PrecisionConfig(name="quartet", keep_bf16=["blocks.-1.*", "blocks.0.attn.qkv", "blocks.1.mlp"])
    plan = apply_precision(model, cfg, seed=1)
    kept = {f"blocks.2.{m}": "blocks.-1.*" for m in ("attn.qkv", "attn.proj", "mlp.w12", "mlp.c_proj")}
    kept |= {"blocks.0.attn.qkv": "blocks.0.attn.qkv", "blocks.1.mlp.w12": "blocks.1.mlp",
             "blocks.1.mlp.c_proj": "blocks.1.mlp"}
    assert plan.keep_bf16 == kept and plan.to_dict()["keep_bf16"] == kept
    for name, mod in model.named_modules():
        if name in kept:
            assert type(mod) is BlockLinear
    names = block_linear_names(3)
    assert set(plan.modules) == set(names) - set(kept)
    for name, info in plan.modules.items():  # the index (and so every random draw) is the one without keep_bf16
        assert info["layer_index"] == names.index(name)
        assert isinstance(model.get_submodule(name), QuantLinear)
    assert set(plan.high_precision) == set(kept) | {"tok_emb", "lm_head"}
    assert "keep_bf16" in plan.summary()


@pytest.mark.parametrize("pattern, message", [
    ("blocks.7.*", "'blocks.7.\\*' matches no block linear"),
    ("lm_head", "'lm_head' matches no block linear"),
    ("blocks.-4.*", "blocks has only 3 entries"),
    ("*.-1.attn", "a negative index needs a module list"),
])
def test_a_pattern_that_matches_nothing_is_a_one_line_error_naming_it(pattern, message):
    for scheme in ("quartet", "bf16"):
        with pytest.raises(ConfigError, match=message) as exc:
            apply_precision(_model(), PrecisionConfig(name=scheme, keep_bf16=["blocks.0.*", pattern]))
        assert "\n" not in str(exc.value) and str(exc.value).startswith("precision.keep_bf16")


def test_bad_pattern_fails_when_the_config_resolves_before_any_model_exists():
    from quartet.config import compose, resolve

    cfg = compose(["model=llama_micro", "precision=nvfp4_recipe", "precision.keep_bf16=[blocks.5.*]"])
    with pytest.raises(ConfigError, match="'blocks.5.\\*' matches no block linear"):
        resolve(cfg)
    resolve(compose(["model=llama_micro", "precision=nvfp4_recipe"]))  # the shipped default resolves


def test_keep_bf16_is_part_of_the_run_id_only_when_set():
    from quartet.config import compose
    from quartet.runs import run_id, semantic_config

    base = compose(["model=llama_30m", "precision=quartet"])
    assert "keep_bf16" not in semantic_config(base)["precision"]  # ids of runs made before the option: unchanged
    assert run_id(compose(["model=llama_30m", "precision=quartet", "precision.keep_bf16=[]"])) == run_id(base)
    one = compose(["model=llama_30m", "precision=quartet", "precision.keep_bf16=[blocks.-1.*]"])
    two = compose(["model=llama_30m", "precision=quartet", "precision.keep_bf16=[blocks.0.*]"])
    assert len({run_id(base), run_id(one), run_id(two)}) == 3
