"""Block Hadamard transforms with optional random signs.

Maths. The Sylvester Hadamard matrix H_n (n a power of two) is built by H_1 = [1],
H_2n = [[H_n, H_n], [H_n, −H_n]]; scaled by 1/√n it is orthonormal and symmetric, so it is its own
inverse. A block transform splits the last dim into blocks of ``block`` elements and multiplies each
block by the same matrix; because it is orthogonal, rotating both GEMM operands along the
reduction (K) axis leaves the product unchanged: (X·H)(W·H)ᵀ = X·Wᵀ. Rotation spreads outliers over
the block so the rotated values look Gaussian, which is what QuEST's σ-based scale assumes.

Random signs ξ ∈ {±1}^block make the rotation a random orthogonal map x ↦ x·diag(ξ)·H. The signs
are applied *before* H (the corrected Quartet-II order): applying them after H would only flip
the signs of the rotated values, which commutes with magnitude rounding and so would not
randomise round-to-nearest at all. The inverse is y ↦ (y·Hᵀ)·diag(ξ).

The block transform is one matmul on a (…, n_blocks, block) view: no Python loop over blocks.

Exact arithmetic (the contract with the GPU kernels). :func:`block_hadamard` never multiplies by the
irrational entries ±1/√n. It forms the sign flips x·diag(s) (exact), multiplies by the *±1* Sylvester
matrix S in float64 — a sum of n float32 terms with ±1 weights, exact whenever the group's values span
at most ~24 binades (53 − 24 − 5 bits) — rounds that sum once to float32 and then multiplies by fp32(1/√n) once (one
float32 rounding). The fused Triton kernels compute the same two roundings (±1 products on tensor
cores with float32 accumulation, then one scale), so kernel and oracle agree bitwise on the rotated
values, not just to an ulp.
"""
from __future__ import annotations

import functools
import math

import torch

__all__ = ["hadamard_matrix", "block_hadamard", "random_signs", "HADAMARD_SIZES"]

#: Block sizes the project validates (any power of two works).
HADAMARD_SIZES = (32, 64, 128, 256)


@functools.lru_cache(maxsize=None)
def _sylvester_cpu(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (h / math.sqrt(n)).float()


@functools.lru_cache(maxsize=64)
def _on_device(n: int, device: str) -> torch.Tensor:
    return _sylvester_cpu(n).to(device)


@functools.lru_cache(maxsize=None)
def _pm1_cpu(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


@functools.lru_cache(maxsize=64)
def _pm1_on_device(n: int, device: str) -> torch.Tensor:
    # float64 on devices that have it (MPS does not): the ±1 sums must not round before the one scale.
    return _pm1_cpu(n).to(device)


def hadamard_matrix(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Orthonormal Sylvester Hadamard matrix of size n (a power of two), float32 on ``device``."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"hadamard size must be a power of two, got {n}")
    return _on_device(n, str(torch.device(device) if device is not None else torch.device("cpu")))


def random_signs(block: int, generator: torch.Generator | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """``block`` iid ±1 signs (float32) drawn from ``generator`` (CPU generator; moved to ``device``)."""
    bits = torch.randint(0, 2, (block,), generator=generator, dtype=torch.int64)
    s = (bits * 2 - 1).float()
    return s if device is None else s.to(device)


def block_hadamard(x: torch.Tensor, block: int = 32, signs: torch.Tensor | None = None, inverse: bool = False) -> torch.Tensor:
    """Apply x_blk ↦ x_blk·diag(signs)·H to every ``block`` of the last dim (float32 result).

    ``inverse=True`` applies the inverse map y_blk ↦ y_blk·Hᵀ·diag(signs). The last dim must be a
    multiple of ``block``.
    """
    k = x.shape[-1]
    if k % block:
        raise ValueError(f"block_hadamard: last dim {k} is not a multiple of the block size {block}")
    if block < 1 or block & (block - 1):
        raise ValueError(f"hadamard size must be a power of two, got {block}")
    s_pm1 = _pm1_on_device(block, str(x.device))
    # exact ±1 sums in float64 (see the module docstring), one rounding to float32, one scale rounding
    xb = x.reshape(*x.shape[:-1], k // block, block).to(torch.float64)
    if signs is not None and not inverse:
        xb = xb * signs.to(xb)  # sign flips are exact; diag(s) before S
    y = (xb @ s_pm1).to(torch.float32) * _inv_sqrt(block)
    if signs is not None and inverse:
        y = y * signs.to(y)  # y·Sᵀ/√n·diag(s): S is symmetric
    return y.reshape(x.shape)


@functools.lru_cache(maxsize=None)
def _inv_sqrt(n: int) -> float:
    """fp32(1/√n) as a Python float (multiplying a float32 tensor by it rounds once, like the kernels)."""
    return float(torch.tensor(1.0 / math.sqrt(n), dtype=torch.float32))
