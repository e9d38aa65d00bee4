"""Non-finite and range-edge inputs, every quantizer kind alike (issue #30, item 2).

The rule (docs/precision.md, "Non-finite inputs"): the unit that shares one scale — a group, tile, row or the whole
tensor, per kind — comes out entirely NaN when it holds a NaN or ±Inf, and every other unit is bitwise what it would
be with the bad unit zeroed. All-zero units stay exactly zero; subnormal units stay finite; huge finite values
saturate (never NaN).
"""
from __future__ import annotations

import pytest
import torch

from quartet.quant.quantizers import QuantizerSpec, reference_quantize

#: id -> (spec, scale unit as (rows, cols) of the (256, 256) test matrix; 0 = the whole dimension)
KINDS = {
    "quest": (QuantizerSpec("quest"), (1, 32)),
    "absmax": (QuantizerSpec("absmax"), (1, 32)),
    "absmax_sr": (QuantizerSpec("absmax", stochastic=True), (1, 32)),
    "ocp": (QuantizerSpec("ocp"), (1, 32)),
    "ms_fp4": (QuantizerSpec("ms_fp4"), (1, 0)),
    "ms_fp4_occ_dge": (QuantizerSpec("ms_fp4", clip_quantile=0.99, dge_k=5.0), (1, 0)),
    "fp8_tensor": (QuantizerSpec("fp8"), (0, 0)),
    "fp8_tensor_e5m2": (QuantizerSpec("fp8", fmt="e5m2"), (0, 0)),
    "fp8_row": (QuantizerSpec("fp8", scaling="row"), (1, 0)),
    "fp8_block_1x128": (QuantizerSpec("fp8", scaling="block", group=128), (1, 128)),
    "fp8_block_128x128": (QuantizerSpec("fp8", scaling="block", group=128, tile_rows=128), (128, 128)),
    "nvfp4": (QuantizerSpec("nvfp4", group=16), (1, 16)),
    "nvfp4_sr": (QuantizerSpec("nvfp4", group=16, stochastic=True), (1, 16)),
    "nvfp4_2d": (QuantizerSpec("nvfp4", group=16, tile_rows=16), (16, 16)),
    "nvfp4_4o6": (QuantizerSpec("nvfp4_4o6", group=16), (1, 16)),
    "nvfp4_sr1617": (QuantizerSpec("nvfp4_sr1617", group=16), (1, 16)),
    "ms_eden": (QuantizerSpec("ms_eden", group=16), (1, 16)),
    "mxfp8": (QuantizerSpec("mxfp8"), (1, 32)),
    "int4_row": (QuantizerSpec("int4", scaling="row"), (1, 0)),
    "int4_row_sr": (QuantizerSpec("int4", scaling="row", stochastic=True), (1, 0)),
    "int4_tensor": (QuantizerSpec("int4", scaling="tensor"), (0, 0)),
    "luq": (QuantizerSpec("luq"), (0, 0)),
}
R = C = 256
#: the element made non-finite: inside one unit of every kind (row 130, columns 128..143 of a 1x16 group)
BAD = (130, 137)


def _x(seed=0) -> torch.Tensor:
    return torch.randn(R, C, generator=torch.Generator().manual_seed(seed))


