"""Llama-2 style decoder used by every experiment (imports only torch).

The architecture follows the Quartet paper's code: pre-norm blocks with RMSNorm (eps 1e-5, computed
in fp32), rotary position embeddings (θ = 10000) on queries and keys, causal SDPA attention, a SwiGLU
MLP with hidden = 256·ceil(int(8d/3)/256), no biases, untied input embedding and output head, init
N(0, 0.02) with the two residual projections (attention out, MLP out) at N(0, 0.02/sqrt(2·layers)).

Every linear *inside* the blocks (fused qkv d→3d, attention out d→d, fused gate/up d→2·hidden, MLP out
hidden→d) is a :class:`BlockLinear`, the one type that precision schemes replace
(``quartet.quant.apply_precision``). Embedding and lm_head are plain modules and stay high precision.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from quartet.shapes import block_linear_names, ffn_hidden  # noqa: F401 - re-exported: the model's shape rules


class BlockLinear(nn.Linear):
    """A bias-free linear inside a transformer block: the seam where quantized linears plug in."""

    def __init__(self, in_features: int, out_features: int, *, residual: bool = False, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=False, device=device, dtype=dtype)
        #: True for projections that write into the residual stream (scaled init)
        self.residual = residual


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 whatever the input dtype, cast back after the weight."""

    def __init__(self, dim: int, eps: float = 1e-5, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(seq_len: int, head_dim: int, theta: float = 10000.0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin tables of shape (seq_len, head_dim/2) for rotary embeddings (float32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of the last dim by position-dependent angles; x is (B, H, T, Dh)."""
    T = x.shape[-2]
    xf = x.float().unflatten(-1, (-1, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    c, s = cos[:T], sin[:T]
    out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    return out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, d_model: int, n_head: int, device=None):
        super().__init__()
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.qkv = BlockLinear(d_model, 3 * d_model, device=device)
        self.proj = BlockLinear(d_model, d_model, residual=True, device=device)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, hidden: int, device=None):
        super().__init__()
        self.hidden = hidden
        self.w12 = BlockLinear(d_model, 2 * hidden, device=device)
        self.c_proj = BlockLinear(hidden, d_model, residual=True, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w12(x).split(self.hidden, dim=-1)
        return self.c_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, hidden: int, eps: float, device=None):
        super().__init__()
        self.attn_norm = RMSNorm(d_model, eps, device=device)
        self.attn = Attention(d_model, n_head, device=device)
        self.mlp_norm = RMSNorm(d_model, eps, device=device)
        self.mlp = SwiGLU(d_model, hidden, device=device)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Llama-2 style decoder; ``forward(idx, targets)`` returns logits, or the mean CE loss with targets."""

    def __init__(self, n_layer: int, d_model: int, n_head: int, vocab_size: int, seq_len: int = 512, *,
                 ffn_multiple_of: int = 256, norm_eps: float = 1e-5, rope_theta: float = 10000.0,
                 init_std: float = 0.02, device=None):
        super().__init__()
        if d_model % n_head or (d_model // n_head) % 2:
            raise ValueError(f"n_head={n_head} must divide d_model={d_model} into an even head dim")
        self.n_layer, self.d_model, self.n_head = n_layer, d_model, n_head
        self.vocab_size, self.seq_len, self.init_std = vocab_size, seq_len, init_std
        self.hidden = ffn_hidden(d_model, ffn_multiple_of)
        self.tok_emb = nn.Embedding(vocab_size, d_model, device=device)
        self.blocks = nn.ModuleList(Block(d_model, n_head, self.hidden, norm_eps, device=device) for _ in range(n_layer))
        self.norm = RMSNorm(d_model, norm_eps, device=device)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False, device=device)
        cos, sin = rope_tables(seq_len, d_model // n_head, rope_theta, device=device)
        # Not persistent: derived from the shape, so checkpoints stay free of them.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    @classmethod
    def from_config(cls, model_cfg, vocab_size: int, device=None) -> "Llama":
        """Build from a ``cfg.model`` node (any object with the ModelConfig attributes)."""
        return cls(int(model_cfg.n_layer), int(model_cfg.d_model), int(model_cfg.n_head), int(vocab_size),
                   int(model_cfg.seq_len), ffn_multiple_of=int(model_cfg.ffn_multiple_of),
                   norm_eps=float(model_cfg.norm_eps), rope_theta=float(model_cfg.rope_theta),
                   init_std=float(model_cfg.init_std), device=device)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """N(0, std) everywhere; residual projections N(0, std/sqrt(2·layers)); norm weights 1."""
        resid_std = self.init_std / math.sqrt(2 * self.n_layer)
        for mod in self.modules():
            if isinstance(mod, BlockLinear):
                nn.init.normal_(mod.weight, 0.0, resid_std if mod.residual else self.init_std)
            elif isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, 0.0, self.init_std)
            elif isinstance(mod, RMSNorm):
                mod.weight.fill_(1.0)

    def block_linears(self) -> dict[str, nn.Module]:
        """Qualified name -> BlockLinear (the modules a precision scheme may replace)."""
        return {n: m for n, m in self.named_modules() if isinstance(m, BlockLinear)}

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; non_embedding excludes the token embedding and lm_head (the paper's N)."""
        total = sum(p.numel() for p in self.parameters())
        if non_embedding:
            total -= self.tok_emb.weight.numel() + self.lm_head.weight.numel()
        return total

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                reduction: str = "mean") -> torch.Tensor:
        T = idx.shape[1]
        if T > self.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than the model's seq_len={self.seq_len}")
        x = self.tok_emb(idx)
        for block in self.blocks:
            x = block(x, self.rope_cos, self.rope_sin)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits
        # CE in float32 so bf16 autocast does not coarsen the loss.
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), reduction=reduction)
