"""Lookahead decoding (Fu et al., arXiv 2402.02057): Jacobi iterations in a window, n-grams from their trajectory.

Parameters: ``level`` N (n-gram size), ``window`` W, ``guess`` G. Follows the code behind
Spec-Bench's Lookahead numbers: ``jacobi_greedy_search_multilevel`` in Spec-Bench's
``model/lade/decoding.py`` and the window's attention mask, ``j_make_causal_mask_multilevel``
and ``jforward_multilevel`` in ``model/lade/models/llama.py`` (commit fd2c1cd; the same as
hao-ai-lab/LookaheadDecoding's ``lade/``). State, per request:

* the **window**: level 0, W-1 tokens, and levels 1..N-2, W tokens each, a Jacobi
  trajectory; column 0 of levels 1..N-2 guesses the tokens right after the root,
  column ``j >= 1`` those after level 0's token ``j - 1``;
* the **pool**: n-grams keyed by their first token, at most G per key, newest last.

Every step forwards, in one tree through the shared verifier:

* the **verification branch**: the root, then each pooled n-gram whose first token is
  the root (at most G), as a chain of its N-1 other tokens;
* the **lookahead branch**: level 0 as a chain under the root; column 0 of levels
  1..N-2 as a chain under the root; column ``j >= 1`` as a chain under level 0's token
  ``j - 1``. A level-``l`` token of column ``j`` thus sits at position ``root + j + l``
  and sees the root, level 0 up to its column and the levels above it in its column.
  These nodes are never accepted (``Draft.acceptable``), only forwarded.

After the step the target's greedy tokens at the last level form the next level (a
Jacobi iteration). With the window full, column 0 yields the n-gram ``root, level1[0],
.., level{N-2}[0], new[0]`` and column ``j >= 1`` the n-gram ``level0[j-1], level1[j],
.., new[j]`` for the pool; then level 0 becomes level 1 without its column 0, each
level the next, and the last level the new tokens.

The window starts with the prefill, as in the reference: the prefill covers the prompt
but its last token (``drafts_first``), and the first step forwards, under the prompt's
last token, a chain of W+N-3 tokens drawn from the prompt; each step of the filling
phase drops every level's first token and adds the new level without its first. So the
first step commits one token, like the reference's prefill, and the window is full after
N-2 more steps.

The window's first tokens: the reference (Spec-Bench commit fd2c1cd7d2201ef71db4c5f4e455008f017967bf,
``model/lade/decoding.py``, ``jacobi_greedy_search_multilevel``) calls ``random.seed(10)`` on entry (line 204),
so once per ``generate`` call, i.e. per turn, and fills level 0 with W+N-3 calls of ``random.choice`` over the
whole prompt (its ``copy_from``, lines 212-213 and 229); no other draw follows, as its ``ALWAYS_FWD_ONE`` is 1
(line 410 is never reached). ``reference=true`` makes the same draws in the same order from a private
``random.Random(10)`` made per request (the same Mersenne Twister as the module's, so the same tokens, and the
global ``random`` is left alone). The default draws them with a torch generator seeded 0, the harness's seeds
before ``reference`` existed, so the runs recorded since reproduce.

Tokens per step: the reference stops its verification at N-2 matched tokens, so it
commits at most N-1 per step; here a fully matched n-gram also commits the bonus token
(N at most), a deliberate improvement that changes no output token.
``reference_bonus=true`` reproduces only that rule (the last token of every pooled n-gram
is forwarded but never accepted), for a MAT comparable with the published one;
``reference=true`` implies it and adds the reference's seeds: the reference's steps, one for one.

Worked example, N=3, W=2, window full: level 0 ``[a]``, level 1 ``[c, d]``, greedy
tokens at level 1 ``[e, f]``, root ``r``: the pool gains ``r -> (c, e)`` and ``a -> (d, f)``;
the window becomes level 0 ``[d]``, level 1 ``[e, f]``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

import torch

from methods.base import Draft, Proposer, Verification, register
from methods.params import param
from methods.tree import Tree


@lru_cache(maxsize=512)
def layout(sizes: tuple[int, ...], candidates: int, chain: int, reference_bonus: bool = False):
    """The step's tree for a window of levels of ``sizes`` (level 0 first) and ``candidates`` pooled n-grams
    of ``chain`` tokens each.

    Returns (tree, order, acceptable, last): ``order[i]`` is the construction index of tree node
    ``i`` (construction: root, the candidates' chains one after the other, level 0's chain, then
    column by column levels 1.. of the window); ``last[j]`` is the tree index of the last level's
    node in column ``j`` (level 0's nodes while the window has one level).
    """
    parents = [-1]
    acceptable = [True]
    for _ in range(candidates):
        parents += [0] + [len(parents) + i for i in range(chain - 1)]
        acceptable += [True] * (chain - 1) + [not reference_bonus]
    row0 = len(parents)
    parents += [0] + [row0 + j for j in range(sizes[0] - 1)]
    last = list(range(row0, row0 + sizes[0]))
    if len(sizes) > 1:
        last = []
        for j in range(sizes[1]):  # column j hangs under the root (j = 0) or under level 0's token j - 1
            parent = 0 if j == 0 else row0 + j - 1
            for _ in sizes[1:]:
                parents.append(parent)
                parent = len(parents) - 1
            last.append(parent)
    acceptable += [False] * (len(parents) - len(acceptable))
    tree, order = Tree.breadth_first(parents)
    position = {old: new for new, old in enumerate(order)}
    return tree, order, torch.tensor([acceptable[old] for old in order]), [position[i] for i in last]


@register
class Lookahead(Proposer):
    name = "lookahead"
    drafts_first = True  # the first window goes with the prefill (the prompt's last token roots it)

    @dataclass
    class Params:  # Spec-Bench's leaderboard settings
        level: int = param(5, "N: n-grams of this many tokens", low=3, high=64)
        window: int = param(7, "W: columns of the Jacobi window", low=2, high=64)
        guess: int = param(7, "G: at most this many pooled n-grams verified per step", low=0, high=64)
        reference_bonus: bool = param(False, "true: a fully matched n-gram commits N-1 tokens, as the reference "
                                      "(false: N, with the bonus token)")
        reference: bool = param(False, "true: the reference step for step: its window seeds (Python's random, "
                                "seed 10, per request) and reference_bonus")

    def __init__(self, level: int, window: int, guess: int, reference_bonus: bool, reference: bool,
                 device: torch.device):
        self.level, self.window, self.guess, self.device = level, window, guess, device
        self.reference = reference
        self.reference_bonus = reference_bonus or reference
        self.levels: list[list[int]] | None = None  # level 0 first; None: seeded at the first proposal
        self.pool: dict[int, list[tuple[int, ...]]] = {}

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device) -> "Lookahead":
        return cls(params.level, params.window, params.guess, params.reference_bonus, params.reference, device)

    def reset(self, prompt_ids: torch.Tensor, turn: int, prompt_logits: torch.Tensor | None,
              prompt_hidden: torch.Tensor | None = None) -> None:
        self.levels = None
        self.pool = {}

    def _seed(self, prompt: torch.Tensor) -> list[int]:
        """W+N-3 tokens drawn from the whole prompt (the reference's ``copy_from``), reseeded per request: the
        reference's draws with ``reference`` (module docstring), else a torch generator's."""
        n = self.window + self.level - 3
        if self.reference:
            rng, population = random.Random(10), prompt.tolist()
            return [rng.choice(population) for _ in range(n)]
        picks = torch.randint(len(prompt), (n,), generator=torch.Generator().manual_seed(0))
        return prompt.cpu()[picks].tolist()

    @property
    def full(self) -> bool:
        return len(self.levels) == self.level - 1

    def propose(self, context: torch.Tensor) -> Draft:
        if self.levels is None:
            self.levels = [self._seed(context)]
        root = int(context[-1])
        candidates = self.pool.get(root, [])[-self.guess:] if self.guess and self.full else []
        sizes = tuple(len(x) for x in self.levels)
        tree, order, acceptable, self._last = layout(sizes, len(candidates), self.level - 1, self.reference_bonus)
        built = [root] + [t for c in candidates for t in c] + self.levels[0]
        if len(sizes) > 1:
            for j in range(sizes[1]):
                built += [lv[j] for lv in self.levels[1:]]
        tokens = torch.tensor([built[i] for i in order], device=self.device)
        depth = (self.level - 1 - self.reference_bonus) if candidates else 0  # the window is never accepted
        return Draft(tokens, tree.to(self.device), acceptable.to(self.device), depth=depth, whole=True)

    def update(self, draft: Draft, result: Verification) -> None:
        if draft.kept is not None:  # a per-step budget verified none of it (a plain step): the window waits
            return
        new = result.argmax[self._last].tolist()
        levels = self.levels
        if len(levels) == 1:  # the first step: level 1 is the greedy tokens after every level-0 token
            self.levels = [levels[0][1:], new]
        elif not self.full:  # filling: every level loses its first token, the new level its own first
            self.levels = [lv[1:] for lv in levels] + [new[1:]]
        else:
            root = int(draft.tokens[0])
            self._add(root, tuple(lv[0] for lv in levels[1:]) + (new[0],))
            for j in range(1, len(new)):
                self._add(levels[0][j - 1], tuple(lv[j] for lv in levels[1:]) + (new[j],))
            self.levels = [levels[1][1:]] + levels[2:] + [new]

    def _add(self, first: int, rest: tuple[int, ...]) -> None:
        """Pool ``rest`` under ``first``: the newest last, at most G per key (the oldest dropped), as the
        reference's least-recently-used ``token_map``."""
        if not self.guess:
            return
        entries = self.pool.setdefault(first, [])
        if rest in entries:
            entries.remove(rest)
        entries.append(rest)
        if len(entries) > self.guess:
            del entries[0]

    def step_sizes(self) -> list[int]:
        n, w = self.level, self.window
        sizes = set()
        for fill in range(n - 1):  # the window's levels 0..fill, as it fills and then stays full
            shape = (w + n - 3 - fill,) + (w + n - 2 - fill,) * fill
            for c in range(self.guess + 1 if fill == n - 2 else 1):
                sizes.add(layout(shape, c, n - 1, self.reference_bonus)[0].size)
        return sorted(sizes)

    def summary(self) -> dict:
        return {"level": self.level, "window": self.window, "guess": self.guess,
                "reference_bonus": self.reference_bonus, "reference": self.reference}
