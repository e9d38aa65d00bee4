"""The recipe table's committed results (benchmarks/results/recipes/) are one consistent result, and
benchmarks/recipes_table.py turns them into the table docs/recipes.md shows."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from committed_fits import assert_refit_agrees, refit

from analysis.ladder import cell_gaps, loss_table, sign_test
from analysis.load import load_table
from analysis.report import update_marked_block

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "benchmarks" / "results" / "recipes"


def test_committed_recipe_tables_agree_with_their_loss_table():
    """losses.csv holds the ladder's bf16 cells (the base law's points) and six cells of every other recipe;
    gaps.csv is what analysis.ladder computes from it, and fit.json was fitted to all of it (the refit of fit.json:
    test_quartet_fit_reproduces_the_committed_fit_json)."""
    table = pd.read_csv(RECIPES / "losses.csv")
    base = table[table["precision"] == "bf16"]
    assert base.groupby(["n_params", "tokens"]).ngroups == 15
    others = table[table["precision"] != "bf16"]
    assert (others.groupby("precision")[["n_params", "tokens"]].apply(lambda g: len(g.drop_duplicates())) == 6).all()
    assert others["precision"].nunique() == 10
    gaps = cell_gaps(loss_table(load_table(RECIPES / "losses.csv")))
    committed = pd.read_csv(RECIPES / "gaps.csv")
    assert np.allclose(gaps["gap"], committed["gap"]) and list(gaps["verdict"]) == list(committed["verdict"])
    fit = json.loads((RECIPES / "fit.json").read_text())
    assert fit["bootstrap"]["requested"] == 200 and fit["provenance"]["options"]["runs"] == len(table)


def test_the_script_rewrites_the_committed_table_and_the_docs_block(recipes_table, tmp_path):
    mod = recipes_table
    assert mod.main(["--out", str(tmp_path), "--docs", ""]) == 0
    table = (tmp_path / "table.md").read_text()
    assert table == (RECIPES / "table.md").read_text()
    assert (tmp_path / "recipes.png").stat().st_size > 10_000
    page = (REPO / "docs" / "recipes.md").read_text()
    begin, end = f"<!-- {mod.PAGE_BLOCK}: begin -->", f"<!-- {mod.PAGE_BLOCK}: end -->"
    block = page[page.index(begin) + len(begin) + 1: page.index(end)]
    assert block == table
    # one row per recipe, bf16 first; every sign count is the ladder's
    first = table.split("\n\n")[1]  # the recipe table (the comment line comes first)
    rows = [line for line in first.splitlines() if line.startswith("| `")]
    signs = sign_test(pd.read_csv(RECIPES / "gaps.csv")).set_index("precision")
    names = [r.split("`")[1] for r in rows]
    assert names[0] == "bf16" and set(names[1:]) == set(signs.index) and len(names) == 11
    for row, name in zip(rows[1:], names[1:]):
        assert f"{signs.loc[name, 'worse_than_base']}/{signs.loc[name, 'cells']} (p " in row, name


def test_update_marked_block_replaces_only_between_the_markers(tmp_path):
    begin, end = "<!-- t.py: begin -->", "<!-- t.py: end -->"
    page = tmp_path / "p.md"
    page.write_text(f"intro\n{begin}\nold\n{end}\nrest\n")
    assert update_marked_block(page, "t.py", "new\n")
    assert page.read_text() == f"intro\n{begin}\nnew\n{end}\nrest\n"
    plain = tmp_path / "q.md"
    plain.write_text("no markers\n")
    assert not update_marked_block(plain, "t.py", "new\n") and plain.read_text() == "no markers\n"
    assert not update_marked_block(tmp_path / "missing.md", "t.py", "new\n")


def test_head_to_head_is_the_ladder_with_the_second_recipe_as_base(recipes_table):
    mod = recipes_table
    losses = pd.read_csv(RECIPES / "losses.csv")
    h = mod.head_to_head(losses, pairs=(("quartet", "luq_int4"),)).iloc[0]
    sub = losses[losses["precision"].isin(["quartet", "luq_int4"])]
    g = cell_gaps(loss_table(sub), base="luq_int4")
    assert h["cells"] == len(g) == 6 and h["a_worse"] == int((g["gap"] > 0).sum())
    assert h["mean_gap"] == pytest.approx(g["gap"].mean())


@pytest.mark.slow
def test_quartet_fit_reproduces_the_committed_fit_json(tmp_path):
    """`quartet fit benchmarks/results/recipes/losses.csv --bootstrap 200` gives fit.json again (seeded bootstrap), as
    far as docs/analysis.md's "Reproducibility of refits" says a refit on any machine does."""
    saved = json.loads((RECIPES / "fit.json").read_text())
    got = refit(RECIPES / "losses.csv", tmp_path / "fit.json", saved, "--bootstrap", "200")
    assert_refit_agrees(got, saved, "recipes")
