"""The paradigms of test-time scaling: what each turn of a question asks, and how its turns are grouped.

SpecTTS-Bench (arXiv 2509.04474; sunshy-1/SpecTTS-Bench at 6b33e4a, ``code/evaluation/eval.py``) measures
speculative decoding on reasoning models under three ways of spending more tokens on a question, each a setting of
the run here (``bench.*``), not a script of its own:

* single pass (``rounds=1``, ``num_choices=1``): the question's turns as Spec-Bench asks them, each turn's prompt
  holding the answers before it (MT-Bench's two turns);
* multi-round thinking (``rounds=R``): round 1 asks the question; round r > 1 asks it again, in a new conversation,
  with the reference's "think twice" sentence carrying round r - 1's final answer (``THINK_TWICE``, as eval.py
  builds it: the answer's text after the model's last end-of-thinking marker, ``</think>`` for Qwen3 and
  ``\\n</think>\\n`` for the R1 distills; none, where the answer never closed its thinking). A model that does not
  think (no such marker in its vocabulary: the embedded models) gives its whole answer, so that round 2 is not
  round 1 again;
* Best-of-N (``num_choices=N``, at ``sampling.temperature`` > 0): N independent samples of the question, each a
  conversation of its own (its rounds, if several), decoded side by side in N rows where ``runtime.batch_size``
  allows. The sample of choice c draws its tokens with noise keyed by (seed, question, c x turns + turn, position)
  (``methods.sampling``), so every method's N answers are token for token vanilla's N answers.
  ``bon_reference=true`` is eval.py's own loop instead: one conversation whose sample j asks the question j + 1
  times in a row (the question appended again each time, no answer between), the samples decoded one after another.

All of a question's turns go into its record as ``turns`` of its one choice (SpecTTS-Bench's layout, which its
``speed_cot.py`` reads: choice-major, round after round), with ``paradigm`` and each turn's ``choice`` and ``round``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from evaluation.records.bench import Question
from evaluation.running.prompts import consecutive_prompt_ids, prompt_ids
from methods.common import HarnessError

# SpecTTS-Bench eval.py (line 114): round 2's addition to the question, carrying round 1's final answer.
THINK_TWICE = ("\nPreviously I tried to solve the problem. Now I need to double check and verify my previous answer "
               "and re-answer the question. My previous answer is: <answer> {answer} </answer>, and please re-answer.")


@dataclass(frozen=True)
class Paradigm:
    rounds: int = 1
    num_choices: int = 1
    bon_reference: bool = False
    force_end_of_thinking: bool = False

    @property
    def single(self) -> bool:
        return self.rounds == 1 and self.num_choices == 1

    def threads(self) -> int:
        """Independent conversations of a question (decoded side by side where the batch has room)."""
        return 1 if self.bon_reference else self.num_choices

    def turns(self, q: Question) -> int:
        """Turns of each conversation, one after another."""
        if self.bon_reference:
            return self.num_choices
        return self.rounds if self.rounds > 1 or self.num_choices > 1 else len(q.turns)

    def key(self, q: Question, thread: int, turn: int) -> int:
        """The turn's index among the question's turns (its record's, its sampling noise's)."""
        return thread * self.turns(q) + turn

    def prompt(self, spec, tok, q: Question, turn: int, answers: list[str], marker: str | None) -> list[int]:
        """Token ids of turn ``turn`` of a conversation of ``q`` whose earlier turns were answered ``answers``
        (``marker``: the model's end of thinking, the text whose last occurrence its final answer follows)."""
        if self.bon_reference:
            return consecutive_prompt_ids(spec, tok, [q.turns[0]] * (turn + 1))
        if self.single:
            return prompt_ids(spec, tok, list(q.turns[: turn + 1]), answers)
        text = q.turns[0]
        if turn:
            final = final_answer(answers[-1], marker)
            text += THINK_TWICE.format(answer=final) if final else ""
        return prompt_ids(spec, tok, [text], [])

    def summary(self) -> dict:
        return asdict(self)


def final_answer(text: str, marker: str | None) -> str:
    """An answer's final part, as eval.py takes it for the next round: after the last ``marker`` (none: "" where
    the marker never appears); a model without a marker: the whole answer."""
    if marker is None:
        return text
    return text.rsplit(marker, 1)[-1] if marker in text else ""


def paradigm(bench, sampling, questions: list[Question], thinking: dict | None) -> Paradigm:
    """The run's ``Paradigm`` from ``bench.*``, or a one-line refusal of settings that cannot be run."""
    p = Paradigm(int(bench.get("rounds", 1)), int(bench.get("num_choices", 1)), bool(bench.get("bon_reference")),
                 bool(bench.get("force_end_of_thinking")))
    for key, value in (("rounds", p.rounds), ("num_choices", p.num_choices)):
        if not isinstance(value, int) or value < 1:
            raise HarnessError(f"bench.{key} must be 1 or more, got {value}")
    if p.num_choices > 1 and sampling.greedy:
        raise HarnessError(f"bench.num_choices={p.num_choices} at temperature 0 would give {p.num_choices} equal "
                           f"answers: set sampling.temperature (SpecTTS-Bench samples at 0.6), or num_choices=1")
    if p.bon_reference and (p.num_choices < 2 or p.rounds > 1):
        raise HarnessError("bench.bon_reference=true is SpecTTS-Bench's Best-of-N loop: give bench.num_choices=N "
                           "(N > 1) and bench.rounds=1")
    if not p.single and (multi := [q.question_id for q in questions if len(q.turns) > 1]):
        raise HarnessError(f"bench.rounds and bench.num_choices ask single-turn questions again; questions "
                           f"{multi[:5]} have several turns: leave them out (bench.categories, bench.question_ids)")
    if p.force_end_of_thinking and not (thinking or {}).get("forced"):
        raise HarnessError("bench.force_end_of_thinking=true needs the model's end-of-thinking text "
                           "(model.thinking.forced), which this model config does not give: it does not think")
    return p
