"""Prompt lookup decoding (PLD): draft the tokens that followed the last n-gram where it occurred before.

The newest ``n`` tokens (n from ``max_ngram`` down to 1) are searched in the whole
committed sequence, prompt and output so far. The earliest earlier occurrence wins
(Spec-Bench's PLD takes the first match; it also keeps drafts stable as the output
grows), and up to ``num_pred_tokens`` tokens that followed it form a chain draft.
No match at any n: a root-only step, as in vanilla decoding.

Worked example, ``max_ngram=2``, sequence ``[4 5 6 9 4 5 7 4 5]``: the last 2-gram
``4 5`` occurs at positions 0 and 4 (and 7, itself); the earliest wins, so the draft
continues with ``6 9 4 ...``.
"""
from __future__ import annotations

import torch

from methods.base import ConfigError, Draft, Proposer, register
from methods.tree import Tree


def lookup(context: torch.Tensor, max_ngram: int, num_pred: int) -> torch.Tensor:
    """Tokens to draft after ``context`` (possibly empty).

    >>> lookup(torch.tensor([4, 5, 6, 9, 4, 5, 7, 4, 5]), max_ngram=2, num_pred=3).tolist()
    [6, 9, 4]
    >>> lookup(torch.tensor([1, 2, 3]), max_ngram=3, num_pred=3).tolist()
    []
    """
    length = len(context)
    for n in range(min(max_ngram, length - 1), 0, -1):
        windows = context[: length - 1].unfold(0, n, 1)  # [length - n, n], every n-gram but the last itself
        hits = torch.nonzero((windows == context[length - n:]).all(dim=1))
        if len(hits):
            start = int(hits[0]) + n
            return context[start: start + num_pred]
    return context[:0]


@register
class PromptLookup(Proposer):
    name = "pld"

    def __init__(self, max_ngram: int, num_pred_tokens: int):
        self.max_ngram, self.num_pred = max_ngram, num_pred_tokens

    @classmethod
    def build(cls, params: dict, *, vocab_size: int, device: torch.device) -> "PromptLookup":
        params = dict(params)
        max_ngram = params.pop("max_ngram", 3)
        num_pred = params.pop("num_pred_tokens", 10)
        if params:
            raise ConfigError(f"method 'pld' has no parameter(s) {', '.join(sorted(params))}; "
                              f"known: max_ngram, num_pred_tokens")
        for key, value in (("max_ngram", max_ngram), ("num_pred_tokens", num_pred)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 256:
                raise ConfigError(f"method.{key} must be an integer from 1 to 256, got {value!r}")
        return cls(max_ngram, num_pred)

    def propose(self, context: torch.Tensor) -> Draft:
        drafts = lookup(context, self.max_ngram, self.num_pred)
        return Draft(torch.cat([context[-1:], drafts]), Tree.chain(len(drafts) + 1).to(context.device))

    def step_sizes(self) -> list[int]:
        return list(range(1, self.num_pred + 2))  # the root and 0..num_pred drafts

    def summary(self) -> dict:
        return {"max_ngram": self.max_ngram, "num_pred_tokens": self.num_pred}
