"""FSDP2 (run.parallel=fsdp) on CPU: two gloo processes train, checkpoint and resume like one process.

Tolerance: per-step losses and the final validation loss agree to 5e-5 absolute. On CPU FSDP2 keeps fp32
parameters and reductions; what differs is only the order of the floating-point sums (each micro-batch's
gradient reduce-scattered and averaged over the ranks where one process sums four micro-batches, the global
norm summed from shards), ~1e-7 relative per step. Seen on torch 2.13 CPU: per-step losses within 4.8e-7;
final validation loss within 1.2e-5 under fp8, whose tensor-wise scales turn such differences into the odd
flipped E4M3 code. Each rank runs two
micro-batches per step, so gradient accumulation and the global micro-batch numbering of the random
draws (rank r's first micro-batch is r * 2) are exercised too.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from quartet.config import compose
from quartet.runs import run_dir
from quartet.train import Trainer

TOL = 5e-5


def _losses(d: Path) -> list[tuple[int, float]]:
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def _val(d: Path) -> float:
    return json.loads((d / "summary.json").read_text())["val_loss"]


def _same_curve(a: Path, b: Path, steps) -> float:
    la, lb = dict(_losses(a)), dict(_losses(b))
    assert sorted(lb) == sorted(la) == list(steps)
    for s in steps:
        assert lb[s] == pytest.approx(la[s], abs=TOL), s
    assert _val(b) == pytest.approx(_val(a), abs=TOL)
    return max(abs(la[s] - lb[s]) for s in steps), abs(_val(a) - _val(b))


def _over(tiny_overrides, precision: str) -> list[str]:
    return [*tiny_overrides, "optim.micro_batch_size=2", "budget.tokens=4096", f"precision={precision}"]


@pytest.mark.parametrize("precision", ["bf16", "quartet", "fp8"])
def test_fsdp_two_gloo_processes_match_one_process(tmp_path, tiny_overrides, torchrun2, precision):
    over = _over(tiny_overrides, precision)
    single = compose([*over, f"run.out_dir={tmp_path / 'one'}"])
    Trainer(single).run()  # one plain process: the reference
    two = torchrun2([*over, "run.parallel=fsdp"], tmp_path / "two")
    worst, val = _same_curve(run_dir(single), two, range(1, 9))
    print(f"{precision}: max |loss(1 proc) - loss(2 procs, fsdp)| over 8 steps: {worst:.3g}; val loss: {val:.3g}")
    ckpt = two / "ckpt"
    # a sharded checkpoint: one DCP file per rank, the metadata and the checksummed meta.pt; the previous
    # generation kept beside it; no single-file checkpoint
    assert sorted(p.name for p in (ckpt / "last").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    assert not (ckpt / "last.pt").exists() and not (ckpt / "last.tmp").exists()
    assert (two / "train.log").read_text().count("completed") == 1


def test_fsdp_resume_on_one_and_two_processes(tmp_path, tiny_overrides, torchrun2):
    """Save sharded on 2 ranks at step 4; resume from it on 1 rank and on 2: the curve of the uninterrupted run."""
    over = [*_over(tiny_overrides, "quartet"), "run.parallel=fsdp", "logging.ckpt_every=4"]
    full = torchrun2(over, tmp_path / "full")  # checkpoints at step 4 and (on completion) step 8
    assert json.loads((full / "state.json").read_text())["state"] == "completed"

    def interrupted_copy(name: str) -> Path:
        d = run_dir(compose([*over, f"run.out_dir={tmp_path / name}"]))
        shutil.copytree(full, d)
        (d / "summary.json").unlink()  # as if the run had stopped after its step-4 checkpoint
        return d

    # on one process: ckpt/last (step 8) gets a flipped byte in a shard, so the load must refuse it, keep it
    # as last.bad and fall back to ckpt/prev (step 4), re-slicing two ranks' shards into one
    one = interrupted_copy("one")
    shard = one / "ckpt" / "last" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    trainer = Trainer(compose([*over, f"run.out_dir={tmp_path / 'one'}"]))
    assert trainer.dist.world_size == 1 and trainer.parallel == "fsdp"
    warnings_seen: list[str] = []
    trainer.log.warning = lambda msg, *a: warnings_seen.append(msg % a if a else msg)
    trainer.run()
    assert any("__1_0.distcp" in w and "resuming from prev at step 4" in w for w in warnings_seen), warnings_seen
    assert (one / "ckpt" / "last.bad").is_dir()
    _same_curve(full, one, range(1, 9))

    # on two processes: ckpt/last is the step-4 generation
    two = interrupted_copy("two")
    shutil.rmtree(two / "ckpt" / "last")
    os.replace(two / "ckpt" / "prev", two / "ckpt" / "last")
    torchrun2(over, tmp_path / "two")
    _same_curve(full, two, range(1, 9))
    assert "resuming" in (two / "train.log").read_text()


def _gather_probe(rank: int, port: int, out: str) -> None:
    """One rank of test_quantized_layers_see_full_weights (module level: spawned processes import it)."""
    import torch.distributed as dist

    from quartet import parallel, quant
    from quartet.model import Llama

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = Llama(2, 64, 4, 50, 32)
    quant.apply_precision(model, compose(["precision=quartet"]).precision, seed=0)
    parallel.wrap(model, "fsdp", torch.device("cpu"), world_size=2, amp=False)
    seen = []
    layers = [m for m in model.modules() if isinstance(m, quant.QuantLinear)]
    others = {id(m): [o for o in layers if o.qname.split(".")[1] != m.qname.split(".")[1]] for m in layers}

    def hook(mod, _inp):
        # the weight this layer sees, and how many layers of the *other* block are gathered at this moment
        gathered = sum(type(o.weight).__name__ != "DTensor" for o in others[id(mod)])
        seen.append((type(mod.weight).__name__, list(mod.weight.shape), [mod.out_features, mod.in_features], gathered))

    for m in layers:
        m.register_forward_pre_hook(hook)
    stored = [(type(m.weight).__name__, list(m.weight.to_local().shape)) for m in layers]
    model(torch.randint(0, 50, (2, 32)), torch.randint(0, 50, (2, 32))).backward()
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump({"seen": seen, "stored": stored}, fh)
    dist.barrier()
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: after this bare FSDP2 probe (a backward, no optimizer step) a
    # spawned process aborted at exit ~1 run in 6, after destroy_process_group had returned ("terminate called
    # without an active exception", SIGABRT, from a C++ thread destroyed unjoined); 20 of 20 passed this way.
    os._exit(0)


def test_quantized_layers_see_full_weights_under_fsdp(tmp_path):
    """Between steps a QuantLinear holds a DTensor shard (half the rows per rank); inside its forward FSDP2
    has all-gathered its block, so the layer sees the plain, full weight, while the other block stays sharded
    (gathered per block, resharded after the block's forward)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_gather_probe, args=(port, str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(got["seen"]) == 8  # 2 blocks x 4 quantized linears, each called once
        for kind, shape, full, other_block_gathered in got["seen"]:
            assert kind != "DTensor" and shape == full and other_block_gathered == 0
        for (kind, local), (_, _, full, _) in zip(got["stored"], got["seen"]):
            assert kind == "DTensor" and local == [full[0] // 2, full[1]]


def test_activation_checkpointing_draws_the_same_numbers(tiny_cfg):
    """With activation checkpointing the recomputed forward replays the layers' micro-batch numbers: under
    stochastic rounding in the forward (sr_fwd) the curve equals the one without it. One process, so the only
    difference could be the draws: 1e-7. (A recompute that counted as a new micro-batch drew other roundings
    for the saved operands: 6e-5 off in the validation loss after 4 steps.)"""
    base = [*"optim.micro_batch_size=2 budget.tokens=2048 precision=sr_fwd".split()]
    a = Trainer(tiny_cfg(*base, "run.name=plain")).run()
    b = Trainer(tiny_cfg(*base, "run.name=ac", "run.activation_checkpointing=true", "run.parallel=fsdp")).run()
    assert b["val_loss"] == pytest.approx(a["val_loss"], abs=1e-7)
    assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-7)
