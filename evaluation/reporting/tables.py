"""The tables of a report: per-task statistics of every row, the main table, the tables of acceptance by depth, of
the hybrids' drafters and under load, each as rows of text (header, body: ``render`` writes them as markdown,
LaTeX or HTML) from the columns of ``columns``."""
from __future__ import annotations

import math

import pandas as pd

from evaluation.records.bench import TASKS
from evaluation.records.metrics import (
    OVERALL,
    batch_stats,
    crossover,
    depth_acceptance,
    drafter_table,
    load_interval,
    load_speedup,
    long_stats,
    position_table,
    repeat_table,
)
from evaluation.reporting.collect import Group, spec_bench_tokens_of
from evaluation.reporting.columns import Column, columns, task_column
from evaluation.reporting.render import markdown_rows

Rows = tuple[list[str], list[list[str]]]  # a table as text: header, body


def task_stats(groups: list[Group]) -> pd.DataFrame:
    """Long table: one row per group and task (tasks in Spec-Bench order, then overall)."""
    frames, tokens = [], {}  # a baseline's answers as Spec-Bench counts them, re-tokenized once for every row
    for g in groups:
        for b in g.baseline:
            if b.path not in tokens:
                tokens[b.path] = spec_bench_tokens_of(b.path, b.records)
        t = repeat_table([r.records for r in g.runs], [b.records for b in g.baseline],
                         [tokens[b.path] for b in g.baseline]).reset_index()
        t.insert(0, "memory", memory_label(g.state))
        t.insert(0, "baseline", g.is_baseline)
        t.insert(0, "method", g.label)
        t.insert(0, "model", g.model)
        frames.append(t)
    df = pd.concat(frames, ignore_index=True)
    df["questions"] = df["questions"].astype(int)
    df["repeats"] = df["repeats"].astype(int)
    return df


def memory_label(state: dict) -> str:
    """What a run's method remembered across its requests (``Proposer.memory``): none, or run (and how many answers
    its memory held at the end, where it counts them); "" for a run that does not say."""
    memory = state.get("memory", "")
    if memory == "run" and state.get("memory_answers") is not None:
        return f"run ({state['memory_answers']} answers)"
    return memory


def main_table(stats: pd.DataFrame) -> pd.DataFrame:
    """One row per model and method: speedup per task, then the main table's columns (``columns("main")``) of the
    overall row (numbers, means and stds, intervals)."""
    rows = []
    for (model, method), t in stats.groupby(["model", "method"], sort=False):
        t = t.set_index("task")
        row = {"model": model, "method": method, "baseline": bool(t["baseline"].iloc[0]),
               "repeats": int(t["repeats"].max()), "memory": t["memory"].iloc[0]}
        for task in [x for x in TASKS if x in t.index] + sorted(set(t.index) - set(TASKS) - {OVERALL}):
            for suffix in ("", "_std", "_lo", "_hi"):
                row[task + suffix] = t.loc[task, "speedup" + suffix]
            row[task + "_n"] = int(t.loc[task, "questions"])
        o = t.loc[OVERALL]
        for c in columns("main"):
            for suffix in ("",) + (("_std",) if c.spread else ()) + (("_lo", "_hi") if "main" in c.interval else ()):
                row[c.key + suffix] = o[c.key + suffix]
        row["questions"] = int(o["questions"])
        rows.append(row)
    return pd.DataFrame(rows)


def main_columns(table: pd.DataFrame) -> list[Column]:
    """The main table's columns: a speedup per task it holds (``main_table``'s order), then ``columns("main")``."""
    main = {c.key for c in columns("main")} | {"model", "method", "baseline", "repeats", "questions", "disturbed",
                                               "memory"}
    tasks = [c for c in table.columns if c not in main and not c.endswith(("_std", "_lo", "_hi", "_n"))]
    return [task_column(t) for t in tasks] + columns("main")


DEPTHS = 8  # depth columns of the markdown table (the CSV has every depth)


