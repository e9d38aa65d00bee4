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

import torch

from quartet.kernels import fp8_linear
from quartet.kernels import gemm as G
from quartet.kernels.triton_quant import absmax_dual_fp8, masked_inverse_hadamard, mx_quantize, signs_to_bits
from quartet.quant.hadamard import random_signs
from quartet.quant.linear import _GEMM_SLOT, _SLOT, QuantLinear, mix_seed

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
#: block rows of the two GEMM operands when block-scaled: left (X, E, Eᵀ) 1×128, right (W, Ŵᵀ, X̂ᵀ) 128×128
LEFT_BLOCK, RIGHT_BLOCK = 1, 128
#: quantize the output gradient for both backward GEMMs in one fused pass (hopper engine). Off: the
#: dual kernel agrees with the oracle in Triton's CPU interpreter but not yet on the H200 (see docs/kernels.md)
DUAL_E = False


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
        return mix_seed(self.seed, self.step, self.layer_index, call, _SLOT[slot]) & 0x7FFF_FFFF

    def signs(self, call: int, gemm: str, device) -> torch.Tensor:
        """Random Hadamard signs of backward GEMM ``gemm`` (``dx`` / ``dw``) of micro-batch ``call``."""
        if self.graph_safe:
            return torch.randint(0, 2, (32,), device=device).float() * 2 - 1
        g = torch.Generator().manual_seed(mix_seed(self.seed, self.step, self.layer_index, call, _GEMM_SLOT[gemm]))
        return random_signs(32, g, device)

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


def _use_blocks(state: _Ctx, in_features: int, out_features: int) -> bool:
    """Whether the hopper engine runs block-scaled FP8 operands for a layer of this shape."""
    return (state.engine == "hopper_fp8" and FP8_SCALING == "block"
            and in_features % 128 == 0 and out_features % 128 == 0)


def _mm(ctx: _Ctx, a, b):
    if ctx.engine == "hopper_fp8":
        return G.hopper_fp8_mm(a, b)
    if ctx.engine == "blackwell_mxfp4":
        return G.blackwell_mxfp4_mm(a, b)
    return G.bf16_mm(a, b)


