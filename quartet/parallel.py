"""Data parallelism of a run (``run.parallel``): DDP, or FSDP2 sharding for models past one GPU's memory.

* ``ddp``: every rank holds the whole model; gradients are all-reduced once per optimizer step (the
  earlier micro-batches run under ``no_sync``).
* ``fsdp``: PyTorch's FSDP2 (:func:`torch.distributed.fsdp.fully_shard`) shards parameters, gradients
  and AdamW states over the ranks, one FSDP unit per transformer block plus the root (embedding, final
  norm, lm_head). Before a block runs, its parameters are all-gathered, so every layer, the reference
  ``QuantLinear`` and the fused kernel layer alike, sees its full weight inside ``forward``; after the
  backward the gradients are reduce-scattered (averaged) back to shards. On CUDA the gathered weights
  are bf16 and the reduction fp32 (``MixedPrecisionPolicy``); on CPU everything stays fp32, so a
  gloo run equals a one-process run up to the order of the reductions. Gradients are reduce-scattered
  after every micro-batch (not accumulated unsharded), which keeps the gradient memory sharded too.
* ``auto``: :func:`quartet.memory.choose_parallel` -- DDP when its per-GPU estimate fits this GPU, else
  FSDP (the planner writes its choice into each run's config, so cluster runs never see ``auto``).

The quantized layers draw their random Hadamard signs / stochastic-rounding seeds from (seed, step,
layer, global micro-batch), never from the rank, so any world size draws the numbers of a one-process
run. Activation checkpointing (``run.activation_checkpointing``) recomputes each block's forward in the
backward; the recompute must not count as a new micro-batch, so it replays the call numbers the layers
had when the block first ran (:func:`checkpoint_blocks`).
"""
from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from quartet.memory import GB, choose_parallel


def resolve_mode(res, requested: str, world_size: int, device_type: str, activation_checkpointing: bool) -> str:
    """``run.parallel`` made concrete for this process: ``auto`` compares the DDP estimate with this GPU."""
    gpu_gb = None
    if device_type == "cuda" and requested == "auto":
        gpu_gb = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / GB
    mode, _ = choose_parallel(res, world_size=world_size, gpu_memory_gb=gpu_gb, requested=requested,
                              activation_checkpointing=activation_checkpointing)
    return mode


def _quant_layers(module: nn.Module) -> list[nn.Module]:
    from quartet.quant.linear import QuantLinear

    return [m for m in module.modules() if isinstance(m, QuantLinear)]


def checkpoint_blocks(blocks, layers_of=_quant_layers) -> None:
    """Recompute each block's activations in the backward (non-reentrant ``torch.utils.checkpoint``).

    The block's forward is replaced on the instance (parameter names and checkpoints stay as they are).
    A quantized layer numbers its micro-batches by counting forward calls; the recompute context sets each
    layer's counter back to its value at the original forward for the length of the recompute, so the
    recomputed forward draws the same signs and seeds as the first one did.
    """
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        layers = layers_of(block)
        inner = block.forward

        def forward(*args, _inner=inner, _layers=layers, **kwargs):
            def context_fn():
                return contextlib.nullcontext(), _replay_calls(_layers, [m._calls for m in _layers])

            return checkpoint(_inner, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

        block.forward = forward


@contextlib.contextmanager
def _replay_calls(layers, calls):
    now = [m._calls for m in layers]
    for m, c in zip(layers, calls):
        m._calls = c
    try:
        yield
    finally:
        for m, c in zip(layers, now):
            m._calls = c


def wrap(model: nn.Module, mode: str, device: torch.device, *, world_size: int, amp: bool,
         activation_checkpointing: bool = False) -> nn.Module:
    """The module the training step calls: ``model`` itself (one rank, DDP off), a DDP wrapper, or ``model``
    sharded in place by FSDP2 (needs an initialised process group, also with one rank)."""
    if activation_checkpointing:
        checkpoint_blocks(model.blocks)
    if mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (world_size,))
        bf16 = device.type == "cuda" and amp
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                  reduce_dtype=torch.float32 if bf16 else None)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=mp)
        # the root's embedding and head are needed again at the start of the backward: keep them gathered
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
        return model
    if world_size > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        # No buffer broadcast: the model's buffers are deterministic, and the fused layers' draw buffers
        # differ per rank on purpose (each rank's micro-batches have their own global numbers).
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)
    return model


def micro_batch_context(train_model: nn.Module, last: bool):
    """DDP skips its all-reduce on all but the last micro-batch; FSDP2 reduce-scatters every micro-batch."""
    if last or not hasattr(train_model, "no_sync"):
        return contextlib.nullcontext()
    return train_model.no_sync()


def clip_grad_norm_(parameters, max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` that also takes sharded (DTensor) gradients: the global norm is
    reduced over the shards before clipping. Returns the (pre-clip) global norm as a plain tensor."""
    params = [p for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
    if hasattr(total, "full_tensor"):  # a DTensor: partial norms of each rank's shard
        total = total.full_tensor()
    if math.isfinite(max_norm):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def eval_batches(windows, *, rank: int, world_size: int, micro: int, lockstep: bool):
    """This rank's share of ``windows`` in micro-batches, as ``(windows, counted)`` pairs.

    Under FSDP every rank must run the same number of forwards (each gathers parameters collectively), so
    with ``lockstep`` a rank whose share runs out repeats its first window with ``counted=False``.
    """
    mine = windows[rank::world_size]
    n = math.ceil(math.ceil(len(windows) / world_size) / micro) if lockstep else math.ceil(len(mine) / micro)
    for i in range(n):
        chunk = mine[i * micro:(i + 1) * micro]
        yield (chunk, True) if len(chunk) else (windows[:1], False)


def describe(cfg, world_size: int) -> str:
    """What ``quartet train --print-config`` states about parallelism: mode, shards, per-GPU memory estimate.

    ``world_size`` is the launcher's WORLD_SIZE; with one rank, a config that records its cluster share
    (``cluster.nodes`` x ``cluster.gpus_per_node``, written by the planner) is described at that size."""
    from quartet.config import resolve
    from quartet.memory import estimate_run

    cluster = cfg.get("cluster") or {}
    if world_size <= 1 and cluster.get("nodes") and cluster.get("gpus_per_node"):
        # a run directory's config.yaml records the GPUs the plan gave it: state the estimate for those
        world_size = int(cluster["nodes"]) * int(cluster["gpus_per_node"])
    res = resolve(cfg.copy(), world_size)
    want = str(cfg.run.device)
    dev = "cuda" if want == "cuda" or (want == "auto" and torch.cuda.is_available()) else "cpu"
    ac = bool(cfg.run.activation_checkpointing)
    mode = resolve_mode(res, str(cfg.run.parallel), world_size, dev, ac)
    est = estimate_run(res, parallel=mode, world_size=world_size, activation_checkpointing=ac)
    return (f"# parallel: {mode} (run.parallel={cfg.run.parallel}) over {world_size} rank(s), model state in "
            f"{est.shards} shard(s), activation checkpointing {'on' if ac else 'off'}\n"
            f"# memory estimate: {est.describe()}")
