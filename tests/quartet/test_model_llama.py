"""The Llama model: block-linear seam, init, norm precision, causality; the optimizer groups."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from quartet.model import BlockLinear, Llama, RMSNorm, ffn_hidden
from quartet.train import param_groups


def small(layers=3, d=64, heads=2, vocab=97, seq=32):
    torch.manual_seed(0)
    return Llama(layers, d, heads, vocab, seq, ffn_multiple_of=32)


def test_block_linears_are_exactly_the_block_projections():
    m = small()
    names = sorted(m.block_linears())
    expect = sorted(f"blocks.{i}.{s}" for i in range(3) for s in ("attn.qkv", "attn.proj", "mlp.w12", "mlp.c_proj"))
    assert names == expect
    # every other linear-like module is a plain one, never BlockLinear
    others = [n for n, mod in m.named_modules() if isinstance(mod, (nn.Linear, nn.Embedding)) and n not in names]
    assert sorted(others) == ["lm_head", "tok_emb"]
    assert type(m.lm_head) is nn.Linear and type(m.tok_emb) is nn.Embedding
    h = ffn_hidden(64, 32)
    shapes = {n.split(".", 2)[2]: tuple(mod.weight.shape) for n, mod in m.block_linears().items() if n.startswith("blocks.0")}
    assert shapes == {"attn.qkv": (192, 64), "attn.proj": (64, 64), "mlp.w12": (2 * h, 64), "mlp.c_proj": (64, h)}
    assert all(mod.bias is None for mod in m.block_linears().values()) and m.lm_head.bias is None


def test_hidden_rule_matches_paper():
    assert [ffn_hidden(d) for d in (640, 768, 1024, 1280, 1664, 2048, 4096)] == [1792, 2048, 2816, 3584, 4608, 5632, 11008]


def test_init_std_and_residual_scaling():
    torch.manual_seed(0)
    m = Llama(8, 512, 4, 1000, 16)
    std = lambda t: t.float().std().item()  # noqa: E731
    assert std(m.tok_emb.weight) == pytest.approx(0.02, rel=0.02)
    assert std(m.lm_head.weight) == pytest.approx(0.02, rel=0.02)
    assert std(m.blocks[0].attn.qkv.weight) == pytest.approx(0.02, rel=0.02)
    resid = 0.02 / math.sqrt(2 * 8)
    assert std(m.blocks[3].attn.proj.weight) == pytest.approx(resid, rel=0.03)
    assert std(m.blocks[3].mlp.c_proj.weight) == pytest.approx(resid, rel=0.03)
    assert torch.all(m.blocks[0].attn_norm.weight == 1)


def test_rmsnorm_computes_in_float32():
    norm = RMSNorm(8)
    x = (torch.randn(4, 8) * 1e3).to(torch.bfloat16)
    ref = x.float() / torch.sqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
    out = norm(x)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), ref.to(torch.bfloat16).float(), atol=1e-2)


def test_causal_and_loss_shapes():
    m = small()
    x = torch.randint(0, 97, (2, 32))
    logits = m(x)
    assert logits.shape == (2, 32, 97)
    x2 = x.clone()
    x2[:, 20:] = (x2[:, 20:] + 1) % 97  # change the future
    assert torch.allclose(m(x2)[:, :20], logits[:, :20], atol=1e-5)
    loss = m(x, x)
    assert loss.ndim == 0 and 3.5 < loss.item() < 6.0  # ~ln(97) at init
    assert m(x, x, reduction="sum").item() == pytest.approx(loss.item() * 64, rel=1e-5)
    with pytest.raises(ValueError, match="longer than the model's seq_len"):
        m(torch.zeros(1, 33, dtype=torch.long))


def test_weight_decay_only_on_block_linear_weights():
    m = small()
    decay_ids = {id(mod.weight) for mod in m.block_linears().values()}
    groups = param_groups(m, decay_ids, 0.1)
    decayed = {id(p) for p in groups[0]["params"]}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert decayed == decay_ids
    names_not = {n for n, p in m.named_parameters() if id(p) not in decayed}
    assert "tok_emb.weight" in names_not and "lm_head.weight" in names_not and "norm.weight" in names_not
    assert all("norm" in n or n in ("tok_emb.weight", "lm_head.weight") for n in names_not)


def test_model_imports_with_torch_only():
    import subprocess
    import sys

    code = ("import sys; import quartet.model as m; "
            "bad=[k for k in sys.modules if k.split('.')[0] in ('hydra','omegaconf','wandb','numpy_','tokenizers')]; "
            "print(bad); assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
