"""GEMM engines, the Blackwell scale layout, the fused Quartet linear and the backend seam."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from quartet.kernels import gemm as G  # noqa: E402
from quartet.kernels import linear as L  # noqa: E402
from quartet.kernels.triton_quant import mx_quantize  # noqa: E402
from quartet.quant import hadamard, mx  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def test_swizzle_layout_matches_the_documented_tile_order():
    R, C = 200, 9  # padded to 256 x 12
    s = torch.randint(0, 255, (R, C), dtype=torch.uint8)
    flat = G.swizzle_mx_scales(s)
    assert flat.numel() == 256 * 12
    # element (r, c) lives in tile (r//128, c//4) at byte 16*(r%32) + 4*((r%128)//32) + c%4
    for r, c in [(0, 0), (31, 3), (32, 0), (127, 5), (130, 8), (199, 2)]:
        tile = (r // 128) * 3 + c // 4
        off = tile * 512 + 16 * (r % 32) + 4 * ((r % 128) // 32) + c % 4
        assert flat[off] == s[r, c]
    assert torch.equal(G.unswizzle_mx_scales(flat, R, C), s)


def _rot(x, signs):
    """The oracle rotation (bitwise equal to the kernels' fused rotation)."""
    return hadamard.block_hadamard(x.cpu(), 32, signs.cpu() if signs is not None else None)


def _reference_layer(x, w, e, s_dx, s_dw):
    """Quartet forward/backward with the oracle (RTN backward), float32, with the oracle rotation."""
    xh, mxk = mx.quest_mxfp4(_rot(x, None))
    wh, mwk = mx.quest_mxfp4(_rot(w, None))
    y = xh @ wh.t()
    qe = mx.absmax_mxfp4(_rot(e, s_dx))
    qwt = mx.absmax_mxfp4(_rot(wh.t().contiguous().bfloat16(), s_dx))
    dx = hadamard.block_hadamard((qe @ qwt.t()) * mxk, 32, inverse=True)
    qet = mx.absmax_mxfp4(_rot(e.t().contiguous(), s_dw))
    qxt = mx.absmax_mxfp4(_rot(xh.t().contiguous().bfloat16(), s_dw))
    dw = hadamard.block_hadamard((qet @ qxt.t()) * mwk, 32, inverse=True)
    return y, dx, dw


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("engine", ["triton", "triton_bool_mask", "triton_mask_bits"] + (
    ["hopper_fp8", "hopper_fp8_row", "hopper_fp8_right1", "hopper_fp8_right128", "hopper_fp8_bool_mask",
     "hopper_fp8_mask_bits"] if DEV == "cuda" and G.hopper_available() else []))
def test_fused_linear_matches_oracle(engine, monkeypatch):
    """The fused layer under every layout it can run: per-row or block FP8 scales, right operands per 128×128 or
    1×128 block, masks saved per element or packed (the variants benchmarks/layer_variants.py times)."""
    variants = {"_row": ("FP8_SCALING", "row"), "_right1": ("RIGHT_BLOCK", 1), "_right128": ("RIGHT_BLOCK", 128),
                "_bool_mask": ("MASK_BITS", False), "_mask_bits": ("MASK_BITS", True)}
    for suffix, (attr, value) in variants.items():
        if engine.endswith(suffix):
            monkeypatch.setattr(L, attr, value)
            engine = engine[: -len(suffix)]
    g = torch.Generator().manual_seed(0)
    T, K, N = (64, 64, 96) if DEV == "cpu" else (512, 256, 384)
    x = torch.randn(T, K, generator=g).bfloat16()
    w = (torch.randn(N, K, generator=g) * 0.1).bfloat16()
    e = torch.randn(T, N, generator=g).bfloat16()
    lin = L.QuartetLinear(K, N, engine=engine, stochastic=False, seed=3, device=DEV)
    with torch.no_grad():
        lin.weight.copy_(w.float())
    xd = x.to(DEV).requires_grad_(True)
    y = lin(xd)
    y.backward(e.to(DEV))
    # the backward draws the reference QuantLinear's signs of (seed 3, step 0, layer 0, call 0)
    st = L._Ctx("triton", False, seed=3)
    ry, rdx, rdw = _reference_layer(x, w, e, st.signs(0, "dx", "cpu"), st.signs(0, "dw", "cpu"))
    assert _rel(y.cpu(), ry) < 1e-2  # bf16 output rounding (exact inputs)
    assert _rel(xd.grad.cpu(), rdx) < 2e-2
    assert _rel(lin.weight.grad.cpu(), rdw) < 2e-2
    if engine == "hopper_fp8":
        assert lin.state.flushed.item() == 0


@pytest.mark.gpu
def test_hopper_fp8_gemm_is_exact_up_to_fp8_accumulation():
    if not G.hopper_available():
        pytest.skip("needs FP8 tensor cores")
    torch.manual_seed(1)
    for axis_a, axis_b, fa, fb in [(-1, -1, "e4m3", "e4m3"), (0, 0, "e5m2", "e4m3"), (-1, 0, "e4m3", "e4m3")]:
        a = torch.randn(*((1024, 2048) if axis_a == -1 else (2048, 1024)), device="cuda", dtype=torch.bfloat16)
        b = torch.randn(*((1536, 2048) if axis_b == -1 else (2048, 1536)), device="cuda", dtype=torch.bfloat16)
        qa = mx_quantize(a, axis=axis_a, rule="absmax", fp8=fa, out_dtype=torch.float32)
        qb = mx_quantize(b, axis=axis_b, rule="absmax", fp8=fb, out_dtype=torch.float32)
        out = G.hopper_fp8_mm(qa, qb, out_dtype=torch.float32)
        ref = qa.deq.double() @ qb.deq.double().t()
        assert qa.flushed.item() == 0 and qb.flushed.item() == 0
        assert _rel(out, ref) < 1e-4  # the stated tolerance: Hopper FP8 accumulation (anchors: 1e-5..5e-5)


def _binade_spread(shape, gen_device="cuda"):
    """Per-row and per-128-column powers of two in [2^-4, 2^4]: block scales that differ from block to block, so a
    GEMM that reads a scale from the wrong place (layout, transposition) is caught. (A 128×128 block then spans
    at most 8 binades of factors plus the data's own: inside e4m3's ~14, so nothing flushes.)"""
    r = torch.exp2(torch.randint(-4, 5, (shape[0], 1), device=gen_device).float())
    c = torch.exp2(torch.randint(-4, 5, (1, -(-shape[1] // 128)), device=gen_device).float()).repeat_interleave(128, 1)
    return r * c[:, : shape[1]]


@pytest.mark.gpu
@pytest.mark.parametrize("right_block", [128, 1])
def test_hopper_block_scaled_gemm_is_exact_up_to_fp8_accumulation(right_block):
    if not G.hopper_available():
        pytest.skip("needs FP8 tensor cores")
    torch.manual_seed(2)
    for axis_a, axis_b in [(-1, -1), (0, 0), (-1, 0)]:
        sa, sb = ((1024, 2048) if axis_a == -1 else (2048, 1024)), ((1536, 2048) if axis_b == -1 else (2048, 1536))
        a = (torch.randn(*sa, device="cuda") * _binade_spread(sa)).to(torch.bfloat16)
        b = (torch.randn(*sb, device="cuda") * _binade_spread(sb)).to(torch.bfloat16)
        qa = mx_quantize(a, axis=axis_a, rule="absmax", fp8="e4m3", fp8_block=1, out_dtype=torch.float32)
        qb = mx_quantize(b, axis=axis_b, rule="absmax", fp8="e4m3", fp8_block=right_block, out_dtype=torch.float32)
        assert qa.flushed.item() == 0 and qb.flushed.item() == 0
        assert torch.equal(qa.fp8_values(), qa.deq) and torch.equal(qb.fp8_values(), qb.deq)
        out = G.hopper_fp8_mm(qa, qb, out_dtype=torch.float32)
        ref = qa.deq.double() @ qb.deq.double().t()
        assert _rel(out, ref) < 1e-4  # the stated tolerance: Hopper FP8 accumulation
    if right_block == 128:  # a 128x128-scaled operand cannot be the left one
        with pytest.raises(ValueError, match="1x128 blocks"):
            G.hopper_fp8_mm(qb, qa)


@pytest.mark.gpu
def test_backend_seam_on_gpu():
    from quartet.quant.backend import get_backend
    from quartet.quant.quantizers import QuantizerSpec, reference_quantize

    dev = torch.device("cuda")
    auto = get_backend("auto", dev, [QuantizerSpec("quest"), QuantizerSpec("absmax", stochastic=True)])
    assert auto.name in ("hopper_fp8", "blackwell_mxfp4")
    x = torch.randn(256, 512, device=dev)
    for name in ("triton", "hopper_fp8"):
        be = get_backend(name, dev)
        for spec in (QuantizerSpec("quest"), QuantizerSpec("absmax"), QuantizerSpec("ocp")):
            q = be.quantize(x, spec)
            ref = reference_quantize(x, spec)
            assert torch.equal(q.values, ref.values), (name, spec)
            if spec.kind == "quest":
                assert torch.equal(q.grad_factor, ref.grad_factor)
        qa, qb = be.quantize(x, QuantizerSpec("quest"), block=32), be.quantize(x[:128], QuantizerSpec("quest"), block=32)
        out = be.gemm(qa, qb)
        # stated tolerances: FP8 accumulation (hopper_fp8) 1e-4; bf16 output rounding (triton) 4e-3
        assert _rel(out, qa.values.double() @ qb.values.double().t()) < (1e-4 if name == "hopper_fp8" else 4e-3)
    with pytest.raises(Exception, match="nvfp4|MX quantizers"):
        get_backend("hopper_fp8", dev, [QuantizerSpec("nvfp4", group=16)])


@pytest.mark.parametrize("scheme", ["quartet", "quest_fwd", "rtn_bwd"])
def test_seam_quantlinear_with_triton_backend_matches_reference(scheme):
    """The quantization library's QuantLinear driven by the kernel backend equals the reference backend
    (RTN schemes: same quantized values; GEMMs differ only by bf16 vs float32 accumulation)."""
    from quartet.kernels.backends import make_backend
    from quartet.quant.backend import ReferenceBackend
    from quartet.quant.linear import QuantLinear
    from quartet.quant.config import PrecisionConfig
    from quartet.quant.schemes import build_scheme

    sch = build_scheme(PrecisionConfig(name=scheme))
    g = torch.Generator().manual_seed(2)
    w = torch.nn.Parameter((torch.randn(64, 96, generator=g) * 0.1).bfloat16().float())
    x = torch.randn(32, 96, generator=g).bfloat16().float()
    e = torch.randn(32, 64, generator=g).bfloat16().float()
    outs = []
    for be in (make_backend("triton"), ReferenceBackend()):
        w.grad = None
        layer = QuantLinear(w, sch, be, seed=5)
        xd = x.clone().to(DEV).requires_grad_(True) if DEV == "cuda" else x.clone().requires_grad_(True)
        if DEV == "cuda":
            layer = layer.cuda()
        y = layer(xd)
        y.backward(e.to(y.device))
        outs.append((y.detach().cpu(), xd.grad.cpu(), w.grad.cpu()))
    for a, b in zip(outs[0], outs[1]):
        assert _rel(a, b) < 1e-2


def test_fused_linear_pads_tokens_and_adapter_covers_quartet_schemes():
    g = torch.Generator().manual_seed(4)
    base = torch.nn.Linear(64, 32, bias=False)
    assert L.fused_linear(base, "fp8", "triton") is None
    lin = L.fused_linear(base, "quartet_sr", "triton", seed=1)
    assert lin.weight is base.weight and lin.state.stochastic
    lin = lin.to(DEV)
    x = torch.randn(2, 21, 64, generator=g).bfloat16().to(DEV).requires_grad_(True)  # 42 tokens: not a multiple of 32
    y = lin(x)
    assert y.shape == (2, 21, 32)
    y.float().sum().backward()
    assert x.grad.shape == x.shape and torch.isfinite(x.grad.float()).all()
    assert torch.isfinite(lin.weight.grad).all()
    with pytest.raises(ValueError, match="multiples of 32"):
        L.QuartetLinear(48, 32, engine="triton")(torch.randn(4, 48))


def test_fused_linear_slices_its_output_only_where_tokens_were_padded():
    """A full slice y[:T] would cost a zero tensor of the whole output plus a copy in its backward."""
    lin = L.QuartetLinear(64, 32, engine="triton", device=DEV)
    for tokens, sliced in ((64, False), (42, True)):
        x = torch.randn(tokens, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        y = lin(x)
        names, todo = set(), [y.grad_fn]
        while todo:
            fn = todo.pop()
            if fn is not None:
                names.add(type(fn).__name__)
                todo.extend(f for f, _ in fn.next_functions)
        assert any("Slice" in n for n in names) == sliced, names
        assert y.shape == (tokens, 32)
