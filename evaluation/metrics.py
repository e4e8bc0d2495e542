"""Every derived number of the harness, defined once.

Raw counters come from answer records (``new_tokens``, ``wall_time``,
``accept_lengths`` per question). Conventions:

* **accept length** of a step = tokens it committed, the bonus token included
  (vanilla: always 1). The prefill counts as one step of length 1.
* **MAT** (mean accepted tokens) = mean of all accept lengths of a task
  = total new tokens / total steps. Spec-Bench defines it the same way.
* **tokens/s** of a task = total new tokens / total wall time over its questions
  (wall time includes the prefill).
* **speedup** = tokens/s of the method / tokens/s of the baseline, over the
  questions both answered (paired by ``question_id``). Being lossless, both
  produce the same tokens, so this is the ratio of wall-clock times.
* **speedup (Spec-Bench)** = mean over questions of per-question tokens/s of the
  method / the same mean for the baseline: the number Spec-Bench's speed script
  prints, kept beside ours so that published tables can be compared.
"""
from __future__ import annotations

import pandas as pd

from evaluation.data import TASKS, task_of

OVERALL = "overall"


def per_question(records: list[dict]) -> pd.DataFrame:
    """One row per question: raw counters summed over its turns."""
    rows = []
    for r in records:
        c = r["choices"][0]
        rows.append({
            "question_id": r["question_id"],
            "task": task_of(r.get("category", "")),
            "new_tokens": sum(c["new_tokens"]),
            "wall_time": sum(c["wall_time"]),
            "steps": len(c["accept_lengths"]),
            "accepted": sum(c["accept_lengths"]),
        })
    df = pd.DataFrame(rows).set_index("question_id")
    df["tok_per_s"] = df["new_tokens"] / df["wall_time"]
    return df


def _aggregate(q: pd.DataFrame) -> dict:
    return {
        "questions": len(q),
        "mat": q["accepted"].sum() / q["steps"].sum(),
        "tok_per_s": q["new_tokens"].sum() / q["wall_time"].sum(),
        "mean_q_tok_per_s": q["tok_per_s"].mean(),
    }


def task_table(records: list[dict], baseline: list[dict] | None = None) -> pd.DataFrame:
    """Per task and overall: MAT, tokens/s and, given a baseline, both speedups on paired questions."""
    q = per_question(records)
    b = per_question(baseline) if baseline is not None else None
    if b is not None:
        common = q.index.intersection(b.index)
        q, b = q.loc[common], b.loc[common]
    groups = [t for t in TASKS if t in set(q["task"])] + sorted(set(q["task"]) - set(TASKS))
    rows = {}
    for name in groups + [OVERALL]:
        sel = q if name == OVERALL else q[q["task"] == name]
        row = _aggregate(sel)
        if b is not None:
            base = _aggregate(b.loc[sel.index])
            row["baseline_tok_per_s"] = base["tok_per_s"]
            row["speedup"] = row["tok_per_s"] / base["tok_per_s"]
            row["speedup_specbench"] = row["mean_q_tok_per_s"] / base["mean_q_tok_per_s"]
        rows[name] = row
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = "task"
    return df
