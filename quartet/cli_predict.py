"""``quartet predict`` at the dispatcher layer: model names become sizes here, then :mod:`analysis` forecasts.

:mod:`analysis` imports nothing of the training library but its errors and paths; a model's exact non-embedding
N and the tokens of a run of a given D/N come from the training configs (``conf/model``, :mod:`quartet.config`),
so the lookup lives up here and is handed down.
"""
from __future__ import annotations


def model_point(model: str, dn: float | None = None, tokens: float | None = None):
    """A model of ``conf/model`` at a budget: its exact non-embedding N; with ``dn`` the tokens a run of that D/N
    trains (``dn`` x the model's nominal size, in whole optimizer steps of its batch), with ``tokens`` those."""
    from analysis.errors import AnalysisError
    from analysis.predict import Point
    from quartet.config import compose, resolve
    from quartet.errors import QuartetError

    budget = ([f"budget.tokens_per_param={dn:g}", "budget.tokens=null"] if dn is not None
              else ["budget.tokens_per_param=null", f"budget.tokens={int(tokens)}"])
    try:
        res = resolve(compose([f"model={model}", *budget]))
    except QuartetError as exc:
        raise AnalysisError(str(exc)) from None
    return Point(n_params=float(res.n_params), tokens=float(res.tokens) if dn is not None else float(tokens),
                 model=model)


def predict_main(argv: list[str] | None = None) -> int:
    """``quartet predict``: :func:`analysis.cli.predict_main` with model names resolved by :func:`model_point`."""
    from analysis.cli import predict_main as forecast_main

    return forecast_main(argv, model_point=model_point)
