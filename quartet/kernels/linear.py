"""The fused Quartet linear layer: forward QuEST, backward absmax×3/4 (RTN or SR), all three GEMMs quantized.

Three GEMMs of ``Y = X Wᵀ`` (X: T × in, W: out × in, E = dL/dY: T × out), each ``a @ b.T`` with
32-groups and a 32-Hadamard along the reduction axis:

=========  ===================================  ====================================  ==========
GEMM       a                                    b                                     reduces
=========  ===================================  ====================================  ==========
forward    QuEST(X H)            (T, in)        QuEST(W H)             (out, in)      in
dX̂        absmax(E D H)         (T, out)       absmax(Ŵᵀ D H)         (in, out)      out
dŴ        absmax(Eᵀ D H)        (out, T)       absmax(X̂ᵀ D H)         (in, T)        T
=========  ===================================  ====================================  ==========

``D`` are the step's random signs (applied before ``H``). Every operand is produced by one fused
kernel straight from the stored tensor (``Ŵᵀ``, ``Eᵀ``, ``X̂ᵀ`` are never materialised), and the
gradients leave through the masked inverse rotation ``dX = (dX̂ ⊙ M_X) Hᵀ`` (same for W).
The ×4/3 of each backward operand rides in the FP8 row scales, so the 16/9 output factor is free.

GEMM engines: ``hopper_fp8`` (FP8 tensor cores on exactly folded values), ``blackwell_mxfp4``,
``triton`` (BF16 GEMM on dequantized values).
"""
from __future__ import annotations

import os

import torch

from quartet.kernels import fp8_block_linear, fp8_linear
from quartet.kernels import gemm as G
from quartet.kernels.triton_quant import masked_inverse_hadamard, mx_quantize, prepare_device, signs_to_bits
from quartet.quant.linear import OPERANDS, QuantLinear, backward_draws, hadamard_signs, operand_seed

ENGINES = ("hopper_fp8", "blackwell_mxfp4", "triton")
#: how the FP8 fold picks each row's exponent ("exact" extra kernel pass, one-pass "bound", or "fused":
#: one full pass + a cheap in-place fold; see mx_quantize)
ROW_EXP = "fused"
#: how the hopper engine scales its FP8 operands: "block" — one scale per 1×128 block of the left
#: operand and per 128×128 block of the right one, written by the quantizer in a single pass and
#: multiplied by ``F.scaled_mm``'s block-wise recipes (needs in/out features that are multiples of 128;
#: tokens are zero-padded to 128) — or "row": one scale per row (``torch._scaled_mm`` rowwise), which
#: needs each row's largest group exponent first (ROW_EXP)
FP8_SCALING = "block"
#: block rows of the two GEMM operands when block-scaled: left (X, E, Eᵀ) 1×128; right (W, Ŵᵀ, X̂ᵀ) 128×128 or
#: 1×128. cuBLAS multiplies two 1×128-scaled operands too, and the 1×128 quantizer tile is cheaper, but the GEMMs
#: are slower by more than the quantizer saves, so 128×128 stays. ``QUARTET_RIGHT_BLOCK`` overrides it
#: (benchmarks/layer_variants.py times both in one process by setting this attribute before each variant is built).
#: Read when a layer runs, and kept with what it saves for the backward. Measured: docs/kernels.md, tuning table.
LEFT_BLOCK = 1
RIGHT_BLOCK = int(os.environ.get("QUARTET_RIGHT_BLOCK", "128"))
#: save the forward's QuEST masks packed (one int32 word per 32-group) instead of one bool per element: an eighth of
#: the bytes written by the forward quantizers, read by the backward's inverse rotations, and held between the two.
#: ``QUARTET_MASK_BITS=0`` saves bool masks instead. Measured: docs/kernels.md, tuning table.
MASK_BITS = os.environ.get("QUARTET_MASK_BITS", "1") == "1"


