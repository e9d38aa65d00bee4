"""fit_all on a demo-sized grid, the JSON report, the CLI, the figures and the no-torch guarantee."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.cli import figures_main, fit_main
from analysis.errors import AnalysisError
from analysis.load import frame_from_table, load_runs_dir
from analysis.report import fit_all

from analysis_testdata import SCHEMES, synthetic_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_report():
    df = frame_from_table(pd.DataFrame(synthetic_rows(noise=0.002)))
    return df, fit_all(df, bootstrap=12, seed=3)


def test_small_grid_with_bootstrap(demo_report):
    df, rep = demo_report
    assert rep.base.n_points == 9 and rep.base.status in ("converged", "too_few_points", "hit_bound")
    assert rep.bootstrap["used"] >= 8
    for label, (fw, bw, en, ed) in SCHEMES.items():
        if label == "bf16":
            continue
        e = rep.eff(f"{fw}:{bw}" if fw != bw else fw)
        assert e.kind == "joint" and e.n_points == 9
        assert e.eff_n == pytest.approx(en, abs=0.12) and e.eff_d == pytest.approx(ed, abs=0.12)
        lo, hi = rep.eff_intervals[e.scheme]["eff_n"]
        assert lo <= hi
    assert set(rep.base_intervals) == {"A", "alpha", "B", "beta", "E", "gamma"}
    # the largest size and budget held out, then each other size (3 sizes here)
    assert len(rep.headlines) == 2 and [f.name for f in rep.forecasts][:2] == ["leave_largest_model_out",
                                                                             "leave_largest_budget_out"]
    assert len(rep.forecasts) == 4 and rep.forecasts[2].name.startswith("leave_size_out_")


def test_json_schema_and_provenance(demo_report, tmp_path):
    _, rep = demo_report
    out = json.loads(rep.to_json(tmp_path / "fit.json"))
    assert json.loads((tmp_path / "fit.json").read_text()) == out
    assert out["schema_version"] == 1
    assert set(out["base"]["params"]) == {"A", "alpha", "B", "beta", "E", "gamma"}
    assert out["base"]["status"] in ("converged", "hit_bound", "not_identified", "too_few_points", "failed")
    assert set(out["base"]["intervals"]) == set(out["base"]["params"])
    e = out["efficiencies"][0]
    for key in ("scheme", "forward", "backward", "kind", "eff_n", "eff_d", "eff_n_interval", "eff_d_interval",
                "status", "n_points", "run_ids"):
        assert key in e
    prov = out["provenance"]
    assert prov["law"] == "busbridge" and prov["options"]["huber_delta"] == 1e-4
    assert prov["code"]["quartet"] and len(prov["input"]["run_ids"]) == 27


def test_missing_baseline_is_a_clear_error():
    df = frame_from_table(pd.DataFrame([r for r in synthetic_rows() if r["forward"] != "bf16"]))
    with pytest.raises(AnalysisError, match="no baseline rows.*precisions present: fp8, quest:rtn_absmax"):
        fit_all(df)


def test_cli_fit_paper_json(tmp_path, capsys):
    assert fit_main(["--paper", "--json", str(tmp_path / "f.json")]) == 0
    text = capsys.readouterr().out
    assert "Base law (busbridge), 23 runs" in text and "quest:sr_absmax" in text
    assert "base fit status: converged" in text
    # many precisions: their headlines are one table (a row each), not a paragraph each
    assert "What each precision costs at N =" in text and "•" not in text
    heads = text[text.index("What each precision costs"):]
    rows = [ln for ln in heads.splitlines() if ln.startswith("│ quest:sr_absmax ")]
    assert len(rows) == 1 and "1.62x" in rows[0] and "finding" in rows[0]
    data = json.loads((tmp_path / "f.json").read_text())
    assert any("pays off when its speedup exceeds" in h["text"] for h in data["headlines"])  # JSON keeps the sentences
    assert data["base"]["params"]["gamma"] == pytest.approx(0.274, rel=0.01)
    assert data["provenance"]["input"]["kind"] == "paper" and len(data["provenance"]["input"]["sha256"]) == 64


def test_cli_errors_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("n_params,tokens,loss\n1,2,3\n")
    assert fit_main([str(bad)]) == 2
    assert "missing column(s) forward, backward" in capsys.readouterr().err
    assert fit_main([]) == 2
    assert "exactly one SOURCE or --paper" in capsys.readouterr().err


def test_figures_from_runs_dir(runs_dir, tmp_path, capsys):
    out = tmp_path / "figs"
    assert figures_main([str(runs_dir), "--out", str(out), "--law", "busbridge"]) == 0
    names = {p.name for p in out.iterdir()}
    for stem in ("losses", "efficiencies", "residuals", "breakeven", "optimal_precision"):
        assert {f"{stem}.png", f"{stem}.pdf"} <= names
        assert (out / f"{stem}.png").stat().st_size > 20_000  # a real plot, not an empty canvas
    assert (out / "fit.json").exists()
    assert "wrote 10 figure files" in capsys.readouterr().out


def test_hoffmann_law_on_runs(runs_dir):
    from analysis.report import fit_all as fa

    rep = fa(load_runs_dir(runs_dir), "hoffmann", forecasts=False)
    assert rep.base.params["gamma"] == 1.0 and "gamma" not in rep.base.free


def test_imports_and_runs_without_torch(tmp_path):
    """analysis must import and fit with torch made unimportable."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import analysis, analysis.figures, analysis.cli\n"
        "from analysis.cli import fit_main\n"
        f"rc = fit_main(['--paper', '--json', {str(tmp_path / 'f.json')!r}])\n"
        "assert rc == 0, rc\n"
        "assert sys.modules['torch'] is None\n"
        "print('NO_TORCH_OK')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "NO_TORCH_OK" in res.stdout


