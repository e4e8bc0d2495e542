"""Every number a report shows, declared once: its key in the long tables (``evaluation.records.metrics`` computes
it), its header in the paper tables, its name in the CSV files and the speed and sweep tables, its format, unit and
scale, whether it carries a spread over repeats (``<key>_std``) and a 95% interval over questions (``<key>_lo``,
``<key>_hi``), and the tables it appears in. Every table writer (``tables``, ``speed_table``), renderer (markdown,
LaTeX and HTML: ``render``) and figure reads it from here.

Adding a number to the report: compute it in ``evaluation.records.metrics.task_table`` (per task) or
``batch_stats`` (under load), and declare it below with the tables it belongs in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from evaluation.records.metrics import OVERALL


@dataclass(frozen=True)
class Column:
    key: str  # in the long tables
    label: str  # the paper tables' header (main table, batch tables, report.html)
    name: str  # the CSV files' and the speed and sweep tables' header
    fmt: str = ".2f"
    unit: str = ""  # after the number: "×" for speedups
    scale: float = 1.0  # shown as value * scale (seconds as ms: 1000)
    spread: bool = False  # the tables carry <key>_std: the spread over repeats
    interval: tuple[str, ...] = ()  # the tables that show its 95% interval over questions (<key>_lo, <key>_hi)
    tables: tuple[str, ...] = ()  # the tables it appears in: "main", "speed", "batch", "reasoning"

    def cell(self, row, pm: str = " ± ", n: int | None = None) -> str:
        """The number as the tables show it: its spread over repeats (a single run has none) and its 95% interval
        over ``n`` questions where the row has them, ``1.85 ± 0.03× [1.71, 2.01]``; a number of one question has no
        interval to give, and says so (``1.17× (n=1)``); a missing number shows as "-"."""
        value = row.get(self.key)
        if missing(value):
            return "-"
        text = self.show(value)
        std = row.get(self.key + "_std") if self.spread else None
        if not missing(std):
            text = text.removesuffix(self.unit) + pm + self.show(std)
        lo, hi = row.get(self.key + "_lo"), row.get(self.key + "_hi")
        if n == 1 and not missing(lo):
            return text + " (n=1)"
        if not (missing(lo) or missing(hi)) and lo == hi == value:  # one question in every task: nothing to resample
            return text + " (n=1 per task)"
        if not (missing(lo) or missing(hi)):
            text += f" [{format(self.scale * lo, self.fmt)}, {format(self.scale * hi, self.fmt)}]"
        return text

    def show(self, value) -> str:
        value = self.scale * value
        return format(int(round(value)) if self.fmt == "d" else value, self.fmt) + self.unit


def missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


TASK_NAMES = {"mt_bench": "MT-Bench", "translation": "Translation", "summarization": "Summarization",
              "qa": "QA", "math_reasoning": "Math", "rag": "RAG", OVERALL: "Overall"}


def task_column(task: str) -> Column:
    """A task's speedup in the main table (its own header: Spec-Bench's task names)."""
    return Column(task, TASK_NAMES.get(task, task), task, unit="×", spread=True, interval=("main",))


METRICS = [
    Column("questions", "Questions", "questions", fmt="d", tables=("speed",)),
    Column("mat", "MAT", "MAT", spread=True, interval=("main", "speed"),
           tables=("main", "speed", "batch", "reasoning")),
    Column("mat_specbench", "MAT (Spec-Bench)", "MAT (Spec-Bench)", spread=True, interval=("main",),
           tables=("main", "speed")),
    Column("tok_per_s", "Tokens/s", "tokens/s", spread=True, tables=("main", "speed")),
    Column("mean_q_tok_per_s", "Mean per-question tokens/s", "mean per-question tokens/s", tables=("speed",)),
    Column("baseline_tok_per_s", "Baseline tokens/s", "baseline tokens/s", tables=("speed",)),
    Column("baseline_mean_q_tok_per_s", "Baseline mean per-question tokens/s", "baseline mean per-question tokens/s",
           tables=("speed",)),
    Column("throughput", "Throughput (tok/s)", "throughput (tokens/s)", tables=("speed", "batch")),
    # the main table's speedup is per request; a batch table's (the same key there) is its throughput's
    Column("speedup", "Speedup", "speedup", unit="×", spread=True, interval=("main", "speed", "batch"),
           tables=("main", "speed", "batch", "reasoning")),
    Column("speedup_specbench", "Speedup (Spec-Bench)", "speedup (Spec-Bench)", unit="×", tables=("speed",)),
    Column("throughput_speedup", "Speedup in throughput", "speedup in throughput", unit="×", tables=("speed",)),
    *(Column(f"{name.lower()}_{stat}", f"{name} {stat} (ms)", f"{name.lower()}_{stat}", fmt=".1f", scale=1000,
             tables=("batch",)) for name in ("TTFT", "TPOT") for stat in ("mean", "p50", "p90")),
    Column("forward_tokens", "Forward tokens", "forward_tokens", fmt=".1f", tables=("batch",)),
    Column("padding", "Padding", "padding", fmt=".1%", tables=("batch",)),
    # a per-step budget (runtime.budget): the draft's nodes drafted and verified per step, the accept length its odds
    # predicted for the steps it chose and the one they reached
    Column("offered_nodes", "Drafted", "draft nodes drafted per step", fmt=".1f", tables=("batch",)),
    Column("kept_nodes", "Verified", "draft nodes verified per step", fmt=".1f", tables=("batch",)),
    Column("expected_mat", "Predicted", "accept length the budget predicted", tables=("batch",)),
    Column("realised_mat", "Reached", "accept length those steps reached", tables=("batch",)),
    # reasoning workloads (evaluation.records.metrics.long_stats)
    Column("answers", "Answers", "answers", fmt="d", tables=("reasoning",)),
    Column("looping", "Looping", "looping questions", fmt="d", tables=("reasoning",)),
    Column("mat_clean", "MAT w/o loops", "MAT without looping questions", tables=("reasoning",)),
    Column("speedup_clean", "Speedup w/o loops", "speedup without looping questions", unit="×",
           tables=("reasoning",)),
    Column("mat_thinking", "MAT thinking", "MAT inside the thinking", tables=("reasoning",)),
    Column("mat_answer", "MAT after", "MAT after the thinking", tables=("reasoning",)),
    Column("mean_acceptance_length", "Mean acc. length", "mean acceptance length (vLLM)", tables=("reasoning",)),
    *(Column(f"accept_rate_{k}", f"Acc. @{k}", f"acceptance rate at position {k}", fmt=".3f",
             tables=("reasoning",)) for k in (1, 2, 3, 4)),
    Column("long_range", "Long-range", "share of drafts from long-range memory", fmt=".1%", tables=("reasoning",)),
    *(Column(f"itl_p{q}", f"ITL p{q} (ms)", f"inter-token latency p{q} (ms)", fmt=".1f", scale=1000,
             tables=("reasoning",)) for q in (50, 95, 99)),
    Column("tpot", "TPOT (ms)", "time per output token (ms)", fmt=".1f", scale=1000, tables=("reasoning",)),
    Column("accuracy", "Accuracy", "accuracy", fmt=".1%", tables=("reasoning",)),
    Column("pass_at_n", "Pass@N", "pass@N", fmt=".1%", tables=("reasoning",)),
]
BY_KEY = {c.key: c for c in METRICS}


def columns(table: str) -> list[Column]:
    """The columns of ``table`` ("main", "speed", "batch"), in declaration order."""
    return [c for c in METRICS if table in c.tables]


def names(table: str) -> dict[str, str]:
    """Key -> name of ``table``'s columns and of their intervals (``MAT 95% low``): a long table's renaming."""
    out = {}
    for c in columns(table):
        out[c.key] = c.name
        if table in c.interval:
            out[c.key + "_lo"], out[c.key + "_hi"] = f"{c.name} 95% low", f"{c.name} 95% high"
    return out
