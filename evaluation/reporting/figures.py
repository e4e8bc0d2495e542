"""The figures of a report (PNG and PDF): speedup per task, accepted lengths, the ablation curves, the start
policies and the speedup under load against the batch size; ``figure_style`` and ``save_figure`` give other figures
of the project the same look and footer, and ``method_colour`` every method its one colour in all of them."""
from __future__ import annotations

import json
import zlib
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.records.bench import TASKS
from evaluation.records.metrics import OVERALL, accept_histogram
from evaluation.reporting.collect import Group, bench_line
from evaluation.reporting.columns import BY_KEY
from evaluation.reporting.tables import batch_sizes, crossovers
from methods.common import atomic

SHORT_NAMES = {"mt_bench": "MT-Bench", "translation": "Trans.", "summarization": "Sum.", "qa": "QA",
               "math_reasoning": "Math", "rag": "RAG", OVERALL: "Overall"}
# Ablation figures: the method parameter swept, the number on the x axis (from the method's summary), the
# number held fixed along one curve, and the axis label.
ABLATIONS = {"ablation_k": ("k", "k", None, "K (adjacency matrix width)"),
             "ablation_tree_size": ("tree", "tree_nodes", "tree_depth",
                                    "draft tree size (tokens per step, root included)"),
             "ablation_tree_depth": ("tree", "tree_depth", "tree_nodes", "draft tree depth")}


