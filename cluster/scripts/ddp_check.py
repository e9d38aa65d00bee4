"""DDP check: the same tiny run trained by 1 GPU and by 2 GPUs must give the same loss curve.

Two halves, so the GPU machine needs only python3 + torch (+ numpy):

``prepare`` (here, with the project's full environment): compose the run with Hydra, resolve it,
prepare its token shards, and write a self-contained bundle (config.yaml + data + pure-Python
wheels of omegaconf/PyYAML) under ``.cache/ddp_check/``.

``train`` (on the GPU machine, started by ddp_check.sh with ``torchrun``): load the bundled
config.yaml WITHOUT Hydra (``quartet.config.load_config_file``), point it at the bundled data and
an output root, and run ``quartet.train.Trainer`` (which reads RANK/LOCAL_RANK/WORLD_SIZE).

``compare``: print both loss curves and their max difference; exit 1 above ``--tol``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUNDLE = Path(os.environ.get("DDP_CHECK_BUNDLE", REPO / ".cache" / "ddp_check"))


def prepare(args) -> int:
    from omegaconf import OmegaConf

    from quartet.config import compose, resolve
    from quartet.data import prepare as prepare_data

    cfg = compose([f"model={args.model}", "budget=tokens", f"budget.tokens={args.tokens}", "data=shakespeare_small",
                   "logging=quiet", "logging.log_every=1", "logging.progress=false", "run.device=cuda",
                   f"run.amp={str(args.amp).lower()}", f"precision={args.precision}", "run.name=ddp_check",
                   f"optim.batch_size={args.batch}",
                   # the same micro-batches in both runs: 1 GPU accumulates two, 2 GPUs take one each. (With the
                   # default, 1 GPU would run ONE micro-batch of the whole batch: the same maths for bf16, but
                   # precision schemes draw their random Hadamard signs per micro-batch, so a quartet run would
                   # see different signs for half of the tokens and the curves could not be compared.)
                   f"optim.micro_batch_size={args.batch // 2}"])
    res = resolve(cfg, world_size=2)  # the batch must split over 2 ranks
    data_dir = prepare_data(cfg.data, progress=False)
    if BUNDLE.exists():
        shutil.rmtree(BUNDLE)
    (BUNDLE / "data").mkdir(parents=True)
    shutil.copytree(data_dir, BUNDLE / "data" / Path(data_dir).name)
    cfg.data.dir = None  # set on the GPU machine to the bundle's absolute path
    OmegaConf.save(cfg, BUNDLE / "config.yaml", resolve=True)
    (BUNDLE / "data_name").write_text(Path(data_dir).name)
    print(f"bundle: {BUNDLE} (run {args.model} x {res.steps} steps of {res.tokens_per_step} tokens, "
          f"precision {args.precision}, amp {args.amp})")
    return 0


def train(args) -> int:
    import os

    from quartet.config import load_config_file
    from quartet.train import Trainer

    data = BUNDLE / "data" / (BUNDLE / "data_name").read_text().strip()
    overrides = [f"run.out_dir={args.out}", f"data.dir={data}", "data.verify=size"]
    if args.device:  # e.g. cpu: try the plumbing (gloo) on a machine without GPUs
        overrides.append(f"run.device={args.device}")
    cfg = load_config_file(BUNDLE / "config.yaml", overrides)
    result = Trainer(cfg).run()
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"world": int(os.environ.get("WORLD_SIZE", "1")), "val_loss": result.get("val_loss"),
                          "tokens_per_s": result.get("tokens_per_s")}))
    return 0


def _curve(root: Path) -> list[tuple[int, float]]:
    (metrics,) = list(root.glob("ddp_check/*/metrics.jsonl"))
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def compare(args) -> int:
    one, two = _curve(Path(args.out1)), _curve(Path(args.out2))
    assert [s for s, _ in one] == [s for s, _ in two], "different logged steps"
    diffs = [abs(a - b) for (_, a), (_, b) in zip(one, two)]
    every = max(1, len(one) // 20)
    la, lb = (args.labels or "1 GPU,2 GPUs").split(",")
    print(f"{'step':>6} {'loss ' + la:>14} {'loss ' + lb:>14} {'|diff|':>10}")
    for i, ((s, a), (_, b)) in enumerate(zip(one, two)):
        if i % every == 0 or i == len(one) - 1:
            print(f"{s:6d} {a:14.6f} {b:14.6f} {abs(a - b):10.2e}")
    s1 = json.loads(next(Path(args.out1).glob("ddp_check/*/summary.json")).read_text())
    s2 = json.loads(next(Path(args.out2).glob("ddp_check/*/summary.json")).read_text())
    print(f"max |loss diff| over {len(one)} steps: {max(diffs):.3e} (at step {one[diffs.index(max(diffs))][0]}); "
          f"final val_loss {la} {s1['val_loss']:.6f} vs {lb} {s2['val_loss']:.6f} "
          f"(diff {abs(s1['val_loss'] - s2['val_loss']):.3e}); tokens/s {s1['tokens_per_s']:.0f} vs {s2['tokens_per_s']:.0f}")
    ok = max(diffs) <= args.tol
    print(("PASS" if ok else "FAIL") + f": tolerance {args.tol:g}")
    return 0 if ok else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("--model", default="llama_small")
    a.add_argument("--tokens", type=int, default=16 * 128 * 300)
    a.add_argument("--batch", type=int, default=16)
    a.add_argument("--precision", default="bf16")
    a.add_argument("--amp", action=argparse.BooleanOptionalAction, default=False)
    b = sub.add_parser("train")
    b.add_argument("--out", required=True)
    b.add_argument("--device", default=None, help="override run.device (default: cuda from the bundle)")
    c = sub.add_parser("compare")
    c.add_argument("out1")
    c.add_argument("out2")
    c.add_argument("--tol", type=float, default=5e-3)
    c.add_argument("--labels", default=None, help="names of the two runs, comma-separated")
    args = p.parse_args(argv)
    return {"prepare": prepare, "train": train, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
