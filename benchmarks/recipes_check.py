"""The fast recipe paths against the recipe table: are the fused runs' losses the compiled runs' losses, within noise?

sweeps/recipes_check.yaml re-trains the recipe table's 7.1M D/N 5 cell (three seeds) of every recipe whose GPU path
is the fused recipe layer or the FP8 tile kernel, with the table's exact configs (same run ids). This script pairs
each re-trained run with the table's run of the same id as first trained on the compiled oracle path
(benchmarks/results/recipes/compiled_losses.csv; the table itself now holds the fast paths' runs) and judges the
difference against the table's own seed noise:

  delta_s   = L_fast(recipe, seed s) - L_table(recipe, seed s)      (the bf16 run of seed s cancels out of the
                                                                      difference of the two paired gaps)
  noise sd  = sd over seeds of the table's paired gap L(recipe, s) - L(bf16, s) at this cell (its seed noise)
  judged    = mean delta over seeds against 2 x sd x sqrt(2 / seeds): the 95% band of the difference of two
              independent seed means of that gap

"within noise" when |mean delta| is inside the band. The fused and compiled runs share seeds and data order but
not their rounding, so their trajectories part after the first steps: the check treats them as independent draws
(a conservative band). Writes check.json and check.md next to the table's results; prints the table.

    python benchmarks/recipes_check.py                                 # the committed check_runs.tar.gz
    python benchmarks/recipes_check.py --runs runs/recipes_check       # a fresh sweep's runs
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.ladder import markdown_table, seed_noise  # noqa: E402
from analysis.load import load_runs_dir, load_table  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "recipes"
BASE = "bf16"
#: half-width of the band in standard errors (two-sided 95%)
Z = 2.0


def load_check_runs(source: Path) -> pd.DataFrame:
    """The re-trained runs from a runs folder or a ``.tar.gz`` of one (as committed)."""
    if source.is_dir():
        return load_runs_dir(source)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(source) as tar:
            tar.extractall(tmp, filter="data")
        return load_runs_dir(tmp)


def compare(fast: pd.DataFrame, table: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Per recipe of ``fast``: the seeds' deltas to ``table``'s runs of the same id, the band, the verdict; and the
    pooled figures over every pair."""
    missing = sorted(set(fast["run_id"]) - set(table["run_id"]))
    if missing:
        raise SystemExit(f"recipes_check: {len(missing)} run(s) not in the table (another config?): {missing[:3]}")
    noise = seed_noise(table, BASE)
    pairs = fast[["run_id", "model", "n_params", "tokens", "precision", "seed", "loss"]].merge(
        table[["run_id", "loss"]].rename(columns={"loss": "table_loss"}), on="run_id")
    pairs["delta"] = pairs["loss"] - pairs["table_loss"]
    rows = []
    for (model, n, d, prec), grp in pairs.groupby(["model", "n_params", "tokens", "precision"]):
        cell = noise[(noise["model"] == model) & (noise["tokens"] == d) & (noise["precision"] == prec)]
        sd = float(cell["gap_sd"].iloc[0]) if len(cell) else math.nan
        k = int(grp["seed"].nunique())
        band = Z * sd * math.sqrt(2.0 / k)
        mean = float(grp["delta"].mean())
        rows.append({"recipe": prec, "model": model, "tokens_per_param": round(d / n, 2), "seeds": k,
                     "table_loss": float(grp["table_loss"].mean()), "fast_loss": float(grp["loss"].mean()),
                     "delta_mean": mean, "delta_min": float(grp["delta"].min()), "delta_max": float(grp["delta"].max()),
                     "noise_sd": sd, "band": band,
                     "verdict": ("noise not measured" if math.isnan(sd) else
                                 "within noise" if abs(mean) <= band else
                                 "fast path higher" if mean > 0 else "fast path lower")})
    out = pd.DataFrame(rows).sort_values("recipe").reset_index(drop=True)
    pooled = {"pairs": int(len(pairs)), "delta_mean": float(pairs["delta"].mean()),
              "delta_sd": float(pairs["delta"].std(ddof=1)),
              "delta_se": float(pairs["delta"].std(ddof=1) / math.sqrt(len(pairs))),
              "within_noise": int((out["verdict"] == "within noise").sum()), "recipes": int(len(out))}
    return out, pooled


def render(out: pd.DataFrame, pooled: dict) -> str:
    """The markdown table docs/recipes.md shows."""
    show = out[["recipe", "seeds", "table_loss", "fast_loss", "delta_mean", "delta_min", "delta_max", "noise_sd",
                "band", "verdict"]].rename(columns={
                    "table_loss": "compiled L", "fast_loss": "fast L", "delta_mean": "mean Δ", "delta_min": "min Δ",
                    "delta_max": "max Δ", "noise_sd": "gap sd", "band": "± band"})
    lines = [markdown_table(show),
             "",
             f"All {pooled['pairs']} pairs: mean Δ {pooled['delta_mean']:+.4f} nats (se {pooled['delta_se']:.4f}, "
             f"sd {pooled['delta_sd']:.4f}); {pooled['within_noise']} of {pooled['recipes']} recipes within noise."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, default=RESULTS / "check_runs.tar.gz",
                   help="the re-trained runs: a runs folder or a .tar.gz of one (default: the committed archive)")
    p.add_argument("--table", type=Path, default=RESULTS / "compiled_losses.csv",
                   help="the compiled runs' losses.csv (default: the recipe table as trained on `compiled`)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where check.json and check.md go")
    args = p.parse_args(argv)
    fast = load_check_runs(args.runs)
    out, pooled = compare(fast, load_table(args.table))
    md = render(out, pooled)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check.md").write_text(md)
    (args.out / "check.json").write_text(json.dumps(
        {"what": "fused recipe paths re-trained at the recipe table's 7.1M D/N 5 cell vs the table's compiled runs "
                 "(same run ids); band = 2 x paired-gap sd x sqrt(2/seeds)",
         "command": "python benchmarks/recipes_check.py", "pooled": pooled,
         "recipes": out.to_dict(orient="records")}, indent=1) + "\n")
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
