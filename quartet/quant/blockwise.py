"""Two-dimensional tile scaling: NVFP4 with 16×16 weight tiles and FP8 with 1×128 / 128×128 tiles.

Maths. A tile-scaled quantizer partitions a matrix X (rows × cols, cols = the GEMM reduction axis) into
tiles of ``rows_per_tile × cols_per_tile`` elements and gives every tile t one scale s_t computed from its
largest magnitude a_t = max_{(i,j)∈t} |x_ij|. Elements are rounded independently given their tile's scale.
A 1×g tile is the usual 1-D group along the reduction axis; a square g×g tile makes the quantizer
*transpose-symmetric*: Q(Xᵀ) = Q(X)ᵀ bit for bit, since Xᵀ has the same tiles (transposed), the same tile
maxima and the same tensor maximum. That is why both recipes below scale weights in square tiles: the
input-gradient GEMM multiplies by Ŵᵀ, and re-quantizing Wᵀ along its own reduction axis gives back exactly
the forward's Ŵᵀ (one weight representation in both passes, no second rounding).

* NVFP4 2-D (NVIDIA, "Pretraining LLMs with NVFP4", arXiv 2509.25149, weights only): E2M1 elements, an FP32
  tensor scale S = amax/(6·448) and an E4M3 tile scale e_t = E4M3(a_t/6/S) per 16×16 tile, x̂ = RTN(x/(e_t·S))·e_t·S
  — the same two-level rule as the 1-D :func:`quartet.quant.mx.nvfp4_quantize`, with the 16-group widened to a
  16×16 tile (a tile scale that underflows E4M3 is raised to its smallest subnormal 2^-9; an all-zero tile
  gets 1).
* FP8 block-wise (DeepSeek-V3, arXiv 2412.19437 §3.3): E4M3 elements with one FP32 scale s_t = a_t/448 per
  1×128 tile of activations and gradients and per 128×128 block of weights, x̂ = E4M3(x/s_t)·s_t (round to
  nearest even, saturating at ±448; s_t = 1 for an all-zero tile). The scale is computed as ``a_t·(1/448)``,
  the form a CUDA kernel computes too (:mod:`quartet.quant.formats`), so a GPU path reproduces the codes.

Partial tiles at the matrix edges (rows or columns not a multiple of the tile) are scaled over the elements they
hold, as if the matrix were zero-padded. Pure PyTorch, float32, any device; one reshape, no Python loop over tiles.

Non-finite inputs (the rule of every quantizer, docs/precision.md): the unit that shares one scale is the tile here. A
tile holding a NaN or ±Inf gets a NaN scale and comes out entirely NaN (its FP8 codes too); the NVFP4 tensor scale is
taken over the finite tiles only, so no other tile changes. An all-zero tile keeps scale 1 and zeros; a scale that
underflows float32 to 0 (a tile of a few-ulp subnormals) flushes its tile to ±0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from quartet.quant.formats import (
    E2M1_MAX,
    E4M3_MAX,
    E5M2_MAX,
    absmax_scale,
    round_to_e2m1,
    round_to_fp8,
    scale_divisor,
)
from quartet.quant.mx import e4m3_block_scale, nvfp4_tensor_scale

__all__ = ["tile_amax", "nvfp4_quantize_2d", "fp8_blockwise_quantize", "fp8_blockwise_codes", "expand_tile_scales"]


def _tiled(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """(R, C) → zero-padded (R'/rows, rows, C'/cols, cols) view of ``x`` as float32."""
    if x.dim() != 2:
        raise ValueError(f"tile-scaled quantizers take a matrix, got shape {tuple(x.shape)}")
    R, C = x.shape
    xp = F.pad(x.float(), (0, -C % cols, 0, -R % rows))
    return xp.reshape(xp.shape[0] // rows, rows, xp.shape[1] // cols, cols)


def _untile(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    a, r, b, c = t.shape
    return t.reshape(a * r, b * c)[: shape[0], : shape[1]]


def tile_amax(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Largest magnitude of every ``rows × cols`` tile of the matrix ``x`` → (ceil(R/rows), ceil(C/cols))."""
    return _tiled(x, rows, cols).abs().amax(dim=(1, 3))


def nvfp4_quantize_2d(x: torch.Tensor, tile: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 with one E4M3 scale per ``tile × tile`` block (round to nearest) → (x̂ float32, tile scales
    (float32 values of the E4M3 codes, one per tile), FP32 tensor scale). Transpose-symmetric (module docstring)."""
    t = _tiled(x, tile, tile)
    amax_t = t.abs().amax(dim=(1, 3))
    tensor_scale = nvfp4_tensor_scale(amax_t, E2M1_MAX, E4M3_MAX)
    block = e4m3_block_scale(amax_t, E2M1_MAX, tensor_scale)  # the 1-D rule, one scale per tile
    s = (block * tensor_scale)[:, None, :, None]
    return _untile(round_to_e2m1(t / scale_divisor(s)) * s, x.shape), block, tensor_scale


def fp8_blockwise_codes(x: torch.Tensor, rows: int = 1, cols: int = 128,
                        fmt: str = "e4m3") -> tuple[torch.Tensor, torch.Tensor]:
    """Storage form of tile-scaled FP8: (x/s_t rounded to FP8, as float32, same shape as ``x``; scales s_t of
    shape (ceil(R/rows), ceil(C/cols))). Multiply back with :func:`fp8_blockwise_quantize` (which returns x̂)."""
    fmax = {"e4m3": E4M3_MAX, "e5m2": E5M2_MAX}[fmt]
    t = _tiled(x, rows, cols)
    scale = absmax_scale(t.abs().amax(dim=(1, 3)), fmax)
    codes = round_to_fp8(t / scale_divisor(scale)[:, None, :, None], fmt)
    return _untile(codes, x.shape), scale


def fp8_blockwise_quantize(x: torch.Tensor, rows: int = 1, cols: int = 128,
                           fmt: str = "e4m3") -> tuple[torch.Tensor, torch.Tensor]:
    """Tile-scaled FP8 fake quantization (DeepSeek-V3: 1×128 activations/gradients, 128×128 weights)
    → (x̂ float32, per-tile scales)."""
    codes, scale = fp8_blockwise_codes(x, rows, cols, fmt)
    return codes * expand_tile_scales(scale, rows, cols, x.shape), scale


def expand_tile_scales(scale: torch.Tensor, rows: int, cols: int, shape) -> torch.Tensor:
    """Per-tile scales (ceil(R/rows), ceil(C/cols)) broadcast to one per element of an (R, C) matrix."""
    return scale.repeat_interleave(rows, 0).repeat_interleave(cols, 1)[: shape[0], : shape[1]]
