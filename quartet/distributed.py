"""Data-parallel setup from the environment that torchrun / submitit / Slurm provide.

``WORLD_SIZE > 1`` (with RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) starts torch.distributed with
NCCL on CUDA and Gloo on CPU. Every rank computes the same global batch of windows and takes its
contiguous slice, so the global batch and the data order equal single-process training; gradients
are averaged by DDP. Only rank 0 writes files and logs.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    initialized_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


#: set once :func:`setup` has created a process group in this process (see :func:`exit_process`)
_GROUP_CREATED = False


def group_created() -> bool:
    """True once :func:`setup` created a process group in this process (destroyed or not)."""
    return _GROUP_CREATED


def exit_process(code: int) -> NoReturn:
    """End a process that ran a process group: Python's exit handlers, flushed stdio, then ``os._exit(code)``.

    Why not a plain exit: ``destroy_process_group()`` unregisters the group, but the Gloo backend's threads
    (``pt_gloo_runloop``, ``gloo_tcp_loop``) live on while anything still holds the group object — under FSDP2 the
    DTensor sharding cache does until the interpreter ends. The interpreter's own teardown then destroys them in an
    order that now and then calls ``std::terminate``: a *completed* rank dies with SIGABRT ("terminate called without
    an active exception"), torchrun reports the run failed. Seen once in 20 two-process CPU FSDP runs on a loaded
    2-core machine; a failed CI run fits it (its log showed only that one run was not ok). Everything a run writes is
    closed before this (the trainer's logs, the wandb mirror); what a normal exit does first is done here too, in its
    order — wait for the non-daemon threads (and thread pools' exits), then the ``atexit`` handlers — only the
    interpreter's final teardown is skipped.
    """
    try:
        # CPython's own first steps of an exit (private names: there is no public way to ask for them)
        getattr(threading, "_shutdown", lambda: None)()  # joins non-daemon threads: no write cut short
        atexit._run_exitfuncs()  # logging.shutdown, wandb, compile-worker pools
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed or broken: nothing left to save
                pass
        os._exit(int(code))


def world_size_from_env() -> int:
    """WORLD_SIZE from the environment (1 when unset)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def setup(device_type: str, single_group: bool = False) -> DistInfo:
    """Initialise the process group when WORLD_SIZE > 1 (nccl on cuda, gloo on cpu); no-op otherwise.

    ``single_group``: one process still gets a one-rank group (in-memory store, no rendezvous), which FSDP2
    needs to shard over a mesh of one.
    """
    global _GROUP_CREATED
    world = world_size_from_env()
    if world <= 1:
        if not single_group or dist.is_initialized():
            return DistInfo()
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo", store=dist.HashStore(),
                                rank=0, world_size=1)
        _GROUP_CREATED = True
        return DistInfo(initialized_here=True)
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    here = False
    if not dist.is_initialized():
        if device_type == "cuda":
            torch.cuda.set_device(local)
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo", rank=rank, world_size=world)
        here = _GROUP_CREATED = True
    return DistInfo(rank=rank, local_rank=local, world_size=world, initialized_here=here)


def all_reduce_mean(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Mean of a tensor over ranks (identity when not distributed)."""
    if info.enabled:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= info.world_size
    return t


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum of a tensor over ranks (identity when not distributed)."""
    if info.enabled:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def any_rank(flag: bool, info: DistInfo, device) -> bool:
    """True when ``flag`` is set on any rank (used to stop all ranks at the same step)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def barrier(info: DistInfo) -> None:
    """Wait for every rank (no-op with one)."""
    if info.enabled:
        dist.barrier()


def teardown(info: DistInfo) -> None:
    """Destroy the process group if this module created it."""
    if info.initialized_here and dist.is_initialized():
        dist.destroy_process_group()
