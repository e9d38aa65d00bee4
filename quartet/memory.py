"""Per-GPU memory estimate of one training run under DDP or FSDP2 (pure Python: the planner imports it).

What one rank holds, in bytes, with P the total parameter count, W the world size, L layers, d the
model width, T = micro-batch x seq_len tokens per micro-batch and V the vocabulary:

* **model state** (the paper's recipe: fp32 master weights, AdamW): weights 4P, gradients 4P, Adam
  moments 8P. DDP keeps all of it on every rank (16P: ~112 GB for 7B, the reason FSDP exists here);
  FSDP2 shards all three over the W ranks (16P/W).
* **working copies**: DDP's gradient buckets (4P) and autocast's bf16 weight casts (2P). FSDP2 holds the
  bf16 all-gathered weights of the block in flight plus the prefetched next one (2 x 2·P_block), their
  fp32 gradients before the reduce-scatter (4·P_block) and the root module's gathered embedding / head
  (2·P_root), which stays unsharded from forward to backward.
* **activations (rough)**: per layer ``T·d·c`` bytes with c = 34 (bf16: Korthikanti et al.'s count without
  the attention-score term, which SDPA does not store) or 58 under a quantized scheme (its linears keep
  their fp32 operands for the backward). With activation checkpointing each layer keeps only its bf16
  input (2·T·d) and one layer is recomputed at a time. Plus the logits: bf16, their fp32 copy and its
  gradient, 10·T·V.
* **overhead**: CUDA context, allocator fragmentation, NCCL buffers: a flat 2 GB.
* **start-up**: every rank builds the whole fp32 model on its GPU (same seed, so no broadcast) before FSDP2
  shards it: 4P + overhead (27 GB + 2 at 7B). The estimate is the larger of that and the training peak.

It is a budget for planning, checked against measured peaks by ``benchmarks/fsdp_memory.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
#: what the CUDA context, allocator slack and communication buffers take besides tensors (bytes)
OVERHEAD_BYTES = 2 * GB
PARALLEL_CHOICES = ("auto", "ddp", "fsdp")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU by component; :attr:`total` is their sum."""

    parallel: str
    world_size: int
    params: float
    grads: float
    optimizer: float
    working: float
    activations: float
    overhead: float = OVERHEAD_BYTES

    #: bytes of the whole fp32 model, built on every rank before sharding
    init: float = 0.0

    @property
    def training(self) -> float:
        """Estimated peak bytes of one rank during training steps."""
        return self.params + self.grads + self.optimizer + self.working + self.activations + self.overhead

    @property
    def total(self) -> float:
        """Estimated peak bytes of one rank: training, or the start-up before sharding if that is larger."""
        return max(self.training, self.init + self.overhead)

    @property
    def shards(self) -> int:
        """How many ranks the model state is split over (1 under DDP)."""
        return self.world_size if self.parallel == "fsdp" else 1

    def describe(self) -> str:
        """One line: total and parts in GB, e.g. ``23.4 GB/GPU (weights 0.4, grads 0.4, ...)``."""
        parts = (("weights", self.params), ("grads", self.grads), ("Adam", self.optimizer),
                 ("working copies", self.working), ("activations", self.activations), ("overhead", self.overhead))
        start = (f"; peak at start-up: the whole fp32 model {self.init / GB:.1f} before sharding"
                 if self.init + self.overhead > self.training else "")
        return (f"{self.total / GB:.1f} GB/GPU ({', '.join(f'{k} {v / GB:.1f}' for k, v in parts)}; "
                f"{self.parallel}, state sharded {self.shards} way{'s' if self.shards != 1 else ''}{start})")


def estimate(*, parallel: str, world_size: int, n_params_total: int, n_layer: int, d_model: int, ffn_hidden: int,
             vocab_size: int, micro_tokens: int, quantized: bool, activation_checkpointing: bool = False,
             overhead: float = OVERHEAD_BYTES) -> MemoryEstimate:
    """Per-GPU bytes of a run (see the module docstring for each term)."""
    if parallel not in ("ddp", "fsdp"):
        raise ValueError(f"parallel={parallel!r}: allowed ddp, fsdp")
    P, W = float(n_params_total), max(1, int(world_size))
    p_block = 4.0 * d_model * d_model + 3.0 * d_model * ffn_hidden + 2.0 * d_model
    p_root = 2.0 * vocab_size * d_model + d_model
    shard = W if parallel == "fsdp" else 1
    if parallel == "ddp":
        working = 4.0 * P + 2.0 * P
    else:
        working = 2 * 2.0 * p_block + 4.0 * p_block + 2.0 * p_root
    per_layer = micro_tokens * d_model * (58.0 if quantized else 34.0)
    if activation_checkpointing:
        acts = n_layer * 2.0 * micro_tokens * d_model + per_layer
    else:
        acts = n_layer * per_layer
    acts += 10.0 * micro_tokens * vocab_size
    return MemoryEstimate(parallel=parallel, world_size=W, params=4.0 * P / shard, grads=4.0 * P / shard,
                          optimizer=8.0 * P / shard, working=working, activations=acts, overhead=overhead, init=4.0 * P)


def estimate_run(res, *, parallel: str, world_size: int, activation_checkpointing: bool = False) -> MemoryEstimate:
    """:func:`estimate` for a resolved run (``quartet.config.ResolvedRun``) on ``world_size`` ranks.

    The micro-batch is the run's per-rank micro-batch at that world size: ``optim.micro_batch_size`` when set,
    else ``batch_size / world_size``.
    """
    cfg = res.cfg
    micro = cfg.optim.micro_batch_size
    micro = int(micro) if micro is not None else max(1, res.batch_size // max(1, world_size))
    quantized = str(cfg.precision.name) != "bf16"
    return estimate(parallel=parallel, world_size=world_size, n_params_total=res.n_params_total,
                    n_layer=int(cfg.model.n_layer), d_model=int(cfg.model.d_model), ffn_hidden=res.ffn_hidden,
                    vocab_size=res.vocab_size, micro_tokens=micro * res.seq_len, quantized=quantized,
                    activation_checkpointing=activation_checkpointing)


def choose_parallel(res, *, world_size: int, gpu_memory_gb: float | None, requested: str = "auto",
                    activation_checkpointing: bool = False) -> tuple[str, MemoryEstimate]:
    """The parallelism a run uses and its estimate: ``requested`` unless ``auto``; ``auto`` is DDP when its
    estimate fits ``gpu_memory_gb`` (or no GPU size is known, or one rank), else FSDP."""
    if requested not in PARALLEL_CHOICES:
        raise ValueError(f"run.parallel={requested!r}: allowed {', '.join(PARALLEL_CHOICES)}")
    mode = requested
    if mode == "auto":
        ddp = estimate_run(res, parallel="ddp", world_size=world_size,
                           activation_checkpointing=activation_checkpointing)
        fits = gpu_memory_gb is None or ddp.total <= float(gpu_memory_gb) * GB
        mode = "ddp" if fits or world_size <= 1 else "fsdp"
    return mode, estimate_run(res, parallel=mode, world_size=world_size,
                              activation_checkpointing=activation_checkpointing)