def test_schemes_sharing_labels_are_not_pooled():
    rows = synthetic_rows()
    extra = [{**r, "precision": "quartet_b", "run_id": r["run_id"] + "-b", "loss": r["loss"] * 1.01}
             for r in rows if r["precision"] == "quartet"]
    rep = fit_all(frame_from_table(pd.DataFrame(rows + extra)), forecasts=False)
    a, b = rep.eff("quartet"), rep.eff("quartet_b")
    assert a.n_points == b.n_points == 9 and (a.forward, a.backward) == (b.forward, b.backward)
    assert b.eff_n < a.eff_n  # the 1 % worse copy is fitted on its own


def test_cli_optimal_profile_and_bad_budgets(capsys):
    assert fit_main(["--paper", "--optimal", "1e20", "--speedup", "quest:sr_absmax=1.8", "--profile-e"]) == 0
    out = capsys.readouterr().out
    assert "Compute-optimal allocation" in out and "quest:sr_absmax" in out and "1.8" in out
    assert "profile over E" in out and "admissible" in out and "no seed replicates" in out
    assert fit_main(["--paper", "--optimal", "lots"]) == 2
    assert "--optimal takes FLOPs" in capsys.readouterr().err
    assert fit_main(["--paper", "--optimal=-1e20"]) == 2


def test_cli_exclusion_rule_start_grid_and_delta(capsys):
    """Outliers leave by a stated rule and are listed with it; the wide start grid finds the paper's optimum too."""
    from analysis.load import load_paper
    from analysis.report import fit_all

    paper = load_paper()
    cut = fit_all(paper, "busbridge", exclude="n_params > 5e8", forecasts=False)
    gone = [d for d in cut.dropped if "excluded by the rule 'n_params > 5e8'" in d["reason"]]
    assert gone and cut.base.n_points == 23 - sum(1 for d in gone if d["run_id"] in set(
        paper[(paper["forward"] == "bf16") & (paper["backward"] == "bf16")]["run_id"]))
    wide = fit_all(paper, "busbridge", start_grid="wide", forecasts=False)
    assert wide.base.multistart.n_starts == 3072
    assert wide.base.params["alpha"] == pytest.approx(0.5885759, rel=1e-4)
    assert fit_main(["--paper", "--exclude", "steps <", "--law", "hoffmann"]) == 2
    assert "is not a valid query" in capsys.readouterr().err
    assert fit_main(["--paper", "--delta", "0"]) == 2
    assert fit_main(["--paper", "--delta", "1e-3", "--exclude", "n_params > 5e8"]) == 0
    out = capsys.readouterr().out
    assert "excluded by the rule" in out