def figure_style():
    """pyplot with the project's look, on the Agg backend: figures are written to files, often without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Fonts embedded as TrueType (Type 42): matplotlib's default Type 3 fonts are refused by paper venues' checks.
    plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 150, "axes.spines.top": False,
                         "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3, "font.size": 9,
                         "legend.fontsize": 8, "legend.frameon": False, "pdf.fonttype": 42, "ps.fonttype": 42})
    return plt


def _palette() -> list[tuple]:
    """Seventeen distinct colours: tab10, the darkest of each of tab20b's five hues, then Dark2's magenta and
    mustard."""
    from matplotlib import colormaps

    dark2 = colormaps["Dark2"].colors
    return list(colormaps["tab10"].colors) + list(colormaps["tab20b"].colors[::4]) + [dark2[3], dark2[5]]


def method_colour(method: str, shade: int = 0, shades: int = 1) -> tuple:
    """The colour ``method`` has in every figure: a registry name or a row label (``tr (k=4)``: the method is the
    part before its settings). A registered method takes the palette's colour at its place in the registry, so
    that no two of them share one; any other name (a foreign answer file's label) the colour its name hashes to,
    the same in every report. ``shade`` of ``shades``: the same method at other settings or on another model, from
    darker to lighter, so that a figure tells them apart while the reader still sees one method."""
    from methods.base import registry

    name, palette, known = method.split(" (")[0], _palette(), list(registry())
    base = palette[(known.index(name) if name in known else zlib.crc32(name.encode())) % len(palette)]
    if shades < 2:
        return tuple(base)
    f = 0.8 * shade / (shades - 1) - 0.4  # -0.4 (towards black) .. 0.4 (towards white)
    return tuple(c + (1 - c) * f if f > 0 else c * (1 + f) for c in base)


def colours(methods: list[str]) -> list[tuple]:
    """``method_colour`` of each entry of a figure, in order; a method met more than once gets its shades."""
    names = [m.split(" (")[0] for m in methods]
    seen, out = Counter(), []
    for name in names:
        out.append(method_colour(name, seen[name], names.count(name)))
        seen[name] += 1
    return out


METRIC_NAMES = {key: BY_KEY[key].name for key in ("speedup", "mat", "tok_per_s")}


def _error_bars(rows: pd.DataFrame, metric: str) -> np.ndarray | None:
    """(below, above) error bars of ``metric`` for these rows of the stats, or None: the 95% interval over
    questions where the stats carry one (``<metric>_lo``, ``<metric>_hi``), else ± the sample standard deviation
    where the rows are repeats. Clipped at zero: an interval of a ratio need not hold its point estimate, and
    matplotlib refuses a negative bar."""
    if f"{metric}_lo" in rows and f"{metric}_hi" in rows:
        below, above = rows[metric] - rows[f"{metric}_lo"], rows[f"{metric}_hi"] - rows[metric]
    elif f"{metric}_std" in rows and rows[f"{metric}_std"].notna().any():
        below = above = rows[f"{metric}_std"]
    else:
        return None
    return np.vstack([below.fillna(0).to_numpy(float), above.fillna(0).to_numpy(float)]).clip(min=0)


def _error_note(stats: pd.DataFrame, metrics: list[str]) -> str:
    """What a figure's error bars are (``_error_bars``), for its footer; empty when it has none."""
    ci = [m for m in metrics if f"{m}_lo" in stats and f"{m}_hi" in stats]
    std = [m for m in metrics if m not in ci and f"{m}_std" in stats and stats[f"{m}_std"].notna().any()]
    parts = ([f"95% interval over questions ({', '.join(METRIC_NAMES[m] for m in ci)})"] if ci else []) + (
        [f"± 1 standard deviation over repeats ({', '.join(METRIC_NAMES[m] for m in std)})"] if std else [])
    return " · error bars: " + "; ".join(parts) if parts else ""


def save_figure(fig, out: Path, name: str, footer: str) -> list[Path]:
    """``name``.png and .pdf under ``out``, each written atomically, with ``footer`` (where the numbers come from)
    at the bottom; closes the figure. Returns the two paths."""
    fig.text(0.01, 0.005, footer, fontsize=6.5, color="0.4", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    files = [out / f"{name}.png", out / f"{name}.pdf"]
    for f in files:
        with atomic(f) as tmp:  # the temporary name hides the format from matplotlib: name it
            fig.savefig(tmp, bbox_inches="tight", format=f.suffix[1:])
    import matplotlib.pyplot as plt

    plt.close(fig)
    return files


def _rows(stats: pd.DataFrame, g: Group) -> pd.DataFrame:
    """The per-task rows of one group, indexed by task."""
    return stats[(stats["model"] == g.model) & (stats["method"] == g.label)].set_index("task")


def _tasks(stats: pd.DataFrame) -> list[str]:
    return [t for t in list(TASKS) + [OVERALL] if t in set(stats["task"])]


def _task_bars(ax, stats: pd.DataFrame, groups: list[Group], metric: str, labels: list[str]) -> list:
    """Grouped bars: one group of bars per task, one bar per group in its method's colour (``_error_bars``);
    returns the bars."""
    tasks, width, containers = _tasks(stats), 0.8 / len(groups), []
    for i, (g, label, colour) in enumerate(zip(groups, labels, colours([g.method for g in groups]))):
        t = _rows(stats, g).reindex(tasks)
        xs = [j + (i - (len(groups) - 1) / 2) * width for j in range(len(tasks))]
        containers.append(ax.bar(xs, t[metric], width * 0.92, yerr=_error_bars(t, metric), capsize=2, label=label,
                                 color=colour))
    ax.set_xticks(range(len(tasks)), [SHORT_NAMES.get(t, t) for t in tasks])
    return containers


def _series_name(g: Group, multi_model: bool) -> str:
    return f"{g.label} · {g.model}" if multi_model else g.label


def plot_speedup(stats: pd.DataFrame, groups: list[Group], out: Path, footer: str) -> list[Path]:
    """``speedup_per_task``: each method's speedup on each task against the dashed line of no speedup."""
    plt = figure_style()
    methods = [g for g in groups if not g.is_baseline]
    if not methods:
        return []
    multi = len({g.model for g in groups}) > 1
    fig, ax = plt.subplots(figsize=(min(11.0, max(6.5, 1.0 + 0.25 * len(_tasks(stats)) * len(methods))), 3.6))
    bars = _task_bars(ax, stats, methods, "speedup", [_series_name(g, multi) for g in methods])
    if len(methods) <= 4:
        for b in bars:
            ax.bar_label(b, fmt="%.2f", fontsize=6, padding=1)
    ax.axhline(1.0, color="0.2", lw=0.8, ls="--")
    ax.set_ylabel("speedup over vanilla (×, tokens/s ratio)")
    ax.set_title("Speedup per Spec-Bench task (" + bench_line(groups) + ")")
    if len(methods) > 4:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(ncol=len(methods), loc="upper left", bbox_to_anchor=(0, -0.08))
    return save_figure(fig, out, "speedup_per_task", footer + _error_note(stats, ["speedup"]))


def plot_accept_lengths(groups: list[Group], out: Path, footer: str) -> list[Path]:
    """``accept_lengths``: the share of steps accepting each length, per method; its mean is the method's MAT."""
    plt = figure_style()
    methods = [g for g in groups if not g.is_baseline]
    if not methods:
        return []
    multi = len({g.model for g in groups}) > 1
    hists = [accept_histogram(g.records) for g in methods]
    longest = max(int(h.index.max()) for h in hists)
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(min(11.0, max(6.5, 0.3 * longest * len(methods))), 3.4))
    for i, (g, h, colour) in enumerate(zip(methods, hists, colours([g.method for g in methods]))):
        h = h.reindex(range(1, longest + 1), fill_value=0.0)
        mat = sum(k * v for k, v in h.items())
        ax.bar([k + (i - (len(methods) - 1) / 2) * width for k in h.index], 100 * h.to_numpy(), width * 0.92,
               label=f"{_series_name(g, multi)} (MAT {mat:.2f})", color=colour)
    ax.set_xticks(range(1, longest + 1))
    ax.set_xlabel("accepted length per step (tokens, bonus token included)")
    ax.set_ylabel("share of steps (%)")
    ax.set_title("Distribution of accepted lengths (" + bench_line(groups) + ")")
    ax.legend(loc="upper right")
    return save_figure(fig, out, "accept_lengths", footer)


def _sweeps(groups: list[Group], param: str, x: str | None = None,
            hold: str | None = None) -> list[tuple[str, list[Group]]]:
    """Sets of groups of one model and method that differ in ``param`` only, each with two values of ``x`` or more.

    ``x`` is what the figure puts on its axis: a number from the method's summary (``tree_nodes`` for a tree
    sweep) or, by default, the parameter's own value; ``hold`` a number of the summary that must be equal
    along a curve (a tree-size curve holds the depth). Returns (series name, groups sorted by x) pairs.
    """
    value = (lambda g: g.state[x]) if x else (lambda g: g.params[param])
    sets = defaultdict(list)
    for g in groups:
        if not g.is_baseline and g.runs[0].summary and param in g.params and (x is None or x in g.state):
            rest = {k: v for k, v in g.params.items() if k != param}
            held = g.state.get(hold) if hold else None
            sets[g.model, g.method, json.dumps(rest, sort_keys=True, default=str), held].append(g)
    out = []
    for (model, method, _, held), members in sets.items():
        if len({json.dumps(value(g)) for g in members}) > 1:
            varying = [k for k in sorted(members[0].params) if k != param
                       and len({json.dumps(h.params.get(k)) for h in groups if h.method == method}) > 1]
            fixed = ", ".join([f"{k}={members[0].params[k]}" for k in varying] + ([f"{hold}={held}"] if hold else []))
            out.append((f"{method} · {model}" + (f" ({fixed})" if fixed else ""),
                        sorted(members, key=lambda g: (str(type(value(g))), value(g)))))
    return out


def plot_ablations(stats: pd.DataFrame, groups: list[Group], out: Path, footer: str) -> list[Path]:
    """One figure per ``ABLATIONS`` entry the runs sweep: MAT and tokens/s along the swept number, where more
    acceptance pays for itself or not, with the baseline's tokens/s for scale."""
    plt = figure_style()
    files = []
    for name, (param, x, hold, xlabel) in ABLATIONS.items():
        series = _sweeps(groups, param, x, hold)
        if not series:
            continue
        fig, (a_mat, a_tok) = plt.subplots(1, 2, figsize=(8.5, 3.3))
        for (line, members), colour in zip(series, colours([members[0].method for _, members in series])):
            xs = [g.state[x] for g in members]
            o = pd.DataFrame([_rows(stats, g).loc[OVERALL] for g in members])
            for ax, metric in ((a_mat, "mat"), (a_tok, "tok_per_s")):
                ax.errorbar(xs, o[metric], yerr=_error_bars(o, metric), marker="o", capsize=2, label=line,
                            color=colour)
            base = stats[(stats["model"] == members[0].model) & (stats["task"] == OVERALL)
                         & stats["method"].isin([g.label for g in groups if g.is_baseline])]
            for _, b in base.iterrows():
                a_tok.axhline(b["tok_per_s"], color="0.3", ls="--", lw=0.8, label=f"{b['method']} · {b['model']}")
        a_mat.set_ylabel("mean accepted tokens per step (MAT)")
        a_tok.set_ylabel("tokens/s")
        from matplotlib.ticker import MaxNLocator

        for ax in (a_mat, a_tok):
            ax.set_xlabel(xlabel)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        a_mat.set_title("MAT against " + xlabel.split(" (")[0])
        a_tok.set_title("Throughput against " + xlabel.split(" (")[0])
        fig.legend(*a_tok.get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2)
        note = _error_note(stats, ["mat", "tok_per_s"])
        files += save_figure(fig, out, name, footer + " · " + bench_line(groups) + note)
    return files


def plot_start_policies(stats: pd.DataFrame, groups: list[Group], out: Path, footer: str) -> list[Path]:
    """``start_policies``: MAT per task for each ``start`` setting, up to three sweeps side by side."""
    series = _sweeps(groups, "start")[:3]
    if not series:
        return []
    plt = figure_style()
    fig, axes = plt.subplots(1, len(series), figsize=(6.5 * len(series), 3.4), squeeze=False)
    for ax, (name, gs) in zip(axes[0], series):
        _task_bars(ax, stats, gs, "mat", [f"start={g.params['start']}" for g in gs])
        ax.set_ylabel("mean accepted tokens per step (MAT)")
        ax.set_title("Start policies: " + name)
        ax.margins(y=0.18)
        ax.legend(ncol=len(gs), loc="upper left")
    return save_figure(fig, out, "start_policies", footer + " · " + bench_line(groups) + _error_note(stats, ["mat"]))


MIN_TRIES = 20  # a depth tried fewer times than this is left off the per-depth figure (its rate is noise)


def plot_depth_acceptance(long: pd.DataFrame, out: Path, footer: str, bench: str,
                          groups: list[Group] | None = None) -> list[Path]:
    """``acceptance_by_depth``: per method, how often a depth-d draft is accepted given that its parent was. A
    method left off is named in the footer and in a printed note, so that a reader does not take it for one that
    never drafts: one whose every depth was tried fewer than ``MIN_TRIES`` times, and one of ``groups`` (the
    report's rows) whose answers record no per-step depths (a foreign answer file, a run from before they were
    recorded)."""
    series, left = [], []
    drafted = {(model, method) for model, method in zip(long["model"], long["method"])}
    multi = len(set(long["model"]) | {g.model for g in groups or []}) > 1

    def name(model, method):
        return f"{method} · {model}" if multi else method

    left += [f"{name(g.model, g.label)} (no per-step depths)" for g in groups or []
             if not g.is_baseline and (g.model, g.label) not in drafted]
    for (model, method), t in long.groupby(["model", "method"], sort=False):
        t = t[t["tried"] >= MIN_TRIES]
        if len(t):
            series.append((name(model, method), method, t))
        else:
            left.append(f"{name(model, method)} (no depth tried {MIN_TRIES} times)")
    if left:
        print(f"note: acceptance_by_depth leaves out {', '.join(left)}")
    if not series:
        return []
    plt = figure_style()
    fig, ax = plt.subplots(figsize=(10.0, 4.0))
    for i, ((label, _, t), colour) in enumerate(zip(series, colours([method for _, method, _ in series]))):
        ax.plot(t["depth"], t["rate"], marker="os^vD"[i % 5], ms=3, lw=1.2, color=colour, label=label)
    from matplotlib.ticker import MaxNLocator

    # Depths are whole numbers; one integer in view is enough (the default asks for two, and a figure of depth 1
    # alone would get ticks at 0.96, 0.98, ...).
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_xlabel("draft depth d")
    ax.set_ylabel("accepted at depth d,\ngiven depth d - 1 was")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"Acceptance per depth ({bench}; depths tried at least {MIN_TRIES} times)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=6.5)
    return save_figure(fig, out, "acceptance_by_depth", footer + (" · left out: " + ", ".join(left) if left else ""))


def temperature(g: Group) -> float:
    """The sampling temperature a group decoded at (0: greedy, also for runs from before sampling existed)."""
    return float((g.runs[0].summary.get("config", {}).get("sampling") or {}).get("temperature", 0.0))


def plot_temperatures(stats: pd.DataFrame, groups: list[Group], out: Path, footer: str) -> list[Path]:
    """``mat_by_temperature``: MAT and speedup against the sampling temperature, one line per method setting that
    ran at two temperatures or more (each speedup against vanilla sampling at its own temperature)."""
    sets = defaultdict(list)
    for g in groups:
        if not g.is_baseline and g.runs[0].summary:
            rest = {k: v for k, v in g.params.items() if k not in ("sampling", "engine")}
            sets[g.model, g.method, json.dumps(rest, sort_keys=True, default=str)].append(g)
    series = [(k, sorted(v, key=temperature)) for k, v in sets.items() if len({temperature(g) for g in v}) > 1]
    if not series:
        return []
    plt = figure_style()
    fig, (a_mat, a_speed) = plt.subplots(1, 2, figsize=(9.5, 3.6))
    multi = len({g.model for g in groups}) > 1
    for ((model, method, rest), members), colour in zip(series, colours([method for (_, method, _), _ in series])):
        shown = ", ".join(f"{k}={v}" for k, v in json.loads(rest).items()
                          if len({json.dumps(h.params.get(k), default=str) for h in groups if h.method == method}) > 1)
        name = method + (f" ({shown})" if shown else "") + (f" · {model}" if multi else "")
        xs = [temperature(g) for g in members]
        o = pd.DataFrame([_rows(stats, g).loc[OVERALL] for g in members])
        for ax, metric in ((a_mat, "mat"), (a_speed, "speedup")):
            ax.errorbar(xs, o[metric], yerr=_error_bars(o, metric), marker="o", ms=3, capsize=2, label=name,
                        color=colour)
    a_speed.axhline(1.0, color="0.2", lw=0.8, ls="--")
    for ax in (a_mat, a_speed):
        ax.set_xlabel("sampling temperature (0: greedy)")
    a_mat.set_ylabel("mean accepted tokens per step (MAT)")
    a_speed.set_ylabel("speedup over vanilla at that temperature (×)")
    a_mat.set_title("Acceptance against temperature")
    a_speed.set_title("Speedup against temperature")
    a_speed.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    return save_figure(fig, out, "mat_by_temperature",
                       footer + " · " + bench_line(groups) + _error_note(stats, ["mat", "speedup"]))


def plot_speedup_vs_batch(batch: pd.DataFrame, out: Path, footer: str, bench: str) -> list[Path]:
    """``speedup_vs_batch``: per method (``evaluation.reporting.tables.batch_table``), its speedup in throughput over vanilla at
    the same batch size against the batch size, on a log2 axis, with the dashed line of no speedup; where a method
    falls below it (``evaluation.records.metrics.crossover``) is marked with an x, and its legend entry says where, or that it
    never does; each point's 95% interval (``load_interval``), where its runs have one, as an error bar."""
    rows = batch[~batch["baseline"].astype(bool) & batch["speedup"].notna()]
    if not len(rows):
        return []
    plt = figure_style()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    multi = batch["model"].nunique() > 1
    series = list(rows.groupby(["model", "method"], sort=False))
    crossing = crossovers(batch)
    for ((model, method), t), colour in zip(series, colours([method for (_, method), _ in series])):
        t = t.sort_values("batch_size")
        name = f"{method} · {model}" if multi else method
        x, where = crossing[model, method]
        ax.plot(t["batch_size"], t["speedup"], marker="o", ms=4, color=colour, label=f"{name}: {where}",
                ls=":" if "budget=" in method else "-")  # a per-step budget's line dotted beside its method's
        if t["speedup_lo"].notna().any():  # its 95% interval, paired over the timed parts (load_interval)
            ax.errorbar(t["batch_size"], t["speedup"], yerr=_error_bars(t, "speedup"), fmt="none", ecolor=colour,
                        elinewidth=0.8, capsize=2)
        if x is not None:
            ax.plot([x], [1.0], marker="x", ms=9, mew=2, color=colour, ls="none")
    ax.axhline(1.0, color="0.2", lw=0.8, ls="--")
    sizes = batch_sizes(batch)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.minorticks_off()
    ax.set_xlabel("batch size (runtime.batch_size: turns decoded at once)")
    ax.set_ylabel("speedup over vanilla at that batch size\n(×, throughput ratio)")
    ax.set_title(f"Speedup under load ({bench})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, out, "speedup_vs_batch", footer + " · x: where a method's speedup falls below 1.0× "
                       "(interpolated on log2 of the batch size; with its 95% interval, where all of it does)")


def plot_budget_calibration(groups: list[Group], out: Path, footer: str) -> list[Path]:
    """``budget_calibration``: per run with a per-step budget that predicts (``runtime.budget=auto``,
    ``methods.budget``), the mean accept length its steps reached against the one its odds predicted for them, by
    bins of a quarter token, beside the diagonal of exact odds."""
    series = []
    for g in groups:
        pairs = [(e, a) for r in g.records for c in r["choices"]
                 for e, a in zip(c.get("expected_lengths") or [], c["accept_lengths"]) if e is not None]
        if pairs:
            series.append((g, pairs))
    if not series:
        return []
    plt = figure_style()
    fig, ax = plt.subplots(figsize=(5.8, 4.0))
    multi, top = len({g.model for g, _ in series}) > 1, 1.0
    for (g, pairs), colour in zip(series, colours([g.method for g, _ in series])):
        bins: dict[float, list[int]] = {}
        for e, a in pairs:
            bins.setdefault(round(e * 4) / 4, []).append(a)
        xs = sorted(bins)
        ys = [float(np.mean(bins[x])) for x in xs]
        top = max(top, *xs, *ys)
        ax.plot(xs, ys, marker="o", ms=3, color=colour, label=f"{_series_name(g, multi)} ({len(pairs)} steps)")
    ax.plot([1, top], [1, top], color="0.3", lw=0.8, ls="--")
    ax.set_xlabel("accept length predicted (the budget's odds, bins of 0.25)")
    ax.set_ylabel("accept length reached (mean)")
    ax.set_title("Per-step draft budget: predicted against reached")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, out, "budget_calibration", footer + " · dashed: exact odds")