class QuartetLinearFn(torch.autograd.Function):
    """autograd over the three quantized GEMMs (see the module docstring)."""

    @staticmethod
    def forward(ctx, x2d: torch.Tensor, weight: torch.Tensor, state: _Ctx, call: int = 0):
        x2d = x2d.to(torch.bfloat16)
        w = weight.to(torch.bfloat16)
        # forward operands: QuEST with the fixed Hadamard. The backward requantizes X̂ and Ŵ: on the
        # hopper engine they are kept as the FP8 tensors + power-of-two row scales the forward GEMM
        # already used (1 byte/element, no bf16 copy); elsewhere as exact bf16 values.
        fp8 = state.engine == "hopper_fp8"
        # block-scaled FP8: X (the GEMM's left operand) per 1×128, W (right) per 128×128 block
        blocks = _use_blocks(state, w.shape[1], w.shape[0]) and x2d.shape[0] % 128 == 0
        bx, bw = ({"fp8_block": LEFT_BLOCK}, {"fp8_block": RIGHT_BLOCK}) if blocks else ({}, {})
        qx = _q(x2d, state, rule="quest", mask=True, deq=not fp8, **bx)
        qw = _q(w, state, rule="quest", mask=True, deq=not fp8, **bw)
        state.add_flushed(qx, qw)
        y = _mm(state, qx, qw)
        if blocks:
            ctx.save_for_backward(qx.fp8, qx.block_scale, qx.mask, qw.fp8, qw.block_scale, qw.mask)
        elif fp8:
            ctx.save_for_backward(qx.fp8, qx.row_scale, qx.mask, qw.fp8, qw.row_scale, qw.mask)
        else:
            ctx.save_for_backward(qx.deq, None, qx.mask, qw.deq, None, qw.mask)
        ctx.blocks = blocks
        ctx.state, ctx.call = state, call
        ctx.wdtype = weight.dtype
        return y

    @staticmethod
    def backward(ctx, e: torch.Tensor):
        xh, xs, mx_, wh, ws, mw = ctx.saved_tensors
        st: _Ctx = ctx.state
        call = ctx.call
        e = e.contiguous().to(torch.bfloat16)
        dev = e.device
        # one set of random signs per backward GEMM, as in the reference QuantLinear
        s_dx, s_dw = st.sign_arg(call, "dx", dev), st.sign_arg(call, "dw", dev)
        kw = dict(rule="absmax", stochastic=st.stochastic)
        if st.engine == "hopper_fp8" and DUAL_E and not ctx.blocks and e.shape[0] % 32 == 0 and st.graph_safe:
            # both quantizations of E from one read per pass (needs one set of signs for both GEMMs,
            # so only in graph_safe mode, where signs are not tied to the reference rule anyway)
            qe, qet = absmax_dual_fp8(e, s_dx, stochastic=st.stochastic, seed=st.operand_seed(call, "dx_e", dev))
            s_dw = s_dx
        else:
            qe = qet = None
        if ctx.blocks:
            # left operands (E, Eᵀ) per 1×128 block, right ones (Ŵᵀ, X̂ᵀ) per 128×128; the saved FP8
            # X̂ / Ŵ are read back through their block scales
            left, right = {"fp8_block": LEFT_BLOCK}, {"fp8_block": RIGHT_BLOCK}
            in_w, in_x = {"in_scale_rows": RIGHT_BLOCK}, {"in_scale_rows": LEFT_BLOCK}
        else:
            left = right = in_w = in_x = {}
        # dX̂ = E Ŵ, reduced over out: E grouped along its rows, Ŵᵀ read from Ŵ's columns
        if qe is None:
            qe = _q(e, st, axis=-1, seed=st.operand_seed(call, "dx_e", dev), signs=s_dx, **left, **kw)
        qwt = _q(wh, st, axis=0, seed=st.operand_seed(call, "dx_w", dev), in_scale=ws, signs=s_dx,
                 **right, **in_w, **kw)
        dx = masked_inverse_hadamard(_mm(st, qe, qwt), mx_)
        # dŴ = Eᵀ X̂, reduced over tokens: both read column-wise. With one scale per whole row the
        # gradient needs e5m2's wider range along the token axis; a 1×128 block spans 4 groups only
        if qet is None:
            fmt = {"fp8": "e5m2"} if st.engine == "hopper_fp8" and not ctx.blocks else {}
            qet = _q(e, st, axis=0, seed=st.operand_seed(call, "dw_e", dev), signs=s_dw, **fmt, **left, **kw)
        qxt = _q(xh, st, axis=0, seed=st.operand_seed(call, "dw_x", dev), in_scale=xs, signs=s_dw,
                 **right, **in_x, **kw)
        st.add_flushed(qe, qwt, qet, qxt)
        dw = masked_inverse_hadamard(_mm(st, qet, qxt), mw, out_dtype=torch.float32)
        return dx, dw.to(ctx.wdtype), None, None