class _Ctx:
    """Per-layer state shared with the autograd function: engine, rounding, seeds, flush counter.

    Seeds and Hadamard signs follow the reference :class:`~quartet.quant.linear.QuantLinear` rule
    exactly: operand seed = ``mix_seed(run seed, step, layer index, micro-batch call, slot)`` (slots of
    ``dx_e, dx_w, dw_e, dw_x``; truncated to 31 bits as every kernel backend does) and one set of
    signs per backward GEMM from ``mix_seed(..., call, 17 | 18)``. So a fused run draws the same
    random Hadamard signs as a reference run of the same seed, step, layer and micro-batch, and the DDP
    numbering of ``set_step(model, step, first_call)`` carries over unchanged. ``graph_safe=True``
    draws them on the device from the CUDA generator instead (seeded by ``torch.manual_seed``), so
    that a captured CUDA graph gets fresh signs and SR streams on every replay.
    """

    def __init__(self, engine: str, stochastic: bool, seed: int = 0, graph_safe: bool = False,
                 layer_index: int = 0):
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        self.engine = engine
        self.stochastic = stochastic
        self.seed = int(seed)
        self.layer_index = int(layer_index)
        self.graph_safe = graph_safe
        self.step = 0
        self.calls = 0
        self.flushed: torch.Tensor | None = None

    def operand_seed(self, call: int, slot: str, device=None):
        """SR seed of one backward operand (``dx_e``, ``dx_w``, ``dw_e``, ``dw_x``) of micro-batch ``call``."""
        if self.graph_safe:
            return torch.randint(0, 2**31 - 1, (1,), device=device, dtype=torch.int64)
        return operand_seed(self.seed, self.step, self.layer_index, call, slot) & 0x7FFF_FFFF

    def signs(self, call: int, gemm: str, device) -> torch.Tensor:
        """Random Hadamard signs of backward GEMM ``gemm`` (``dx`` / ``dw``) of micro-batch ``call``."""
        if self.graph_safe:
            return torch.randint(0, 2, (32,), device=device).float() * 2 - 1
        return hadamard_signs(self.seed, self.step, self.layer_index, call, gemm, 32, device)

    def sign_arg(self, call: int, gemm: str, device):
        """The signs as the quantizer takes them: a 32-bit mask passed by value (no host-to-device copy,
        which would make the host wait for the GPU), or the device tensor in ``graph_safe`` mode."""
        if self.graph_safe:
            return self.signs(call, gemm, device)
        return signs_to_bits(self.signs(call, gemm, None))

    def flush_counter(self, device) -> torch.Tensor:
        """The layer's device counter of flushed FP8 values; the kernels add to it directly."""
        if self.flushed is None:
            self.flushed = torch.zeros(1, device=device, dtype=torch.int32)
        return self.flushed

    def add_flushed(self, *ops):
        for op in ops:
            if op.flushed is not None and op.flushed is not self.flushed:
                self.flushed = op.flushed.clone() if self.flushed is None else self.flushed + op.flushed


def _q(x, ctx: _Ctx, **kw):
    if ctx.engine == "hopper_fp8":
        kw.setdefault("fp8", "e4m3")
        kw.setdefault("deq", False)
        kw.setdefault("row_exp", ROW_EXP)
        kw["flush"] = ctx.flush_counter(x.device)
    elif ctx.engine == "blackwell_mxfp4":
        kw["mx"] = True
        kw.setdefault("deq", False)
    else:
        kw["deq"] = True
    return mx_quantize(x, **kw)


def _blocks_for(engine: str, in_features: int, out_features: int) -> bool:
    """Whether ``engine`` runs block-scaled FP8 operands for a layer of this shape."""
    return engine == "hopper_fp8" and FP8_SCALING == "block" and in_features % 128 == 0 and out_features % 128 == 0


def _use_blocks(state: _Ctx, in_features: int, out_features: int) -> bool:
    """Whether the hopper engine runs block-scaled FP8 operands for a layer of this shape."""
    return _blocks_for(state.engine, in_features, out_features)


def _mm(ctx: _Ctx, a, b):
    if ctx.engine == "hopper_fp8":
        return G.hopper_fp8_mm(a, b)
    if ctx.engine == "blackwell_mxfp4":
        return G.blackwell_mxfp4_mm(a, b)
    return G.bf16_mm(a, b)


