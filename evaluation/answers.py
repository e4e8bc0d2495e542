"""Answer files: Spec-Bench's JSONL format plus our extra fields, written one whole line at a time.

Each line is one question::

    {"question_id": 81, "category": "writing", "answer_id": "...", "model_id": "smollm2-135m",
     "tstamp": 1764430000.0, "method": "tr",
     "choices": [{"index": 0,
                  "turns": ["text of turn 1", "text of turn 2"],      # Spec-Bench
                  "decoding_steps": [40, 37],                          # Spec-Bench: target forwards per turn
                  "new_tokens": [128, 128],                            # Spec-Bench: tokens generated per turn
                  "wall_time": [2.91, 2.75],                           # Spec-Bench: seconds per turn, prefill included
                  "accept_lengths": [1, 3, 2, ...],                    # Spec-Bench: tokens per step, all turns
                  "token_ids": [[...], [...]],                         # ours: generated ids per turn
                  "prefill_time": [0.05, 0.07], "decode_time": [2.86, 2.68],
                  "stop": ["length", "eos"],
                  "prefill_step": [true, true],                        # ours: the turn's first step is the
                                                                       # prefill's one token
                  "spec_bench_steps": [39, 36]}]}                      # ours: steps as Spec-Bench counts them
                                                                       # (evaluation/metrics.py)
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from evaluation.errors import HarnessError, read_jsonl

ANSWERS = "answers.jsonl"
SUMMARY = "summary.json"
SPEC_BENCH_FIELDS = ("turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths")


def answer_file(path: str | Path) -> Path:
    """A run folder or an answer file -> the answer file."""
    p = Path(path)
    if p.is_dir():
        p = p / ANSWERS
    if not p.is_file():
        raise HarnessError(f"no answer file at {path}; give a run folder holding {ANSWERS} or a .jsonl file")
    return p


def _check(obj, where: str) -> dict:
    if not isinstance(obj, dict):
        raise HarnessError(f"{where}: not an answer record (expected a JSON object)")
    for key in ("question_id", "choices"):
        if key not in obj:
            raise HarnessError(f"{where}: not a Spec-Bench answer record: missing '{key}'")
    choices = obj["choices"]
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise HarnessError(f"{where}: 'choices' must be a non-empty list of objects")
    missing = [k for k in SPEC_BENCH_FIELDS if k not in choices[0]]
    if missing:
        raise HarnessError(f"{where}: not a Spec-Bench answer record: choices[0] lacks {', '.join(missing)}")
    return obj


def read_summary(path: str | Path) -> dict:
    """The run summary beside an answer file (``{}`` for a file without one, e.g. Spec-Bench's own)."""
    p = answer_file(path)
    f = p.parent / SUMMARY
    return json.loads(f.read_text()) if p.name == ANSWERS and f.is_file() else {}


def separate_runs_note(summaries: list[dict]) -> str | None:
    """None when every run was decoded side by side in one process (``scripts.bench_methods`` gives them one
    ``session``); else the warning that a speed table of separately made runs needs."""
    sessions = {s.get("session") for s in summaries}
    if len(sessions) == 1 and None not in sessions:
        return None
    return ("note: these runs were made at different times, in separate processes; their speedups include whatever "
            "else the machine did meanwhile. Decode the methods side by side (python -m scripts.bench_methods) for "
            "speedups a paper can use")


def read_answers(path: str | Path) -> list[dict]:
    p = answer_file(path)
    records, seen = [], set()
    for where, obj in read_jsonl(p, "one answer record a line (is this an answer file?)"):
        rec = _check(obj, where)
        if rec["question_id"] in seen:
            raise HarnessError(f"{where}: question {rec['question_id']} is answered twice")
        seen.add(rec["question_id"])
        records.append(rec)
    if not records:
        raise HarnessError(f"answer file {p} holds no answers")
    return records


class AnswerWriter:
    """Appends whole lines. A line cut short by a killed process is removed when the file is reopened."""

    def __init__(self, path: Path):
        self.path = path
        self.done: set[int] = set()
        if path.exists():
            data = path.read_bytes()
            whole = data[: data.rfind(b"\n") + 1]
            if len(whole) != len(data):
                with open(path, "r+b") as f:
                    f.truncate(len(whole))
            for line in whole.decode("utf-8").splitlines():
                if line.strip():
                    self.done.add(json.loads(line)["question_id"])

    def append(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.done.add(record["question_id"])


def write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def save_torch_atomic(path: Path, obj) -> None:
    """``torch.save`` that a kill cannot leave half-written (the folder is made if missing)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)
