"""The fused recipe layer: every quantized operand from one Triton kernel, three BF16 tensor-core GEMMs, scales after.

What ``auto`` runs on a CUDA GPU for the recipes no FP8 / MXFP4 layer covers (``mxfp8``, ``nvfp4``,
``nvfp4_recipe``, ``quartet2``, ``ms_fp4``, ``luq_int4``), their forward-only / backward-only variants and ``fp8``'s
(any scheme whose operands :mod:`quartet.kernels.recipe_quant` quantizes and whose forward GEMM is not rotated). The
layer is read off the :class:`~quartet.quant.schemes.Scheme` itself (:func:`plan_for`), not off a list of names.

For ``Y = X Wᵀ`` (X: T × K tokens, W: N × K, E = dL/dY: T × N) the three GEMMs ``a @ bᵀ`` are

=========  =========================  ===============================================  ==========================
GEMM       a                          b                                                reduces
=========  =========================  ===============================================  ==========================
forward    Q_fa(X)                    Q_fb(W)                                          K
dX         Q_xa(E·R)                  Q_xb(Wsrcᵀ·R): W or the forward's Ŵ, read down   N (R: the GEMM's rotation)
dW         Q_wa(Eᵀ·R)  (E read down)  Q_wb(Xsrcᵀ·R): X or the forward's X̂, read down   T
=========  =========================  ===============================================  ==========================

Each quantizer returns BF16 values q·s_g and the scale P it factored out (a tensor scale, or one per row of a
row-scaled operand); the GEMM multiplies the values with float32 accumulation and the output is scaled by
P_a (rows) · P_b (columns) — so it equals the oracle's product of x̂ up to summation order. A rotation along the
reduction axis cancels in the product, so no output is rotated back. An operand a scheme leaves unquantized is,
as in the oracle, the forward's X̂ / Ŵ as saved (BF16; :attr:`Plain.REUSED`) where the backward reads the quantized
operands, else the tensor itself rounded to BF16 (:attr:`Plain.UNQUANTIZED`: the unquantized half of a forward-only
or backward-only variant, a BF16 GEMM operand as in the BF16 model). A row-scaled forward operand (MS-FP4, INT4)
is saved as x̂ rounded once to BF16, because its row scales lie along the backward GEMMs' reduction axis where no
scale can be factored out (so is MS-FP4's X̂ = Q(Xc) + ΔX in its forward GEMM: the outlier residual has no common
scale). Those, the unquantized operands' and one more are the layer's only roundings beyond the oracle's, each
≤ 2^-9 relative (BF16's, as the BF16 model's own): on a GPU under autocast the forward GEMM writes BF16 (as the
BF16 model's linears; no float32 pass over the output) and the scales P multiply that, so an output with a
post-scale is rounded twice where the oracle rounds once. The CPU (float32 GEMM output) rounds once.

Graph-safe: the layer's forward and backward are registered operators (``torch.library.custom_op``, with shape
functions and an autograd formula, as the fused Quartet layer), the random draws (Hadamard signs, Philox seeds) are
device tensors fed per micro-batch (:class:`~quartet.kernels.linear.DeviceDraws`) or made on the host per call when
run eagerly, and there is no host sync, so ``torch.compile`` traces the whole model and CUDA graphs capture it.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from enum import Enum

import torch

from quartet.kernels import recipe_quant as rq
from quartet.kernels.fp8_linear import pad_tokens, unpad_tokens
from quartet.kernels.gemm import bf16_matmul
from quartet.quant.linear import QuantLinear, backward_draws, hadamard_signs
from quartet.quant.quantizers import QuantizerSpec

__all__ = ["RecipePlan", "OperandPlan", "Plain", "plan_for", "covers", "covers_shape", "RecipeQuantLinear",
           "recipe_quant_linear", "bind_recipe_draws", "IMPL_RECIPE"]

#: how the quant plan names this layer
IMPL_RECIPE = ("RecipeQuantLinear, fused Triton quantizers + BF16 tensor-core GEMMs, scales after the GEMM "
               "(quartet.kernels.recipe_linear)")
#: the layer plans by key: what the registered operators receive (a string) and look up
_PLANS: dict = {}


class Plain(str, Enum):
    """A GEMM operand the layer does not quantize itself."""

    #: high precision: the tensor itself (X, W or E) rounded to BF16, the GEMM operand of the BF16 model's linears
    UNQUANTIZED = "unquantized"
    #: the forward's quantized operand as saved (X̂ or Ŵ, BF16 values and their scale): the backward multiplies it
    REUSED = "reused"


@dataclass(frozen=True)
class OperandPlan:
    """One operand quantizer as the layer calls it: the spec, its key for the registered operators, and what the
    layer needs to know of it (precomputed, so that a traced layer reads constants)."""

    spec: QuantizerSpec
    key: str
    #: the tile kernel runs it (else the row kernel)
    tile: bool
    #: its values carry a factored-out tensor scale (a 0-d post-scale)
    tensor_scaled: bool
    #: one scale for the whole tensor and no groups: the same values along either axis
    elementwise: bool
    stochastic: bool
    #: MS-FP4's outlier clamping (the GEMM takes x̂ with its high-precision residual)
    occ: bool

    @classmethod
    def of(cls, spec: QuantizerSpec) -> "OperandPlan":
        kind = rq.kernel_kind(spec)
        return cls(spec, json.dumps(spec.to_dict(), sort_keys=True), kind is not None,
                   kind is not None and kind.amax != rq.AMAX_NONE, kind is not None and kind.amax == rq.AMAX_ALL,
                   rq.draws_random(spec), spec.kind == "ms_fp4" and bool(spec.clip_quantile))


@dataclass(frozen=True)
class RecipePlan:
    """The layer's six GEMM operands, each an :class:`OperandPlan` (quantized here) or a :class:`Plain` one (forward
    operands and E: :attr:`Plain.UNQUANTIZED`; the backward's W / X: also :attr:`Plain.REUSED`, the forward's Ŵ / X̂),
    the backward GEMMs' rotations (Hadamard block, 0 = none; signs ``random`` per micro-batch or ``seeded`` once per
    run) and what the backward requantizes (``input`` X, W or the ``quantized`` X̂, Ŵ)."""

    fwd_a: OperandPlan | Plain
    fwd_b: OperandPlan | Plain
    dx_a: OperandPlan | Plain
    dx_b: OperandPlan | Plain
    dw_a: OperandPlan | Plain
    dw_b: OperandPlan | Plain
    dx_hb: int
    dw_hb: int
    dx_signs: str | None
    dw_signs: str | None
    bwd_source: str
    #: the plan's name for the registered operators (:data:`_PLANS`)
    key: str = field(default="", compare=False)

    @property
    def draw_block(self) -> int:
        """Length of the layer's per-GEMM sign vectors (the rotated GEMMs' block; 16 when none rotates)."""
        return max(self.dx_hb, self.dw_hb) or 16

    @property
    def multiple(self) -> int:
        """What in/out features must be multiples of (groups, 2-D tiles, Hadamard blocks), and what the layer
        zero-pads the token count to: the weight gradient's groups, tiles and rotations run along the token axis
        (zero rows change no scale and no sum, as the oracle's padded reduction)."""
        return math.lcm(128, self.dx_hb or 1, self.dw_hb or 1)

    @property
    def keep_x(self) -> bool:
        """The backward reads the forward's X̂ (``quantized`` source, X quantized in the forward), else X itself."""
        return self.bwd_source == "quantized" and isinstance(self.fwd_a, OperandPlan)

    @property
    def keep_w(self) -> bool:
        """The backward reads the forward's Ŵ, else W itself (as :attr:`keep_x`)."""
        return self.bwd_source == "quantized" and isinstance(self.fwd_b, OperandPlan)

    @property
    def share_e(self) -> bool:
        """Both backward GEMMs quantize E with the same elementwise quantizer, unrotated: the gradient's tensor amax
        (and, deterministic, its values) serve both."""
        return (isinstance(self.dx_a, OperandPlan) and self.dx_a == self.dw_a and self.dx_a.elementwise
                and not self.dx_hb and not self.dw_hb)


def _rotation(g) -> tuple[int, str | None]:
    if g.transform == "none":
        return 0, None
    if g.transform == "random_hadamard":
        return g.block, "random"
    if g.transform == "seeded_hadamard":
        return g.block, "seeded"
    return -1, None  # a fixed rotation (hadamard): not run here


def _runs(spec: QuantizerSpec | None, *, forward: bool) -> bool:
    if spec is None:
        return True
    kind = rq.kernel_kind(spec)
    if kind is not None:
        return kind.code != rq.K_FP8_BLOCK  # tile-scaled FP8 needs FP8 GEMMs: quartet.kernels.fp8_block_linear
    return forward and rq.supports(spec)  # row kinds read the forward operands along their rows only


def _operand(spec: QuantizerSpec | None, reused: bool = False) -> OperandPlan | Plain:
    """The plan of one operand: quantized by ``spec``; where the scheme leaves it unquantized (None), the forward's
    quantized operand when ``reused`` (a backward W / X whose source is the forward's X̂, Ŵ), else the tensor itself."""
    if spec is not None:
        return OperandPlan.of(spec)
    return Plain.REUSED if reused else Plain.UNQUANTIZED


def plan_for(scheme) -> RecipePlan | None:
    """The layer plan of ``scheme`` (a :class:`~quartet.quant.schemes.Scheme`), or None when this layer does not run
    it: nothing quantized, a rotated forward, an operand kind without a kernel here, a rotated GEMM with an
    operand it does not quantize.

    An operand the scheme leaves unquantized (None) is, as in the oracle (:mod:`quartet.quant.linear`): in the
    backward GEMMs' W / X slot, the forward's Ŵ / X̂ where the backward reads the quantized operands
    (``bwd_source="quantized"``) and the forward quantized it (:attr:`Plain.REUSED`, MS-FP4's and LUQ's backward,
    a forward-only variant's); anywhere else the high-precision tensor (:attr:`Plain.UNQUANTIZED`: the half a
    forward-only or backward-only variant leaves unquantized), a BF16 GEMM operand."""
    if not scheme.convert or not scheme.specs() or scheme.fwd.transform != "none":
        return None
    if not (_runs(scheme.fwd.a, forward=True) and _runs(scheme.fwd.b, forward=True)):
        return None
    if not all(_runs(s, forward=False) for s in (scheme.dx.a, scheme.dx.b, scheme.dw.a, scheme.dw.b)):
        return None
    (dx_hb, dx_signs), (dw_hb, dw_signs) = _rotation(scheme.dx), _rotation(scheme.dw)
    if dx_hb < 0 or dw_hb < 0 or (dx_hb and dw_hb and dx_hb != dw_hb):
        return None
    if any(hb and (hb < 16 or hb > 256) for hb in (dx_hb, dw_hb)):
        return None
    if any(hb and (g.a is None or g.b is None) for hb, g in ((dx_hb, scheme.dx), (dw_hb, scheme.dw))):
        return None  # the rotation is fused into the quantizers
    quantized = scheme.bwd_source == "quantized"
    ops = [_operand(scheme.fwd.a), _operand(scheme.fwd.b),
           _operand(scheme.dx.a), _operand(scheme.dx.b, quantized and scheme.fwd.b is not None),
           _operand(scheme.dw.a), _operand(scheme.dw.b, quantized and scheme.fwd.a is not None)]
    key = json.dumps([op.key if isinstance(op, OperandPlan) else op.value for op in ops]
                     + [dx_hb, dw_hb, dx_signs, dw_signs, scheme.bwd_source])
    plan = RecipePlan(*ops, dx_hb, dw_hb, dx_signs, dw_signs, scheme.bwd_source, key)
    return _PLANS.setdefault(key, plan)


def covers(scheme) -> bool:
    """Whether :class:`RecipeQuantLinear` runs ``scheme`` (layer shapes are checked apart: :func:`covers_shape`)."""
    return plan_for(scheme) is not None


def covers_shape(plan: RecipePlan, in_features: int, out_features: int) -> bool:
    """Whether a layer of this shape runs fused (features multiples of the plan's groups, tiles and blocks)."""
    return in_features % plan.multiple == 0 and out_features % plan.multiple == 0


# ------------------------------------------------------------------------------------------------------------------
# Registered operators: the kernel calls as torch.compile sees them (specs travel as JSON strings)
# ------------------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _spec(key: str) -> QuantizerSpec:
    return QuantizerSpec(**json.loads(key))


@torch.library.custom_op("quartet::recipe_quant", mutates_args=())
def recipe_quant_op(x: torch.Tensor, spec: str, axis: int, hadamard: int, signs: torch.Tensor | None,
                    seed: torch.Tensor | None, amax: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    torch.Tensor]:
    """:func:`quartet.kernels.recipe_quant.recipe_quantize` (BF16 values stored like ``x``) → ``(values as stored,
    post-scale (0-d), tensor amax cell)``; the logical operand is ``values`` (axis -1) or ``values.t()`` (axis 0)."""
    out = rq.recipe_quantize(x, _spec(spec), axis=axis, hadamard=hadamard, signs=signs, seed=seed, amax=amax)
    stored = out.values if axis != 0 else out.values.t()
    post = out.post if out.post is not None else torch.ones((), device=x.device, dtype=torch.float32)
    cell = out.amax if out.amax is not None else torch.zeros(1, device=x.device, dtype=torch.int32)
    if amax is not None and cell is amax:
        cell = cell.clone()  # an operator's output may not alias its input
    return stored, post, cell


@recipe_quant_op.register_fake
def _(x, spec, axis, hadamard, signs, seed, amax):
    return (x.new_empty(x.shape, dtype=torch.bfloat16), x.new_empty((), dtype=torch.float32),
            x.new_empty(1, dtype=torch.int32))


@torch.library.custom_op("quartet::recipe_row_quant", mutates_args=())
def recipe_row_quant_op(x: torch.Tensor, spec: str, values: bool, deq: bool,
                        factor: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`quartet.kernels.recipe_quant.row_quantize` → ``(codes, row scales, x̂ in BF16, DGE factor)``, the
    ones not asked for empty."""
    out = rq.row_quantize(x, _spec(spec), values=values, deq=deq, factor=factor)
    empty = x.new_empty(0, dtype=torch.bfloat16)
    return (out.values if out.values is not None else empty, out.post,
            out.deq if out.deq is not None else empty.clone(),
            out.factor if out.factor is not None else x.new_empty(0, dtype=torch.float32))


@recipe_row_quant_op.register_fake
def _(x, spec, values, deq, factor):
    R, K = x.shape
    s = _spec(spec)
    fac = factor and s.kind == "ms_fp4" and bool(s.dge_k)
    return (x.new_empty((R, K) if values else (0,), dtype=torch.bfloat16), x.new_empty(R, dtype=torch.float32),
            x.new_empty((R, K) if deq else (0,), dtype=torch.bfloat16),
            x.new_empty((R, K) if fac else (0,), dtype=torch.float32))


# ------------------------------------------------------------------------------------------------------------------
# The layer's maths
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class _Operand:
    """A GEMM operand: the logical (rows × reduction) BF16 values and the scale factored out of them (None, 0-d,
    or one per row)."""

    values: torch.Tensor
    post: torch.Tensor | None = None


def _quantize(src: torch.Tensor, op: OperandPlan, axis: int, hb: int = 0, signs=None, seed=None,
              amax=None) -> tuple[_Operand, torch.Tensor]:
    stored, post, cell = recipe_quant_op(src, op.key, axis, hb, signs, seed, amax)
    values = stored if axis != 0 else stored.t()
    return _Operand(values, post if op.tensor_scaled else None), cell


def _gemm_dtype(t: torch.Tensor, out_dtype: torch.dtype) -> torch.dtype:
    """What the GEMM writes: the output's own dtype on a GPU (BF16 under autocast, as the BF16 model's linears; a
    float32 output is accumulated and written in float32, not rounded through BF16), float32 on the CPU."""
    return out_dtype if t.is_cuda and out_dtype in (torch.bfloat16, torch.float32) else torch.float32


def _gemm(a: _Operand, b: _Operand, out_dtype: torch.dtype, gemm_dtype: torch.dtype,
          factor: torch.Tensor | None = None) -> torch.Tensor:
    """The scaled product ``(a.values @ b.valuesᵀ) · P_a · P_b (· factor)`` in ``out_dtype``."""
    y = bf16_matmul(a.values, b.values, gemm_dtype)
    scalar = None
    for p, rows in ((a.post, True), (b.post, False)):
        if p is None:
            continue
        if p.dim() == 0:
            scalar = p if scalar is None else scalar * p
        else:
            y = y * (p[:, None] if rows else p[None, :])
    if scalar is not None:
        y = y * scalar
    if factor is not None:
        y = y * factor
    return y.to(out_dtype)


def _times(op: _Operand, extra: torch.Tensor | None) -> _Operand:
    """``op`` with its post-scale multiplied by a saved operand's scalar post-scale."""
    if extra is None:
        return op
    return _Operand(op.values, extra if op.post is None else op.post * extra)


def _unquantized(t: torch.Tensor) -> _Operand:
    """A high-precision GEMM operand: ``t`` rounded to BF16 (the BF16 model's linears multiply the same)."""
    return _Operand(t.to(torch.bfloat16))


def _forward_operand(src: torch.Tensor, plan: OperandPlan | Plain, keep: bool):
    """(GEMM operand, what the backward reuses when ``keep`` (an _Operand or None), gradient factor or None)."""
    if plan is Plain.UNQUANTIZED:
        return _unquantized(src), None, None
    if plan.tile:
        op, _ = _quantize(src, plan, -1)
        return op, (op if keep else None), None
    occ = plan.occ
    codes, rows, deq, fac = recipe_row_quant_op(src, plan.key, not occ, keep or occ, True)
    op = _Operand(deq) if occ else _Operand(codes, rows)
    saved = _Operand(deq) if keep else None
    return op, saved, (fac if fac.numel() else None)


def _empty(like: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return like.new_empty(0, dtype=dtype)


def _forward(x2d: torch.Tensor, weight: torch.Tensor, plan: RecipePlan, out_dtype: torch.dtype):
    """``(y, X̂ or None, its post-scale, Ŵ or None, its post-scale, X's gradient factor, W's)``: the forward GEMM
    and, where the backward reads the forward's quantized operands (:attr:`RecipePlan.keep_x`, ``keep_w``), them."""
    qa, xs, fx = _forward_operand(x2d, plan.fwd_a, plan.keep_x)
    qb, ws, fw = _forward_operand(weight, plan.fwd_b, plan.keep_w)
    y = _gemm(qa, qb, out_dtype, _gemm_dtype(x2d, out_dtype))
    (xv, xp), (wv, wp) = ((o.values, o.post) if o is not None else (None, None) for o in (xs, ws))
    return y, xv, xp, wv, wp, fx, fw


def _backward_operand(src: torch.Tensor, post, plan: OperandPlan | Plain, hb: int, signs, seed) -> _Operand:
    """The backward GEMMs' right operand Wsrcᵀ / Xsrcᵀ (read down ``src``'s columns): quantized, the forward's saved
    operand as is, or the high-precision tensor."""
    if plan is Plain.REUSED:
        return _Operand(src.t(), post)
    if plan is Plain.UNQUANTIZED:
        return _unquantized(src.t())
    op, _ = _quantize(src, plan, 0, hb, signs, seed)
    return _times(op, post)


def _backward(e: torch.Tensor, x_src, x_post, w_src, w_post, fx, fw, signs, seeds, plan: RecipePlan,
              x_dtype: torch.dtype, w_dtype: torch.dtype, need_x: bool, need_w: bool):
    """``(dX, dW)`` (None where not needed) from the output gradient ``e`` and what the forward saved."""
    gx = gw = None
    s_dx = signs[0] if plan.dx_signs else None
    s_dw = signs[1] if plan.dw_signs else None
    ea = cell = None
    # dX = E·Wsrc: E along N, Wsrcᵀ (K × N) read down W's columns; E quantized for dX only where dX is wanted or
    # dW shares it (each operand has its own seed: skipping one changes no other draw)
    if plan.dx_a is Plain.UNQUANTIZED:
        ea = _unquantized(e)
    elif need_x or plan.share_e:
        ea, cell = _quantize(e, plan.dx_a, -1, plan.dx_hb, s_dx, seeds[0:1])
    if need_x:
        wb = _backward_operand(w_src, w_post, plan.dx_b, plan.dx_hb, s_dx, seeds[1:2])
        gx = _gemm(ea, wb, x_dtype, _gemm_dtype(e, x_dtype), fx)
    if need_w:
        # dW = Eᵀ·Xsrc: both read down their columns (reduction over tokens). An elementwise kind (one scale for
        # the whole tensor: FP8 tensor scaling, LUQ) quantizes E the same along either axis: a deterministic one is
        # reused as is, a stochastic one reuses the tensor amax
        if plan.dw_a is Plain.UNQUANTIZED:
            et = _unquantized(e.t())
        elif plan.share_e and not plan.dw_a.stochastic:
            et = _Operand(ea.values.t(), ea.post)
        else:
            et, _ = _quantize(e, plan.dw_a, 0, plan.dw_hb, s_dw, seeds[2:3], cell if plan.share_e else None)
        xb = _backward_operand(x_src, x_post, plan.dw_b, plan.dw_hb, s_dw, seeds[3:4])
        gw = _gemm(et, xb, w_dtype, torch.float32, fw)
    return gx, gw


def _opt(t: torch.Tensor | None) -> torch.Tensor | None:
    """An operator's optional tensor: an empty one stands for None."""
    return None if t is None or (t.dim() > 0 and t.numel() == 0) else t


# The layer as two registered operators (forward, backward) with an autograd formula, as the fused Quartet layer:
# torch.compile traces a call of each, CUDA graphs capture them. (An autograd.Function traced by Dynamo returned zero
# gradients on an H200 where the same code eager and on the CPU was right; the operators keep the layer out of it.)
@torch.library.custom_op("quartet::recipe_linear_fwd", mutates_args=())
def recipe_linear_fwd(x2d: torch.Tensor, weight: torch.Tensor, signs: torch.Tensor, seeds: torch.Tensor,
                      plan_key: str, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                       torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, X̂, X̂'s post-scale, Ŵ, Ŵ's post-scale, X's factor, W's factor)`` of :func:`_forward`, absent ones empty.
    ``signs`` (2, block) float32 and ``seeds`` (4,) int64, the backward GEMMs' Hadamard signs and the Philox seeds of
    ``dx_e, dx_w, dw_e, dw_x`` on the device, are only carried to the backward."""
    with torch.autocast(device_type=x2d.device.type, enabled=False):
        out = _forward(x2d, weight, _PLANS[plan_key], out_dtype)
    return tuple(o if o is not None else _empty(x2d) for o in out)


@recipe_linear_fwd.register_fake
def _(x2d, weight, signs, seeds, plan_key, out_dtype):
    plan = _PLANS[plan_key]
    T, K = x2d.shape
    N = weight.shape[0]

    def saved(op: OperandPlan | Plain, keep: bool, rows: int):
        if not keep:
            return _empty(x2d), _empty(x2d)
        post = x2d.new_empty((), dtype=torch.float32) if op.tile and op.tensor_scaled else _empty(x2d)
        return x2d.new_empty((rows, K), dtype=torch.bfloat16), post

    def factor(op: OperandPlan | Plain, rows: int):
        dge = isinstance(op, OperandPlan) and not op.tile and op.spec.kind == "ms_fp4" and bool(op.spec.dge_k)
        return x2d.new_empty((rows, K), dtype=torch.float32) if dge else _empty(x2d)

    (xs, xp), (ws, wp) = saved(plan.fwd_a, plan.keep_x, T), saved(plan.fwd_b, plan.keep_w, N)
    return (x2d.new_empty((T, N), dtype=out_dtype), xs, xp, ws, wp, factor(plan.fwd_a, T), factor(plan.fwd_b, N))


@torch.library.custom_op("quartet::recipe_linear_bwd", mutates_args=())
def recipe_linear_bwd(gy: torch.Tensor, x_src: torch.Tensor, x_post: torch.Tensor, w_src: torch.Tensor,
                      w_post: torch.Tensor, fx: torch.Tensor, fw: torch.Tensor, signs: torch.Tensor,
                      seeds: torch.Tensor, plan_key: str, x_dtype: torch.dtype, w_dtype: torch.dtype,
                      need_x: bool, need_w: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dX, dW)`` of :func:`_backward` (an empty tensor where not needed)."""
    with torch.autocast(device_type=gy.device.type, enabled=False):
        gx, gw = _backward(gy.contiguous(), x_src, _opt(x_post), w_src, _opt(w_post), _opt(fx), _opt(fw), signs,
                           seeds, _PLANS[plan_key], x_dtype, w_dtype, need_x, need_w)
    return (gx if gx is not None else _empty(gy, x_dtype)), (gw if gw is not None else _empty(gy, w_dtype))


@recipe_linear_bwd.register_fake
def _(gy, x_src, x_post, w_src, w_post, fx, fw, signs, seeds, plan_key, x_dtype, w_dtype, need_x, need_w):
    T, K = (x_src.shape[0], w_src.shape[1])
    N = gy.shape[1]
    return (gy.new_empty((T, K) if need_x else (0,), dtype=x_dtype),
            gy.new_empty((N, K) if need_w else (0,), dtype=w_dtype))


def _setup_context(ctx, inputs, output):
    x2d, weight, signs, seeds, plan_key, _out_dtype = inputs
    _y, xs, xp, ws, wp, fx, fw = output
    plan = _PLANS[plan_key]
    ctx.save_for_backward(xs if plan.keep_x else x2d, xp, ws if plan.keep_w else weight, wp, fx, fw, signs, seeds)
    ctx.plan_key = plan_key
    ctx.x_dtype, ctx.w_dtype = x2d.dtype, weight.dtype


def _backward_formula(ctx, gy, *_unused):
    x_src, x_post, w_src, w_post, fx, fw, signs, seeds = ctx.saved_tensors
    gx, gw = recipe_linear_bwd(gy, x_src, x_post, w_src, w_post, fx, fw, signs, seeds, ctx.plan_key, ctx.x_dtype,
                               ctx.w_dtype, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
    return ((gx if ctx.needs_input_grad[0] else None), (gw if ctx.needs_input_grad[1] else None),
            None, None, None, None)


recipe_linear_fwd.register_autograd(_backward_formula, setup_context=_setup_context)


# ------------------------------------------------------------------------------------------------------------------
# The layer
# ------------------------------------------------------------------------------------------------------------------
class RecipeQuantLinear(QuantLinear):
    """The reference :class:`~quartet.quant.linear.QuantLinear` of a recipe with the fused layer as its fast path.

    What ``apply_precision`` installs on the ``fused`` backend where :func:`covers` and :func:`covers_shape` hold.
    Steps that record statistics run the operand-by-operand seam path (the backend's compiled oracle quantizers);
    every other step runs :func:`recipe_linear_fwd`, with its draws from the device arena once
    :func:`bind_recipe_draws` bound one (compiled models), else made on the host per call (the same numbers)."""

    def __init__(self, weight, scheme, backend, *, plan: RecipePlan, **kw):
        super().__init__(weight, scheme, backend, **kw)
        self.plan = plan
        self.draw_block = plan.draw_block
        #: the arena feeding ``draw_signs`` / ``draw_seeds`` (None: host draws per call)
        self.device_draws = None
        # seeded_hadamard: one sign vector per GEMM for the whole run (QuantLinear.gemm_signs' rule)
        fixed = torch.ones(2, self.draw_block)
        for i, (gemm, kind) in enumerate((("dx", plan.dx_signs), ("dw", plan.dw_signs))):
            if kind == "seeded":
                fixed[i] = hadamard_signs(self.seed, 0, 0, 0, gemm, self.draw_block)
        self.register_buffer("fixed_signs", fixed.to(weight.device), persistent=False)

    def _draws(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """This call's (signs (2, block), seeds (4,)) on the device."""
        if self.device_draws is not None:
            signs, seeds = self.draw_signs, self.draw_seeds
        else:
            call = self._calls
            self._calls += 1
            signs, seeds = backward_draws(self.seed, self.step, self.layer_index, call, self.draw_block)
            signs, seeds = signs[0], seeds[0] & 0x7FFF_FFFF
            if device.type == "cuda":
                signs, seeds = signs.pin_memory(), seeds.pin_memory()
            signs, seeds = signs.to(device, non_blocking=True), seeds.to(device, non_blocking=True)
        if "seeded" in (self.plan.dx_signs, self.plan.dw_signs):
            rows = [self.fixed_signs[i] if kind == "seeded" else signs[i]
                    for i, kind in enumerate((self.plan.dx_signs, self.plan.dw_signs))]
            signs = torch.stack(rows)
        return signs, seeds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stats_enabled:
            return super().forward(x)  # seam path: records statistics (kept out of graphs)
        if self.device_draws is None and torch.compiler.is_compiling():
            raise RuntimeError("a compiled RecipeQuantLinear needs device draws: apply_precision(..., traceable=True)")
        return self._fused(x)

    def _fused(self, x: torch.Tensor) -> torch.Tensor:
        dev = x.device.type
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        signs, seeds = self._draws(x.device)
        x2, T = pad_tokens(x, self.plan.multiple)
        y = recipe_linear_fwd(x2, self.weight, signs, seeds, self.plan.key, out_dtype)[0]
        return unpad_tokens(y, T).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", fused=True" + (", traceable=True" if self.device_draws is not None else "")


def recipe_quant_linear(weight, scheme, backend, **kw) -> RecipeQuantLinear | None:
    """The fused recipe layer for ``scheme`` (QuantLinear keywords), or None where it does not cover the scheme or
    this layer's shape. Used by the ``fused`` backend's ``fused_layer``."""
    plan = plan_for(scheme)
    if plan is None or not covers_shape(plan, weight.shape[1], weight.shape[0]):
        return None
    return RecipeQuantLinear(weight, scheme, backend, plan=plan, **kw)


def bind_recipe_draws(model: torch.nn.Module, device) -> bool:
    """Feed every :class:`RecipeQuantLinear` of ``model`` from device arenas (one per sign length), refreshed by
    ``quartet.quant.set_step`` / ``begin_micro_batch``: what a compiled model needs. True when there were any."""
    from quartet.kernels.linear import DeviceDraws

    layers = [m for m in model.modules() if isinstance(m, RecipeQuantLinear)]
    for block in sorted({m.draw_block for m in layers}):
        group = [m for m in layers if m.draw_block == block]
        for m in group:
            rq.hadamard_pm1(block, device)  # outside any CUDA-graph pool
        DeviceDraws(group, device, block)
    return bool(layers)
