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

Runs of other settings (model, questions, ``bench.max_new_tokens``, sampling) are refused as a settings
difference, and unfinished runs unless ``--allow-unfinished`` (``evaluation.consistency``): exit 2.

Exit status: 0 when everything is equal; with ``--dtype-tolerant``, also when every
mismatch is a near-tie in a run of less than fp32 precision; 1 otherwise. In fp32 any
mismatch fails: there, a near-tie is shown with where and why, and still counts.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from evaluation.answers import SUMMARY, answer_file, read_answers, read_summary
from evaluation.consistency import SETTINGS, Side, check
from methods.common import HarnessError, exit_on_error

# The near-tie threshold, in machine epsilons of the dtype times the largest logit's magnitude at the position.
# Measured with scripts/tie_noise.py (embedded model, AMD EPYC Zen 4, 5 questions x 48 tokens): the largest difference
# at the top-2 logits between a whole-sequence forward and step-by-step decoding was 12.9 such units in fp32, 4.4 in
# bf16 and 2.2 in fp16. Two computation orders can swap the best two tokens only when their margin is below the sum
# of both differences; the thresholds cover twice the largest difference seen, rounded up to a power of two.
TIE_EPS = {"float32": 32, "bfloat16": 16, "float16": 8}
NEAR_TIE, REAL = "near-tie", "real mismatch"


@dataclass
class Mismatch:
    question_id: int
    turn: int | None  # 1-based; None when a question is missing on one side
    position: int | None  # first differing token (or character, in text mode)
    a: object
    b: object
    kind: str | None = None  # NEAR_TIE, REAL, "follows turn N" or None (not explained)
    why: str = ""  # the evidence: margin, threshold, ranks

    def describe(self) -> str:
        if self.turn is None:
            return f"question {self.question_id}: {self.a}"
        text = (f"question {self.question_id} turn {self.turn}: first difference at position {self.position}: "
                f"{self.a!r} vs {self.b!r}")
        return text + (f": {self.kind} ({self.why})" if self.kind else "")


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
        diverged = None  # the first turn of this question that differs: later turns build on other answers
        for turn in range(max(len(ta), len(tb))):
            total += 1
            xa = ta[turn] if turn < len(ta) else []
            xb = tb[turn] if turn < len(tb) else []
            pos = first_difference(xa, xb)
            if pos is None:
                same += 1
                continue
            end = "<end>"
            m = Mismatch(qid, turn + 1, pos, xa[pos] if pos < len(xa) else end, xb[pos] if pos < len(xb) else end)
            if diverged is not None:
                m.kind, m.why = f"follows turn {diverged}", "its prompt holds the diverged answer"
            diverged = diverged or turn + 1
            mismatches.append(m)
    return same, total, mismatches, "token" if by_tokens else "text"


def tie_threshold(logits, dtype) -> float:
    """The largest top-2 margin of ``logits`` [vocab] that rounding in ``dtype`` can explain (``TIE_EPS``)."""
    import torch

    name = str(dtype).removeprefix("torch.")
    return TIE_EPS.get(name, max(TIE_EPS.values())) * torch.finfo(dtype).eps * float(logits.float().abs().max())


def classify(logits, a: int, b: int, dtype, threshold: float | None = None, what: str = "logits") -> tuple[str, str]:
    """(kind, evidence) for a divergence between tokens ``a`` and ``b`` where the reference model gives ``logits``
    [vocab] (teacher-forced on the common prefix, in the run's ``dtype``).

    A near-tie: both tokens' logits are within the dtype's threshold (``threshold``; default ``tie_threshold``) of
    the best one, so another summation order can make either the argmax. Usually they are the top two; but bf16
    logits near 26 are 0.125 apart, and a third token one step below a tied top two is as much a tie."""
    x = logits.float()
    best = float(x.max())
    threshold = tie_threshold(logits, dtype) if threshold is None else threshold
    rank = {t: int((x > x[t]).sum()) + 1 for t in (a, b)}
    gap = best - min(float(x[a]), float(x[b]))
    evidence = (f"{what} {float(x[a]):.4f} (token {a}, rank {rank[a]}) and {float(x[b]):.4f} (token {b}, rank "
                f"{rank[b]}), best {best:.4f}; the lower is {gap:.4g} below the best; near-tie threshold "
                f"{threshold:.3g} in {str(dtype).removeprefix('torch.')}")
    return (NEAR_TIE if gap <= threshold else REAL), evidence


