"""Tile-scaled quantizers (NVFP4 16x16, FP8 1x128 / 128x128) against the 1-D / per-tensor oracles, and the two
recipes that use them (nvfp4_recipe, fp8_deepseek) checked GEMM by GEMM through the quantized linear."""
from __future__ import annotations

import pytest
import torch

from quartet.quant.backend import ReferenceBackend
from quartet.quant.blockwise import fp8_blockwise_codes, fp8_blockwise_quantize, nvfp4_quantize_2d, tile_amax
from quartet.quant.formats import fp8_quantize
from quartet.quant.hadamard import block_hadamard
from quartet.quant.linear import QuantLinear, hadamard_signs
from quartet.quant.mx import nvfp4_quantize
from quartet.quant.quantizers import QuantizerSpec, reference_quantize
from quartet.quant.schemes import build_scheme


def _heavy(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    # a few outliers per row so tiles have different maxima
    return torch.randn(shape, generator=g) * torch.exp(2 * torch.randn(shape, generator=g))


def test_nvfp4_2d_is_transpose_symmetric_and_partial_tiles_are_zero_padded():
    w = _heavy((40, 56))  # neither dim a multiple of 16
    q, block, ts = nvfp4_quantize_2d(w)
    qt, block_t, ts_t = nvfp4_quantize_2d(w.t())
    assert torch.equal(qt, q.t()) and torch.equal(block_t, block.t()) and torch.equal(ts_t, ts)
    padded = torch.nn.functional.pad(w, (0, 8, 0, 8))
    assert torch.equal(nvfp4_quantize_2d(padded)[0][:40, :56], q)
    assert block.shape == (3, 4)


def test_nvfp4_2d_equals_the_1d_rule_when_tile_rows_repeat():
    """With the 16 rows of every tile identical, each tile's max is each row-group's max: the 2-D rule must give
    the 1-D NVFP4 oracle's values bitwise."""
    rows = _heavy((3, 64))
    w = rows.repeat_interleave(16, 0)  # (48, 64): every 16-row tile repeats one row
    q2, block2, ts2 = nvfp4_quantize_2d(w)
    q1, block1, ts1 = nvfp4_quantize(w)
    assert torch.equal(q2, q1) and torch.equal(ts2, ts1)
    assert torch.equal(block2.repeat_interleave(16, 0), block1)


def test_nvfp4_2d_zero_and_underflowing_tiles():
    w = torch.zeros(32, 32)
    w[0, 0] = 1e6
    w[16:, :16] = 2.0   # a tile ~2^19 below the tensor max: its E4M3 scale underflows
    q, block, _ = nvfp4_quantize_2d(w)
    assert q[0, 0] == pytest.approx(1e6, rel=1e-6)  # amax·(1/2688)·6 in float32
    assert (q[16:, :16] != 0).all()          # kept (coarsely), not zeroed
    assert (q[:16, 16:] == 0).all() and block[0, 1] == 1.0  # the all-zero tile


def test_nvfp4_2d_spec_rejects_sr_and_non_square_tiles():
    with pytest.raises(ValueError, match="square tiles"):
        QuantizerSpec("nvfp4", group=16, tile_rows=16, stochastic=True)
    with pytest.raises(ValueError, match="square tiles"):
        QuantizerSpec("nvfp4", group=16, tile_rows=8)


def test_fp8_blockwise_matches_row_and_tensor_scaling_on_single_tiles():
    x = _heavy((5, 128))
    q, s = fp8_blockwise_quantize(x, 1, 128)  # one 1x128 tile per row = per-row current scaling
    qr, sr = fp8_quantize(x, "e4m3", "row")
    assert torch.equal(q, qr) and torch.equal(s, sr)
    w = _heavy((128, 128), 1)
    qw, sw = fp8_blockwise_quantize(w, 128, 128)  # one block = per-tensor scaling
    qt, st = fp8_quantize(w, "e4m3", "tensor")
    assert torch.equal(qw, qt) and torch.equal(sw.reshape(()), st)


def test_fp8_blockwise_tiles_of_an_odd_matrix_match_per_tile_quantization():
    x = _heavy((200, 300), 2)
    for rows in (1, 128):
        q, s = fp8_blockwise_quantize(x, rows, 128)
        assert s.shape == (-(-200 // rows), 3)
        for i in range(0, 200, rows):
            for j in range(0, 300, 128):
                tile = x[i:i + rows, j:j + 128]
                qt, st = fp8_quantize(tile, "e4m3", "tensor")
                assert torch.equal(q[i:i + rows, j:j + 128], qt) and s[i // rows, j // 128] == st
    codes, scale = fp8_blockwise_codes(x, 128, 128)
    assert torch.equal(codes, codes.to(torch.float8_e4m3fn).float())  # codes are FP8 numbers
    assert torch.equal(tile_amax(x, 128, 128) * (1.0 / 448.0), scale)
    qw = fp8_blockwise_quantize(x, 128, 128)[0]
    assert torch.equal(fp8_blockwise_quantize(x.t(), 128, 128)[0], qw.t())  # 128x128 blocks: transpose-symmetric


class _Spy(ReferenceBackend):
    """The reference backend, recording every quantized operand (spec, values)."""

    def __init__(self):
        self.calls = []

    def quantize(self, x, spec, **kw):
        q = super().quantize(x, spec, **kw)
        self.calls.append((spec, kw.get("block"), kw.get("signs"), q.values))
        return q


def _layer(name, n=48, k=64, seed=0):
    from types import SimpleNamespace

    w = torch.nn.Parameter(_heavy((n, k), seed) * 0.02)
    spy = _Spy()
    return QuantLinear(w, build_scheme(SimpleNamespace(name=name)), spy, name="l", layer_index=3, seed=7), spy


def test_nvfp4_recipe_gemms_follow_the_paper():
    layer, spy = _layer("nvfp4_recipe")
    x = _heavy((32, 64), 5).requires_grad_(True)
    layer.set_step(4)
    layer(x).sum().backward()
    (fx, _, _, xq), (fw, _, _, wq), (dxe, _, _, _), (dxw, _, _, wtq), (dwe, b1, s1, _), (dwx, b2, s2, _) = spy.calls
    assert fw.tile_rows == 16 and dxw.tile_rows == 16 and fx.tile_rows == dwx.tile_rows == 1
    assert not fx.stochastic and not fw.stochastic and not dwx.stochastic and dxe.stochastic and dwe.stochastic
    assert torch.equal(wtq, wq.t())  # the input-gradient GEMM multiplies exactly the forward's W-hat, transposed
    # the Hadamard: 16 points, weight-gradient GEMM only, one sign vector for every layer, step and micro-batch
    assert b1 == b2 == 16 and s1 is s2 and torch.equal(s1, hadamard_signs(7, 0, 0, 0, "dw", 16))
    layer.set_step(5)
    spy.calls.clear()
    layer(x).sum().backward()
    assert torch.equal(spy.calls[4][2], s1)


def test_fp8_deepseek_gradients_equal_the_hand_written_recipe():
    layer, spy = _layer("fp8_deepseek", n=160, k=192)
    x = _heavy((136, 192), 6).requires_grad_(True)
    y = layer(x)
    e = _heavy(y.shape, 8) * 1e-3
    y.backward(e)
    act = QuantizerSpec("fp8", scaling="block", group=128)
    blk = QuantizerSpec("fp8", scaling="block", group=128, tile_rows=128)
    xq = reference_quantize(x.detach(), act).values
    wq = reference_quantize(layer.weight.detach(), blk).values
    assert torch.equal(y.detach(), xq @ wq.t())
    gx = reference_quantize(e, act).values @ wq           # E in 1x128 tiles along out-features, W-hat reused
    gw = reference_quantize(e.t(), act).values @ reference_quantize(xq.t(), act).values.t()  # both along tokens
    assert torch.equal(x.grad, gx) and torch.equal(layer.weight.grad, gw)
    assert len(spy.calls) == 5  # X, W, E (dX), E^T and X-hat^T (dW): the weight is quantized once


def test_reference_backend_rotates_then_tiles():
    x = _heavy((16, 32), 9)
    signs = hadamard_signs(1, 0, 0, 0, "dw", 16)
    spec = QuantizerSpec("nvfp4", group=16, stochastic=True)
    q = ReferenceBackend().quantize(x, spec, block=16, signs=signs, seed=3).values
    assert torch.equal(q, reference_quantize(block_hadamard(x, 16, signs), spec, seed=3).values)
