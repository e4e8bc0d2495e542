"""Prompt lookup decoding (PLD): draft the tokens that followed the last n-gram where it occurred before.

The newest ``n`` tokens (n from ``max_ngram`` down to 1) are searched in the whole
committed sequence, prompt and output so far, and up to ``num_pred_tokens`` tokens that
followed a match form a chain draft. Which match counts (``method.match``):

* ``spec_bench`` (the default: the rule behind Spec-Bench's PLD numbers,
  ``find_candidate_pred_tokens`` in Spec-Bench's ``model/pld/pld.py``, commit fd2c1cd):
  the earliest match that is followed by a full ``num_pred_tokens`` continuation and
  whose continuation starts before the last n-gram; else later matches, then a smaller n.
* ``transformers`` (transformers' ``PromptLookupCandidateGenerator``): the earliest
  earlier match with any continuation, cut at the sequence's end.

No match at any n: a root-only step, as in vanilla decoding. (Spec-Bench's loop then
verifies a dummy draft, token 100; a one-token step here.)

Worked example, ``[4 5 6 9 4 5 7 4 5]``, ``max_ngram=2``: the last 2-gram ``4 5`` occurs
at positions 0 and 4; with ``num_pred_tokens=3`` both rules take position 0 and draft
``6 9 4``; with ``num_pred_tokens=10`` no match has 10 tokens after it, so Spec-Bench's rule
finds nothing for ``4 5`` nor for ``5`` and drafts nothing, while transformers' drafts the
7 tokens ``6 9 4 5 7 4 5``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from methods.base import Draft, Proposer, register
from methods.params import param
from methods.tree import Tree

RULES = ("spec_bench", "transformers")


def lookup(context: torch.Tensor, max_ngram: int, num_pred: int, rule: str = "spec_bench") -> torch.Tensor:
    """Tokens to draft after ``context`` (possibly empty) under match rule ``rule`` (module docstring).

    >>> seq = torch.tensor([4, 5, 6, 9, 4, 5, 7, 4, 5])
    >>> lookup(seq, 2, 3).tolist(), lookup(seq, 2, 10).tolist(), lookup(seq, 2, 10, "transformers").tolist()
    ([6, 9, 4], [], [6, 9, 4, 5, 7, 4, 5])
    """
    length = len(context)
    for n in range(min(max_ngram, length - 1), 0, -1):
        windows = context.unfold(0, n, 1)  # [length - n + 1, n]: every n-gram, the last one itself included
        hits = torch.nonzero((windows == context[length - n:]).all(dim=1))[:, 0].tolist()
        for start in (h + n for h in hits):
            if rule == "transformers":
                if start < length:  # any earlier occurrence (the last n-gram itself has nothing after it)
                    return context[start: start + num_pred]
            elif start + num_pred <= length and start < length - n:
                return context[start: start + num_pred]
    return context[:0]


class NgramIndex:
    """The first occurrence of every n-gram (n up to ``max_n``) of a growing sequence, so that a step's lookup costs
    the same at token 15,000 as at token 100 (``lookup`` searches the whole sequence). The earliest occurrence is
    all either rule needs: a later one starts later, so it cannot have a full continuation, or end before the last
    n-gram, where the earliest has not (tests/test_pld.py holds it to ``lookup`` on random sequences).

    >>> index = NgramIndex(2)
    >>> index.extend([4, 5, 6, 9, 4, 5, 7, 4, 5])
    >>> index.lookup(3, "spec_bench"), index.lookup(10, "spec_bench"), index.lookup(10, "transformers")
    (2, None, 2)
    """

    def __init__(self, max_n: int):
        self.max_n, self.tokens, self.first = max_n, [], {}
        self.matched = 0  # the last lookup's n

    def extend(self, tokens: list[int]) -> None:
        seq = self.tokens
        for t in tokens:
            seq.append(t)
            end = len(seq)
            for n in range(1, min(self.max_n, end) + 1):
                self.first.setdefault(tuple(seq[end - n:]), end - n)

    def lookup(self, num_pred: int, rule: str) -> int | None:
        """Where the draft starts (after the earliest match of the newest n-gram, n from the largest down), or None."""
        seq, length = self.tokens, len(self.tokens)
        for n in range(min(self.max_n, length - 1), 0, -1):
            start = self.first[tuple(seq[length - n:])] + n
            if (start < length) if rule == "transformers" else (start + num_pred <= length and start < length - n):
                self.matched = n  # the match's length, a per-step budget's key (Draft.keys)
                return start
        return None


@register
class PromptLookup(Proposer):
    name = "pld"
    resumes_mid_request = True
    token_only = True

    @dataclass
    class Params:  # Spec-Bench's settings
        max_ngram: int = param(3, "match the newest n-gram, n from this down to 1", low=1, high=256)
        num_pred_tokens: int = param(10, "draft up to this many tokens after a match, as a chain", low=1, high=256)
        match: str = param("spec_bench", "which match counts (module docstring): spec_bench's rule needs "
                           "num_pred_tokens after it, transformers' takes the earliest", choices=RULES)

    def __init__(self, max_ngram: int, num_pred_tokens: int, match: str):
        self.max_ngram, self.num_pred, self.match = max_ngram, num_pred_tokens, match
        self.index = NgramIndex(max_ngram)  # of the request's committed tokens (``propose`` catches up)

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device) -> "PromptLookup":
        return cls(params.max_ngram, params.num_pred_tokens, params.match)

    def reset(self, prompt_ids, turn, prompt_logits, prompt_hidden=None) -> None:
        self.index = NgramIndex(self.max_ngram)

    def fork(self) -> "PromptLookup":
        other = super().fork()
        other.index = NgramIndex(self.max_ngram)
        return other

    def propose(self, context: torch.Tensor) -> Draft:
        """A chain after the newest n-gram's earliest match (``lookup``'s, from the index); its step info says how
        far back the copied tokens are (``reach``)."""
        if len(context) < len(self.index.tokens):  # not this request's context: index it anew
            self.index = NgramIndex(self.max_ngram)
        self.index.extend(context[len(self.index.tokens):].tolist())
        start = self.index.lookup(self.num_pred, self.match)
        if start is None:
            return Draft(context[-1:], Tree.chain(1).to(context.device))
        drafts = context[start: start + self.num_pred]
        return Draft(torch.cat([context[-1:], drafts]), Tree.chain(len(drafts) + 1).to(context.device),
                     info={"reach": len(context) - start}, keys=[0] + [self.index.matched] * len(drafts))

    def step_sizes(self) -> list[int]:
        return list(range(1, self.num_pred + 2))  # the root and 0..num_pred drafts

    def summary(self) -> dict:
        return {"max_ngram": self.max_ngram, "num_pred_tokens": self.num_pred, "match": self.match}
