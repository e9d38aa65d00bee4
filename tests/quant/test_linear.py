"""The quantized linear: gradients equal the scheme's definition, conversion, stats, seeds, errors."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from quartet.errors import ConfigError
from quartet.model import BlockLinear, Llama
from quartet.quant import QuantLinear, apply_precision, collect_stats, set_step
from quartet.quant.config import PrecisionConfig
from quartet.quant.formats import fp8_quantize
from quartet.quant.hadamard import block_hadamard
from quartet.quant.mx import absmax_mxfp4, quest_mxfp4
from quartet.quant.quantizers import dge_derivative, ms_fp4_quantize


class TwoLayer(nn.Module):
    """A small stand-in with two block linears plus high-precision embedding / head."""

    def __init__(self, vocab=50, d=64, h=96):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.up = BlockLinear(d, h)
        self.down = BlockLinear(h, d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        return self.head(self.down(torch.relu(self.up(self.emb(idx)))))


def _layer(name, k=64, n=96, seed=0, **kw):
    torch.manual_seed(seed)
    m = nn.Sequential(BlockLinear(k, n))
    plan = apply_precision(m, PrecisionConfig(name=name, backend="reference", **kw), seed=123)
    assert list(plan.modules) == ["0"]
    return m[0]


def _run(layer, x, gy, step=7):
    layer.set_step(step)
    x = x.clone().requires_grad_(True)
    layer.weight.grad = None
    y = layer(x)
    y.backward(gy)
    return y.detach(), x.grad, layer.weight.grad.clone()


def _data(m=64, k=64, n=96, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, m // 2, k, generator=g), torch.randn(2, m // 2, n, generator=g) * 1e-3


def test_quartet_gradients_match_algorithm_1():
    layer = _layer("quartet")
    x, gy = _data()
    y, gx, gw = _run(layer, x, gy)
    w = layer.weight.detach()
    x2, e = x.reshape(-1, 64), gy.reshape(-1, 96)
    # forward: QuEST on the fixed 32-Hadamard basis of both operands
    xq, mx_ = quest_mxfp4(block_hadamard(x2, 32))
    wq, mw = quest_mxfp4(block_hadamard(w, 32))
    assert torch.allclose(y.reshape(-1, 96), xq @ wq.t(), atol=1e-6)
    # input grad: random-sign Hadamard along N on E and on the forward-quantized W^T, absmax x3/4 RTN,
    # then the forward mask and H^T
    s = layer.signs(0, "dx", 32, "cpu")
    g_hat = absmax_mxfp4(block_hadamard(e, 32, s)) @ absmax_mxfp4(block_hadamard(wq.t(), 32, s)).t()
    want_gx = block_hadamard(g_hat * mx_, 32, inverse=True)
    assert torch.allclose(gx.reshape(-1, 64), want_gx, atol=1e-7, rtol=1e-5)
    # weight grad: along tokens on E^T and the forward-quantized X^T
    s = layer.signs(0, "dw", 32, "cpu")
    g_hat = absmax_mxfp4(block_hadamard(e.t(), 32, s)) @ absmax_mxfp4(block_hadamard(xq.t(), 32, s)).t()
    want_gw = block_hadamard(g_hat * mw, 32, inverse=True)
    assert torch.allclose(gw, want_gw, atol=1e-7, rtol=1e-5)
    # and it approximates the true gradient
    assert (gw - e.t() @ x2).norm() / (e.t() @ x2).norm() < 0.5


def test_quartet_sr_uses_the_layer_seeds():
    layer = _layer("quartet_sr")
    x, gy = _data(seed=2)
    _, gx, _ = _run(layer, x, gy, step=3)
    w = layer.weight.detach()
    wq, _ = quest_mxfp4(block_hadamard(w, 32))
    xq, mx_ = quest_mxfp4(block_hadamard(x.reshape(-1, 64), 32))
    s = layer.signs(0, "dx", 32, "cpu")
    from quartet.quant.linear import _SLOT

    def sr(t, slot):
        return absmax_mxfp4(t, True, torch.Generator().manual_seed(layer.operand_seed(0, _SLOT[slot])))

    g_hat = sr(block_hadamard(gy.reshape(-1, 96), 32, s), "dx_e") @ sr(block_hadamard(wq.t(), 32, s), "dx_w").t()
    assert torch.allclose(gx.reshape(-1, 64), block_hadamard(g_hat * mx_, 32, inverse=True), atol=1e-7, rtol=1e-5)


def test_quest_fwd_is_masked_straight_through():
    layer = _layer("quest_fwd")
    x, gy = _data(seed=3)
    _, gx, gw = _run(layer, x, gy)
    w = layer.weight.detach()
    x2, e = x.reshape(-1, 64), gy.reshape(-1, 96)
    xq, mx_ = quest_mxfp4(block_hadamard(x2, 32))
    wq, mw = quest_mxfp4(block_hadamard(w, 32))
    assert torch.allclose(gx.reshape(-1, 64), block_hadamard((e @ wq) * mx_, 32, inverse=True), atol=1e-7, rtol=1e-5)
    assert torch.allclose(gw, block_hadamard((e.t() @ xq) * mw, 32, inverse=True), atol=1e-7, rtol=1e-5)


def test_backward_only_scheme_leaves_forward_exact():
    layer = _layer("rtn_bwd")
    x, gy = _data(seed=4)
    y, gx, gw = _run(layer, x, gy)
    w = layer.weight.detach()
    assert torch.allclose(y, x @ w.t(), atol=1e-6)
    e, x2 = gy.reshape(-1, 96), x.reshape(-1, 64)
    s = layer.signs(0, "dw", 32, "cpu")
    want = absmax_mxfp4(block_hadamard(e.t(), 32, s)) @ absmax_mxfp4(block_hadamard(x2.t(), 32, s)).t()
    assert torch.allclose(gw, want, atol=1e-7, rtol=1e-5)


def test_ms_fp4_forward_occ_and_dge_weight_gradient():
    layer = _layer("ms_fp4")
    x, gy = _data(seed=5)
    y, gx, gw = _run(layer, x, gy)
    w = layer.weight.detach()
    x2, e = x.reshape(-1, 64), gy.reshape(-1, 96)
    qx = ms_fp4_quantize(x2, clip_quantile=0.99)
    qw = ms_fp4_quantize(w, dge_k=5.0, dge_cap=3.0)
    assert torch.allclose(y.reshape(-1, 96), qx.values @ qw.values.t() + qx.residual @ qw.values.t(), atol=1e-6)
    e5 = fp8_quantize(e, "e5m2", "tensor")[0]
    assert torch.allclose(gx.reshape(-1, 64), e5 @ qw.values, atol=1e-7, rtol=1e-5)
    e5t = fp8_quantize(e.t().contiguous(), "e5m2", "tensor")[0]
    scaled = w / (w.abs().amax(1, keepdim=True) * (1.0 / 6))
    want = (e5t @ (qx.values + qx.residual)) * dge_derivative(scaled, 5.0, 3.0)
    assert torch.allclose(gw, want, atol=1e-7, rtol=1e-5)


def test_fp8_forward_is_e4m3_product():
    layer = _layer("fp8")
    x, gy = _data(seed=6)
    y, _, _ = _run(layer, x, gy)
    xq = fp8_quantize(x.reshape(-1, 64), "e4m3", "tensor")[0]
    wq = fp8_quantize(layer.weight.detach(), "e4m3", "tensor")[0]
    assert torch.allclose(y.reshape(-1, 96), xq @ wq.t(), atol=1e-6)


def test_bf16_is_bitwise_the_unquantized_model():
    torch.manual_seed(0)
    a = TwoLayer()
    b = copy.deepcopy(a)
    up, weight = b.up, b.up.weight
    plan = apply_precision(b, PrecisionConfig(name="bf16"))
    assert plan.modules == {} and b.up is up and type(up) is BlockLinear and up.weight is weight
    idx = torch.randint(0, 50, (4, 16))
    la, lb = a(idx).sum(), b(idx).sum()
    la.backward()
    lb.backward()
    assert torch.equal(la, lb)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa.grad, pb.grad)
    assert set(plan.high_precision) == {"emb", "up", "down", "head"}


def test_apply_precision_converts_exactly_block_linears():
    torch.manual_seed(0)
    model = Llama(2, 64, 2, 128, 32, ffn_multiple_of=32)
    block = model.block_linears()
    weights = {n: m.weight for n, m in block.items()}
    plan = apply_precision(model, PrecisionConfig(name="quartet"), seed=1)
    assert set(plan.modules) == set(block) and len(block) == 8
    for n, mod in model.named_modules():
        if n in block:
            assert isinstance(mod, QuantLinear) and mod.weight is weights[n]  # shared Parameter
    assert type(model.tok_emb) is nn.Embedding and type(model.lm_head) is nn.Linear
    assert set(plan.high_precision) == {"tok_emb", "lm_head"}
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["scheme"] == "quartet" and d["forward"] == "quest" and d["backward"] == "rtn_absmax"
    ops = d["modules"]["blocks.0.attn.qkv"]["operands"]
    assert ops["forward"] == {"X": "quest/g32", "W": "quest/g32", "transform": "hadamard32"}
    assert ops["grad_weight"]["transform"] == "random_hadamard32"
    assert d["backend"] == "reference" or d["backend"] in ("triton", "hopper_fp8", "blackwell_mxfp4")
    assert "quartet" in plan.summary()
    with pytest.raises(ConfigError):
        apply_precision(model, PrecisionConfig(name="quartet"))  # twice


def test_bad_configs_fail_loudly_at_start():
    with pytest.raises(ConfigError, match="unknown scheme"):
        apply_precision(TwoLayer(), PrecisionConfig(name="quartett"))
    with pytest.raises(ConfigError, match="precision.backend"):
        apply_precision(TwoLayer(), PrecisionConfig(name="quartet", backend="cuda_magic"))
    with pytest.raises(ConfigError, match="blackwell_mxfp4"):
        # a GPU backend asked for by name on a CPU model: an error, never a silent fallback
        apply_precision(TwoLayer(), PrecisionConfig(name="quartet", backend="blackwell_mxfp4"), device="cpu")
    with pytest.raises(ConfigError, match="hadamard_block"):
        apply_precision(TwoLayer(), PrecisionConfig(name="quartet", hadamard_block=48))


def test_stats_only_on_schedule():
    torch.manual_seed(0)
    m = TwoLayer()
    apply_precision(m, PrecisionConfig(name="quartet", stats_every=2))
    idx = torch.randint(0, 50, (2, 16))
    set_step(m, 1)
    m(idx).sum().backward()
    assert collect_stats(m) == {}
    set_step(m, 2)
    m(idx).sum().backward()
    st = collect_stats(m)
    for op in ("x", "w", "dx_e", "dx_w", "dw_e", "dw_x"):
        assert 0 <= st[f"q/up/{op}/rel_err"] < 1
        assert 0 <= st[f"q/up/{op}/underflow_frac"] <= 1
        assert st[f"q/up/{op}/scale_exp_min"] <= st[f"q/up/{op}/scale_exp_max"]
    assert 0 < st["q/up/x/clip_frac"] < 0.5 and "q/up/dx_e/clip_frac" not in st
    assert collect_stats(m) == {}  # cleared


def test_randomness_is_a_function_of_seed_step_layer():
    x, gy = _data(seed=7)
    a = _run(_layer("quartet_sr"), x, gy, step=5)
    b = _run(_layer("quartet_sr"), x, gy, step=5)
    c = _run(_layer("quartet_sr"), x, gy, step=6)
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    assert not torch.equal(a[2], c[2])
    # RTN backward still changes with the step: the Hadamard signs are re-drawn
    assert not torch.equal(_run(_layer("quartet"), x, gy, step=1)[2], _run(_layer("quartet"), x, gy, step=2)[2])


def test_ragged_token_count_and_autocast():
    layer = _layer("quartet")
    g = torch.Generator().manual_seed(8)
    x = torch.randn(5, 10, 64, generator=g)  # 50 tokens: padded along the dW reduction axis
    gy = torch.randn(5, 10, 96, generator=g)
    _, gx, gw = _run(layer, x, gy)
    true_gw = gy.reshape(-1, 96).t() @ x.reshape(-1, 64)
    assert torch.isfinite(gw).all() and (gw - true_gw).norm() / true_gw.norm() < 0.5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x.bfloat16().requires_grad_(True))
    assert y.dtype == torch.bfloat16


def test_vectorised_backward_draws_equal_the_scalar_rule():
    """backward_draws (what compiled fused layers upload per micro-batch) = hadamard_signs + operand_seed,
    over 64-bit seeds and call numbers."""
    from quartet.quant.linear import backward_draws, hadamard_signs, operand_seed

    rows = [(0, 0, 0, 0), (5, 7, 2, 4), (2**40 + 3, 9, 27, 2**33), (2**63 - 1, 123456, 3, 1)]
    signs, seeds = backward_draws(*(list(c) for c in zip(*rows)))
    assert signs.shape == (4, 2, 32) and seeds.shape == (4, 4) and seeds.dtype == torch.int64
    for i, (s, t, layer, call) in enumerate(rows):
        assert torch.equal(signs[i, 0], hadamard_signs(s, t, layer, call, "dx"))
        assert torch.equal(signs[i, 1], hadamard_signs(s, t, layer, call, "dw"))
        assert seeds[i].tolist() == [operand_seed(s, t, layer, call, o) for o in ("dx_e", "dx_w", "dw_e", "dw_x")]
    assert not torch.equal(signs[1], signs[2])
