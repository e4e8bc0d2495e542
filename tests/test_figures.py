"""The report's figures on synthetic rows: one colour per method in every figure, TrueType fonts in the PDFs, whole
depths on the depth axis and the methods it leaves out named, the stats' intervals drawn as error bars."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evaluation.reporting import figures
from evaluation.reporting.collect import Group, Run

MODEL = "tiny-llama"


def group(label, records=(), params=None, state=None, temperature=0.0, baseline=False):
    """A row of the report: one run of ``label`` (method: the label's first word) with the summary the figures
    read."""
    summary = {"config": {"sampling": {"temperature": temperature}}, "method_state": state or {}}
    method = label.split(" (")[0]
    run = Run(Path(f"/runs/{label}/answers.jsonl"), list(records), summary, MODEL, method, params or {}, label)
    return Group(MODEL, label, [run], is_baseline=baseline)


def steps(*accepts):
    """One answer record holding only what the accepted-length figure reads."""
    return {"question_id": 1, "category": "qa", "choices": [{"accept_lengths": list(accepts)}]}


def stats_frame(rows, intervals=False):
    """Per-task stats as ``evaluation.reporting.tables.task_stats`` makes them, single runs (stds NaN); ``rows``: (label,
    task, speedup, MAT, tokens/s). With ``intervals`` each speedup and MAT gets an asymmetric 95% interval:
    0.1 below and 0.3 above the speedup, 0.2 below and 0.4 above the MAT."""
    out = []
    for label, task, speedup, mat, tok in rows:
        r = {"model": MODEL, "method": label, "task": task, "baseline": label.startswith("vanilla"), "mat": mat,
             "mat_std": np.nan, "tok_per_s": tok, "tok_per_s_std": np.nan, "speedup": speedup,
             "speedup_std": np.nan, "questions": 2, "repeats": 1}
        if intervals:
            r.update(speedup_lo=speedup - 0.1, speedup_hi=speedup + 0.3, mat_lo=mat - 0.2, mat_hi=mat + 0.4)
        out.append(r)
    return pd.DataFrame(out)


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions make, kept open instead of written: name -> (figure, footer)."""
    import matplotlib.pyplot as plt

    made = {}

    def keep(fig, out, name, footer):
        made[name] = (fig, footer)
        return []

    monkeypatch.setattr(figures, "save_figure", keep)
    yield made
    for fig, _ in made.values():
        plt.close(fig)


def legend_colours(fig) -> dict[str, tuple]:
    """Legend label (its method and settings, without the MAT the accepted-length figure adds) -> RGBA colour."""
    from matplotlib.colors import to_rgba

    out = {}
    for handle, label in zip(*fig.axes[0].get_legend_handles_labels()):
        colour = handle.patches[0].get_facecolor() if hasattr(handle, "patches") else handle.get_color()
        out[label.split(" (MAT")[0]] = to_rgba(colour)
    return out


def test_a_method_has_one_colour_in_every_figure(drawn, tmp_path):
    from matplotlib.colors import to_rgba

    groups = [group("vanilla", [steps(1, 1)], baseline=True), group("pld", [steps(1, 3, 2)]),
              group("tr", [steps(1, 4, 2)])]
    stats = stats_frame([(g.label, task, 1.2, 2.0, 10.0) for g in groups for task in ("qa", "overall")])
    long = pd.DataFrame([{"model": MODEL, "method": m, "depth": d, "tried": 50, "accepted": 25, "rate": 0.5}
                         for m in ("pld", "tr") for d in (1, 2, 3)])
    figures.plot_speedup(stats, groups, tmp_path, "env")
    figures.plot_accept_lengths(groups, tmp_path, "env")
    figures.plot_depth_acceptance(long, tmp_path, "env", "tiny")
    seen = [legend_colours(fig) for fig, _ in drawn.values()]
    assert len(seen) == 3
    for method in ("pld", "tr"):
        assert {c[method] for c in seen} == {to_rgba(figures.method_colour(method))}, method
    assert seen[0]["pld"] != seen[0]["tr"]
    # Every registered method its own colour; a label's settings keep its method's colour, in shades.
    from methods.base import registry

    assert len({figures.method_colour(m) for m in registry()}) == len(registry())
    assert figures.method_colour("tr (k=4)") == figures.method_colour("tr")
    shades = figures.colours(["tr (k=2)", "pld", "tr (k=4)"])
    assert shades[1] == figures.method_colour("pld") and len(set(shades)) == 3


def test_pdfs_embed_truetype_fonts_not_type3(tmp_path):
    """Paper venues refuse PDFs with Type 3 fonts (matplotlib's default): the figures embed TrueType (Type 42)."""
    plt = figures.figure_style()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1.0, 1.5], label="tr")
    ax.set_title("Speedup per task (×)")
    ax.legend()
    [pdf] = [f for f in figures.save_figure(fig, tmp_path, "fonts", "cpu, float32") if f.suffix == ".pdf"]
    data = pdf.read_bytes()
    assert b"/Subtype /Type3" not in data
    assert b"/FontFile2" in data  # an embedded TrueType font program