def depth_stats(groups: list[Group]) -> pd.DataFrame:
    """Long table: acceptance at each depth (``evaluation.records.metrics.depth_acceptance``) per model and method that
    drafted (rows: model, method, depth, tried, accepted, rate)."""
    frames = []
    for g in groups:
        t = depth_acceptance(g.records)
        if len(t) and not g.is_baseline:
            frames.append(t.reset_index().assign(model=g.model, method=g.label))
    cols = ["model", "method", "depth", "tried", "accepted", "rate"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def depth_rows(long: pd.DataFrame) -> Rows:
    """Rate (and tries) per depth, one row per model and method, depths 1..DEPTHS."""
    header = ["Model", "Method"] + [f"d={d}" for d in range(1, DEPTHS + 1)]
    body = []
    for (model, method), t in long.groupby(["model", "method"], sort=False):
        t = t.set_index("depth")
        cells = [f"{t.loc[d, 'rate']:.3f} ({int(t.loc[d, 'tried'])})" if d in t.index and t.loc[d, "tried"] else "-"
                 for d in range(1, DEPTHS + 1)]
        body.append([str(model), str(method)] + cells)
    return header, body


DEPTH_NOTE = ("d=k: rate (tries): of the steps whose draft reached depth k and whose accepted path reached depth k - 1 "
              "(tries), the share that accepted a draft at depth k: how often a depth-k draft is accepted given that "
              "its parent was (evaluation.records.metrics); - where no step tried that depth.")


def depth_markdown(long: pd.DataFrame) -> str:
    return markdown_rows(*depth_rows(long)) + "\n\n" + DEPTH_NOTE


def drafter_stats(groups: list[Group]) -> pd.DataFrame:
    """Long table: each hybrid's drafters (``evaluation.records.metrics.drafter_table``): model, method, drafter, steps,
    share, mat, nodes. Empty when no method records its drafters."""
    frames = [drafter_table(g.records).reset_index().assign(model=g.model, method=g.label) for g in groups]
    cols = ["model", "method", "drafter", "steps", "share", "mat", "nodes"]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def drafter_rows(long: pd.DataFrame) -> Rows:
    header = ["Model", "Method", "Drafter", "Steps", "Share", "MAT", "Nodes"]
    body = [[str(r["model"]), str(r["method"]), str(r["drafter"]), str(int(r["steps"])), f"{100 * r['share']:.1f}%",
             f"{r['mat']:.2f}", f"{r['nodes']:.1f}"] for _, r in long.iterrows()]
    return header, body


DRAFTER_NOTE = ("Drafters of a hybrid's steps: sam, a chain from the automaton of the prompt and the answer so far; "
                "sam_static, a chain from the corpus's automaton; tr, eagle2, the tree drafter; tr+sam (and the like), "
                "chain and tree merged into one tree (method.merge=true); plain, no draft (a root-only step). Share: of "
                "the steps; MAT: their mean accept length; Nodes: their mean draft size, the root included.")


def drafter_markdown(long: pd.DataFrame) -> str:
    return markdown_rows(*drafter_rows(long), lead=3) + "\n\n" + DRAFTER_NOTE


def batched(groups: list[Group]) -> bool:
    """Whether a report's runs were decoded under load: at more than one batch size, or any above 1."""
    sizes = {g.batch_size for g in groups} - {None}
    return len(sizes) > 1 or any(s > 1 for s in sizes)


UNDER_LOAD = [c.key for c in columns("batch") if c.key not in ("mat", "speedup")]  # batch_stats' numbers shown


def batch_table(groups: list[Group], stats: pd.DataFrame) -> pd.DataFrame:
    """Long table of a batched report (``batched``), one row per group: model, method (its label without the batch
    size), batch_size, baseline, mat (the main table's), the numbers under load of ``evaluation.records.metrics.batch_stats``
    (repeats pooled) and speedup (``load_speedup``: over its baseline, vanilla at the same batch size) with its 95%
    interval (``speedup_lo``, ``speedup_hi``: ``load_interval``, where the runs were timed in paired parts). Empty
    when the runs are not batched."""
    cols = ["model", "method", "batch_size", "baseline", "mat", "speedup", "speedup_lo", "speedup_hi"] + UNDER_LOAD
    if not batched(groups):
        return pd.DataFrame(columns=cols)
    rows = []
    for g in groups:
        load = batch_stats(g.records)
        base = [r for b in g.baseline for r in b.records]
        speedup = load_speedup(g.records, base)
        span = load_interval(g.records, base) if speedup is not None and not g.is_baseline else None
        span = span or (math.nan, math.nan)
        overall = stats[(stats["model"] == g.model) & (stats["method"] == g.label) & (stats["task"] == OVERALL)]
        rows.append({"model": g.model, "method": g.series, "batch_size": g.batch_size, "baseline": g.is_baseline,
                     "mat": overall["mat"].iloc[0], "speedup": math.nan if speedup is None else speedup,
                     "speedup_lo": span[0], "speedup_hi": span[1],
                     **{k: math.nan if load[k] is None else load[k] for k in UNDER_LOAD}})
    return pd.DataFrame(rows, columns=cols)


def batch_sizes(long: pd.DataFrame) -> list[int]:
    """The batch sizes of ``batch_table``'s rows, in order."""
    return sorted({int(b) for b in long["batch_size"].dropna()})


def batch_rows(long: pd.DataFrame, size: int) -> Rows:
    """The rows of one batch size of ``batch_table``, in the columns of ``columns("batch")``: MAT, throughput,
    speedup in throughput, TTFT and TPOT (ms), forward tokens and the share of them that was padding."""
    shown = columns("batch")
    header = ["Model", "Method"] + [c.label for c in shown]
    body = [[str(r["model"]), str(r["method"])] + [c.cell(r) for c in shown]
            for _, r in long[long["batch_size"] == size].iterrows()]
    return header, body


def batch_markdown(long: pd.DataFrame, size: int) -> str:
    return markdown_rows(*batch_rows(long, size))


def crossovers(long: pd.DataFrame) -> dict[tuple[str, str], tuple[float | None, str]]:
    """Per (model, method) of ``batch_table`` with a measured speedup: the batch size where it falls below 1.0x
    (``evaluation.records.metrics.crossover``, by each point's 95% interval where it has one; None: it never does)
    and that as text: ``below 1.0× from B≈2.83``, ``above 1.0× up to B=16``, or ``not below 1.0× within its 95%
    interval up to B=16`` (a point under 1.0 whose interval reaches it)."""
    out = {}
    methods = long[~long["baseline"].astype(bool) & long["speedup"].notna()]
    for key, t in methods.groupby(["model", "method"], sort=False):
        x, sizes = crossover(list(zip(t["batch_size"], t["speedup"], t["speedup_hi"]))), set(t["batch_size"])
        if x is not None:
            out[key] = x, f"below 1.0× from B{'=' if x in sizes else '≈'}{x:.3g}"
        else:
            within = "not below 1.0× within its 95% interval" if (t["speedup"] < 1.0).any() else "above 1.0×"
            out[key] = None, f"{within} up to B={max(sizes)}"
    return out


def main_rows(table: pd.DataFrame, pm: str = " ± ") -> Rows:
    """The main table as text, shared by its markdown, LaTeX and HTML forms so that all show the same numbers."""
    shown = main_columns(table)
    memory = "memory" in table and (~table["memory"].isin(["", "none"])).any()  # where some row remembered
    header = ["Model", "Method"] + (["Memory"] if memory else []) + [c.label for c in shown]
    body = [[str(r["model"]), str(r["method"]) + (" †" if r.get("disturbed") is True else "")]
            + ([r["memory"] or "-"] if memory else [])
            + [c.cell(r, pm, r.get(c.key + "_n", r["questions"])) for c in shown] for _, r in table.iterrows()]
    return header, body


def to_markdown(table: pd.DataFrame) -> str:
    """The main table as a markdown table, numbers right-aligned."""
    return markdown_rows(*main_rows(table))


def _tex(s: str) -> str:
    """LaTeX-escaped text; backslashes go through a placeholder so that their escape is not escaped again."""
    s = s.replace("\\", "\0")
    for a, b in (("&", r"\&"), ("%", r"\%"), ("#", r"\#"), ("_", r"\_"), ("{", r"\{"), ("}", r"\}")):
        s = s.replace(a, b)
    return s.replace("\0", r"\textbackslash{}").replace("×", r"$\times$").replace("±", r"$\pm$")


def to_latex(table: pd.DataFrame, caption: str) -> str:
    """A booktabs table; the best speedup of each column within a model is bold (baselines excluded)."""
    header, body = main_rows(table)
    numbers = main_columns(table)
    first = len(header) - len(numbers)  # the columns before the numbers: model, method (and memory)
    bold = set()
    for model, t in table.groupby("model", sort=False):
        methods = t[~t["baseline"]]
        for j, c in enumerate(c.key for c in numbers):
            if len(methods) > 1 and methods[c].notna().any():
                bold.add((methods[c].idxmax(), j + first))
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             r"\begin{tabular}{" + "l" * first + "r" * (len(header) - first) + "}", r"\toprule",
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


# ---------------------------------------------------------------- reasoning workloads

def reasoning(groups: list[Group]) -> bool:
    """Whether a report's runs are reasoning workloads: SpecTTS-Bench's questions, or a paradigm of test-time scaling
    (thinking twice, Best-of-N, a forced end of thinking)."""
    return any(run.summary.get("config", {}).get("bench", {}).get("file") == "spec_tts" or run.params.get("paradigm")
               for g in groups for run in g.runs)


def position_bucket(groups: list[Group]) -> int:
    """Output positions per bucket of the tables and figure by position: 1,024 for runs on a GPU, else 256."""
    devices = {str(run.summary.get("environment", {}).get("device", "cpu")) for g in groups for run in g.runs}
    return 1024 if any(d.startswith("cuda") for d in devices) else 256


def reasoning_table(groups: list[Group]) -> pd.DataFrame:
    """Long table, one row per model and method (its paradigm in its label and in ``paradigm``): the numbers of
    ``evaluation.records.metrics.long_stats`` against its baseline (its repeats pooled)."""
    rows = []
    for g in groups:
        base = [r for b in g.baseline for r in b.records]
        stats = long_stats(g.records, None if g.is_baseline else base)
        rows.append({"model": g.model, "method": g.label, "paradigm": g.params.get("paradigm") or "single pass",
                     "baseline": g.is_baseline, **stats})
    return pd.DataFrame(rows)


def reasoning_rows(long: pd.DataFrame, paradigm: str) -> Rows:
    """The rows of one paradigm of ``reasoning_table`` in the columns of ``columns("reasoning")``."""
    shown = columns("reasoning")
    header = ["Model", "Method"] + [c.label for c in shown]
    body = [[str(r["model"]), str(r["method"])] + [c.cell(r) for c in shown]
            for _, r in long[long["paradigm"] == paradigm].iterrows()]
    return header, body


REASONING_NOTE = ("Looping: questions with an answer whose distinct 4-grams are under 30% of its 4-grams (the same "
                  "text again and again, which copying drafters accept at length); w/o loops: the same numbers "
                  "without them. MAT thinking / after: inside a reasoning model's thinking and after its end. Acc. @k: "
                  "the drafting steps whose draft's k-th token was accepted, over the drafting steps (vLLM's "
                  "definition); mean acceptance length: 1 + accepted drafts per drafting step. Long-range: the drafts "
                  "copied from 256 tokens back or more, or from a corpus. ITL: the time between a token and the one "
                  "before it (a step's tokens arrive together). Accuracy: the final answers graded against the "
                  "solutions; Pass@N: questions one of whose conversations is right (evaluation.records.grading).")


def reasoning_markdown(long: pd.DataFrame) -> str:
    parts = [f"### {paradigm}\n\n" + markdown_rows(*reasoning_rows(long, paradigm))
             for paradigm in dict.fromkeys(long["paradigm"])]
    return "\n\n".join(parts) + "\n\n" + REASONING_NOTE


def position_long(groups: list[Group], bucket: int) -> pd.DataFrame:
    """Long table by output position (``evaluation.records.metrics.position_table``): per model, method and bucket
    its tokens, steps, seconds, MAT and tokens/s, and its speedup over its baseline's tokens/s in that bucket (on
    the questions both answered)."""
    frames = []
    for g in groups:
        t = position_table(g.records, bucket)
        if not g.is_baseline and g.baseline:
            ids = {r["question_id"] for r in g.records}
            b = position_table([r for run in g.baseline for r in run.records if r["question_id"] in ids], bucket)
            t["speedup"] = t["tok_per_s"] / b["tok_per_s"].reindex(t.index)
        frames.append(t.reset_index().assign(model=g.model, method=g.label, baseline=g.is_baseline))
    cols = ["model", "method", "baseline", "position", "tokens", "steps", "seconds", "mat", "tok_per_s", "speedup"]
    return pd.concat(frames, ignore_index=True).reindex(columns=cols)
