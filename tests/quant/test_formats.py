"""Element formats and Hadamard transforms: exact grids, code round trips, orthonormality."""
from __future__ import annotations


import pytest
import torch

from quartet.quant import formats as F
from quartet.quant.hadamard import block_hadamard, hadamard_matrix, random_signs


def test_e2m1_grid_is_exact():
    assert F.E2M1_GRID.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    # every grid value (and its negative) is a fixed point of RTN
    g = torch.cat([F.E2M1_GRID, -F.E2M1_GRID])
    assert torch.equal(F.round_to_e2m1(g), g)


def test_e2m1_rtn_thresholds_and_saturation():
    # strictly above a threshold rounds up; exactly on it stays down (the kernels compare with >)
    y = torch.tensor([0.25, 0.2501, 0.75, 0.7501, 1.25, 1.2501, 1.75, 1.7501, 2.5, 2.5001, 3.5, 3.5001, 5.0, 5.001,
                      6.0, 7.0, 1e9])
    want = [0, .5, .5, 1, 1, 1.5, 1.5, 2, 2, 3, 3, 4, 4, 6, 6, 6, 6]
    assert F.round_to_e2m1(y).tolist() == want
    assert F.round_to_e2m1(-y).tolist() == [-w for w in want]
    # RTN is nearest: brute force against the grid on a fine sweep away from ties
    x = torch.linspace(-7, 7, 2801) + 1e-4
    cand = torch.cat([F.E2M1_GRID, -F.E2M1_GRID])
    nearest = cand[(x.clamp(-6, 6).unsqueeze(1) - cand).abs().argmin(1)]
    assert torch.equal(F.round_to_e2m1(x), nearest)


