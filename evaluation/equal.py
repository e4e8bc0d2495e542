"""Prove losslessness: compare two answer files token by token, question by question, turn by turn.

    python -m evaluation.equal results/runs/.../vanilla/ results/runs/.../tr/

Prints the share of identical turns and, for each mismatch, the question, turn,
first differing position and both tokens. Exits 1 unless everything is equal.
Files without token ids (Spec-Bench's own) are compared by text, and it says so.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from evaluation.answers import read_answers
from evaluation.errors import HarnessError, exit_on_error


@dataclass
class Mismatch:
    question_id: int
    turn: int | None  # 1-based; None when a question is missing on one side
    position: int | None  # first differing token (or character, in text mode)
    a: object
    b: object

    def describe(self) -> str:
        if self.turn is None:
            return f"question {self.question_id}: {self.a}"
        return (f"question {self.question_id} turn {self.turn}: first difference at position {self.position}: "
                f"{self.a!r} vs {self.b!r}")


def first_difference(a, b) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(recs_a: list[dict], recs_b: list[dict]) -> tuple[int, int, list[Mismatch], str]:
    """(identical turns, compared turns, mismatches, unit) where unit is 'token' or 'text'."""
    models = {r.get("model_id") for r in recs_a}, {r.get("model_id") for r in recs_b}
    if models[0] != models[1]:
        raise HarnessError(f"the files answer with different models ({sorted(map(str, models[0]))} vs "
                           f"{sorted(map(str, models[1]))}); compare runs of one model")
    a = {r["question_id"]: r["choices"][0] for r in recs_a}
    b = {r["question_id"]: r["choices"][0] for r in recs_b}
    by_tokens = all("token_ids" in c for c in (*a.values(), *b.values()))
    key = "token_ids" if by_tokens else "turns"
    same = total = 0
    mismatches = []
    for qid in sorted(a.keys() | b.keys()):
        if qid not in b or qid not in a:
            mismatches.append(Mismatch(qid, None, None, f"answered only in {'A' if qid in a else 'B'}", None))
            continue
        ta, tb = a[qid][key], b[qid][key]
        for turn in range(max(len(ta), len(tb))):
            total += 1
            xa = ta[turn] if turn < len(ta) else []
            xb = tb[turn] if turn < len(tb) else []
            pos = first_difference(xa, xb)
            if pos is None:
                same += 1
            else:
                end = "<end>"
                mismatches.append(Mismatch(qid, turn + 1, pos, xa[pos] if pos < len(xa) else end,
                                           xb[pos] if pos < len(xb) else end))
    return same, total, mismatches, "token" if by_tokens else "text"


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", help="answer file or run folder (the reference, e.g. vanilla)")
    ap.add_argument("b", help="answer file or run folder to check against it")
    args = ap.parse_args(argv)
    same, total, mismatches, unit = compare(read_answers(args.a), read_answers(args.b))
    if unit == "text":
        print("note: at least one file has no token ids (a Spec-Bench file?): comparing texts, not tokens")
    print(f"identical turns ({unit}s): {same}/{total} ({100.0 * same / max(total, 1):.1f}%)")
    for m in mismatches:
        print("  " + m.describe())
    print("EQUAL" if not mismatches else f"NOT EQUAL: {len(mismatches)} mismatch(es)")
    return 0 if not mismatches else 1


if __name__ == "__main__":
    sys.exit(main())
