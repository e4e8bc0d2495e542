"""What token-identical means, and what a divergence is: two runs' answers compared turn by turn, and a first
divergence classified as a near-tie of the arithmetic or a real mismatch (``python -m evaluation.equal`` is the
command; ``evaluation.running.explain`` re-runs a model to classify)."""
from __future__ import annotations

from dataclasses import dataclass

from methods.common import HarnessError

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