def test_e2m1_codes_and_packing_round_trip():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = F.e2m1_decode(codes)
    assert vals[:8].tolist() == F.E2M1_GRID.tolist()
    assert torch.equal(vals[8:].abs(), F.E2M1_GRID) and (vals[9:] < 0).all()
    assert torch.equal(F.e2m1_encode(vals), codes)  # all 16 codes round-trip, -0 (code 8) included
    c = torch.randint(0, 16, (5, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    packed = F.pack_e2m1(c)
    assert packed.shape == (5, 32) and packed.dtype == torch.uint8
    assert torch.equal(packed[0, 0], (c[0, 0] | (c[0, 1] << 4)))  # low nibble first
    assert torch.equal(F.unpack_e2m1(packed), c)
    # our packing matches torch's float4_e2m1fn_x2 storage convention (two codes per byte)
    assert torch.equal(packed.view(torch.float4_e2m1fn_x2).view(torch.uint8), packed)
    with pytest.raises(ValueError):
        F.e2m1_encode(torch.tensor([0.7]))


def test_all_256_e8m0_codes_round_trip():
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    vals = F.e8m0_decode(codes)
    assert torch.isnan(vals[255])
    exps = torch.arange(-127, 128, dtype=torch.float64)
    assert torch.equal(vals[:255].double(), torch.pow(2.0, exps))
    assert torch.equal(F.e8m0_encode(vals), codes)
    # same bit meaning as PyTorch's own float8_e8m0fnu dtype
    torch_vals = codes.view(torch.float8_e8m0fnu).float()
    assert torch.equal(torch_vals[:255], vals[:255]) and torch.isnan(torch_vals[255])


def test_exact_pow2_is_every_float32_power_of_two_bitwise():
    e = torch.arange(-149, 128)
    got = F.exact_pow2(e)
    want = torch.tensor([2.0 ** int(k) for k in e], dtype=torch.float64).float()  # every one exact in float32
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert F.exact_pow2(torch.tensor([-127])).item() > 0  # E8M0's smallest scale is a subnormal, not 0


def test_fp8_and_int4_helpers():
    x = torch.tensor([1.0, 300.0, 1000.0, -1e6, 0.3])
    e4 = F.round_to_fp8(x, "e4m3")
    assert e4.tolist()[:4] == [1.0, 288.0, 448.0, -448.0]  # RNE and saturation, never NaN
    assert torch.equal(F.round_to_fp8(x, "e5m2")[3], torch.tensor(-57344.0))
    y = torch.randn(64, 128, generator=torch.Generator().manual_seed(1))
    q, s = F.fp8_quantize(y, "e4m3", "tensor")
    assert s.numel() == 1 and float(q.abs().max()) == pytest.approx(float(y.abs().max()), rel=1e-6)
    q, s = F.fp8_quantize(y, "e5m2", "row")
    assert s.shape == (64, 1) and (q - y).abs().div(y.abs().amax(1, keepdim=True)).max() < 2 ** -2
    q, s = F.int4_quantize(y, "row")
    assert set((q / s).round().unique().tolist()) <= set(range(-7, 8))
    assert ((q / s) - (q / s).round()).abs().max() < 1e-4
    with pytest.raises(ValueError):
        F.fp8_quantize(y, "e3m4")
    # an all-zero row keeps scale 1 and stays zero; a bad scaling is a one-line error naming the format family
    y[3] = 0.0
    for quantize, what, args in ((F.fp8_quantize, "fp8", ("e4m3",)), (F.int4_quantize, "int4", ())):
        q, s = quantize(y, *args, scaling="row")
        assert s[3].item() == 1.0 and not q[3].any()
        with pytest.raises(ValueError, match=f"^{what} scaling must be 'tensor' or 'row', got 'col'$"):
            quantize(y, *args, scaling="col")


@pytest.mark.parametrize("n", [32, 64, 128, 256])
def test_hadamard_orthonormal_and_sylvester(n):
    h = hadamard_matrix(n)
    assert torch.allclose(h @ h.t(), torch.eye(n), atol=1e-6)
    assert torch.equal(h, h.t())
    assert torch.equal((h * n**0.5).round().abs(), torch.ones(n, n))
    assert torch.equal(h[:n // 2, :n // 2], h[n // 2:, :n // 2]) and torch.equal(h[n // 2:, n // 2:], -h[:n // 2, :n // 2])


def test_block_hadamard_signs_before_h_and_inverse():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, 128, generator=g)
    s = random_signs(32, g)
    assert set(s.tolist()) <= {-1.0, 1.0}
    y = block_hadamard(x, 32, s)
    h = hadamard_matrix(32)
    ref = torch.cat([(x[..., i:i + 32] @ torch.diag(s)) @ h for i in range(0, 128, 32)], dim=-1)
    assert torch.allclose(y, ref, atol=1e-5)
    assert torch.allclose(block_hadamard(y, 32, s, inverse=True), x, atol=1e-5)
    assert torch.allclose(block_hadamard(block_hadamard(x, 64), 64, inverse=True), x, atol=1e-5)
    # norms preserved blockwise; both GEMM operands rotated -> product unchanged
    w = torch.randn(10, 128, generator=g)
    assert torch.allclose(block_hadamard(x, 32, s) @ block_hadamard(w, 32, s).t(), x @ w.t(), atol=1e-4)
    with pytest.raises(ValueError):
        block_hadamard(torch.zeros(3, 48), 32)


def test_signs_after_h_would_not_randomise_rtn():
    """Why the order matters: signs applied after H only flip signs, which RTN commutes with."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 32, generator=g) * 2
    h = hadamard_matrix(32)
    outs_after, outs_before = set(), set()
    for _ in range(4):
        s = random_signs(32, g)
        after = F.round_to_e2m1((x @ h) * s) * s  # the buggy order, undone
        before = block_hadamard(F.round_to_e2m1(block_hadamard(x, 32, s)), 32, s, inverse=True)
        outs_after.add(tuple(after.flatten().tolist()))
        outs_before.add(tuple(before.flatten().round(decimals=5).tolist()))
    assert len(outs_after) == 1 and len(outs_before) > 1


def test_quant_package_imports_with_only_torch():
    """The GPU boxes have torch and nothing else of ours: no hydra/omegaconf/wandb/rich/numpy at import."""
    import subprocess
    import sys

    code = ("import sys\n"
            "for m in ('hydra', 'omegaconf', 'wandb', 'rich', 'numpy', 'scipy', 'pandas'): sys.modules[m] = None\n"
            "import quartet.quant, quartet.quant.stats, quartet.quant.linear, quartet.quant.config\n"
            "from quartet.quant.stats import gaussian_stats\n"
            "print(round(gaussian_stats(['rtn_absmax'], samples=1 << 12, scales=1)[0]['mse'], 3))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert 0.005 < float(out.stdout.strip().splitlines()[-1]) < 0.03


def test_scale_exponent_is_exact_just_below_a_power_of_two():
    """floor(log2 v) taken in float32 rounds up for v = 2^k·(1−2⁻²⁴); the scale must come from the exact exponent:
    amax = 8·(1−2⁻²⁴) gets the OCP scale 2^(2−2) = 1, so its value rounds to 6, not to 8 (scale 2)."""
    from quartet.quant import mx

    below = torch.tensor([2.0 ** k * (1 - 2.0 ** -24) for k in range(-100, 101, 7)], dtype=torch.float32)
    assert torch.equal(mx._pow2_floor(below), torch.tensor([2.0 ** (k - 1) for k in range(-100, 101, 7)]))
    exact = torch.tensor([2.0 ** k for k in range(-126, 128, 9)], dtype=torch.float32)
    assert torch.equal(mx._pow2_floor(exact), exact)
    assert torch.equal(mx._pow2_floor(torch.tensor([2.0 ** -140, 0.0])), torch.tensor([2.0 ** -127, 1.0]))
    x = torch.zeros(32)
    x[0] = 8 * (1 - 2.0 ** -24)
    assert mx.absmax_scales(x).item() == 1.0 and mx.rtn_absmax_mxfp4(x)[0].item() == 6.0


def test_e2m1_negative_zero_keeps_its_sign_bit():
    """-0.0 encodes as 8 (sign bit, magnitude 0) and decodes back to -0.0; +0.0 stays 0."""
    z = torch.tensor([0.0, -0.0, -0.0, 0.5, -0.5])
    c = F.e2m1_encode(z)
    assert c.tolist() == [0, 8, 8, 1, 9]
    back = F.e2m1_decode(c)
    assert torch.equal(torch.signbit(back), torch.signbit(z)) and torch.equal(back, z)
    # round_to_e2m1 of a small negative value gives -0.0, which now encodes as 8
    assert F.e2m1_encode(F.round_to_e2m1(torch.tensor([-0.1]))).item() == 8


def test_e4m3_stochastic_rounding_neighbours_and_mean():
    """SR to E4M3 returns one of the two E4M3 neighbours, keeps grid values, saturates at 448 and is unbiased, in the
    normal range and among the subnormals (spacing 2^-9 below 2^-6)."""
    every = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # all non-negative E4M3
    g = torch.Generator().manual_seed(0)
    assert torch.equal(F.round_to_e4m3_stochastic(every, g), every)
    assert torch.equal(F.round_to_e4m3_stochastic(-every, g), -every)
    v = torch.tensor([2.0 ** -12, 3 * 2.0 ** -10, 0.013, 1.03, 1.1, 100.0, 300.0, 447.0, 1e4, -5.3])
    n = 20000
    r = F.round_to_e4m3_stochastic(v.repeat(n, 1), g)
    assert torch.equal(r, F.round_to_fp8(r, "e4m3"))  # every draw is an E4M3 value
    lo = every[torch.searchsorted(every, v.abs().clamp(max=448), right=True) - 1]
    hi = every[torch.searchsorted(every, v.abs().clamp(max=448))]
    assert ((r.abs() == lo) | (r.abs() == hi)).all() and (r[:, 8] == 448).all() and (r[:, 9] < 0).all()
    mean, se = r.mean(0)[:8], r.std(0)[:8] / n ** 0.5
    assert ((mean - v[:8]).abs() < 4 * se).all()


def test_e2m1_rounding_keeps_nan_and_nvfp4_propagates_it():
    """NaN has no E2M1 grid point: RTN and SR keep it NaN (RTN used to index its table with NaN -> IndexError), and
    an NVFP4 operand holding a NaN comes out non-finite where it was, finite numbers elsewhere in its group kept."""
    import torch

    from quartet.quant.formats import round_to_e2m1
    from quartet.quant.mx import nvfp4_quantize

    y = torch.tensor([float("nan"), 0.3, -5.5, float("inf"), -float("inf")])
    for sr in (False, True):
        q = round_to_e2m1(y, stochastic=sr, generator=torch.Generator().manual_seed(0))
        assert q[0].isnan() and q[3] == 6.0 and q[4] == -6.0
        assert q[2] == -6.0 and (q[1] == 0.5 or (sr and q[1] == 0.0))
    x = torch.randn(4, 32)
    x[1, 3] = float("nan")
    xq, _, _ = nvfp4_quantize(x)
    assert xq[1, 3].isnan() and not torch.isfinite(xq).all()
