"""The quantized linear layer: one ``autograd.Function`` running the scheme's three GEMMs.

Maths (see :mod:`quartet.quant.schemes` for the operand table). With R the forward rotation along
K (identity, or block Hadamard H), Qa/Qb the forward quantizers and F_x, F_w their gradient factors
(QuEST mask, DGE derivative, or 1):

    forward:       X̂ = Qa(X·R),  Ŵ = Qb(W·R),  Y = X̂·Ŵᵀ (+ ΔX·Ŵᵀ for an OCC residual)
    input grad:    G_X̂ = GEMM_dx(E, Ŵᵀ)   →  dX = (G_X̂ ⊙ F_x)·Rᵀ
    weight grad:   G_Ŵ = GEMM_dw(Eᵀ, X̂ᵀ)  →  dW = (G_Ŵ ⊙ F_w)·Rᵀ

where GEMM_dx / GEMM_dw quantize their operands along their own reduction axes (out_features for
dX, tokens for dW), optionally after a random-sign Hadamard that is re-drawn for every layer, step
and micro-batch. For Quartet this is exactly Algorithm 1: the 16/9 correction is inside the
absmax×3/4 dequantized values. Only the tensors the backward needs are saved (X̂ or X·R, Ŵ or W·R,
and the gradient factors).

Randomness (stochastic rounding seeds, Hadamard signs) derives from (run seed, step, layer index,
micro-batch call, operand) through a SplitMix64 hash, so a resumed run draws the same numbers.
"""
from __future__ import annotations

import torch
from torch import nn

from quartet.quant.backend import Backend
from quartet.quant.hadamard import random_signs
from quartet.quant.quantizers import QTensor
from quartet.quant.schemes import GemmSpec, Scheme

__all__ = ["QuantLinear", "mix_seed", "OPERANDS", "operand_seed", "hadamard_signs", "backward_draws"]

#: operand names used in statistics keys q/<module>/<operand>/<stat>
OPERANDS = ("x", "w", "dx_e", "dx_w", "dw_e", "dw_x")
_SLOT = {name: i for i, name in enumerate(OPERANDS)}
_GEMM_SLOT = {"fwd": 16, "dx": 17, "dw": 18}
_MASK64 = (1 << 64) - 1


def mix_seed(*values: int) -> int:
    """Deterministic 63-bit seed from integers (SplitMix64 chain); stable across runs and platforms."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & _MASK64)) & _MASK64
        h = (h + 0x9E3779B97F4A7C15) & _MASK64
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        h = z ^ (z >> 31)
    return h & 0x7FFF_FFFF_FFFF_FFFF


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


_GOLDEN, _C1, _C2 = (_signed64(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch shifts signed integers arithmetically)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix_seed_tensor(*values: torch.Tensor) -> torch.Tensor:
    """:func:`mix_seed` elementwise over broadcast int64 tensors: the same bits, two's-complement arithmetic
    (int64 addition and multiplication wrap modulo 2**64 exactly like the masked Python integers)."""
    values = torch.broadcast_tensors(*values)
    h = torch.full(values[0].shape, _GOLDEN, dtype=torch.int64)
    for v in values:
        h = (h ^ v) + _GOLDEN
        z = (h ^ _shr(h, 30)) * _C1
        z = (z ^ _shr(z, 27)) * _C2
        h = z ^ _shr(z, 31)
    return h & 0x7FFF_FFFF_FFFF_FFFF


_DRAW_GENERATOR = torch.Generator()


def backward_draws(seed, step, layer_index, call, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The random draws of the backward of micro-batch ``call`` for many layers at once (arrays of equal length,
    or scalars): ``(signs (n, 2, block) float32 — the dx and dw GEMMs' :func:`hadamard_signs`,
    seeds (n, 4) int64 — the :func:`operand_seed` of dx_e, dx_w, dw_e, dw_x)``. Equal to the scalar rules,
    computed with a vectorised hash (what a layer fed from the device uploads every micro-batch)."""
    cols = [torch.as_tensor(v, dtype=torch.int64).reshape(-1) for v in (seed, step, layer_index, call)]
    cols = [c[:, None] for c in torch.broadcast_tensors(*cols)]
    seeds = _mix_seed_tensor(*cols, torch.tensor([[_SLOT[o] for o in OPERANDS[2:]]]))
    gemm_seeds = _mix_seed_tensor(*cols, torch.tensor([[_GEMM_SLOT["dx"], _GEMM_SLOT["dw"]]]))
    bits = torch.empty(gemm_seeds.shape + (block,), dtype=torch.int64)
    g = _DRAW_GENERATOR  # reseeded per draw: the same numbers as a fresh generator with that seed
    for i, row in enumerate(gemm_seeds.tolist()):
        for j, s in enumerate(row):
            g.manual_seed(s)
            torch.randint(0, 2, (block,), generator=g, out=bits[i, j])
    return (bits * 2 - 1).float(), seeds


