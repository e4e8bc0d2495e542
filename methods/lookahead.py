"""Lookahead decoding (Fu et al., arXiv 2402.02057): Jacobi iterations in a window, n-grams from their trajectory.

Parameters: ``level`` N (n-gram size), ``window`` W, ``guess`` G. State (per request):

* the **window**, N-1 rows of W tokens, a Jacobi trajectory: row ``l`` column ``j``
  guesses the token ``j + 1 + l`` places after the root;
* the **pool**: n-grams keyed by their first token, at most G per key, newest last.

Every step forwards, in one tree through the shared verifier:

* the **verification branch**: the root, then each of the (at most G) pooled n-grams
  whose first token is the root, as a chain of its N-1 other tokens;
* the **lookahead branch**: row 0 as a chain under the root, and under row 0's token
  ``j`` the chain of rows 1..N-2 at column ``j``. So the token at row ``l``, column
  ``j`` sits at position ``root + j + 1 + l`` and sees row 0 up to column ``j`` and
  the rows above it in its column: the causal context of the sequence it guesses.
  These nodes are never accepted (``Draft.acceptable``), only forwarded.

After the step the target's greedy tokens at the last row's nodes form the next row
(a Jacobi iteration). Once the window holds N-1 rows, column ``j`` yields the n-gram
``row0[j], row1[j], ..., row_{N-2}[j], new[j]`` for the pool, and the oldest row is
dropped. The window starts as row 0 only, W tokens drawn from the prompt (a fixed
seed: runs are reproducible), and grows one row per step.

Worked example, N=3, W=2, rows ``[[a, b], [c, d]]``, greedy tokens at the last row
``[e, f]``: the pool gains ``a -> (c, e)`` and ``b -> (d, f)``; the rows become
``[[c, d], [e, f]]``.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from methods.base import ConfigError, Draft, Proposer, Verification, register
from methods.tree import Tree


@lru_cache(maxsize=512)
def layout(level: int, window: int, rows: int, candidates: int):
    """The step's tree for ``candidates`` verification chains and a window of ``rows`` rows.

    Returns (tree, order, acceptable, last_row): ``order[i]`` is the construction index
    of tree node ``i`` (construction: root, the candidates' chains one after the other,
    row 0, then column by column the rows below it); ``last_row[j]`` is the tree index
    of the window's last-row node in column ``j``.
    """
    parents = [-1]
    for _ in range(candidates):
        parents += [0] + [len(parents) + i for i in range(level - 2)]
    row0 = len(parents)
    parents += [0] + [row0 + j for j in range(window - 1)]
    last = [row0 + j for j in range(window)]
    for j in range(window):
        for r in range(1, rows):
            parents.append(last[j])
            last[j] = len(parents) - 1
    tree, order = Tree.breadth_first(parents)
    position = {old: new for new, old in enumerate(order)}
    acceptable = torch.tensor([old < row0 for old in order])
    return tree, order, acceptable, [position[i] for i in last]


@register
class Lookahead(Proposer):
    name = "lookahead"

    def __init__(self, level: int, window: int, guess: int, device: torch.device):
        self.level, self.window, self.guess, self.device = level, window, guess, device
        self.rows: list[list[int]] = []
        self.pool: dict[int, list[tuple[int, ...]]] = {}

    @classmethod
    def build(cls, params: dict, *, vocab_size: int, device: torch.device) -> "Lookahead":
        params = dict(params)
        values = {"level": params.pop("level", 5), "window": params.pop("window", 7), "guess": params.pop("guess", 7)}
        if params:
            raise ConfigError(f"method 'lookahead' has no parameter(s) {', '.join(sorted(params))}; "
                              f"known: level, window, guess")
        lowest = {"level": 2, "window": 1, "guess": 0}
        for key, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool) or not lowest[key] <= value <= 64:
                raise ConfigError(f"method.{key} must be an integer from {lowest[key]} to 64, got {value!r}")
        return cls(values["level"], values["window"], values["guess"], device)

    def reset(self, prompt_ids: torch.Tensor, turn: int, prompt_logits: torch.Tensor | None,
              prompt_hidden: torch.Tensor | None = None) -> None:
        gen = torch.Generator().manual_seed(0)
        picks = torch.randint(len(prompt_ids), (self.window,), generator=gen)
        self.rows = [prompt_ids.cpu()[picks].tolist()]
        self.pool = {}

    def propose(self, context: torch.Tensor) -> Draft:
        root = int(context[-1])
        candidates = self.pool.get(root, [])[-self.guess:] if self.guess else []
        tree, order, acceptable, self._last_row = layout(self.level, self.window, len(self.rows), len(candidates))
        built = [root] + [t for c in candidates for t in c] + self.rows[0]
        for j in range(self.window):
            built += [row[j] for row in self.rows[1:]]
        tokens = torch.tensor([built[i] for i in order], device=self.device)
        return Draft(tokens, tree.to(self.device), acceptable.to(self.device))

    def update(self, draft: Draft, result: Verification) -> None:
        new = result.argmax[self._last_row].tolist()
        if len(self.rows) == self.level - 1:
            for j in range(self.window):
                self._add(self.rows[0][j], tuple(row[j] for row in self.rows[1:]) + (new[j],))
            self.rows = self.rows[1:]
        self.rows.append(new)

    def _add(self, first: int, rest: tuple[int, ...]) -> None:
        entries = self.pool.setdefault(first, [])
        if rest in entries:
            entries.remove(rest)
        entries.append(rest)
        if len(entries) > max(self.guess, 1):
            del entries[0]

    def step_sizes(self) -> list[int]:
        return sorted({layout(self.level, self.window, rows, c)[0].size
                       for rows in range(1, self.level) for c in range(self.guess + 1)})

    def summary(self) -> dict:
        return {"level": self.level, "window": self.window, "guess": self.guess}
