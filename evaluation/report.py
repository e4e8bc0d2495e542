"""Paper outputs from any set of runs: the main table (markdown, CSV, LaTeX) and the figures (PNG, PDF).

    python -m evaluation.report RUN [RUN ...] [--baseline RUN] [--out DIR]

A RUN is a run folder, an answer file, a folder holding run folders (a sweep, a
``scripts.bench_methods`` output) or a folder of answer files (Spec-Bench's
``model_answer/``); ``LABEL=PATH`` names it. Our runs carry a ``summary.json``
(model, method, config, environment); answer files from Spec-Bench's own harness
carry none, and are named by LABEL or their file name, with their ``model_id`` as
model. Runs of one model and one method configuration are repeats: the tables give
their mean and spread. Each model's baseline is its vanilla run(s), or ``--baseline``.

Writes to --out (default ``results/reports/<time>``): ``main_table.{md,csv,tex}``
(one row per model and method: speedup per Spec-Bench task, MAT, tokens/s, overall
speedup, the layout of the TR paper's Table 1), ``tasks.csv`` (every number of every
task), ``environment.json`` and figures as PNG and PDF: ``speedup_per_task``,
``accept_lengths``, and where the runs form an ablation ``ablation_k``,
``ablation_tree_size``, ``ablation_tree_depth`` and ``start_policies``. All numbers
come from ``evaluation.metrics``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from evaluation.answers import ANSWERS, SUMMARY, read_answers, separate_runs_note
from evaluation.data import TASKS
from methods.common import RESULTS, HarnessError, exit_on_error
from evaluation.metrics import OVERALL, accept_histogram, repeat_table

BASELINE = "vanilla"
TASK_NAMES = {"mt_bench": "MT-Bench", "translation": "Translation", "summarization": "Summarization",
              "qa": "QA", "math_reasoning": "Math", "rag": "RAG", OVERALL: "Overall"}
SHORT_NAMES = {"mt_bench": "MT-Bench", "translation": "Trans.", "summarization": "Sum.", "qa": "QA",
               "math_reasoning": "Math", "rag": "RAG", OVERALL: "Overall"}
# Ablation figures: the method parameter swept, the number on the x axis (from the method's summary), the
# number held fixed along one curve, and the axis label.
ABLATIONS = {"ablation_k": ("k", "k", None, "K (adjacency matrix width)"),
             "ablation_tree_size": ("tree", "tree_nodes", "tree_depth", "draft tree size (tokens per step, root included)"),
             "ablation_tree_depth": ("tree", "tree_depth", "tree_nodes", "draft tree depth")}


@dataclass
class Run:
    """One answer file and what is known about it."""
    path: Path                     # the answer file
    records: list[dict]
    summary: dict                  # our summary.json; {} for Spec-Bench's own answer files
    model: str
    method: str                    # registry name, or the label of a foreign file
    params: dict = field(default_factory=dict)  # method config, name excluded
    label: str = ""                # method plus the parameters that tell it from its siblings

    @property
    def questions(self) -> frozenset:
        return frozenset(r["question_id"] for r in self.records)

    @property
    def state(self) -> dict:
        return self.summary.get("method_state", {})


@dataclass
class Group:
    """Repeats of one configuration: one row of the main table."""
    model: str
    label: str
    runs: list[Run]
    baseline: list[Run] = field(default_factory=list)
    is_baseline: bool = False      # this row is (one of) the baseline(s)

    @property
    def method(self) -> str:
        return self.runs[0].method

    @property
    def params(self) -> dict:
        return self.runs[0].params

    @property
    def state(self) -> dict:
        return self.runs[0].state

    @property
    def records(self) -> list[dict]:
        return [r for run in self.runs for r in run.records]


# ---------------------------------------------------------------- loading

def _answer_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if (path / ANSWERS).is_file():
        return [path / ANSWERS]
    if path.is_dir():
        found = sorted(path.rglob(ANSWERS)) or sorted(path.glob("*.jsonl"))
        if found:
            return found
        raise HarnessError(f"no answer files under {path}: give run folders (holding {ANSWERS}) or .jsonl files")
    raise HarnessError(f"{path} does not exist; give run folders, answer files or folders holding them")


def load_run(file: Path, label: str | None = None) -> Run:
    records = read_answers(file)
    summary_file = file.parent / SUMMARY
    if file.name == ANSWERS and summary_file.is_file():
        summary = json.loads(summary_file.read_text())
        params = dict(summary.get("config", {}).get("method", {}))
        params.pop("name", None)
        params["engine"] = engine_name(summary.get("config", {}).get("engine"))
        return Run(file, records, summary, summary["model"], label or summary["method"], params)
    models = sorted({str(r.get("model_id")) for r in records})
    if len(models) != 1:
        raise HarnessError(f"{file} answers with several models {models}; give one answer file per model and method")
    return Run(file, records, {}, models[0], label or (file.parent.name if file.name == ANSWERS else file.stem))


def engine_name(engine: dict | None) -> str:
    """``hf``, ``static``, ``static(pack=false)``, ``static(compiled)`` or ``static(compiled:reduce-overhead)``
    from a run's engine config (runs from before engines: ``hf``)."""
    if not engine:
        return "hf"
    notes = [] if engine.get("pack", "auto") == "auto" else [f"pack={engine['pack']}"]
    if engine.get("compile"):
        mode = engine.get("compile_mode", "default")
        notes.append("compiled" + ("" if mode == "default" else f":{mode}"))
    return engine["name"] + (f"({','.join(notes)})" if notes else "")


