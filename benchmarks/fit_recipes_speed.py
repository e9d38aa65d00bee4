"""Benchmark: `quartet fit` on the recipe table's design — eleven recipes at once, 200 bootstrap refits.

The data are planted: the one-GPU ladder's bf16 cells (sizes and budgets of benchmarks/results/ladder/losses.csv)
and, for every other recipe of ``quartet.quant.schemes.RECIPES``, the cells of sweeps/recipes.yaml (3 sizes x 2
budgets + two more seeds at one cell per size), with losses from a known law (the committed ladder fit's base
parameters) and a known effN / effD per recipe, plus Gaussian noise of the ladder's seed sd in log loss. The
script times the CLI as a user runs it (a fresh process: imports, load, fit, bootstrap, report) and keeps the
printed report, so its readability is checked on the same run.

    .venv/bin/python benchmarks/fit_recipes_speed.py [--bootstrap 200] [--repeats 3] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.laws import predict  # noqa: E402
from quartet.quant.schemes import RECIPES  # noqa: E402

#: planted efficiencies (effN, effD): roughly the interim measurements' ordering, not a claim about any recipe
PLANTED = {"fp8": (0.98, 1.0), "mxfp8": (0.97, 1.0), "fp8_deepseek": (0.99, 1.0), "nvfp4": (0.7, 0.95),
           "nvfp4_recipe": (0.78, 0.96), "quartet": (0.62, 0.94), "quartet_sr": (0.6, 0.9), "quartet2": (0.78, 0.97),
           "ms_fp4": (0.72, 0.95), "luq_int4": (0.3, 0.75)}
NOISE = 0.008  # log-loss sd, about the ladder's seed noise


def planted_table(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ladder = pd.read_csv(REPO / "benchmarks" / "results" / "ladder" / "losses.csv")
    fit = json.loads((REPO / "benchmarks" / "results" / "ladder" / "fit.json").read_text())
    base = fit["base"]["params"]
    sweep = yaml.safe_load((REPO / "sweeps" / "recipes.yaml").read_text())
    cells = {(m, b) for m in sweep["axes"]["model"] for b in sweep["axes"]["budget"]}
    cells -= {(e["model"], e["budget"]) for e in sweep["exclude"]}
    sizes = ladder.groupby("model")["n_params"].first().to_dict()
    rows = []
    bf16 = ladder[ladder["precision"] == "bf16"]
    for _, r in bf16.iterrows():
        loss = float(predict(base, r["n_params"], r["tokens"])[()]) * np.exp(rng.normal(0, NOISE))
        rows.append(dict(n_params=r["n_params"], tokens=r["tokens"], forward="bf16", backward="bf16", loss=loss,
                         seed=int(r["seed"]), model=r["model"], precision="bf16"))
    seeded = {(e["model"], e["budget"]) for e in sweep["include"]}
    for name in RECIPES:
        if name == "bf16":
            continue
        prec = yaml.safe_load((REPO / "conf" / "precision" / f"{name}.yaml").read_text())
        en, ed = PLANTED[name]
        for model, budget in sorted(cells):
            n = sizes[model]
            d = n * float(budget[2:])
            for s in ((0, 1, 2) if (model, budget) in seeded else (0,)):
                loss = float(predict(base, n, d, en, ed)[()]) * np.exp(rng.normal(0, NOISE))
                rows.append(dict(n_params=n, tokens=d, forward=prec["forward"], backward=prec["backward"], loss=loss,
                                 seed=s, model=model, precision=name))
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "planted.csv"
        table = planted_table()
        table.to_csv(csv, index=False)
        env = {**os.environ, "MPLCONFIGDIR": str(Path(tmp) / "mpl")}
        walls, cpus, out = [], [], ""
        for _ in range(args.repeats):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            res = subprocess.run([sys.executable, "-m", "quartet.cli", "fit", str(csv), "--bootstrap",
                                  str(args.bootstrap)], cwd=REPO, env=env, capture_output=True, text=True)
            walls.append(time.perf_counter() - t)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            if res.returncode:
                print(res.stdout[-3000:], res.stderr[-3000:], file=sys.stderr)
                return res.returncode
            out = res.stdout
    print(out)
    result = {"what": f"quartet fit on {len(table)} planted runs of {table['precision'].nunique()} recipes, "
                      f"--bootstrap {args.bootstrap}, a fresh process each",
              "command": "python3 benchmarks/fit_recipes_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_average": [round(x, 2) for x in os.getloadavg()]},
              "wall_s": [round(w, 2) for w in walls], "cpu_s": [round(c, 2) for c in cpus],
              "median_wall_s": round(statistics.median(walls), 2), "median_cpu_s": round(statistics.median(cpus), 2),
              "report_lines": len(out.splitlines())}
    print(json.dumps({k: v for k, v in result.items() if k != "what"}))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