def classify_draw(logits, a: int, b: int, dtype, sampler, position: int) -> tuple[str, str]:
    """(kind, evidence) for a divergence of sampled tokens ``a`` and ``b``, the draw of new-token index ``position``
    under ``sampler`` (``methods.sampling.Sampler`` of the question and turn) where the reference model gives
    ``logits`` [vocab]. The draw is the argmax of the processed logits plus the position's Gumbel noise, so this is
    ``classify``'s rule on those perturbed logits: a near-tie when both tokens' are within the logits' near-tie
    threshold (over the temperature, as the logits are divided by it) of the best one."""
    import torch

    x = sampler.scores(logits[None], torch.zeros(1, dtype=torch.long, device=logits.device), position, 0)[0]
    t = sampler.settings.temperature
    kind, evidence = classify(x, a, b, dtype, tie_threshold(logits, dtype) / t,
                              "perturbed logits (processed logit + Gumbel noise)")
    return kind, f"{evidence} at T={t:g}"


def explain(run: Path, recs: list[dict], mismatches: list[Mismatch]) -> str:
    """Classify every first divergence of a turn by re-running ``run``'s model (the reference); returns the
    run's dtype name. Raises HarnessError when ``run`` holds no config to rebuild the model from."""
    import json

    import torch
    from omegaconf import OmegaConf

    from evaluation.data import load_bench
    from evaluation.models import ModelSpec, load_model
    from evaluation.prompts import prompt_ids

    config_file = run / "config.yaml"
    if not config_file.is_file():
        raise HarnessError(f"{run} has no config.yaml to rebuild its model from (a Spec-Bench file?)")
    cfg = OmegaConf.to_container(OmegaConf.load(config_file), resolve=True)
    env = json.loads((run / SUMMARY).read_text()).get("environment", {}) if (run / SUMMARY).is_file() else {}
    dtype = env.get("dtype", cfg["model"].get("dtype", "float32"))
    device = env.get("device", "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"note: the run used {device}; re-running its model on the CPU in {dtype}")
        device = "cpu"
    spec = replace(ModelSpec(**cfg["model"]), dtype=dtype, device=device)
    from methods.sampling import Sampler, Sampling

    sampling = Sampling(**cfg.get("sampling", {}))
    model, tok, dev = load_model(spec)
    todo = [m for m in mismatches if m.turn is not None and m.kind is None]
    questions = {q.question_id: q for q in load_bench(cfg["bench"].get("path"),
                                                      question_ids=sorted({m.question_id for m in todo}))}
    answers = {r["question_id"]: r["choices"][0] for r in recs}
    for m in todo:
        if "<end>" in (m.a, m.b):
            m.kind, m.why = REAL, "one run stopped where the other went on"
            continue
        q, c = questions[m.question_id], answers[m.question_id]
        ids = prompt_ids(spec, tok, list(q.turns[: m.turn]), c["turns"][: m.turn - 1])
        ids += c["token_ids"][m.turn - 1][: m.position]
        with torch.inference_mode():
            logits = model(torch.tensor([ids], device=dev), logits_to_keep=1).logits[0, -1]
        if sampling.greedy:
            m.kind, m.why = classify(logits, int(m.a), int(m.b), logits.dtype)
        else:
            m.kind, m.why = classify_draw(logits, int(m.a), int(m.b), logits.dtype,
                                          Sampler(sampling, m.question_id, m.turn - 1), m.position)
    return dtype


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
    # every batch size must give batch-1 vanilla's tokens: runs of other batch sizes compare
    keys = tuple(k for k in SETTINGS if k != "batch_size")
    note = check([Side(answer_file(p).parent, read_summary(p), r) for p, r in ((args.a, recs_a), (args.b, recs_b))],
                 keys, allow_unfinished=args.allow_unfinished, fix="tokens of other settings differ by design").note
    if note:
        print(f"note: {note}")
        common = {r["question_id"] for r in recs_a} & {r["question_id"] for r in recs_b}
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
