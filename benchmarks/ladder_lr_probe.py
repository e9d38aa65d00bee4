"""Pick a ladder size's peak LR from a bf16 probe sweep by a rule fixed before the probe ran.

``sweeps/ladder_1m_lr.yaml`` trains llama_1m in bf16 at several peak LRs, two budgets and three seeds. The rule:
the LR with the lowest final validation loss averaged over every seed and budget wins (a mean over budgets of
per-budget means, so a budget with a missing run cannot tilt it). Quartet and fp8 never enter the choice, so the
precision gaps measured afterwards at the chosen LR are not selected for. The table also shows each LR's seed sd
per budget, the figure the ladder's noise bar is made of.

    python benchmarks/ladder_lr_probe.py runs/ladder_1m_lr                     # the table and the winner
    python benchmarks/ladder_lr_probe.py runs/ladder_1m_lr --apply conf/model/llama_1m.yaml --csv out.csv

``--apply`` rewrites the ``lr:`` line of the model YAML to the winner (and says so in its comment). Every
run in the folder must have finished, and every LR must have runs at every budget: otherwise it names what is
missing and exits non-zero instead of choosing. (Runs never launched are not seen: count the table's seeds.)

``--same-config-in FOLDER`` (repeatable) pairs each probe run with any run in FOLDER of the same configuration
(model, budget, LR, seed, data seed, precision) and prints both losses: a second run of an identical config on
the GPU is not bitwise equal (inductor/cuBLAS kernel choices, atomics), and where the loss falls steeply that
difference is as large as a seed's.

    python benchmarks/ladder_lr_probe.py runs/ladder_1m_lr --same-config-in runs/ladder_1gpu \
        --same-config-in runs/ladder_1gpu_retired --same-config-csv rerun_identity.csv
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd
import yaml

from quartet import paths


def load_probe(folder: Path) -> pd.DataFrame:
    """One row per finished run of the probe: lr, budget (tokens per parameter), seed, val_loss, run_id (and the
    configuration key :func:`same_config` pairs runs by)."""
    rows, unfinished = [], []
    for run in sorted(p for p in folder.iterdir() if p.is_dir()):
        summary = paths.read_summary(run)
        if summary is None:
            unfinished.append(run.name)
            continue
        rows.append(_row(run, summary))
    if unfinished:
        raise SystemExit(f"ladder_lr_probe: {len(unfinished)} run(s) in {folder} have no {paths.SUMMARY} "
                         f"(unfinished or failed): {', '.join(unfinished[:4])}{' ...' if len(unfinished) > 4 else ''}")
    if not rows:
        raise SystemExit(f"ladder_lr_probe: no finished runs in {folder}")
    return pd.DataFrame(rows)


def _row(run: Path, s: dict) -> dict:
    cfg = run / paths.CONFIG
    data_seed = (yaml.safe_load(cfg.read_text()) or {}).get("run", {}).get("data_seed") if cfg.is_file() else None
    return {"lr": float(s["lr"]), "dn": round(float(s["tokens_per_param"])), "seed": int(s["seed"]),
            "val_loss": float(s["val_loss"]), "run_id": s["run_id"], "model": s["model"], "precision": s["precision"],
            "data_seed": data_seed, "device": s.get("device_name"), "finished_at": s.get("finished_at")}


def same_config(probe: pd.DataFrame, folders: list[Path]) -> pd.DataFrame:
    """Probe runs next to the runs in ``folders`` that have the same configuration, with the loss difference."""
    key = ["model", "precision", "dn", "lr", "seed", "data_seed"]
    others = [_row(run, s) for folder in folders for run in sorted(folder.iterdir())
              if (s := paths.read_summary(run)) is not None]
    if not others:
        return pd.DataFrame()
    pairs = probe.merge(pd.DataFrame(others), on=key, suffixes=("_probe", "_other"))
    pairs["difference"] = pairs["val_loss_other"] - pairs["val_loss_probe"]
    return pairs[key + ["run_id_probe", "val_loss_probe", "run_id_other", "val_loss_other", "difference",
                        "finished_at_other"]]


def choose(df: pd.DataFrame) -> tuple[float, pd.DataFrame]:
    """(winning LR, per-LR table): mean and sd of the loss over seeds per budget, and the score (mean of means)."""
    per = df.groupby(["lr", "dn"])["val_loss"].agg(["mean", "std", "count"]).unstack("dn")
    table = pd.DataFrame(index=per.index)
    for dn in sorted(df["dn"].unique()):
        table[f"mean_dn{dn}"] = per[("mean", dn)]
        table[f"sd_dn{dn}"] = per[("std", dn)]
        table[f"seeds_dn{dn}"] = per[("count", dn)]
    # an LR without runs at some budget is not scored on the others alone (the mean of means would skip the NaN)
    table["score"] = per["mean"].mean(axis=1, skipna=False)
    if table["score"].isna().any():
        missing = ", ".join(f"{lr:g}" for lr in table.index[table["score"].isna()])
        raise SystemExit(f"ladder_lr_probe: LR {missing} lacks finished runs at some budget; not choosing")
    return float(table["score"].idxmin()), table.reset_index()


def apply_lr(yaml_path: Path, lr: float, note: str) -> None:
    """Rewrite the model YAML's ``lr:`` line (value and comment), leaving every other line as it is."""
    text = yaml_path.read_text()
    new, n = re.subn(r"(?m)^lr:.*$", f"lr: {lr:g}    # {note}", text)
    if n != 1:
        raise SystemExit(f"ladder_lr_probe: {yaml_path} has {n} 'lr:' lines (expected one)")
    yaml_path.write_text(new)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="the probe sweep's runs folder (runs/ladder_1m_lr)")
    p.add_argument("--apply", type=Path, default=None, metavar="MODEL_YAML", help="write the winner into this YAML")
    p.add_argument("--csv", type=Path, default=None, help="write the per-LR table")
    p.add_argument("--same-config-in", type=Path, action="append", default=[], metavar="FOLDER",
                   help="pair probe runs with runs of the same configuration in FOLDER (repeatable)")
    p.add_argument("--same-config-csv", type=Path, default=None, help="write those pairs")
    args = p.parse_args(argv)
    if not args.folder.is_dir():
        print(f"ladder_lr_probe: {args.folder} is not a folder", file=sys.stderr)
        return 2
    df = load_probe(args.folder)
    lr, table = choose(df)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"chosen peak LR: {lr:g} (lowest bf16 validation loss averaged over {df['seed'].nunique()} seeds and "
          f"D/N {', '.join(str(d) for d in sorted(df['dn'].unique()))})")
    if args.csv:
        table.to_csv(args.csv, index=False)
    if args.same_config_in:
        pairs = same_config(df, args.same_config_in)
        if pairs.empty:
            print("no run of the same configuration in " + ", ".join(map(str, args.same_config_in)))
        else:
            print(pairs.drop(columns=["finished_at_other"]).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
            print(f"same configuration, two runs: |difference| median {pairs['difference'].abs().median():.4f}, "
                  f"max {pairs['difference'].abs().max():.4f} nats over {len(pairs)} pairs")
            if args.same_config_csv:
                pairs.to_csv(args.same_config_csv, index=False)
    if args.apply:
        apply_lr(args.apply, lr, f"bf16 LR probe (sweeps/ladder_1m_lr.yaml, benchmarks/ladder_lr_probe.py): "
                                 f"lowest mean validation loss of {', '.join(f'{v:g}' for v in table['lr'])}")
        print(f"wrote lr: {lr:g} into {args.apply}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