def operand_seed(seed: int, step: int, layer_index: int, call: int, operand: str) -> int:
    """The 63-bit random seed of one operand quantization (``operand`` in :data:`OPERANDS`) of micro-batch
    ``call`` of optimizer step ``step`` in layer ``layer_index`` of a run seeded ``seed``.

    The one rule every implementation of a quantized layer follows (reference, seam and fused kernels), so
    that they draw the same stochastic-rounding streams; kernels that take 31-bit seeds use its low 31 bits.
    """
    return mix_seed(seed, step, layer_index, call, _SLOT[operand])


def hadamard_signs(seed: int, step: int, layer_index: int, call: int, gemm: str, block: int = 32,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """The random Hadamard signs (float32 ±1, ``block`` of them) shared by both operands of GEMM ``gemm``
    (``fwd``, ``dx`` or ``dw``) of micro-batch ``call`` — the same rule as :func:`operand_seed`."""
    g = torch.Generator().manual_seed(mix_seed(seed, step, layer_index, call, _GEMM_SLOT[gemm]))
    return random_signs(block, g, device)


def _pad_last(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Zero-pad the last dim to a multiple (padding the reduction axis of both operands leaves the
    product unchanged)."""
    extra = (-x.shape[-1]) % multiple
    return torch.nn.functional.pad(x, (0, extra)) if extra else x.contiguous()


class QuantLinear(nn.Linear):
    """A bias-free linear whose GEMMs follow a :class:`Scheme` through a :class:`Backend`.

    It shares the ``weight`` Parameter of the module it replaces (optimizer state, checkpoints and
    weight decay see the same tensor).
    """

    def __init__(self, weight: nn.Parameter, scheme: Scheme, backend: Backend, *, name: str = "",
                 layer_index: int = 0, seed: int = 0, stats_every: int = 0, residual: bool = False):
        nn.Module.__init__(self)  # not nn.Linear.__init__: that would allocate a fresh weight
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        self.register_parameter("bias", None)
        self.scheme = scheme
        self.backend = backend
        self.qname = name
        self.layer_index = int(layer_index)
        self.seed = int(seed)
        self.stats_every = int(stats_every)
        self.residual = residual
        self.step = 0
        self._calls = 0
        self._first_call = 0
        self.stats_enabled = False
        self._stats: dict[str, list[dict[str, float]]] = {}

    # -- schedule -------------------------------------------------------------------------------
    def set_step(self, step: int, first_call: int = 0) -> None:
        """Start optimizer step ``step``: new random draws; stats on when step % stats_every == 0.

        ``first_call`` is the global index of this process's first micro-batch in the step: under data
        parallelism rank r starts at r * micro_batches_per_rank, so every micro-batch draws the same
        signs / SR seeds as in single-process training with gradient accumulation.
        """
        self.step = int(step)
        self._calls = self._first_call = int(first_call)
        self.stats_enabled = self.stats_every > 0 and self.step % self.stats_every == 0

    def begin_micro_batch(self, index: int) -> None:
        """Micro-batch ``index`` (0-based within this process's step) comes next: its draws are those of the
        global micro-batch ``first_call + index``. Layers count their calls themselves when run eagerly, so
        this only matters where a compiled graph runs the layer (it cannot count on the host)."""
        self._calls = self._first_call + int(index)

    def operand_seed(self, call: int, slot: int) -> int:
        """Seed of one operand quantization in micro-batch ``call`` of the current step."""
        return mix_seed(self.seed, self.step, self.layer_index, call, slot)

    def signs(self, call: int, gemm: str, block: int, device: torch.device) -> torch.Tensor:
        """Random Hadamard signs shared by both operands of one GEMM of one micro-batch."""
        return hadamard_signs(self.seed, self.step, self.layer_index, call, gemm, block, device)

    def gemm_signs(self, g: GemmSpec, call: int, gemm: str, device: torch.device) -> torch.Tensor | None:
        """The Hadamard signs of one GEMM under its transform: re-drawn per call (``random_hadamard``), one
        vector for the whole run (``seeded_hadamard``: the draw of step 0, layer 0, call 0), else None."""
        if g.transform == "random_hadamard":
            return self.signs(call, gemm, g.block, device)
        if g.transform == "seeded_hadamard":
            return hadamard_signs(self.seed, 0, 0, 0, gemm, g.block, device)
        return None

    # -- statistics -----------------------------------------------------------------------------
    def record(self, operand: str, stats: dict[str, float] | None) -> None:
        if stats:
            self._stats.setdefault(operand, []).append(stats)

    def pop_stats(self) -> dict[str, dict[str, float]]:
        """Aggregate recorded stats per operand (mean; min/max for scale exponents) and clear."""
        out: dict[str, dict[str, float]] = {}
        for operand, rows in self._stats.items():
            agg: dict[str, float] = {}
            for key in {k for r in rows for k in r}:
                vals = [r[key] for r in rows if key in r]
                if key.endswith("_min"):
                    agg[key] = min(vals)
                elif key.endswith("_max"):
                    agg[key] = max(vals)
                else:
                    agg[key] = sum(vals) / len(vals)
            out[operand] = agg
        self._stats = {}
        return out

    # Kept out of torch.compile graphs: every call advances a host-side micro-batch counter and derives
    # Python-int seeds from it, which a traced graph would freeze (or recompile for on every call). With
    # ``run.compile`` the rest of the model (norms, attention, activations, loss) is still compiled.
    @torch.compiler.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _QuantLinearFn.apply(x, self.weight, self)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme.name}, "
                f"backend={self.backend.name}, layer={self.layer_index}")


def _operand(layer: QuantLinear, be: Backend, g: GemmSpec, spec, x: torch.Tensor, block, signs, call: int,
             slot: str) -> QTensor:
    """Quantize (or just rotate) one GEMM operand and record its statistics."""
    if spec is None:
        return QTensor(values=be.transform(x, block, signs) if block else x)
    q = be.quantize(x, spec, block=block, signs=signs, seed=layer.operand_seed(call, _SLOT[slot]),
                    stats=layer.stats_enabled)
    layer.record(slot, q.stats)
    return q


def _run_gemm(layer: QuantLinear, be: Backend, g: GemmSpec, gemm: str, a: torch.Tensor, b: torch.Tensor,
              call: int, slots: tuple[str, str]) -> torch.Tensor:
    """One GEMM a @ b.T with the GemmSpec's rotation and operand quantizers (pads the reduction axis)."""
    if not g.quantized and g.transform == "none":
        return be.matmul(a, b)
    mult = g.multiple()
    a, b = _pad_last(a, mult), _pad_last(b, mult)
    block = g.block if g.transform != "none" else None
    signs = layer.gemm_signs(g, call, gemm, a.device)
    qa = _operand(layer, be, g, g.a, a, block, signs, call, slots[0])
    qb = _operand(layer, be, g, g.b, b, block, signs, call, slots[1])
    return be.gemm(qa, qb)


class _QuantLinearFn(torch.autograd.Function):
    """Y = X·Wᵀ with the three GEMMs of ``layer.scheme`` (see the module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, layer: QuantLinear) -> torch.Tensor:
        scheme, be = layer.scheme, layer.backend
        dev = x.device.type
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        call = layer._calls
        layer._calls += 1
        K = layer.in_features
        f = scheme.fwd
        with torch.autocast(device_type=dev, enabled=False):
            x2 = x.reshape(-1, K).float()
            mult = f.multiple()
            xp, wp = _pad_last(x2, mult), _pad_last(weight.float(), mult)
            block = f.block if f.transform != "none" else None
            signs = layer.gemm_signs(f, call, "fwd", x.device)
            qx = _operand(layer, be, f, f.a, xp, block, signs, call, "x")
            qw = _operand(layer, be, f, f.b, wp, block, signs, call, "w")
            y = be.gemm(qx, qw) if f.quantized else be.matmul(qx.values, qw.values)
        # What the backward GEMMs multiply: the forward-quantized operands or the (rotated) inputs.
        if scheme.bwd_source == "quantized":
            x_src, w_src = qx.dequantized(), qw.dequantized()
        else:
            x_src = be.transform(xp, block, signs) if block else xp
            w_src = be.transform(wp, block, signs) if block else wp
        fx = qx.grad_factor
        fw = qw.grad_factor
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        ctx.save_for_backward(w_src if need_x else None, x_src if need_w else None,
                              fx if need_x else None, fw if need_w else None, signs)
        ctx.layer, ctx.call, ctx.block = layer, call, block
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        return y.reshape(*x.shape[:-1], layer.out_features).to(out_dtype)

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        w_src, x_src, fx, fw, signs = ctx.saved_tensors
        layer, call, block = ctx.layer, ctx.call, ctx.block
        scheme, be = layer.scheme, layer.backend
        K, N = layer.in_features, layer.out_features
        gx = gw = None
        with torch.autocast(device_type=gy.device.type, enabled=False):
            e = gy.reshape(-1, N).float()
            if ctx.needs_input_grad[0]:
                g = _run_gemm(layer, be, scheme.dx, "dx", e, w_src.t(), call, ("dx_e", "dx_w"))
                if fx is not None:
                    g = g * fx
                if block:
                    g = be.transform(g, block, signs, inverse=True)
                gx = g[:, :K].reshape(ctx.x_shape).to(ctx.x_dtype)
            if ctx.needs_input_grad[1]:
                g = _run_gemm(layer, be, scheme.dw, "dw", e.t(), x_src.t(), call, ("dw_e", "dw_x"))
                if fw is not None:
                    g = g * fw
                if block:
                    g = be.transform(g, block, signs, inverse=True)
                gw = g[:, :K].to(ctx.w_dtype)
        return gx, gw, None
