"""The one rule for every command that combines runs (report, speed, equal, sweep): the runs compared must be
finished and made under the same settings, or the command refuses in one line naming the key that differs.

A speedup, a MAT beside another or a token-by-token comparison means something only when both sides asked the
model the same questions under the same settings; a difference there is a settings difference, not a result.
The settings (``SETTINGS``): the model (name and checkpoint), the questions answered, ``bench.max_new_tokens``, the
sampling settings, the paradigm (``bench.rounds``, ``num_choices``, ...) and ``runtime.batch_size`` (a speedup under load is against vanilla at the same batch size). An unfinished run (its summary's status is not ``finished``) is refused unless the command's
``--allow-unfinished`` is given (a summary whose status is ``running`` or ``interrupted``); then the runs are compared on the questions all of them answered, and the command
says so (``Check.note``) beside its table. Spec-Bench's own answer files record no settings: only their questions
are checked.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from methods.common import HarnessError
from methods.sampling import Sampling

SETTINGS = ("model", "questions", "max_new_tokens", "sampling", "paradigm", "batch_size")
ALLOW = "--allow-unfinished"


def paradigm_label(bench: dict | None) -> str | None:
    """``rounds=2``, ``N=4``, ``N=4 (reference loop)``, ``forced end of thinking`` (together where several) for a
    run of another paradigm than a single pass (``evaluation.running.paradigms``); None for a single pass."""
    b = bench or {}
    parts = ([f"rounds={b['rounds']}"] if b.get("rounds", 1) > 1 else []) + \
        ([f"N={b['num_choices']}" + (" (reference loop)" if b.get("bon_reference") else "")]
         if b.get("num_choices", 1) > 1 else []) + (["forced end of thinking"] if b.get("force_end_of_thinking") else [])
    return ", ".join(parts) or None


def budget_label(runtime: dict | None) -> str | None:
    """``auto``, ``off above 4`` or ``auto, off above 4`` for a run with a per-step draft budget
    (``runtime.budget``, ``runtime.spec_off_above``: ``methods.budget``); None for one without."""
    r = runtime or {}
    parts = (["auto"] if r.get("budget") == "auto" else []) + \
        ([f"off above {r['spec_off_above']}"] if r.get("spec_off_above") is not None else [])
    return ", ".join(parts) or None


def sampling_label(sampling: dict | None) -> str | None:
    """``T=0.7 seed=1`` (with any top-k or top-p) for a run that sampled, None for a greedy one (or one from before
    sampling settings existed)."""
    s = Sampling(**sampling) if sampling else Sampling()
    return None if s.greedy else s.label()


@dataclass
class Side:
    """One run as the rule sees it: where it is, its summary ({} for a foreign file) and its answers."""
    path: Path
    summary: dict
    records: list[dict]

    @property
    def finished(self) -> bool:
        """Only a summary's own status (``running``, ``interrupted``) marks a run unfinished."""
        return self.summary.get("status", "finished") == "finished"

    @property
    def progress(self) -> str:
        s = self.summary
        return f"{s.get('answered', len(self.records))}/{s.get('questions', '?')} questions, status {s.get('status')}"

    def setting(self, key: str):
        """The run's value of a ``SETTINGS`` key; None where it records none (a foreign file)."""
        if key == "questions":
            return sorted({r["question_id"] for r in self.records})
        config = self.summary.get("config")
        if not config:
            return None
        if key == "model":
            m = config.get("model", {})
            return f"{m.get('name')} ({m.get('checkpoint')})"
        if key == "max_new_tokens":
            return config.get("bench", {}).get("max_new_tokens")
        if key == "batch_size":
            return (config.get("runtime") or {}).get("batch_size", 1)
        if key == "paradigm":
            return paradigm_label(config.get("bench")) or "single pass"
        return sampling_label(config.get("sampling")) or "greedy"


@dataclass
class Check:
    note: str | None = None  # what the caption must say (unfinished runs compared on common questions)


def _shown(key: str, value) -> str:
    if key == "questions":
        return f"{len(value)} questions ({_ids(value)})"
    return str(value)


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:5])) + (", ..." if len(ids) > 5 else "")


def check(sides: list[Side], keys: tuple[str, ...] = SETTINGS, allow_unfinished: bool = False,
          fix: str = "compare runs made with the same settings") -> Check:
    """Refuse (HarnessError) ``sides`` that are unfinished (unless ``allow_unfinished``) or differ in one of
    ``keys``; the first difference is named with both runs and both values."""
    unfinished = [s for s in sides if not s.finished]
    if unfinished and not allow_unfinished:
        s = unfinished[0]
        raise HarnessError(f"{s.path} is unfinished ({s.progress}); finish it (rerun its command: it resumes) or "
                           f"pass {ALLOW} to compare on the questions every run answered")
    for key in keys:
        if key == "questions" and unfinished:
            continue  # compared on the common questions, which the note names
        seen = [(s, s.setting(key)) for s in sides]
        seen = [(s, v) for s, v in seen if v is not None]
        for s, v in seen[1:]:
            if json.dumps(v) != json.dumps(seen[0][1]):
                first, value = seen[0]
                name = {"max_new_tokens": "bench.max_new_tokens", "sampling": "sampling.*",
                        "batch_size": "runtime.batch_size"}.get(key, key)
                raise HarnessError(f"{first.path} and {s.path} differ in {name} ({_shown(key, value)} vs "
                                   f"{_shown(key, v)}): a settings difference; {fix}")
    if not unfinished:
        return Check()
    common = set.intersection(*({r["question_id"] for r in s.records} for s in sides))
    return Check(f"unfinished run(s) compared on the {len(common)} question(s) every run answered: "
                 + "; ".join(f"{s.path} ({s.progress})" for s in unfinished))
