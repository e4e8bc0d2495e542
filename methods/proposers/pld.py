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


@register
class PromptLookup(Proposer):
    name = "pld"
    resumes_mid_request = True

    @dataclass
    class Params:  # Spec-Bench's settings
        max_ngram: int = param(3, "match the newest n-gram, n from this down to 1", low=1, high=256)
        num_pred_tokens: int = param(10, "draft up to this many tokens after a match, as a chain", low=1, high=256)
        match: str = param("spec_bench", "which match counts (module docstring): spec_bench's rule needs "
                           "num_pred_tokens after it, transformers' takes the earliest", choices=RULES)

    def __init__(self, max_ngram: int, num_pred_tokens: int, match: str):
        self.max_ngram, self.num_pred, self.match = max_ngram, num_pred_tokens, match

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device) -> "PromptLookup":
        return cls(params.max_ngram, params.num_pred_tokens, params.match)

    def propose(self, context: torch.Tensor) -> Draft:
        drafts = lookup(context, self.max_ngram, self.num_pred, self.match)
        return Draft(torch.cat([context[-1:], drafts]), Tree.chain(len(drafts) + 1).to(context.device))

    def step_sizes(self) -> list[int]:
        return list(range(1, self.num_pred + 2))  # the root and 0..num_pred drafts

    def summary(self) -> dict:
        return {"max_ngram": self.max_ngram, "num_pred_tokens": self.num_pred, "match": self.match}