def collect(paths: list[str]) -> list[Run]:
    """Every run under the given paths, each answer file once; ``LABEL=PATH`` names the runs found there."""
    runs, seen = [], set()
    for arg in paths:
        label, _, path = arg.partition("=") if "=" in arg and not Path(arg).exists() else (None, "", arg)
        for file in _answer_files(Path(path)):
            if file.resolve() not in seen:
                seen.add(file.resolve())
                runs.append(load_run(file, label or None))
    if not runs:
        raise HarnessError("no runs given")
    return runs


def _label(runs: list[Run]) -> None:
    """Name each run by its method and the parameters that differ between runs of that method and model."""
    siblings = defaultdict(list)
    for run in runs:
        if run.summary:  # a foreign file's label is its name
            siblings[run.model, run.method].append(run)
        else:
            run.label = run.method
    for group in siblings.values():
        keys = sorted({k for r in group for k in r.params})
        differ = [k for k in keys if len({json.dumps(r.params.get(k), sort_keys=True) for r in group}) > 1]
        for r in group:
            r.label = r.method + (" (" + ", ".join(f"{k}={r.params.get(k)}" for k in differ) + ")" if differ else "")


def _bench(run: Run) -> dict:
    return run.summary.get("config", {}).get("bench", {})


def machine(run: Run) -> str | None:
    """The machine a run was timed on, as far as its summary says (None: not recorded, a foreign file): the GPU's
    name, or the CPU's model, family/model/stepping, ISA flags and torch's threads (``methods.machine``)."""
    e = run.summary.get("environment")
    if not e:
        return None
    if str(e.get("device", "")).startswith("cuda"):
        return e.get("device_name")
    if e.get("cpu"):
        from methods.machine import describe

        return describe(e["cpu"])
    return f"{e.get('device_name', '?')}, {e.get('cpu_threads', '?')} threads"


def check_machines(groups: list[Group]) -> None:
    """A speedup divides a method's timings by its baseline's: both must come from one kind of machine."""
    for g in groups:
        seen: dict[str, Run] = {}
        for run in g.baseline + g.runs:
            m = machine(run)
            if m is not None:
                seen.setdefault(m, run)
        if len(seen) > 1:
            (m1, r1), (m2, r2) = list(seen.items())[:2]
            raise HarnessError(f"{g.label} on {g.model} mixes machines: {r1.path} ran on {m1} but {r2.path} on "
                               f"{m2}; a speedup across machines measures the machines. Report each machine "
                               f"apart, or pass --mixed-machines to do it anyway")


