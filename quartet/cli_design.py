"""``quartet design`` at the dispatcher layer: model names, budgets and precisions become cells and labels here, then
:mod:`analysis.design` simulates the fit.

:mod:`analysis` imports nothing of the training library but its errors and paths; a model's exact non-embedding N,
the tokens and optimizer steps of a run at a D/N, and a precision's forward / backward labels come from the training
configs (``conf/``, :mod:`quartet.config`), so the lookups live up here and are handed down.
"""
from __future__ import annotations


def _resolve(overrides: list[str]):
    from analysis.errors import AnalysisError
    from quartet.config import compose, resolve
    from quartet.errors import QuartetError

    try:
        return resolve(compose(overrides))
    except QuartetError as exc:
        raise AnalysisError(str(exc)) from None


def cell_of(model: str, dn: float):
    """The :class:`analysis.design.Cell` of a run of ``model`` (``conf/model``) at D/N ``dn``: exact N, tokens,
    optimizer steps, tokens per step, and the budget's config name (``dn<dn>`` where ``conf/budget`` has it)."""
    from analysis.design import Cell
    from quartet.paths import CONF_DIR

    res = _resolve([f"model={model}", f"budget.tokens_per_param={dn:g}", "budget.tokens=null"])
    name = f"dn{dn:g}"
    budget = name if (CONF_DIR / "budget" / f"{name}.yaml").exists() else f"tokens_per_param={dn:g}"
    return Cell(model=model, n_params=float(res.n_params), tokens=float(res.tokens), steps=int(res.steps),
                tokens_per_step=int(res.tokens_per_step), budget=budget)


def labels_of(precision: str) -> tuple[str, str]:
    """``(forward, backward)``: the labels a run of ``precision`` (``conf/precision``) carries in ``losses.csv``."""
    from analysis.errors import AnalysisError
    from quartet.config import compose
    from quartet.errors import QuartetError

    try:
        p = compose([f"precision={precision}"]).precision
    except QuartetError as exc:
        raise AnalysisError(str(exc)) from None
    return str(p.forward), str(p.backward)


def design_main(argv: list[str] | None = None) -> int:
    """``quartet design``: :func:`analysis.cli.design_main` with models and precisions resolved here."""
    from analysis.cli import design_main as main

    return main(argv, cell_of=cell_of, labels_of=labels_of)