def plot_by_position(long: pd.DataFrame, out: Path, footer: str, bench: str, bucket: int) -> list[Path]:
    """``mat_by_position``: per method (``evaluation.reporting.tables.position_long``), its MAT (left) and its
    speedup over its baseline (right) against the position in the answer, by buckets of ``bucket`` tokens."""
    if not len(long):
        return []
    plt = figure_style()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    multi = long["model"].nunique() > 1
    series = list(long.groupby(["model", "method"], sort=False))
    for ((model, method), t), colour in zip(series, colours([method for (_, method), _ in series])):
        name = f"{method} · {model}" if multi else method
        left.plot(t["position"], t["mat"], marker="o", ms=3, color=colour, label=name)
        if t["speedup"].notna().any():
            right.plot(t["position"], t["speedup"], marker="o", ms=3, color=colour, label=name)
    right.axhline(1.0, color="0.2", lw=0.8, ls="--")
    for ax, what in ((left, "MAT (tokens per step)"), (right, "speedup over vanilla (×)")):
        ax.set_xlabel(f"position in the answer (tokens, buckets of {bucket})")
        ax.set_ylabel(what)
    left.set_title(f"MAT by output position ({bench})")
    right.set_title("Speedup by output position")
    right.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, out, "mat_by_position", footer)