def group_runs(runs: list[Run], baseline: list[Run] | None = None) -> list[Group]:
    """Repeats grouped, each group given its baseline: ``baseline`` for all, else its model's vanilla runs.

    A set that cannot make a table (a model without a baseline, repeats on other questions) is refused, saying why.
    """
    runs = runs + [b for b in baseline or [] if b.path.resolve() not in {r.path.resolve() for r in runs}]
    if baseline and len({b.model for b in baseline}) == 1:
        for run in runs:  # Spec-Bench's files name the method in model_id: report them under the baseline's model
            if not run.summary:
                run.model = baseline[0].model
    _label(runs)
    groups: dict[tuple, Group] = {}
    for run in runs:
        g = groups.setdefault((run.model, run.label), Group(run.model, run.label, []))
        first = g.runs[0] if g.runs else run
        if run.questions != first.questions or _bench(run) != _bench(first):
            raise HarnessError(
                f"{run.path} and {first.path} are both {run.label} on {run.model} but answer different "
                f"questions or bench settings, so they are not repeats: report them separately")
        g.runs.append(run)
    if baseline:
        models = {b.model for b in baseline if b.summary}
        for g in groups.values():
            if g.runs[0].summary and models and g.model not in models:
                raise HarnessError(f"the baseline ({baseline[0].path}) is a run of {sorted(models)} but {g.label} "
                                   f"runs {g.model}; give a baseline of the same model, or report each model apart")
            g.baseline = baseline
            g.is_baseline = all(r.path.resolve() in {b.path.resolve() for b in baseline} for r in g.runs)
    else:
        for g in groups.values():
            g.baseline = [r for r in runs if r.model == g.model and r.method == BASELINE
                          and r.params.get("engine") == g.params.get("engine")]
            g.is_baseline = g.method == BASELINE
        missing = sorted({(g.model, g.params.get("engine")) for g in groups.values() if not g.baseline},
                         key=str)
        if missing:
            have = {m: [g.label for g in groups.values() if (g.model, g.params.get("engine")) == m] for m in missing}
            raise HarnessError("; ".join(f"no {BASELINE} run of model {m}" + (f" on engine {e}" if e else "")
                                         + f" (runs: {', '.join(have[m, e])})" for m, e in missing)
                               + f"; add that model's {BASELINE} run (python -m evaluation.run method={BASELINE}) "
                                 f"or name a baseline with --baseline RUN")
    for g in groups.values():
        theirs = frozenset().union(*(b.questions for b in g.baseline))
        if not g.runs[0].questions & theirs:
            raise HarnessError(f"{g.label} on {g.model} and its baseline ({g.baseline[0].path}) answer no question "
                               f"in common; give a baseline run on the same questions")
    # Per model: baselines first, then methods in the order given, a method's settings in natural order (k=2 < k=16).
    first = {}
    for run in runs:
        first.setdefault(run.method, len(first))

    def natural(value) -> tuple:
        return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))

    return sorted(groups.values(), key=lambda g: (g.model, not g.is_baseline, first[g.method],
                                                  [natural(g.params[k]) for k in sorted(g.params)]))


# ---------------------------------------------------------------- tables

def task_stats(groups: list[Group]) -> pd.DataFrame:
    """Long table: one row per group and task (tasks in Spec-Bench order, then overall)."""
    frames = []
    for g in groups:
        t = repeat_table([r.records for r in g.runs], [b.records for b in g.baseline]).reset_index()
        t.insert(0, "baseline", g.is_baseline)
        t.insert(0, "method", g.label)
        t.insert(0, "model", g.model)
        frames.append(t)
    df = pd.concat(frames, ignore_index=True)
    df["questions"] = df["questions"].astype(int)
    df["repeats"] = df["repeats"].astype(int)
    return df


def _cell(mean: float, std: float, digits: int, pm: str) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    return f"{mean:.{digits}f}" + ("" if std is None or math.isnan(std) else f"{pm}{std:.{digits}f}")


def main_table(stats: pd.DataFrame) -> pd.DataFrame:
    """One row per model and method: speedup per task, MAT, tokens/s, overall speedup (numbers, means and stds)."""
    rows = []
    for (model, method), t in stats.groupby(["model", "method"], sort=False):
        t = t.set_index("task")
        row = {"model": model, "method": method, "baseline": bool(t["baseline"].iloc[0]),
               "repeats": int(t["repeats"].max())}
        for task in [x for x in TASKS if x in t.index] + sorted(set(t.index) - set(TASKS) - {OVERALL}):
            row[task] = t.loc[task, "speedup"]
            row[task + "_std"] = t.loc[task, "speedup_std"]
        o = t.loc[OVERALL]
        row.update(mat=o["mat"], mat_std=o["mat_std"], mat_specbench=o["mat_specbench"],
                   mat_specbench_std=o["mat_specbench_std"], tok_per_s=o["tok_per_s"], tok_per_s_std=o["tok_per_s_std"],
                   speedup=o["speedup"], speedup_std=o["speedup_std"], questions=int(o["questions"]))
        rows.append(row)
    return pd.DataFrame(rows)