def _fused_forward(x: torch.Tensor, weight: torch.Tensor, state: _Ctx, call: int, out_features: int) -> torch.Tensor:
    """Run :class:`QuartetLinearFn` on ``x`` of any leading shape (tokens padded to a multiple of 32)."""
    in_features = weight.shape[1]
    if in_features % 32 or out_features % 32:
        raise ValueError(f"QuartetLinear needs in/out features that are multiples of 32, got "
                         f"{in_features}x{out_features}")
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    T = x2.shape[0]
    # the weight-gradient GEMM groups along tokens (in 128-blocks when block-scaled): zero rows
    # contribute nothing
    pad = -T % (128 if _use_blocks(state, in_features, out_features) else 32)
    if pad:
        x2 = torch.nn.functional.pad(x2, (0, 0, 0, pad))
    y = QuartetLinearFn.apply(x2, weight, state, call)
    if pad:
        y = y[:T]
    return y.reshape(*shape[:-1], out_features)


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
    kernels do not compute statistics); on every other step it runs :class:`QuartetLinearFn`. Both
    paths draw identical signs and SR seeds for a given (seed, step, layer, micro-batch).
    """

    def __init__(self, weight: torch.nn.Parameter, scheme, backend, *, stochastic: bool, **kw):
        super().__init__(weight, scheme, backend, **kw)
        self.fused = _Ctx(backend.name, stochastic, self.seed, layer_index=self.layer_index)

    @property
    def flushed(self) -> torch.Tensor | None:
        """Device counter of FP8 values the hopper fold could not represent exactly (None: none seen)."""
        return self.fused.flushed

    @torch.compiler.disable  # host-side call counter and seeds, as QuantLinear.forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stats_enabled:
            return super().forward(x)  # seam path: records statistics, same seeds
        dev = x.device.type
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        call = self._calls
        self._calls += 1
        self.fused.step = self.step
        return _fused_forward(x, self.weight, self.fused, call, self.out_features).to(out_dtype)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", fused=True"


#: schemes the fused layer implements: name -> stochastic backward
FUSED_SCHEMES = {"quartet": False, "quartet_sr": True}
#: how the quant plan names each implementation
IMPL_FUSED = "fused QuartetLinear (quartet.kernels.linear)"
IMPL_SEAM = "QuantLinear, operand by operand (quartet.quant.linear)"


#: how the quant plan names the FP8 tensor-core layer of the fp8 scheme
IMPL_FP8 = "FP8QuantLinear, E4M3/E5M2 tensor-wise on FP8 tensor cores (quartet.kernels.fp8_linear)"


def fused_covers(scheme, backend_name: str) -> bool:
    """Whether a fused layer implements ``scheme`` (a :class:`~quartet.quant.schemes.Scheme`) on ``backend_name``:
    the fused Quartet layer (``quartet``/``quartet_sr``, Hadamard block 32, any kernel engine) or the FP8
    tensor-core layer (``fp8`` with tensor scaling, on ``hopper_fp8``; layer shapes are checked per layer)."""
    if scheme.name == "fp8":
        return backend_name == "hopper_fp8" and fp8_linear.covers(scheme)
    return (scheme.name in FUSED_SCHEMES and backend_name in ENGINES
            and all(g.block == 32 for g in (scheme.fwd, scheme.dx, scheme.dw)))


def fused_implementation(scheme) -> str:
    """The quant plan's name of the fused layer that runs ``scheme``."""
    return IMPL_FP8 if scheme.name == "fp8" else IMPL_FUSED


def fused_quant_linear(weight: torch.nn.Parameter, scheme, backend, **kw) -> QuantLinear | None:
    """The fused layer for ``scheme`` on kernel ``backend`` (QuantLinear keywords) — :class:`FusedQuantLinear`
    or :class:`~quartet.kernels.fp8_linear.FP8QuantLinear` — or None when no fused layer covers the scheme,
    backend or this layer's shape. Used by ``quartet.quant.apply_precision``."""
    if not fused_covers(scheme, backend.name):
        return None
    if scheme.name == "fp8":
        if not fp8_linear.covers_shape(weight.shape[1], weight.shape[0]):
            return None
        return fp8_linear.FP8QuantLinear(weight, scheme, backend, **kw)
    return FusedQuantLinear(weight, scheme, backend, stochastic=FUSED_SCHEMES[scheme.name], **kw)


def fused_linear(lin: torch.nn.Linear, scheme_name: str, backend_name: str, seed: int = 0):
    """A standalone :class:`QuartetLinear` sharing ``lin.weight`` when the fused layer covers
    ``scheme_name`` on ``backend_name`` (``hopper_fp8`` / ``triton`` / ``blackwell_mxfp4``), else ``None``.

    (Benchmarks and direct use; training goes through ``apply_precision`` → :func:`fused_quant_linear`.)
    It does not record per-layer quantization statistics.
    """
    if scheme_name not in FUSED_SCHEMES or backend_name not in ENGINES:
        return None
    return QuartetLinear.from_linear(lin, engine=backend_name, stochastic=FUSED_SCHEMES[scheme_name], seed=seed)
