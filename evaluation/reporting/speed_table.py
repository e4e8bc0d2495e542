"""The speed table of runs against a baseline, per task (``python -m evaluation.speed`` is the command)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from evaluation.records.answers import ANSWERS, answer_file, read_answers, read_summary
from evaluation.records.consistency import Side, check, sampling_label
from evaluation.records.metrics import OVERALL, batch_stats, load_speedup, task_table
from evaluation.reporting.collect import disturbance_note, spec_bench_tokens_of
from evaluation.reporting.columns import names
from methods.common import HarnessError

COLUMNS = names("speed")  # key -> name, intervals included (evaluation.reporting.columns)


def label(records: list[dict], path: str) -> str:
    methods = {r.get("method") for r in records}
    return methods.pop() if len(methods) == 1 and None not in methods else Path(path).stem


def sampling_of(records: list[dict], path: str) -> str:
    """``greedy`` or the settings (``T=0.7 seed=1``) the records sampled with (records from before sampling
    existed: greedy); HarnessError when one file mixes settings."""
    found = {sampling_label(r.get("sampling")) or "greedy" for r in records}
    if len(found) > 1:
        raise HarnessError(f"{path} mixes answers of different sampling settings ({', '.join(sorted(found))}); "
                           f"keep one run's settings per answer file")
    return found.pop() if found else "greedy"


def speed_table(runs: list[str], baseline: str | None, allow_unfinished: bool = False) -> tuple[pd.DataFrame, list]:
    """The table of ``runs`` against ``baseline``, and the notes it needs (unfinished runs compared on common
    questions, a busy machine). Runs that cannot be compared with the baseline (``evaluation.records.consistency``) are
    refused."""
    base = read_answers(baseline) if baseline else None
    base_tokens = spec_bench_tokens_of(baseline, base) if base is not None else None
    tables, notes = [], []
    records = [read_answers(path) for path in runs]
    labels = [label(recs, path) for recs, path in zip(records, runs)]
    twice = {name for name in labels if labels.count(name) > 1}  # two runs of one method: add their folders
    labels = [f"{name} ({answer_file(run).parent.name})" if name in twice else name for name, run in zip(labels, runs)]
    for path, recs, name in zip(runs, records, labels):
        sampling = sampling_of(recs, path)
        if base is not None:
            mine, theirs = {r.get("model_id") for r in recs}, {r.get("model_id") for r in base}
            if mine != theirs:
                raise HarnessError(f"{path} answers with model(s) {sorted(map(str, mine))} but the baseline with "
                                   f"{sorted(map(str, theirs))}; give a baseline run of the same model")
            note = check([_side(path, recs), _side(baseline, base)], allow_unfinished=allow_unfinished,
                         fix="give as --baseline the vanilla run of the same settings").note
            notes += [note] if note and note not in notes else []
            if not {r["question_id"] for r in recs} & {r["question_id"] for r in base}:
                raise HarnessError(f"{path} and the baseline answer no question in common")
        t = task_table(recs, base, base_tokens).reset_index()
        t.insert(0, "method", name)
        t.insert(1, "sampling", sampling)
        tables.append(t)
    _under_load(tables, records, base)
    table = pd.concat(tables, ignore_index=True)
    table = table[[c for c in table.columns if c in ("method", "sampling", "task") or c in COLUMNS]]
    # a speedup above MAT signals a disturbed clock only against a baseline of the same model setting: a bf16 step is
    # cheaper than an fp32 one, so bf16 vanilla against fp32 vanilla is faster than its MAT by design
    same = {name for name, path in zip(labels, runs) if base is None or same_setting(path, baseline)}
    rows = [r for r in zip(table["method"], table["task"], table["speedup"], table["mat"]) if r[0] in same] \
        if "speedup" in table else []
    busy, _ = disturbance_note(dict(zip(labels, records)), rows)
    table = table.rename(columns=COLUMNS)
    table = table if (table["sampling"] != "greedy").any() else table.drop(columns="sampling")
    return table, notes + ([busy] if busy else [])


def same_setting(a: str, b: str) -> bool:
    """Whether two runs ran the same model setting (the model config, its dtype, the engine); runs without a summary
    (foreign files) count as the same."""
    def setting(path):
        summary = read_summary(path)
        config = summary.get("config") or {}
        return json.dumps([config.get("model"), config.get("engine"), summary.get("environment", {}).get("dtype")],
                          sort_keys=True) if summary else None

    x, y = setting(a), setting(b)
    return x is None or y is None or x == y


def _under_load(tables: list[pd.DataFrame], records: list[list[dict]], base: list[dict] | None) -> None:
    """When a run was batched, every run's throughput and its speedup over the baseline's, on its overall row (a
    throughput is the whole run's: the tasks' turns overlapped); "-" where a run recorded no clock."""
    loads = [batch_stats(recs) for recs in records]
    if not any((s["batch_size"] or 1) > 1 for s in loads):
        return
    for t, recs, s in zip(tables, records, loads):
        t["throughput"] = [(s["throughput"] or "-") if task == OVERALL else "" for task in t["task"]]
        if base is not None:
            speedup = load_speedup(recs, base) or "-"
            t["throughput_speedup"] = [speedup if task == OVERALL else "" for task in t["task"]]


def _side(path: str, records: list[dict]) -> Side:
    return Side(answer_file(path).parent if answer_file(path).name == ANSWERS else answer_file(path),
                read_summary(path), records)