def _display(table: pd.DataFrame, pm: str) -> tuple[list[str], list[list[str]]]:
    tasks = [c for c in table.columns if c in TASK_NAMES and c != OVERALL]
    header = ["Model", "Method"] + [TASK_NAMES[t] for t in tasks] + ["MAT", "MAT (Spec-Bench)", "Tokens/s",
                                                                      "Speedup"]
    body = []
    for _, r in table.iterrows():
        body.append([str(r["model"]), str(r["method"])]
                    + [_cell(r[t], r[t + "_std"], 2, pm) + "×" for t in tasks]
                    + [_cell(r["mat"], r["mat_std"], 2, pm), _cell(r["mat_specbench"], r["mat_specbench_std"], 2, pm),
                       _cell(r["tok_per_s"], r["tok_per_s_std"], 2, pm),
                       _cell(r["speedup"], r["speedup_std"], 2, pm) + "×"])
    return header, body


def to_markdown(table: pd.DataFrame) -> str:
    header, body = _display(table, " ± ")
    rows = [header, ["---"] * 2 + ["---:"] * (len(header) - 2)] + body
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def _tex(s: str) -> str:
    s = s.replace("\\", "\0")
    for a, b in (("&", r"\&"), ("%", r"\%"), ("#", r"\#"), ("_", r"\_"), ("{", r"\{"), ("}", r"\}")):
        s = s.replace(a, b)
    return s.replace("\0", r"\textbackslash{}").replace("×", r"$\times$").replace("±", r"$\pm$")


def to_latex(table: pd.DataFrame, caption: str) -> str:
    """A booktabs table; the best speedup of each column within a model is bold (baselines excluded)."""
    header, body = _display(table, " ± ")
    tasks = [c for c in table.columns if c in TASK_NAMES and c != OVERALL]
    columns = tasks + ["mat", "mat_specbench", "tok_per_s", "speedup"]
    bold = set()
    for model, t in table.groupby("model", sort=False):
        methods = t[~t["baseline"]]
        for j, c in enumerate(columns):
            if len(methods) > 1 and methods[c].notna().any():
                bold.add((methods[c].idxmax(), j + 2))
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             r"\begin{tabular}{ll" + "r" * (len(header) - 2) + "}", r"\toprule",
             " & ".join(_tex(h) for h in header) + r" \\", r"\midrule"]
    previous = None
    for row_index, cells in zip(table.index, body):
        if previous is not None and table.loc[row_index, "model"] != previous:
            lines.append(r"\midrule")
        previous = table.loc[row_index, "model"]
        out = [r"\textbf{" + _tex(c) + "}" if (row_index, j) in bold else _tex(c) for j, c in enumerate(cells)]
        lines.append(" & ".join(out) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\caption{" + _tex(caption) + "}", r"\end{table}"]
    return "\n".join(lines)


# ---------------------------------------------------------------- environment

def environment_line(groups: list[Group]) -> str:
    """Where the numbers came from, one line; differing environments are all listed (and are a warning sign)."""
    seen = []
    for g in groups:
        for run in g.runs + g.baseline:
            e = run.summary.get("environment")
            if not e:
                line = "environment not recorded (foreign answer file)"
            else:
                where = machine(run) if e.get("cpu") or e.get("device", "").startswith("cuda") else \
                    f"{e.get('device', '?')} {e.get('device_name', '')}, {e.get('cpu_threads', '?')} threads"
                line = (f"{where}, {e.get('dtype', '?')}, torch {e.get('torch', '?')}, "
                        f"transformers {e.get('transformers', '?')}")
            if line not in seen:
                seen.append(line)
    return ("mixed environments: " if len(seen) > 1 else "") + " | ".join(seen)


def timing_note(groups: list[Group]) -> str | None:
    """The warning a table of runs not decoded side by side needs (``answers.separate_runs_note``), or None."""
    return separate_runs_note([run.summary for g in groups for run in g.runs + g.baseline])


def bench_line(groups: list[Group]) -> str:
    first = next((r for g in groups for r in g.runs if r.summary), groups[0].runs[0])
    b, n = _bench(first), len(first.questions)
    return f"{b.get('name', 'Spec-Bench answers')}, {n} questions" + (
        f", {b['max_new_tokens']} new tokens" if b.get("max_new_tokens") else "")


# ---------------------------------------------------------------- figures

def _figure_style():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 150, "axes.spines.top": False,
                         "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3, "font.size": 9,
                         "legend.fontsize": 8, "legend.frameon": False})
    return plt