def test_cli_isoflop_says_when_there_are_no_slices(capsys):
    assert fit_main(["--paper", "--isoflop"]) == 0
    assert "IsoFLOP slices" in capsys.readouterr().out


def test_figure_titles_say_when_they_extrapolate():
    from analysis.figures import extrapolation_note

    assert extrapolation_note(8.2e8, 1e11) == "; law fitted up to N = 820M, extrapolated 122x beyond it"
    assert extrapolation_note(8.2e8, 5e9) == "; law fitted up to N = 820M"
    assert extrapolation_note(2.05e7, 1e11) == "; law fitted up to N = 20.5M, extrapolated 4,878x beyond it"


def _overlapping_labels(ax) -> list:
    """Pairs of x tick labels (major and minor) whose drawn boxes overlap (after a draw)."""
    ax.figure.canvas.draw()
    boxes = [(t.get_text(), t.get_window_extent()) for minor in (False, True)
             for t in ax.get_xticklabels(minor=minor) if t.get_text() and t.get_visible()]
    return [(a, c) for i, (a, b) in enumerate(boxes) for c, d in boxes[i + 1:] if b.overlaps(d)]


def test_log_axis_labels_stay_readable_on_a_narrow_range():
    """The ladder's 3.4M panel spans 3.4e7-2.8e8 tokens: matplotlib's default labels (3x10^7, 4x10^7, ...) overlap;
    log_axis labels 1-2-5 ticks as 50M, 100M, 200M; a wide axis gets decades only; a short one still 3 ticks."""
    import matplotlib.pyplot as plt

    from analysis.figures import log_axis

    fig, ax = plt.subplots(figsize=(4.3, 3.7))
    ax.errorbar([3.41e7, 6.8e7, 1.36e8, 2.73e8], [2.4, 2.0, 1.85, 1.75], yerr=0.02, marker="o")
    ax.set_xscale("log")
    assert _overlapping_labels(ax)  # the figure as it was
    log_axis(ax)
    assert not _overlapping_labels(ax)
    assert [t.get_text() for t in ax.get_xticklabels() if t.get_text()] == ["50M", "100M", "200M"]
    ax.set_xlim(1e7, 1e11)
    log_axis(ax)
    assert [t.get_text() for t in ax.get_xticklabels() if t.get_text()] == ["10M", "100M", "1B", "10B", "100B"]
    ax.set_xlim(1e8, 4.3e8)
    log_axis(ax)
    assert [t.get_text() for t in ax.get_xticklabels() if t.get_text()] == ["100M", "200M", "300M", "400M"]
    assert not _overlapping_labels(ax)
    plt.close(fig)


def test_one_colour_per_precision_across_figures():
    """Named precisions keep their colours; the others get distinct colours that depend on the set of labels only
    (not their order), never one of a named precision present nor the baseline's."""
    from analysis.figures import PRECISION_COLORS, precision_colors

    labels = ["quartet", "fp8", "bf16:quest", "luq-int4", "halo-fp4", "jetfire-fp4", "quest:bf16", "sr_absmax:bf16",
              "rtn_absmax:bf16", "quest:sr_absmax", "luq-fp4", "lss-int4"]
    colors = precision_colors(labels)
    assert colors == precision_colors(reversed(labels))
    assert colors["quartet"] == PRECISION_COLORS["quartet"] and colors["fp8"] == PRECISION_COLORS["fp8"]
    assert len(set(colors.values())) == len(labels) and PRECISION_COLORS["bf16"] not in colors.values()
    ladder = precision_colors(["bf16", "fp8", "quartet"])
    assert ladder == {k: PRECISION_COLORS[k] for k in ("bf16", "fp8", "quartet")}


