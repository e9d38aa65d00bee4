"""Config composition, derived values, the paper's parameter counts and clear bad-input errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from quartet.config import compose, count_non_embedding_params, load_config_file, resolve
from quartet.errors import ConfigError
from quartet.model import Llama
from quartet.runs import run_dir, run_id

REPO = Path(__file__).resolve().parents[2]

# The paper's non-embedding parameter counts (Quartet Table 4 / code; 1600M and 3200M from main_setup.sh).
PAPER_N = {
    "llama_30m": 30_482_560, "llama_50m": 49_556_736, "llama_100m": 102_777_856, "llama_200m": 203_188_480,
    "llama_430m": 443_068_288, "llama_800m": 822_151_168, "llama_1600m": 1_586_076_160,
    "llama_3200m": 3_171_068_928, "llama_7b": 6_476_271_616,
}


@pytest.mark.parametrize("name", list(PAPER_N))
def test_paper_parameter_counts(name):
    cfg = compose([f"model={name}", "data.vocab_size=32000"])
    res = resolve(cfg)
    assert res.n_params == PAPER_N[name]
    # The instantiated module agrees with the formula (meta device: no memory even for 7B).
    with torch.device("meta"):
        model = Llama.from_config(cfg.model, 32000)
    assert model.num_params(non_embedding=True) == PAPER_N[name]
    assert model.num_params(non_embedding=False) == PAPER_N[name] + 2 * 32000 * cfg.model.d_model


def test_paper_shapes_and_lrs():
    expect = {"llama_30m": (6, 640, 5, 1.2e-3), "llama_50m": (7, 768, 6, 1.2e-3), "llama_100m": (8, 1024, 8, 6e-4),
              "llama_200m": (10, 1280, 10, 3e-4), "llama_800m": (16, 2048, 16, 7.5e-5),
              "llama_7b": (32, 4096, 32, 9.375e-6)}
    for name, (layers, width, heads, lr) in expect.items():
        m = compose([f"model={name}"]).model
        assert (m.n_layer, m.d_model, m.n_head, m.lr, m.seq_len, m.batch_size) == (layers, width, heads, lr, 512, 512)


def test_steps_and_warmup_derived_like_the_paper():
    # 30M at D/N = 25, 512 x 512 tokens per step: 2861 steps, warm-up 286 (ITERATIONS / 10).
    for ratio, steps in ((25, 2861), (50, 5722), (100, 11444), (800, 91552)):
        res = resolve(compose(["model=llama_30m", f"budget=dn{ratio}"]))
        assert (res.steps, res.warmup_steps, res.tokens_per_step) == (steps, steps // 10, 262144)
        assert res.tokens == steps * 262144 and res.lr == 1.2e-3
    res = resolve(compose(["model=llama_50m", "budget=dn25"]))
    assert res.steps == 4768
    res = resolve(compose(["model=llama_30m", "budget=tokens", "budget.tokens=262144000"]))
    assert res.steps == 1000
    # derived values land in cfg.derived and survive a save / replay
    cfg = compose(["model=llama_30m", "budget=dn25"])
    resolve(cfg)
    assert cfg.derived.steps == 2861 and cfg.derived.n_params == PAPER_N["llama_30m"]


def test_accumulation_and_world_size():
    res = resolve(compose(["model=llama_30m", "optim.micro_batch_size=64"]), world_size=8)
    assert res.accum_steps(8) == 1  # the paper's 8 GPUs x 64 sequences
    res = resolve(compose(["model=llama_30m", "optim.micro_batch_size=64"]), world_size=1)
    assert res.accum_steps(1) == 8


@pytest.mark.parametrize("overrides, needle", [
    (["model=llama_9000m"], "model=llama_9000m: unknown model; allowed: llama_100m"),
    (["precision=fp9"], "precision=fp9: unknown precision; allowed:"),
    (["budget=dn3"], "budget=dn3: unknown budget; allowed:"),
    (["model.widht=3"], "model.widht: unknown key; allowed keys of model:"),
    (["optim.lr=fast"], "optim.lr: bad value 'fast'; expected float"),
    (["budget.tokens_per_param=0"], "budget.tokens_per_param=0.0: must be > 0"),
    (["budget.tokens_per_param=-5"], "budget.tokens_per_param=-5.0: must be > 0"),
    (["budget=tokens", "budget.tokens=0"], "budget.tokens=0: must be > 0"),
    (["budget.tokens=100"], "set exactly one of budget.tokens_per_param and budget.tokens"),
    (["optim.micro_batch_size=3"], "optim.batch_size=16 is not divisible by optim.micro_batch_size=3; allowed"),
    (["data.vocab_size=70000", "data.token_dtype=uint16"], "data.vocab_size=70000 does not fit data.token_dtype=uint16"),
    (["data.token_dtype=int8"], "data.token_dtype='int8': allowed: auto, uint16, uint32"),
    (["logging.wandb.mode=loud"], "logging.wandb.mode='loud': allowed: offline, online, disabled"),
    (["derived.steps=5"], "derived.steps=5: derived values are computed, never set"),
    (["run.threads=-3"], "run.threads=-3: allowed 0 (the default number of torch threads) or a positive number of threads"),
])
def test_bad_inputs_are_one_line_config_errors(overrides, needle):
    with pytest.raises(ConfigError) as info:
        resolve(compose(overrides))
    msg = str(info.value)
    assert needle in msg
    assert "\n" not in msg


def test_vocab_dtype_auto():
    assert resolve(compose(["data.vocab_size=65536"])).token_dtype == "uint16"
    assert resolve(compose(["data.vocab_size=65537"])).token_dtype == "uint32"


def test_run_id_is_semantic(tmp_path):
    a = compose(["model=llama_30m", "budget=dn25"])
    b = compose(["model=llama_30m", "budget=dn25", "run.name=other", f"run.out_dir={tmp_path}",
                 "logging=quiet", "optim.micro_batch_size=64", "optim.lr=0.0012"])
    assert run_id(a) == run_id(b)
    assert run_id(a).startswith("llama_30m-dn25-bf16-s0-")
    assert run_dir(b) == tmp_path / "other" / run_id(a)
    for change in (["run.seed=1"], ["budget=dn50"], ["optim.lr=0.001"], ["model=llama_50m"], ["data.vocab_size=4096"]):
        assert run_id(compose(["model=llama_30m", "budget=dn25", *change])) != run_id(a), change


def test_config_file_replay_round_trip(tmp_path):
    from omegaconf import OmegaConf

    cfg = compose(["model=llama_100m", "budget=dn50", "run.seed=3"])
    resolve(cfg)
    OmegaConf.save(cfg, tmp_path / "config.yaml", resolve=True)
    again = load_config_file(tmp_path)
    assert resolve(again).steps == resolve(cfg).steps
    assert run_id(again) == run_id(cfg)
    with pytest.raises(ConfigError, match="--config-file: .* does not exist"):
        load_config_file(tmp_path / "nope")


def _cli(*args: str, env_extra: dict | None = None, timeout: int = 600):
    env = {**os.environ, "WANDB_MODE": "disabled", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "quartet.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=timeout)


def test_cli_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path):
    out = _cli("train", "model=llama_9000m", f"run.out_dir={tmp_path}")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("quartet: error: model=llama_9000m: unknown model; allowed:")
    assert "llama_30m" in lines[0]
    assert not list(tmp_path.rglob("summary.json")) and not list(tmp_path.rglob("*"))
    out = _cli("train", "optim.micro_batch_size=5", f"run.out_dir={tmp_path}")
    assert out.returncode == 2 and "optim.micro_batch_size=5" in out.stderr and not list(tmp_path.rglob("*"))


def test_cli_print_config_shows_derived_values(tmp_path):
    from quartet.train import cli_main

    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli_main(["model=llama_30m", "budget=dn25", "--print-config", f"run.out_dir={tmp_path}"]) == 0
    text = buf.getvalue()
    assert "steps: 2861" in text and "warmup_steps: 286" in text and "n_params: 30482560" in text
    assert "# run_id: llama_30m-dn25-bf16-s0-" in text
    assert not list(tmp_path.rglob("*"))  # printing writes nothing


def test_compose_leaves_an_outer_hydra_alone():
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from quartet.paths import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        before = GlobalHydra.instance().config_loader()
        assert compose(["model=llama_30m"]).model.name == "llama_30m"
        assert GlobalHydra.instance().is_initialized() and GlobalHydra.instance().config_loader() is before


def test_cluster_group_is_optional_and_selectable():
    assert compose([]).cluster is None
    assert compose(["cluster=local"]).cluster is not None
    assert compose(["+cluster=local"]).cluster == compose(["cluster=local"]).cluster
    with pytest.raises(ConfigError, match="cluster=nope: unknown cluster; allowed: local"):
        compose(["cluster=nope"])
    # cluster settings never change the run id
    assert run_id(compose(["cluster=local"])) == run_id(compose([]))


def test_own_corpus_overrides_compose_to_the_checkout_s_docs_and_sources():
    """``quartet.paths.own_corpus_overrides``: the corpus the multi-GPU checks and the FSDP memory benchmark train on
    composes into a ``data=files`` config over folders of this checkout that exist and hold text."""
    from quartet.paths import REPO_ROOT, own_corpus_overrides

    cfg = compose(own_corpus_overrides(vocab_size=1024, val_fraction=0.1))
    paths = [Path(p) for p in cfg.data.paths]
    assert paths == [REPO_ROOT / "docs", REPO_ROOT / "quartet"]
    assert all(p.is_dir() and any(p.rglob("*.md" if p.name == "docs" else "*.py")) for p in paths)
    assert cfg.data.vocab_size == 1024 and cfg.data.val_fraction == pytest.approx(0.1)