def _save(fig, out: Path, name: str, footer: str) -> list[Path]:
    fig.text(0.01, 0.005, footer, fontsize=6.5, color="0.4", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    files = [out / f"{name}.png", out / f"{name}.pdf"]
    for f in files:
        fig.savefig(f, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return files


def _rows(stats: pd.DataFrame, g: Group) -> pd.DataFrame:
    """The per-task rows of one group, indexed by task."""
    return stats[(stats["model"] == g.model) & (stats["method"] == g.label)].set_index("task")


def _tasks(stats: pd.DataFrame) -> list[str]:
    return [t for t in list(TASKS) + [OVERALL] if t in set(stats["task"])]


def _task_bars(ax, stats: pd.DataFrame, groups: list[Group], metric: str, labels: list[str]) -> list:
    """Grouped bars: one group of bars per task, one bar per group (error bars for repeats); returns the bars."""
    tasks, width, containers = _tasks(stats), 0.8 / len(groups), []
    for i, (g, label) in enumerate(zip(groups, labels)):
        t = _rows(stats, g).reindex(tasks)
        xs = [j + (i - (len(groups) - 1) / 2) * width for j in range(len(tasks))]
        err = t[metric + "_std"].fillna(0).to_numpy() if g.runs[1:] else None
        containers.append(ax.bar(xs, t[metric], width * 0.92, yerr=err, capsize=2, label=label))
    ax.set_xticks(range(len(tasks)), [SHORT_NAMES.get(t, t) for t in tasks])
    return containers


def _series_name(g: Group, multi_model: bool) -> str:
    return f"{g.label} · {g.model}" if multi_model else g.label


def plot_speedup(stats: pd.DataFrame, groups: list[Group], out: Path, footer: str) -> list[Path]:
    plt = _figure_style()
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
    return _save(fig, out, "speedup_per_task", footer)


def plot_accept_lengths(groups: list[Group], out: Path, footer: str) -> list[Path]:
    plt = _figure_style()
    methods = [g for g in groups if not g.is_baseline]
    if not methods:
        return []
    multi = len({g.model for g in groups}) > 1
    hists = [accept_histogram(g.records) for g in methods]
    longest = max(int(h.index.max()) for h in hists)
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(min(11.0, max(6.5, 0.3 * longest * len(methods))), 3.4))
    for i, (g, h) in enumerate(zip(methods, hists)):
        h = h.reindex(range(1, longest + 1), fill_value=0.0)
        mat = sum(k * v for k, v in h.items())
        ax.bar([k + (i - (len(methods) - 1) / 2) * width for k in h.index], 100 * h.to_numpy(), width * 0.92,
               label=f"{_series_name(g, multi)} (MAT {mat:.2f})")
    ax.set_xticks(range(1, longest + 1))
    ax.set_xlabel("accepted length per step (tokens, bonus token included)")
    ax.set_ylabel("share of steps (%)")
    ax.set_title("Distribution of accepted lengths (" + bench_line(groups) + ")")
    ax.legend(loc="upper right")
    return _save(fig, out, "accept_lengths", footer)


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
    plt = _figure_style()
    files = []
    for name, (param, x, hold, xlabel) in ABLATIONS.items():
        series = _sweeps(groups, param, x, hold)
        if not series:
            continue
        fig, (a_mat, a_tok) = plt.subplots(1, 2, figsize=(8.5, 3.3))
        for line, members in series:
            xs = [g.state[x] for g in members]
            o = [_rows(stats, g).loc[OVERALL] for g in members]
            a_mat.errorbar(xs, [r["mat"] for r in o], yerr=[0 if math.isnan(r["mat_std"]) else r["mat_std"]
                                                            for r in o], marker="o", capsize=2, label=line)
            a_tok.errorbar(xs, [r["tok_per_s"] for r in o],
                           yerr=[0 if math.isnan(r["tok_per_s_std"]) else r["tok_per_s_std"] for r in o],
                           marker="o", capsize=2, label=line)
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
        files += _save(fig, out, name, footer + " · " + bench_line(groups))
    return files


def plot_start_policies(stats: pd.DataFrame, groups: list[Group], out: Path, footer: str) -> list[Path]:
    series = _sweeps(groups, "start")[:3]
    if not series:
        return []
    plt = _figure_style()
    fig, axes = plt.subplots(1, len(series), figsize=(6.5 * len(series), 3.4), squeeze=False)
    for ax, (name, gs) in zip(axes[0], series):
        _task_bars(ax, stats, gs, "mat", [f"start={g.params['start']}" for g in gs])
        ax.set_ylabel("mean accepted tokens per step (MAT)")
        ax.set_title("Start policies: " + name)
        ax.margins(y=0.18)
        ax.legend(ncol=len(gs), loc="upper left")
    return _save(fig, out, "start_policies", footer + " · " + bench_line(groups))


# ---------------------------------------------------------------- the command

def report(paths: list[str], out: Path, baseline: str | None = None, figures: bool = True,
           mixed_machines: bool = False) -> dict:
    """Build everything; returns {"table": main table, "stats": per-task table, "files": [written paths]}."""
    groups = group_runs(collect(paths), collect([baseline]) if baseline else None)
    if not mixed_machines:
        check_machines(groups)
    stats = task_stats(groups)
    table = main_table(stats)
    env = environment_line(groups)
    out.mkdir(parents=True, exist_ok=True)
    caption = f"Speedup over vanilla greedy decoding per Spec-Bench task, mean accepted tokens (MAT) and " \
              f"tokens/s ({bench_line(groups)}; {env})."
    note = timing_note(groups)
    written = {"main_table.md": to_markdown(table) + "\n" + (f"\n{note}\n" if note else ""),
               "main_table.tex": to_latex(table, caption) + "\n" + (f"% {note}\n" if note else "")}
    for name, text in written.items():
        (out / name).write_text(text)
    table.to_csv(out / "main_table.csv", index=False)
    stats.to_csv(out / "tasks.csv", index=False)
    (out / "environment.json").write_text(json.dumps({
        "environment": env, "bench": bench_line(groups), "side_by_side": note is None,
        "runs": [{"model": g.model, "method": g.label, "runs": [str(r.path) for r in g.runs],
                  "baseline": [str(b.path) for b in g.baseline],
                  "environment": [r.summary.get("environment") for r in g.runs]} for g in groups]}, indent=2) + "\n")
    files = [out / n for n in ("main_table.md", "main_table.csv", "main_table.tex", "tasks.csv", "environment.json")]
    if figures:
        files += plot_speedup(stats, groups, out, env)
        files += plot_accept_lengths(groups, out, env)
        files += plot_ablations(stats, groups, out, env)
        files += plot_start_policies(stats, groups, out, env)
    return {"table": table, "stats": stats, "groups": groups, "files": files}


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders, answer files, folders of them; LABEL=PATH names them")
    ap.add_argument("--baseline", help="the baseline run for every row (default: each model's vanilla runs)")
    ap.add_argument("--out", help="output folder (default: results/reports/<time>)")
    ap.add_argument("--no-figures", action="store_true", help="tables only")
    ap.add_argument("--mixed-machines", action="store_true",
                    help="allow a speedup whose method and baseline ran on different machines")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else RESULTS / "reports" / time.strftime("%Y-%m-%d_%H-%M-%S")
    result = report(args.runs, out, args.baseline, figures=not args.no_figures, mixed_machines=args.mixed_machines)
    print(to_markdown(result["table"]))
    print(f"\n{bench_line(result['groups'])}; {environment_line(result['groups'])}")
    note = timing_note(result["groups"])
    if note:
        print(note)
    print("-> " + ", ".join(str(f.relative_to(out)) for f in result["files"]) + f" in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
