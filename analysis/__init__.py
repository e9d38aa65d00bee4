"""Scaling-law analysis of logged losses. Importable without torch.

Python API (what ``quartet fit`` / ``quartet figures`` and the demo call)::

    import analysis
    df = analysis.load("runs/my_sweep")          # or a .csv/.parquet, "paper", "wandb:entity/project"
    report = analysis.fit_all(df, bootstrap=50)  # base law + effN/effD per precision, CIs, forecasts
    print(report.headlines[0]["text"])
    paths = analysis.figures.make_all(report, df, "figures/")

``analysis.figures`` (matplotlib) is imported on first use so fitting alone stays light.
"""
from __future__ import annotations

import importlib

from analysis.errors import AnalysisError
from analysis.fit import BaseFit, EffFit, fit_base, fit_efficiency
from analysis.laws import BUSBRIDGE, HOFFMANN, KAPLAN, LAWS, get_law, predict
from analysis.load import load, load_curve, load_paper, load_runs_dir, load_table, load_wandb, load_wandb_offline
from analysis.report import FitReport, fit_all
from analysis.speed import breakeven_speedup, optimal_map, training_speedup

__all__ = ["AnalysisError", "BaseFit", "EffFit", "FitReport", "fit_base", "fit_efficiency", "fit_all", "load",
           "load_curve", "load_paper", "load_runs_dir", "load_table", "load_wandb", "load_wandb_offline", "predict",
           "get_law", "LAWS", "BUSBRIDGE", "HOFFMANN", "KAPLAN", "breakeven_speedup", "optimal_map",
           "training_speedup", "figures"]


def __getattr__(name: str):
    if name == "figures":
        return importlib.import_module("analysis.figures")
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