def _unit(unit, r, c) -> torch.Tensor:
    """Bool (R, C) mask of the elements that share element (r, c)'s scale."""
    ur, uc = unit
    m = torch.zeros(R, C, dtype=torch.bool)
    r0, r1 = (0, R) if ur == 0 else (r // ur * ur, r // ur * ur + ur)
    c0, c1 = (0, C) if uc == 0 else (c // uc * uc, c // uc * uc + uc)
    m[r0:r1, c0:c1] = True
    return m


def nonfinite_input(bad: float) -> torch.Tensor:
    """The test matrix with ``bad`` at :data:`BAD` and, beside it in the same unit, a finite value larger than any
    other (it must not set the scale of any other unit: NVFP4's tensor amax is taken over the finite units only,
    not over the finite elements)."""
    x = _x()
    x[BAD] = bad
    x[BAD[0], BAD[1] + 1] = 50.0
    return x


def zero_inputs() -> dict[str, torch.Tensor]:
    """An all-zero tensor, and all-zero rows 0..127 (whole units of every row / group / tile kind) beside random ones."""
    return {"zeros": torch.zeros(R, C), "zero rows": torch.cat([torch.zeros(128, C), _x()[128:]])}


def subnormal_inputs() -> dict[str, torch.Tensor]:
    """Tensors of float32 subnormals, and subnormal units beside normal ones."""
    g = torch.Generator().manual_seed(3)
    tiny = 2.0 ** -149
    cases = {
        "1e-40": _x(1) * 1e-40,                                                   # subnormal with ~16 bits
        "3 ulps": torch.randint(-3, 4, (R, C), generator=g).float() * tiny,      # amax 3·2^-149: scales underflow
        "1 ulp": torch.randint(-1, 2, (R, C), generator=g).float() * tiny,
    }
    mixed = _x(2)
    mixed[:128] = cases["3 ulps"][:128]
    cases["mixed"] = mixed
    return cases


def huge_input() -> torch.Tensor:
    """Values up to 2.5e38 (74% of float32's largest), a few of them exactly at the top."""
    x = _x(4)
    x = x / x.abs().amax() * 2.5e38
    x[7, :5] = torch.tensor([2.5e38, -2.5e38, 1e38, 3.0, 0.0])
    return x


def edge_inputs() -> dict[str, torch.Tensor]:
    """Every edge case of this file by name (the GPU test in test_gpu.py runs them all on the device)."""
    cases = {name: nonfinite_input(v) for name, v in (("nan", float("nan")), ("inf", float("inf")),
                                                        ("-inf", -float("inf")))}
    cases.update(zero_inputs())
    cases.update(subnormal_inputs())
    cases["huge"] = huge_input()
    return cases


def _quant(x, spec):
    q = reference_quantize(x, spec, seed=1)
    scale = q.data.get("scale") if isinstance(q.data, dict) else None
    return q.dequantized(), scale


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_nonfinite_value_turns_exactly_its_scale_unit_nan(kind, bad):
    spec, unit = KINDS[kind]
    x = nonfinite_input(bad)
    u = _unit(unit, *BAD)
    xq, scale = _quant(x, spec)
    assert torch.equal(torch.isnan(xq), u), kind  # the whole unit NaN, nothing else NaN
    clean = torch.where(u, 0.0, x)
    cq, _ = _quant(clean, spec)
    assert torch.equal(xq[~u], cq[~u]), kind  # every other unit as if the bad one were zero (same random draws)
    assert torch.isfinite(cq).all()
    if scale is not None:  # exactly one scale (the bad unit's) is NaN
        assert int(torch.isnan(scale).sum()) == 1 and int((~torch.isfinite(scale)).sum()) == 1, kind


@pytest.mark.parametrize("kind", list(KINDS))
def test_all_zero_units_stay_exactly_zero(kind):
    spec, _ = KINDS[kind]
    for x in zero_inputs().values():
        xq, scale = _quant(x, spec)
        assert torch.isfinite(xq).all() and (xq[x == 0] == 0).all(), kind
        if scale is not None:  # a zero unit's scale is finite and positive (1, 2^k, ...), never 0 or NaN
            assert torch.isfinite(scale).all() and (scale > 0).all(), kind


@pytest.mark.parametrize("kind", list(KINDS))
def test_subnormal_inputs_stay_finite(kind):
    """Tensors (and units beside normal ones) of float32 subnormals. A scale amax/c that underflows float32 to 0
    (amax a few times 2^-149) flushes its unit to zero; it used to give 0/0 = NaN for the unit's zeros."""
    spec, _ = KINDS[kind]
    for name, x in subnormal_inputs().items():
        xq, _ = _quant(x, spec)
        assert torch.isfinite(xq).all(), (kind, name)
        assert (xq[x == 0] == 0).all(), (kind, name)


@pytest.mark.parametrize("kind", list(KINDS))
def test_huge_finite_values_saturate_instead_of_turning_nan(kind):
    spec, _ = KINDS[kind]
    x = huge_input()
    xq, _ = _quant(x, spec)
    assert torch.isfinite(xq).all(), kind
    # at float32's very top nothing turns NaN; x̂ may still overflow to ±Inf where the format's value exceeds
    # float32 (absmax×3/4: a group with amax ≥ 5/3·2^127 has 6·2^125·4/3 = 2^128; docs/precision.md)
    x[7, 0] = torch.finfo(torch.float32).max
    xq, _ = _quant(x, spec)
    assert not torch.isnan(xq).any(), kind
