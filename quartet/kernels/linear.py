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

from quartet.kernels import gemm as G
from quartet.kernels.triton_quant import absmax_dual_fp8, masked_inverse_hadamard, mx_quantize

ENGINES = ("hopper_fp8", "blackwell_mxfp4", "triton")
#: how the FP8 fold picks each row's exponent ("exact" kernel pass or one-pass "bound"; see mx_quantize)
ROW_EXP = "exact"
#: quantize the output gradient for both backward GEMMs in one fused pass (hopper engine). Off: the
#: dual kernel agrees with the oracle in Triton's CPU interpreter but not yet on the H200 (see docs/kernels.md)
DUAL_E = False


def _signs(seed: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(int(seed) & 0x7FFF_FFFF)
    return (torch.randint(0, 2, (32,), generator=g) * 2 - 1).float().to(device)


class _Ctx:
    """Per-layer state shared with the autograd function: engine, rounding, seeds, flush counter.

    Seeds and Hadamard signs derive from (layer seed, step, call number) on the host, so a run is
    reproducible and every call and step gets its own stream. ``graph_safe=True`` draws them on the
    device from the CUDA generator instead (seeded by ``torch.manual_seed``), so that a captured CUDA
    graph gets fresh signs and SR streams on every replay.
    """

    def __init__(self, engine: str, stochastic: bool, seed: int = 0, graph_safe: bool = False):
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        self.engine = engine
        self.stochastic = stochastic
        self.seed = seed
        self.graph_safe = graph_safe
        self.step = 0
        self.calls = 0
        self.flushed: torch.Tensor | None = None

    def next_seed(self, device=None):
        self.calls += 1
        if self.graph_safe:
            return torch.randint(0, 2**31 - 1, (1,), device=device, dtype=torch.int64)
        return (self.seed * 1_000_003 + self.step * 7919 + self.calls) & 0x7FFF_FFFF

    def signs(self, device) -> torch.Tensor:
        if self.graph_safe:
            return torch.randint(0, 2, (32,), device=device).float() * 2 - 1
        return _signs(self.next_seed(), device)

    def add_flushed(self, *ops):
        for op in ops:
            if op.flushed is not None:
                self.flushed = op.flushed.clone() if self.flushed is None else self.flushed + op.flushed


def _q(x, ctx: _Ctx, **kw):
    if ctx.engine == "hopper_fp8":
        kw.setdefault("fp8", "e4m3")
        kw.setdefault("deq", False)
        kw.setdefault("row_exp", ROW_EXP)
    elif ctx.engine == "blackwell_mxfp4":
        kw["mx"] = True
        kw.setdefault("deq", False)
    else:
        kw["deq"] = True
    return mx_quantize(x, **kw)


def _mm(ctx: _Ctx, a, b):
    if ctx.engine == "hopper_fp8":
        return G.hopper_fp8_mm(a, b)
    if ctx.engine == "blackwell_mxfp4":
        return G.blackwell_mxfp4_mm(a, b)
    return G.bf16_mm(a, b)


class QuartetLinearFn(torch.autograd.Function):
    """autograd over the three quantized GEMMs (see the module docstring)."""

    @staticmethod
    def forward(ctx, x2d: torch.Tensor, weight: torch.Tensor, state: _Ctx):
        x2d = x2d.to(torch.bfloat16)
        w = weight.to(torch.bfloat16)
        # forward operands: QuEST with the fixed Hadamard. The backward requantizes X̂ and Ŵ: on the
        # hopper engine they are kept as the FP8 tensors + power-of-two row scales the forward GEMM
        # already used (1 byte/element, no bf16 copy); elsewhere as exact bf16 values.
        fp8 = state.engine == "hopper_fp8"
        qx = _q(x2d, state, rule="quest", mask=True, deq=not fp8)
        qw = _q(w, state, rule="quest", mask=True, deq=not fp8)
        state.add_flushed(qx, qw)
        y = _mm(state, qx, qw)
        if fp8:
            ctx.save_for_backward(qx.fp8, qx.row_scale, qx.mask, qw.fp8, qw.row_scale, qw.mask)
        else:
            ctx.save_for_backward(qx.deq, None, qx.mask, qw.deq, None, qw.mask)
        ctx.state = state
        ctx.wdtype = weight.dtype
        return y

    @staticmethod
    def backward(ctx, e: torch.Tensor):
        xh, xs, mx_, wh, ws, mw = ctx.saved_tensors
        st: _Ctx = ctx.state
        e = e.contiguous().to(torch.bfloat16)
        signs = st.signs(e.device)
        dev = e.device
        kw = dict(rule="absmax", stochastic=st.stochastic, signs=signs)
        if st.engine == "hopper_fp8" and DUAL_E and e.shape[0] % 32 == 0:
            # both quantizations of E from one read per pass; Eᵀ gets e5m2's wider range (token axis)
            qe, qet = absmax_dual_fp8(e, signs, stochastic=st.stochastic, seed=st.next_seed(dev))
        else:
            qe = qet = None
        # dX̂ = E Ŵ, reduced over out: E grouped along its rows, Ŵᵀ read from Ŵ's columns
        if qe is None:
            qe = _q(e, st, axis=-1, seed=st.next_seed(dev), **kw)
        qwt = _q(wh, st, axis=0, seed=st.next_seed(dev), in_scale=ws, **kw)
        dx = masked_inverse_hadamard(_mm(st, qe, qwt), mx_)
        # dŴ = Eᵀ X̂, reduced over tokens: both read column-wise; the gradient gets e5m2's wider range
        if qet is None:
            fmt = {"fp8": "e5m2"} if st.engine == "hopper_fp8" else {}
            qet = _q(e, st, axis=0, seed=st.next_seed(dev), **fmt, **kw)
        qxt = _q(xh, st, axis=0, seed=st.next_seed(dev), in_scale=xs, **kw)
        st.add_flushed(qe, qwt, qet, qxt)
        dw = masked_inverse_hadamard(_mm(st, qet, qxt), mw, out_dtype=torch.float32)
        return dx, dw.to(ctx.wdtype), None


class QuartetLinear(torch.nn.Linear):
    """Drop-in ``nn.Linear`` (no bias) that runs the fused Quartet scheme on a GPU engine."""

    def __init__(self, in_features: int, out_features: int, engine: str = "hopper_fp8", stochastic: bool = False,
                 seed: int = 0, device=None, dtype=None, graph_safe: bool = False):
        super().__init__(in_features, out_features, bias=False, device=device, dtype=dtype)
        self.state = _Ctx(engine, stochastic, seed, graph_safe)

    @classmethod
    def from_linear(cls, lin: torch.nn.Linear, engine: str = "hopper_fp8", stochastic: bool = False, seed: int = 0,
                    graph_safe: bool = False):
        """Wrap an existing (bias-free) linear, sharing its weight Parameter."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = lin.in_features, lin.out_features
        new.weight = lin.weight
        new.bias = None
        new.state = _Ctx(engine, stochastic, seed, graph_safe)
        return new

    def set_step(self, step: int) -> None:
        self.state.step = step
        self.state.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        if self.in_features % 32 or self.out_features % 32:
            raise ValueError(f"QuartetLinear needs in/out features that are multiples of 32, got "
                             f"{self.in_features}x{self.out_features}")
        x2 = x.reshape(-1, shape[-1])
        T = x2.shape[0]
        pad = -T % 32  # the weight-gradient GEMM groups along tokens: zero rows contribute nothing
        if pad:
            x2 = torch.nn.functional.pad(x2, (0, 0, 0, pad))
        y = QuartetLinearFn.apply(x2, self.weight, self.state)
        if pad:
            y = y[:T]
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype if x.dtype != torch.float32 else y.dtype)


#: schemes the fused layer implements: name -> stochastic backward
FUSED_SCHEMES = {"quartet": False, "quartet_sr": True}


def fused_linear(lin: torch.nn.Linear, scheme_name: str, backend_name: str, seed: int = 0):
    """A :class:`QuartetLinear` sharing ``lin.weight`` when the fused layer covers ``scheme_name`` on
    ``backend_name`` (``hopper_fp8`` / ``triton`` / ``blackwell_mxfp4``), else ``None``.

    One-line hook for ``apply_precision``: the fused layer quantizes each operand once, keeps FP8
    copies for the backward and avoids float32 round trips, so it is ~2.5x faster than driving the
    same kernels operand by operand through the generic seam (docs/kernels.md). It does not record
    per-layer quantization statistics.
    """
    if scheme_name not in FUSED_SCHEMES or backend_name not in ENGINES:
        return None
    return QuartetLinear.from_linear(lin, engine=backend_name, stochastic=FUSED_SCHEMES[scheme_name], seed=seed)