def _as_bf16_input(t: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """``t`` as the forward quantizer reads it: bf16 as is, float32 with ``cast_bf16`` (rounded in the kernel),
    anything else cast to bf16 first."""
    if t.dtype == torch.float32:
        return t, {"cast_bf16": True}
    return t.to(torch.bfloat16), {}


def _forward_gemm(x2d: torch.Tensor, weight: torch.Tensor, state: _Ctx, blocks: bool, right_block: int,
                  mask_bits: bool):
    """Forward of the layer on a 2-D ``x2d`` (tokens padded): ``y`` and the six tensors the backward needs
    (``X̂``, its scales, its QuEST mask, ``Ŵ``, its scales, its mask; a scale is None on engines that keep
    dequantized bf16 values). With ``blocks`` the right operand W is scaled per ``right_block``×128 block;
    ``mask_bits`` keeps the masks packed (int32 words, see ``mx_quantize``)."""
    # float32 operands (training's master weight; an input outside autocast) are rounded to bf16 by the quantizer
    # as it loads them — the same bf16 operand without a cast kernel and its copy
    x_in, cx = _as_bf16_input(x2d)
    w_in, cw = _as_bf16_input(weight)
    # forward operands: QuEST with the fixed Hadamard. The backward requantizes X̂ and Ŵ: on the
    # hopper engine they are kept as the FP8 tensors + power-of-two row scales the forward GEMM
    # already used (1 byte/element, no bf16 copy); elsewhere as exact bf16 values.
    fp8 = state.engine == "hopper_fp8"
    # block-scaled FP8: X (the GEMM's left operand) per 1×128, W (right) per 128×128 block
    bx, bw = ({"fp8_block": LEFT_BLOCK}, {"fp8_block": right_block}) if blocks else ({}, {})
    qx = _q(x_in, state, rule="quest", mask=True, mask_bits=mask_bits, deq=not fp8, **bx, **cx)
    qw = _q(w_in, state, rule="quest", mask=True, mask_bits=mask_bits, deq=not fp8, **bw, **cw)
    state.add_flushed(qx, qw)
    y = _mm(state, qx, qw)
    mx_, mw = (qx.mask_bits, qw.mask_bits) if mask_bits else (qx.mask, qw.mask)
    if blocks:
        saved = (qx.fp8, qx.block_scale, mx_, qw.fp8, qw.block_scale, mw)
    elif fp8:
        saved = (qx.fp8, qx.row_scale, mx_, qw.fp8, qw.row_scale, mw)
    else:
        saved = (qx.deq, None, mx_, qw.deq, None, mw)
    return y, saved


def _backward_gemms(e: torch.Tensor, saved, st: _Ctx, blocks: bool, s_dx, s_dw, seeds,
                    right_block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Both backward GEMMs: ``dX`` (bf16) and ``dW`` (float32) from the output gradient ``e``.

    ``right_block`` is the forward's (the saved Ŵ's block rows); the backward's right operands use it too.
    The saved masks are bool per element or packed words: the inverse rotation reads either.

    ``s_dx`` / ``s_dw`` are the random Hadamard signs of the two GEMMs (a 32-bit mask or a device tensor of
    32 ±1) and ``seeds`` maps ``dx_e, dx_w, dw_e, dw_x`` to their SR seeds (ints or one-element device
    tensors): the kernels compute the same numbers from either form."""
    xh, xs, mx_, wh, ws, mw = saved
    e = e.contiguous().to(torch.bfloat16)
    kw = dict(rule="absmax", stochastic=st.stochastic)
    if blocks:
        # left operands (E, Eᵀ) per 1×128 block, right ones (Ŵᵀ, X̂ᵀ) per right_block×128; the saved FP8
        # X̂ / Ŵ are read back through their block scales
        left, right = {"fp8_block": LEFT_BLOCK}, {"fp8_block": right_block}
        in_w, in_x = {"in_scale_rows": right_block}, {"in_scale_rows": LEFT_BLOCK}
    else:
        left = right = in_w = in_x = {}
    # dX̂ = E Ŵ, reduced over out: E grouped along its rows, Ŵᵀ read from Ŵ's columns
    qe = _q(e, st, axis=-1, seed=seeds["dx_e"], signs=s_dx, **left, **kw)
    qwt = _q(wh, st, axis=0, seed=seeds["dx_w"], in_scale=ws, signs=s_dx, **right, **in_w, **kw)
    dx = masked_inverse_hadamard(_mm(st, qe, qwt), mx_)
    # dŴ = Eᵀ X̂, reduced over tokens: both read column-wise. With one scale per whole row the
    # gradient needs e5m2's wider range along the token axis; a 1×128 block spans 4 groups only
    fmt = {"fp8": "e5m2"} if st.engine == "hopper_fp8" and not blocks else {}
    qet = _q(e, st, axis=0, seed=seeds["dw_e"], signs=s_dw, **fmt, **left, **kw)
    qxt = _q(xh, st, axis=0, seed=seeds["dw_x"], in_scale=xs, signs=s_dw, **right, **in_x, **kw)
    st.add_flushed(qe, qwt, qet, qxt)
    dw = masked_inverse_hadamard(_mm(st, qet, qxt), mw, out_dtype=torch.float32)
    return dx, dw


class QuartetLinearFn(torch.autograd.Function):
    """autograd over the three quantized GEMMs (see the module docstring), random draws made on the host."""

    @staticmethod
    def forward(ctx, x2d: torch.Tensor, weight: torch.Tensor, state: _Ctx, call: int = 0):
        blocks = _use_blocks(state, weight.shape[1], weight.shape[0]) and x2d.shape[0] % 128 == 0
        y, saved = _forward_gemm(x2d, weight, state, blocks, RIGHT_BLOCK, MASK_BITS)
        ctx.save_for_backward(*saved)
        ctx.blocks, ctx.right_block = blocks, RIGHT_BLOCK
        ctx.state, ctx.call = state, call
        ctx.wdtype = weight.dtype
        return y

    @staticmethod
    def backward(ctx, e: torch.Tensor):
        st: _Ctx = ctx.state
        call, dev = ctx.call, e.device
        # one set of random signs per backward GEMM, as in the reference QuantLinear
        s_dx, s_dw = st.sign_arg(call, "dx", dev), st.sign_arg(call, "dw", dev)
        seeds = {slot: st.operand_seed(call, slot, dev) for slot in BACKWARD_OPERANDS}
        dx, dw = _backward_gemms(e, ctx.saved_tensors, st, ctx.blocks, s_dx, s_dw, seeds, ctx.right_block)
        return dx, dw.to(ctx.wdtype), None, None


#: the backward operands that draw SR seeds, in the order of a layer's device seed row
BACKWARD_OPERANDS = OPERANDS[2:]


def _check_features(in_features: int, out_features: int) -> None:
    if in_features % 32 or out_features % 32:
        raise ValueError(f"QuartetLinear needs in/out features that are multiples of 32, got "
                         f"{in_features}x{out_features}")


def _fused_forward(x: torch.Tensor, weight: torch.Tensor, state: _Ctx, call: int, out_features: int) -> torch.Tensor:
    """Run :class:`QuartetLinearFn` on ``x`` of any leading shape (tokens padded to a multiple of 32)."""
    in_features = weight.shape[1]
    _check_features(in_features, out_features)
    x2, T = fp8_linear.pad_tokens(x, 128 if _use_blocks(state, in_features, out_features) else 32)
    y = QuartetLinearFn.apply(x2, weight, state, call)
    return fp8_linear.unpad_tokens(y, T).reshape(*x.shape[:-1], out_features)


# ------------------------------------------------------------------------------------------------
# The graph-capturable form of the layer: two registered operators.
#
# torch.compile cannot trace the Python that drives the Triton kernels (host-side seeds, the
# QuantizedOperand bookkeeping), so the eager layer is excluded from tracing and every block linear
# splits the compiled model — on small models the step is then bound by the host. As registered
# operators with shape functions the layer sits inside the compiled graph (and inside a captured CUDA
# graph under run.compile_mode=reduce-overhead). What a captured graph cannot do is draw on the host:
# the Hadamard signs and SR seeds are read from the layer's device buffers instead, which
# :class:`DeviceDraws` fills once per micro-batch with the very numbers the eager layer would draw, so
# both forms compute the same result bit for bit. FP8 flush counts are not collected on this path.
# ------------------------------------------------------------------------------------------------
_SCALE_DTYPE = torch.float32


@torch.library.custom_op("quartet::fused_linear_fwd", mutates_args=())
def fused_linear_fwd(x: torch.Tensor, weight: torch.Tensor, signs: torch.Tensor, seeds: torch.Tensor, engine: str,
                     stochastic: bool, blocks: bool, right_block: int = 128,
                     mask_bits: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                       torch.Tensor, torch.Tensor, torch.Tensor]:
    """``Y = QuEST(X H) QuEST(W H)ᵀ`` of a 2-D ``x`` (tokens padded to 32, or 128 with ``blocks``) and what the
    backward needs: ``(y, X̂, X̂ scales, X mask, Ŵ, Ŵ scales, W mask)``. ``signs`` / ``seeds`` (the
    backward's draws) are only carried to the backward. Scales are the stored form: a 1×128 block scale is
    the contiguous ``(K/128, rows)`` tensor (X̂'s; Ŵ's with ``right_block=1``); engines without FP8 give empty
    scales. Masks are bool per element, or int32 words per 32-group with ``mask_bits``."""
    y, saved = _forward_gemm(x, weight, _Ctx(engine, stochastic), blocks, right_block, mask_bits)
    xq, xs, xm, wq, ws, wm = saved
    empty = x.new_empty(0, dtype=_SCALE_DTYPE)
    xs = empty if xs is None else (xs.t() if blocks else xs)
    ws = empty.clone() if ws is None else (ws.t() if blocks and right_block == 1 else ws)
    return y, xq, xs, xm, wq, ws, wm


@fused_linear_fwd.register_fake
def _fused_linear_fwd_fake(x, weight, signs, seeds, engine, stochastic, blocks, right_block=128, mask_bits=False):
    T, K = x.shape
    N = weight.shape[0]
    y = x.new_empty((T, N), dtype=torch.bfloat16)
    if mask_bits:
        xm, wm = x.new_empty((T, K // 32), dtype=torch.int32), x.new_empty((N, K // 32), dtype=torch.int32)
    else:
        xm, wm = x.new_empty((T, K), dtype=torch.bool), x.new_empty((N, K), dtype=torch.bool)
    if engine == "hopper_fp8":
        xq, wq = x.new_empty((T, K), dtype=torch.float8_e4m3fn), x.new_empty((N, K), dtype=torch.float8_e4m3fn)
        if blocks:
            xs = x.new_empty((K // 128, T), dtype=_SCALE_DTYPE)
            if right_block == 1:
                ws = x.new_empty((K // 128, N), dtype=_SCALE_DTYPE)
            else:
                ws = x.new_empty((-(-N // 128), -(-(K // 128) // 4) * 4), dtype=_SCALE_DTYPE)
        else:
            xs, ws = x.new_empty((T, 1), dtype=_SCALE_DTYPE), x.new_empty((N, 1), dtype=_SCALE_DTYPE)
    else:
        xq, wq = x.new_empty((T, K), dtype=torch.bfloat16), x.new_empty((N, K), dtype=torch.bfloat16)
        xs, ws = x.new_empty(0, dtype=_SCALE_DTYPE), x.new_empty(0, dtype=_SCALE_DTYPE)
    return y, xq, xs, xm, wq, ws, wm


@torch.library.custom_op("quartet::fused_linear_bwd", mutates_args=())
def fused_linear_bwd(e: torch.Tensor, xq: torch.Tensor, xs: torch.Tensor, xm: torch.Tensor, wq: torch.Tensor,
                     ws: torch.Tensor, wm: torch.Tensor, signs: torch.Tensor, seeds: torch.Tensor, engine: str,
                     stochastic: bool, blocks: bool, right_block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dX bf16, dW float32)`` of :func:`fused_linear_fwd`; ``signs`` (2, 32) are the dx / dw GEMMs' Hadamard
    signs and ``seeds`` (4,) int64 the SR seeds of ``dx_e, dx_w, dw_e, dw_x``, both on the device."""
    if xs.numel() == 0:
        xs = ws = None
    elif blocks:
        xs = xs.t()  # back to the (T, K/128) column-major view the quantizer reads
        if right_block == 1:
            ws = ws.t()
    saved = (xq, xs, xm, wq, ws, wm)
    slot_seeds = {slot: seeds[i:i + 1] for i, slot in enumerate(BACKWARD_OPERANDS)}
    return _backward_gemms(e, saved, _Ctx(engine, stochastic), blocks, signs[0], signs[1], slot_seeds, right_block)


@fused_linear_bwd.register_fake
def _fused_linear_bwd_fake(e, xq, xs, xm, wq, ws, wm, signs, seeds, engine, stochastic, blocks, right_block=128):
    return (e.new_empty(xq.shape, dtype=torch.bfloat16),
            e.new_empty(wq.shape, dtype=torch.float32))


def _fused_setup_context(ctx, inputs, output):
    x, weight, signs, seeds, engine, stochastic, blocks, right_block, _mask_bits = inputs
    ctx.save_for_backward(*output[1:], signs, seeds)
    ctx.engine, ctx.stochastic, ctx.blocks, ctx.right_block = engine, stochastic, blocks, right_block
    ctx.x_dtype, ctx.w_dtype = x.dtype, weight.dtype


def _fused_backward(ctx, gy, *_unused):
    xq, xs, xm, wq, ws, wm, signs, seeds = ctx.saved_tensors
    dx, dw = fused_linear_bwd(gy, xq, xs, xm, wq, ws, wm, signs, seeds, ctx.engine, ctx.stochastic, ctx.blocks,
                              ctx.right_block)
    return dx.to(ctx.x_dtype), dw.to(ctx.w_dtype), None, None, None, None, None, None, None


fused_linear_fwd.register_autograd(_fused_backward, setup_context=_fused_setup_context)


def traceable_fused_forward(x: torch.Tensor, weight: torch.Tensor, signs: torch.Tensor, seeds: torch.Tensor,
                            engine: str, stochastic: bool, out_features: int) -> torch.Tensor:
    """The fused layer on ``x`` of any leading shape through the registered operators (compile/graph-safe).

    ``signs`` (2, 32) float32 and ``seeds`` (4,) int64 live on the device and hold this micro-batch's draws
    (see :class:`DeviceDraws`); the output is bf16, like the eager layer's."""
    in_features = weight.shape[1]
    _check_features(in_features, out_features)
    blocks = _blocks_for(engine, in_features, out_features)
    x2, T = fp8_linear.pad_tokens(x, 128 if blocks else 32)
    y = fused_linear_fwd(x2, weight, signs, seeds, engine, stochastic, blocks, RIGHT_BLOCK, MASK_BITS)[0]
    return fp8_linear.unpad_tokens(y, T).reshape(*x.shape[:-1], out_features)


class DeviceDraws:
    """The random draws of a model's compiled fused layers, in one device arena filled per micro-batch.

    A captured graph reads its inputs from fixed addresses, so the draws cannot be Python numbers made
    during the call. Each layer reads two rows of the arena — ``draw_signs`` (2, block) float32: the Hadamard
    signs of its dx and dw GEMMs, and ``draw_seeds`` (4,) int64: the SR seeds of ``dx_e, dx_w, dw_e, dw_x``
    — registered as (non-persistent) buffers that view the arena. :meth:`upload` computes every layer's
    draws for its current (seed, step, layer index, micro-batch call) with the reference rule
    (:func:`~quartet.quant.linear.hadamard_signs`, :func:`~quartet.quant.linear.operand_seed`) and copies
    them in with one transfer per tensor, ordered on the stream before the next micro-batch's kernels.
    Build it after the model is on its device (moving the model would detach the views).
    """

    def __init__(self, layers: list, device: torch.device, block: int = 32):
        self.layers = list(layers)
        self.device = torch.device(device)
        self.block = int(block)
        n = len(self.layers)
        self.signs = torch.ones(n, 2, self.block, device=self.device, dtype=torch.float32)
        self.seeds = torch.zeros(n, len(BACKWARD_OPERANDS), device=self.device, dtype=torch.int64)
        self._uploaded: tuple | None = None
        for i, layer in enumerate(self.layers):
            layer.register_buffer("draw_signs", self.signs[i], persistent=False)
            layer.register_buffer("draw_seeds", self.seeds[i], persistent=False)
            layer.device_draws = self

    def host_values(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This micro-batch's draws of every layer, on the host: (signs (L, 2, block), seeds (L, 4), 31 bits)."""
        cols = zip(*((m.seed, m.step, m.layer_index, m._calls) for m in self.layers))
        signs, seeds = backward_draws(*(list(c) for c in cols), block=self.block)
        return signs, seeds & 0x7FFF_FFFF

    def upload(self) -> None:
        """Copy the layers' current draws into the arena (asynchronously from pinned memory on a GPU); a no-op
        when the arena already holds the draws of every layer's current (step, call)."""
        key = tuple((m.seed, m.step, m.layer_index, m._calls) for m in self.layers)
        if key == self._uploaded:
            return
        self._uploaded = key
        signs, seeds = self.host_values()
        if self.device.type == "cuda":
            # pinned blocks come from the caching host allocator, which keeps each one until its copy is done
            self.signs.copy_(signs.pin_memory(), non_blocking=True)
            self.seeds.copy_(seeds.pin_memory(), non_blocking=True)
        else:
            self.signs.copy_(signs)
            self.seeds.copy_(seeds)


class QuartetLinear(torch.nn.Linear):
    """Drop-in ``nn.Linear`` (no bias) that runs the fused Quartet scheme on a GPU engine."""

    def __init__(self, in_features: int, out_features: int, engine: str = "hopper_fp8", stochastic: bool = False,
                 seed: int = 0, device=None, dtype=None, graph_safe: bool = False, layer_index: int = 0):
        super().__init__(in_features, out_features, bias=False, device=device, dtype=dtype)
        self.state = _Ctx(engine, stochastic, seed, graph_safe, layer_index)

    @classmethod
    def from_linear(cls, lin: torch.nn.Linear, engine: str = "hopper_fp8", stochastic: bool = False, seed: int = 0,
                    graph_safe: bool = False, layer_index: int = 0):
        """Wrap an existing (bias-free) linear, sharing its weight Parameter."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = lin.in_features, lin.out_features
        new.weight = lin.weight
        new.bias = None
        new.state = _Ctx(engine, stochastic, seed, graph_safe, layer_index)
        return new

    def set_step(self, step: int, first_call: int = 0) -> None:
        """Start optimizer step ``step``; ``first_call`` = global index of this process's first micro-batch."""
        self.state.step = int(step)
        self.state.calls = int(first_call)

    @torch.compiler.disable  # host-side call counter and seeds, as QuantLinear.forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        call = self.state.calls
        self.state.calls += 1
        y = _fused_forward(x, self.weight, self.state, call, self.out_features)
        return y.to(x.dtype if x.dtype != torch.float32 else y.dtype)


class FusedQuantLinear(QuantLinear):
    """The reference :class:`~quartet.quant.linear.QuantLinear` with the fused Quartet layer as its fast path.

    What ``apply_precision`` installs for ``quartet`` / ``quartet_sr`` on a kernel backend. It *is* a
    QuantLinear (same weight sharing, ``set_step(step, first_call)``, stats, seeds), so the seam API is
    unchanged. On steps where statistics are requested (``step % stats_every == 0``) it runs the
    operand-by-operand seam path through the same kernel backend, which records them (the fused
    kernels do not compute statistics); on every other step it runs the fused layer: eagerly
    (:class:`QuartetLinearFn`, draws made on the host per call) or, once :func:`bind_device_draws` gave it
    device draws, as registered operators that ``torch.compile`` traces and CUDA graphs capture. All
    paths draw identical signs and SR seeds for a given (seed, step, layer, micro-batch).
    """

    def __init__(self, weight: torch.nn.Parameter, scheme, backend, *, stochastic: bool, **kw):
        super().__init__(weight, scheme, backend, **kw)
        self.fused = _Ctx(backend.name, stochastic, self.seed, layer_index=self.layer_index)
        #: the arena that feeds this layer's draws when it runs as traceable operators (None: eager)
        self.device_draws: DeviceDraws | None = None

    @property
    def flushed(self) -> torch.Tensor | None:
        """Device counter of FP8 values the hopper fold could not represent exactly (None: none seen)."""
        return self.fused.flushed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stats_enabled:
            return super().forward(x)  # seam path: records statistics, same seeds (kept out of graphs)
        if self.device_draws is None:
            return self._eager_forward(x)
        dev = x.device.type
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        y = traceable_fused_forward(x, self.weight, self.draw_signs, self.draw_seeds, self.fused.engine,
                                    self.fused.stochastic, self.out_features)
        return y.to(out_dtype)

    @torch.compiler.disable  # host-side call counter and seeds, as QuantLinear.forward
    def _eager_forward(self, x: torch.Tensor) -> torch.Tensor:
        dev = x.device.type
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        call = self._calls
        self._calls += 1
        self.fused.step = self.step
        return _fused_forward(x, self.weight, self.fused, call, self.out_features).to(out_dtype)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", fused=True" + (", traceable=True" if self.device_draws is not None else "")


def bind_device_draws(model: torch.nn.Module, device) -> DeviceDraws | None:
    """Switch every :class:`FusedQuantLinear` of ``model`` to the traceable operators, fed by one
    :class:`DeviceDraws` arena on ``device`` (None when the model has no fused Quartet layer).

    ``quartet.quant.set_step`` and ``quartet.quant.begin_micro_batch`` refresh the draws; the traceable
    path assumes one call of each layer per micro-batch (true of the model's block linears)."""
    layers = [m for m in model.modules() if isinstance(m, FusedQuantLinear)]
    if not layers:
        return None
    prepare_device(device)  # outside any CUDA-graph pool (the model is compiled afterwards)
    return DeviceDraws(layers, device)


def quartet_backward_sr(scheme) -> bool | None:
    """Whether the fused Quartet layer runs ``scheme`` — QuEST MXFP4 forward with the fixed 32-Hadamard, absmax×3/4
    MXFP4 backward with a 32-Hadamard re-randomised per micro-batch, on the forward's X̂, Ŵ — and if so whether its
    backward rounds stochastically (True / False); None where it does not run it. Read off the scheme's operands,
    not its name."""
    f, dx, dw = scheme.fwd, scheme.dx, scheme.dw

    def mx(spec, kind: str) -> bool:
        return spec is not None and spec.kind == kind and spec.group == 32 and spec.tile_rows == 1

    forward = (mx(f.a, "quest") and f.b == f.a and not f.a.stochastic and f.a.floor
               and f.transform == "hadamard" and f.block == 32)
    backward = all(mx(g.a, "absmax") and g.b == g.a and g.transform == "random_hadamard" and g.block == 32
                   for g in (dx, dw)) and dx.a == dw.a
    if not (forward and backward and scheme.bwd_source == "quantized"):
        return None
    return bool(dx.a.stochastic)


def _fused_schemes() -> dict[str, bool]:
    from types import SimpleNamespace

    from quartet.quant.schemes import SCHEMES, build_scheme

    found = {name: quartet_backward_sr(build_scheme(SimpleNamespace(name=name))) for name in SCHEMES}
    return {name: sr for name, sr in found.items() if sr is not None}


#: the registered schemes the fused Quartet layer implements (name -> stochastic backward), found by
#: :func:`quartet_backward_sr`
FUSED_SCHEMES = _fused_schemes()
#: how the quant plan names each implementation
IMPL_FUSED = "fused QuartetLinear (quartet.kernels.linear)"
IMPL_SEAM = "QuantLinear, operand by operand (quartet.quant.linear)"


#: how the quant plan names the FP8 tensor-core layer of the fp8 scheme
IMPL_FP8 = "FP8QuantLinear, E4M3/E5M2 tensor-wise on FP8 tensor cores (quartet.kernels.fp8_linear)"
IMPL_FP8_BLOCK = ("FP8BlockQuantLinear, E4M3 1x128/128x128 block-wise on FP8 tensor cores "
                  "(quartet.kernels.fp8_block_linear)")


def _fp8_layer(scheme):
    """The FP8 tensor-core layer module whose operand set ``scheme`` is, or None."""
    for module in (fp8_linear, fp8_block_linear):
        if module.covers(scheme):
            return module
    return None


def fused_covers(scheme, backend_name: str) -> bool:
    """Whether a fused layer implements ``scheme`` (a :class:`~quartet.quant.schemes.Scheme`) on ``backend_name``,
    each layer judging the scheme's operands (not its name): the FP8 tensor-core layers (E4M3/E5M2 tensor scaling;
    DeepSeek's 1x128 / 128x128 blocks) on ``hopper_fp8``, the fused Quartet layer (:func:`quartet_backward_sr`) on
    any MX kernel engine. Layer shapes are checked per layer."""
    if _fp8_layer(scheme) is not None:
        return backend_name == "hopper_fp8"
    return backend_name in ENGINES and quartet_backward_sr(scheme) is not None


def fused_implementation(scheme) -> str:
    """The quant plan's name of the fused layer that runs ``scheme``."""
    module = _fp8_layer(scheme)
    return {fp8_linear: IMPL_FP8, fp8_block_linear: IMPL_FP8_BLOCK}.get(module, IMPL_FUSED)


def fused_quant_linear(weight: torch.nn.Parameter, scheme, backend, **kw) -> QuantLinear | None:
    """The fused layer for ``scheme`` on kernel ``backend`` (QuantLinear keywords) — :class:`FusedQuantLinear`
    or an FP8 tensor-core layer — or None when no fused layer covers the scheme, backend or this layer's shape.
    Used by ``quartet.quant.apply_precision``."""
    if not fused_covers(scheme, backend.name):
        return None
    module = _fp8_layer(scheme)
    if module is not None:
        if not module.covers_shape(weight.shape[1], weight.shape[0]):
            return None
        cls = fp8_linear.FP8QuantLinear if module is fp8_linear else fp8_block_linear.FP8BlockQuantLinear
        return cls(weight, scheme, backend, **kw)
    return FusedQuantLinear(weight, scheme, backend, stochastic=quartet_backward_sr(scheme), **kw)


def fused_linear(lin: torch.nn.Linear, scheme_name: str, backend_name: str, seed: int = 0):
    """A standalone :class:`QuartetLinear` sharing ``lin.weight`` when the fused layer covers
    ``scheme_name`` on ``backend_name`` (``hopper_fp8`` / ``triton`` / ``blackwell_mxfp4``), else ``None``.

    (Benchmarks and direct use; training goes through ``apply_precision`` → :func:`fused_quant_linear`.)
    It does not record per-layer quantization statistics.
    """
    if scheme_name not in FUSED_SCHEMES or backend_name not in ENGINES:
        return None
    return QuartetLinear.from_linear(lin, engine=backend_name, stochastic=FUSED_SCHEMES[scheme_name], seed=seed)
