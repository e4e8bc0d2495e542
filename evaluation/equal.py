"""Prove losslessness: compare two answer files token by token, question by question, turn by turn.

    python -m evaluation.equal results/runs/.../vanilla/ results/runs/.../tr/ [--dtype-tolerant] [--no-explain]

Prints the share of identical turns and, for each mismatch, the question, turn,
first differing position and both tokens. Files without token ids (Spec-Bench's own)
are compared by text, and it says so.

Why two outputs differ: in fp16 or bf16 a tree forward sums in another order than a
plain step, so a method can flip a near-tie between the two best tokens and then follow
another (equally greedy) path; Spec-Bench claims equality in fp32 only. For the first
divergence of every turn the checker re-runs the reference run's model (its config.yaml:
checkpoint, dtype, prompt format) teacher-forced on the common prefix and reports the
logits of both runs' tokens there. A divergence is a **near-tie** when both tokens' logits
lie within a threshold of the best logit (``TIE_EPS[dtype]`` machine epsilons of the run's
dtype times the largest logit's magnitude there; usually the two are the top two, but
bf16's coarse steps put a third token within it too); otherwise it is a **real mismatch**
(a bug).
A later turn built on a diverged answer is reported as following it.

At temperature > 0 (the run's ``sampling.*``) every method draws each token as the argmax of the
processed logits plus a Gumbel noise keyed by its position (``methods.sampling``), so its tokens must
equal vanilla sampling's exactly like greedy tokens; a divergence is a **near-tie** when the two tokens'
perturbed logits are within float noise of the best one (the rule above, the threshold divided by the
temperature), otherwise a real mismatch.

Runs of other settings (model, ``bench.max_new_tokens``, sampling) are refused as a settings difference, and
unfinished runs unless ``--allow-unfinished`` (``evaluation.records.consistency``): exit 2. Runs of other selections
(a method's run of a few questions against vanilla's of many) or batch sizes are compared on the questions both
answered, and the checker says how many of each side it left out.

Exit status: 0 when everything is equal; with ``--dtype-tolerant``, also when every
mismatch is a near-tie in a run of less than fp32 precision; 1 otherwise. In fp32 any
mismatch fails: there, a near-tie is shown with where and why, and still counts.
"""
from __future__ import annotations

import argparse
import sys

from evaluation.records.answers import answer_file, read_answers, read_summary
from evaluation.records.consistency import SETTINGS, Side, check
from evaluation.records.equality import NEAR_TIE, compare
from evaluation.running.explain import explain
from methods.common import HarnessError, exit_on_error


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", help="answer file or run folder (the reference, e.g. vanilla)")
    ap.add_argument("b", help="answer file or run folder to check against it")
    ap.add_argument("--dtype-tolerant", action="store_true",
                    help="exit 0 when every mismatch is a near-tie of a run in fp16 or bf16")
    ap.add_argument("--no-explain", action="store_true", help="do not re-run the model to classify mismatches")
    ap.add_argument("--allow-unfinished", action="store_true",
                    help="compare an unfinished run on the questions both answered")
    args = ap.parse_args(argv)
    recs_a, recs_b = read_answers(args.a), read_answers(args.b)
    # every batch size must give batch-1 vanilla's tokens, and a question's tokens do not depend on which others were
    # asked: runs of other batch sizes or selections compare, on the questions both answered
    keys = tuple(k for k in SETTINGS if k not in ("batch_size", "questions"))
    note = check([Side(answer_file(p).parent, read_summary(p), r) for p, r in ((args.a, recs_a), (args.b, recs_b))],
                 keys, allow_unfinished=args.allow_unfinished, fix="tokens of other settings differ by design").note
    if note:
        print(f"note: {note}")
    ids_a, ids_b = ({r["question_id"] for r in recs} for recs in (recs_a, recs_b))
    common = ids_a & ids_b
    if not common:
        raise HarnessError(f"{args.a} and {args.b} answer no question in common; compare runs of one selection")
    if ids_a != ids_b:
        print(f"note: compared on the {len(common)} question(s) both answered; left out: {len(ids_a - common)} of "
              f"{args.a}'s, {len(ids_b - common)} of {args.b}'s")
        recs_a, recs_b = ([r for r in recs if r["question_id"] in common] for recs in (recs_a, recs_b))
    same, total, mismatches, unit = compare(recs_a, recs_b)
    if unit == "text":
        print("note: at least one file has no token ids (a Spec-Bench file?): comparing texts, not tokens")
    dtype = None
    if mismatches and unit == "token" and not args.no_explain:
        try:
            dtype = explain(answer_file(args.a).parent, recs_a, mismatches)
        except HarnessError as e:
            print(f"note: mismatches not classified: {e}")
    print(f"identical turns ({unit}s): {same}/{total} ({100.0 * same / max(total, 1):.1f}%)")
    for m in mismatches:
        print("  " + m.describe())
    first = [m for m in mismatches if not (m.kind or "").startswith("follows")]
    ties = sum(m.kind == NEAR_TIE for m in first)
    if not mismatches:
        print("EQUAL")
        return 0
    tolerated = args.dtype_tolerant and dtype not in (None, "float32") and ties == len(first)
    print(f"{'EQUAL UP TO NEAR-TIES' if tolerated else 'NOT EQUAL'}: {len(first)} divergence(s), {ties} near-tie(s)"
          f"{f' in {dtype}' if dtype else ''}" + ("" if tolerated or not ties or dtype != "float32" else
                                                  "; fp32 tolerates none"))
    return 0 if tolerated else 1


if __name__ == "__main__":
    sys.exit(main())