def test_depth_axis_has_whole_depths_only(drawn, tmp_path):
    """A figure whose methods were tried at depth 1 alone still gets ticks at whole depths (matplotlib's integer
    locator gives up on them when fewer than two integers are in view)."""
    long = pd.DataFrame([{"model": MODEL, "method": m, "depth": 1, "tried": 40, "accepted": 10, "rate": r}
                         for m, r in (("pld", 0.25), ("tr", 0.5))])
    figures.plot_depth_acceptance(long, tmp_path, "env", "tiny")
    ax = drawn["acceptance_by_depth"][0].axes[0]
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_depth_figure_names_the_methods_it_leaves_out(drawn, tmp_path, capsys):
    groups = [group("vanilla", baseline=True), group("pld"), group("tr (k=4)"), group("eagle-answers")]
    long = pd.DataFrame([{"model": MODEL, "method": m, "depth": d, "tried": n, "accepted": 1, "rate": 0.5}
                         for m, n in (("pld", 40), ("tr (k=4)", 5)) for d in (1, 2)])
    figures.plot_depth_acceptance(long, tmp_path, "env", "tiny", groups)
    fig, footer = drawn["acceptance_by_depth"]
    note = capsys.readouterr().out
    for text in (footer, note):
        assert "tr (k=4) (no depth tried 20 times)" in text and "eagle-answers (no per-step depths)" in text
        assert "vanilla" not in text and "pld" not in text
    assert list(legend_colours(fig)) == ["pld"]
    # Nothing left to draw: no figure, but the note still says why.
    drawn.clear()
    assert figures.plot_depth_acceptance(long[long["method"] != "pld"], tmp_path, "env", "tiny", groups) == []
    assert not drawn and "tr (k=4) (no depth tried 20 times)" in capsys.readouterr().out


def errorbar_extents(container) -> list[tuple[float, float]]:
    """(bottom, top) of each vertical error bar of an errorbar container."""
    return [(seg[0][1], seg[1][1]) for bars in container.lines[2] for seg in bars.get_segments()]


def test_speedup_bars_carry_the_stats_intervals(drawn, tmp_path):
    from matplotlib.container import BarContainer

    groups = [group("vanilla", baseline=True), group("pld"), group("tr")]
    rows = [(g.label, task, s, 2.0, 10.0) for g, (qa, overall) in zip(groups, ((1.0, 1.0), (1.5, 1.4), (2.0, 1.8)))
            for task, s in (("qa", qa), ("overall", overall))]
    figures.plot_speedup(stats_frame(rows, intervals=True), groups, tmp_path, "env")
    fig, footer = drawn.pop("speedup_per_task")
    bars = [c for c in fig.axes[0].containers if isinstance(c, BarContainer)]
    assert [errorbar_extents(b.errorbar) for b in bars] == [
        [pytest.approx((1.4, 1.8)), pytest.approx((1.3, 1.7))], [pytest.approx((1.9, 2.3)), pytest.approx((1.7, 2.1))]]
    assert "error bars: 95% interval over questions (speedup)" in footer
    # A stats table without intervals (single runs): no error bars, and the footer claims none.
    figures.plot_speedup(stats_frame(rows), groups, tmp_path, "env")
    fig, footer = drawn.pop("speedup_per_task")
    assert all(c.errorbar is None for c in fig.axes[0].containers if isinstance(c, BarContainer))
    assert "error bars" not in footer


def test_ablation_and_temperature_curves_carry_the_stats_intervals(drawn, tmp_path):
    from matplotlib.container import ErrorbarContainer

    def curves(ax):
        return [errorbar_extents(c) for c in ax.containers if isinstance(c, ErrorbarContainer)]

    sweep = [group("vanilla", baseline=True)] + [group(f"tr (k={k})", params={"k": k}, state={"k": k}) for k in (2, 4)]
    stats = stats_frame([("vanilla", "overall", 1.0, 1.0, 10.0), ("tr (k=2)", "overall", 1.2, 2.0, 12.0),
                         ("tr (k=4)", "overall", 1.1, 2.5, 11.0)], intervals=True)
    figures.plot_ablations(stats, sweep, tmp_path, "env")
    fig, footer = drawn["ablation_k"]
    assert curves(fig.axes[0]) == [[pytest.approx((1.8, 2.4)), pytest.approx((2.3, 2.9))]]
    assert curves(fig.axes[1]) == [[]]  # tokens/s: no interval, and single runs have no spread
    assert "95% interval over questions (MAT)" in footer

    temps = [group("vanilla", baseline=True), group("vanilla (T=0.7 seed=0)", temperature=0.7, baseline=True),
             group("tr"), group("tr (T=0.7 seed=0)", temperature=0.7)]
    stats = stats_frame([("vanilla", "overall", 1.0, 1.0, 10.0), ("vanilla (T=0.7 seed=0)", "overall", 1.0, 1.0, 9.0),
                         ("tr", "overall", 1.5, 2.0, 15.0), ("tr (T=0.7 seed=0)", "overall", 1.2, 1.6, 10.8)],
                        intervals=True)
    figures.plot_temperatures(stats, temps, tmp_path, "env")
    fig, footer = drawn["mat_by_temperature"]
    assert curves(fig.axes[0]) == [[pytest.approx((1.8, 2.4)), pytest.approx((1.4, 2.0))]]
    assert curves(fig.axes[1]) == [[pytest.approx((1.4, 1.8)), pytest.approx((1.1, 1.5))]]
    assert "95% interval over questions (MAT, speedup)" in footer
