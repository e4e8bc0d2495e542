"""Sampling at temperature > 0 that every method reproduces token for token.

Settings (``sampling.*`` in a run's config): ``temperature`` (0: greedy, the default), ``top_k`` (0: off),
``top_p`` (1: off) and ``seed``. The target's distribution at a position is the softmax of its logits
processed as transformers' sampling warpers process them, in ``generate``'s order: divided by the
temperature, then all but the ``top_k`` largest logits removed (ties with the k-th kept), then all but
the smallest set of most likely tokens whose probability reaches ``top_p`` (at least one kept).

**Position-keyed draws.** The j-th new token of a turn is drawn by inverse CDF from one uniform
number: the first token, in vocabulary order, whose cumulative probability exceeds ``u_j`` times the
total. ``u_j`` is a hash of (seed, question, turn, j) (``uniform``, splitmix64), not a generator's
state, so it depends on nothing a method changes. A speculative method verifies a draft node at
depth d below a root whose next token is the j-th by comparing the node's token with its parent's
draw for position j + d - 1 (``Sampler.draw`` at every node, then the greedy acceptance rule with the
draws in place of the argmax: ``methods.verify``). Every committed token is then the draw vanilla
sampling makes at its position from the target's distribution given the same prefix, so **every
method's tokens equal vanilla sampling's with the same seed** (in fp32, up to a draw that falls
within float noise of a CDF boundary: ``evaluation.equal`` says where). The output has exactly the
target's distribution, and a draft x is accepted with probability p(x), a set of siblings with the
sum of theirs: what the rule of EAGLE-2 and SAM-Decoding for deterministic drafts (accept with p(x),
on rejection zero it and renormalise) achieves, with reproducibility on top.

>>> s = Sampler(Sampling(temperature=1.0, seed=1), question=81, turn=0)
>>> s.draw(torch.tensor([[0.0, 0.0, 9.0]]), torch.tensor([0]), 0, 0).tolist()  # nearly all mass on token 2
[2]
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from methods.common import HarnessError

MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy decoding
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1: no top-p filter
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not 0 <= self.temperature <= 100:
            raise HarnessError(f"sampling.temperature must be a number from 0 (greedy) to 100, got "
                               f"{self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise HarnessError(f"sampling.top_k must be an integer of at least 0 (0: off), got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise HarnessError(f"sampling.top_p must be a number above 0 and at most 1 (1: off), got {self.top_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise HarnessError(f"sampling.seed must be an integer of at least 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def label(self) -> str:
        """How tables name these settings: ``greedy``, or ``T=0.7`` with its filters and seed."""
        if self.greedy:
            return "greedy"
        parts = [f"T={self.temperature:g}"] + ([f"top_k={self.top_k}"] if self.top_k else []) \
            + ([f"top_p={self.top_p:g}"] if self.top_p < 1 else [])
        return " ".join(parts + [f"seed={self.seed}"])


def process(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Probabilities [n, vocab] (float32) of ``logits`` [n, vocab] under ``s`` (temperature > 0)."""
    x = logits.float() / s.temperature
    if s.top_k and s.top_k < x.shape[-1]:
        kth = x.topk(s.top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = x.softmax(dim=-1)
    if s.top_p < 1:
        ranked, order = probs.sort(dim=-1, descending=True)
        before = ranked.cumsum(dim=-1) - ranked  # the mass of the more likely tokens
        drop = before >= s.top_p
        drop[:, 0] = False  # the most likely token always stays
        probs = probs.scatter(-1, order, ranked.masked_fill(drop, 0.0))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform(seed: int, question: int, turn: int, position: int) -> float:
    """A number in [0, 1) fixed by (seed, question, turn, position): 53 bits of a splitmix64 hash chain.

    >>> uniform(0, 81, 0, 5) == uniform(0, 81, 0, 5) != uniform(0, 81, 0, 6)
    True
    """
    x = 0
    for v in (seed, question, turn, position):
        x = _splitmix64(x ^ (v & MASK64))
    return (x >> 11) / float(1 << 53)


class Sampler:
    """The draws of one turn: ``draw(logits, positions)`` gives the token at every row's position."""

    def __init__(self, settings: Sampling, question: int, turn: int):
        self.settings, self.question, self.turn = settings, question, turn
        self._u: dict[int, float] = {}

    def uniforms(self, positions: list[int]) -> list[float]:
        s, u = self.settings, self._u
        for p in positions:
            if p not in u:
                u[p] = uniform(s.seed, self.question, self.turn, p)
        return [u[p] for p in positions]

    def draw(self, logits: torch.Tensor, depth: torch.Tensor, start: int, max_depth: int) -> torch.Tensor:
        """Tokens [n] drawn by inverse CDF from ``logits`` [n, vocab]: row i is at new-token index
        ``start + depth[i]`` (``depth`` [n] on the logits' device, at most ``max_depth``; no host sync)."""
        probs = process(logits, self.settings)
        cdf = probs.cumsum(dim=-1)
        u = torch.tensor(self.uniforms(list(range(start, start + max_depth + 1))), dtype=cdf.dtype,
                         device=cdf.device)
        target = u[depth][:, None] * cdf[:, -1:]
        return torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)[:, 0]