def test_breakeven_names_every_scheme_the_axis_does_not_show_whole():
    """Schemes that never pay off, stay above the axis or leave it over part of N are named in a note (flagged ones
    with their status), not dropped."""
    import dataclasses

    import numpy as np

    from analysis.figures import breakeven_curves
    from analysis.fit import EffFit
    from analysis.load import load_paper

    paper = fit_all(load_paper(), forecasts=False)
    n = np.geomspace(1e7, 1e11, 200)
    curves, notes = breakeven_curves(paper, n, 100)
    text = "\n".join(notes)
    assert "never pays off" in text and "halo-fp4 (hit_bound)" in text and "luq-int4" in text
    assert "above 4x everywhere" in text and "bf16:quest (too_few_points)" in text
    assert {e.scheme for e, _ in curves} >= {"quest:bf16", "quest:sr_absmax"}
    # a backward scheme whose data penalty grows against the parameter term with N: Z from 3.7x to 16x, clipped
    worse = EffFit("bwd-x", "bf16", "x", "backward", 1.0, 0.3, 0.0, 6, "converged", "ok")
    curves, notes = breakeven_curves(dataclasses.replace(paper, efficiencies=(worse,)), n, 100)
    (e, z), = curves
    assert z[0] < 4 < z[-1]
    assert notes == [f"clipped at the axes (0.8-4x):\n  bwd-x (reaches {z[-1]:.3g}x)"]


def _captured_figures(monkeypatch) -> dict:
    """The figures the plot functions save, by name (still drawable after they are closed)."""
    import analysis.figures as figs

    seen, real = {}, figs._save

    def save(fig, out_dir, name):
        seen[name] = fig
        return real(fig, out_dir, name)

    monkeypatch.setattr(figs, "_save", save)
    return seen


def test_loss_panels_fill_their_grid(tmp_path, monkeypatch):
    """The baseline and three precisions (the demo's study) are laid out 2 × 2, every axes a drawn panel — not a
    2 × 3 grid with two empty cells."""
    from analysis.figures import panel_grid, plot_losses
    from analysis.load import load_paper

    assert [panel_grid(k) for k in (1, 3, 4, 5, 6, 7)] == [(1, 1), (1, 3), (2, 2), (2, 3), (2, 3), (3, 3)]
    df = load_paper()
    four = df[df["forward"].astype(str).str.cat(df["backward"].astype(str), ":").isin(
        ["bf16:bf16", "quest:bf16", "quest:sr_absmax", "luq-int4:luq-int4"])]
    seen = _captured_figures(monkeypatch)
    plot_losses(fit_all(four, forecasts=False), four, tmp_path)
    axes = seen["losses"].axes
    assert len(axes) == 4 and all(ax.get_visible() and ax.collections for ax in axes)


def test_breakeven_legend_and_notes_beside_the_plot_not_in_it(tmp_path, monkeypatch):
    """The legend and the notes (never pays off, above the axis) sit in a panel of their own, so the plot keeps its
    width instead of being squeezed by artists placed outside its axes."""
    from analysis.figures import plot_breakeven
    from analysis.load import load_paper

    seen = _captured_figures(monkeypatch)
    plot_breakeven(fit_all(load_paper(), forecasts=False), tmp_path)
    fig = seen["breakeven"]
    ax, side = fig.axes
    assert ax.get_legend() is None and side.get_legend() is not None
    assert any("never pays off" in t.get_text() for t in side.texts)
    assert not any("never pays off" in t.get_text() for t in ax.texts)
    assert ax.get_position().width * fig.get_figwidth() >= 5.0  # inches of plot (it was 2.7)


def test_training_curves_tell_precisions_apart(runs_dir, tmp_path, monkeypatch):
    """Each precision's curve has its own colour and line style; the baseline is drawn first (under the others) and
    widest; the legend sits beside the panels, not on the curves."""
    from matplotlib.colors import to_hex

    from analysis.figures import PRECISION_COLORS, plot_training_curves

    seen = _captured_figures(monkeypatch)
    plot_training_curves(load_runs_dir(runs_dir), tmp_path)
    fig = seen["ladder_curves"]
    assert fig.legends
    for ax in fig.axes:
        lines = ax.get_lines()
        assert len(lines) >= 3 and ax.get_legend() is None
        assert len({(to_hex(ln.get_color()), str(ln.get_linestyle())) for ln in lines}) == len(lines)
        base = min(lines, key=lambda ln: ln.get_zorder())
        assert to_hex(base.get_color()) == PRECISION_COLORS["bf16"]
        assert base.get_linewidth() > max(ln.get_linewidth() for ln in lines if ln is not base)
