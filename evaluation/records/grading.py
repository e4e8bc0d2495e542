"""What an answer says, and whether it is right: the boxed final answer of a reasoning answer against a question's
``solution`` (SpecTTS-Bench's questions), and how much an answer repeats itself.

Grading, by category (SpecTTS-Bench's own code grades nothing; these are the usual rules of each source):

* AIME (``aime24``: the solution boxed, ``aime25``: a bare integer): the answer's last ``\\boxed{...}`` read as an
  integer equals the solution's;
* MATH-500 (``math500``): the answer's last boxed expression equals the question's ``answer`` (or its solution's
  boxed one) after normalising LaTeX (spaces, ``\\left``/``\\right``, ``\\dfrac``, ``\\text{}``, degrees, a trailing
  dot; equal as numbers where both are numbers);
* GPQA (``gpqa``: the solution is the correct option's text, boxed; the prompts list no letters): the answer's last
  boxed text equals it after the same normalising, case and punctuation aside.

An answer without a boxed expression is wrong; a question without a solution is not graded (None). Being lossless,
every method gives the same tokens and so the same grades as vanilla: the accuracy beside a speedup says what the
tokens were worth, not what the method changed.

Repetition (``repetition``): the share of distinct 4-grams among an answer's token 4-grams, and its longest span of
tokens that occurs twice (overlaps allowed). An answer whose share is below ``LOOP_DISTINCT`` loops: the same
sentences again and again, which copying drafters accept at length, so that the report gives MAT and speedup with
and without such answers.
"""
from __future__ import annotations

import re

from evaluation.records.bench import Question

LOOP_DISTINCT = 0.3  # below this share of distinct 4-grams an answer loops (fluent text: 0.9 and above)


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (braces matched) in ``text``, or None.

    >>> last_boxed(r"so \boxed{1} or rather \boxed{\frac{1}{2}}.")
    '\\frac{1}{2}'
    """
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def normalise(expr: str) -> str:
    r"""A LaTeX answer reduced to what it says.

    >>> normalise(r"\left( 3, \dfrac{\pi}{2} \right)"), normalise(r"90^\circ"), normalise(r"\text{Evelyn}.")
    ('(3,\\frac{\\pi}{2})', '90', 'evelyn')
    """
    s = expr.strip().strip("$").rstrip(".")
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s)
    for a, b in (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\!", ""),
                 ("\\,", ""), ("\\;", ""), ("\\ ", ""), ("{,}", "")):
        s = s.replace(a, b)
    return re.sub(r"\s+", "", s).lower()


def _number(s: str) -> float | None:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def grade(q: Question, text: str) -> bool | None:
    """Whether ``text`` answers ``q`` right (the module docstring's rules); None where ``q`` has no solution."""
    if not q.solution:
        return None
    got = last_boxed(text)
    if got is None:
        return False
    reference = q.answer if q.category == "math500" and q.answer else (last_boxed(q.solution) or q.solution)
    a, b = normalise(got), normalise(reference)
    if q.category.startswith("aime"):
        x, y = _number(a), _number(b)
        return x is not None and y is not None and int(x) == int(y) and x == int(x)
    if q.category == "gpqa":
        a, b = (re.sub(r"[^\w]", "", t) for t in (a, b))
    x, y = _number(a), _number(b)
    return a == b or (x is not None and y is not None and abs(x - y) < 1e-9)


def repetition(tokens: list[int]) -> dict:
    """``distinct_4grams`` (share of distinct token 4-grams, 1.0 for an answer under 4 tokens) and
    ``longest_repeat`` (tokens in the longest span that occurs twice).

    >>> repetition([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4])
    {'distinct_4grams': 0.444, 'longest_repeat': 8}
    """
    grams = [tuple(tokens[i:i + 4]) for i in range(len(tokens) - 3)]
    distinct = len(set(grams)) / len(grams) if grams else 1.0
    lo, hi = 0, max(len(tokens) - 1, 0)  # the longest L with a repeat, by bisection (a repeat of L has one of L-1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _repeats(tokens, mid):
            lo = mid
        else:
            hi = mid - 1
    return {"distinct_4grams": round(distinct, 3), "longest_repeat": lo}


def _repeats(tokens: list[int], n: int) -> bool:
    """Whether some span of ``n`` tokens occurs twice: a rolling hash of every window, each match checked."""
    mod, base = (1 << 61) - 1, 1_000_003
    power = pow(base, n, mod)
    h, seen = 0, {}
    for i, t in enumerate(tokens):
        h = (h * base + t + 1) % mod
        if i >= n:
            h = (h - (tokens[i - n] + 1) * power) % mod
        if i >= n - 1:
            start = i - n + 1
            for other in seen.get(h, ()):
                if tokens[other:other + n] == tokens[start:start + n]:
                    return True
            seen.setdefault(h, []).append(start)
    return False


def loops(rep: dict) -> bool:
    return rep["distinct_4grams"] < LOOP_DISTINCT
