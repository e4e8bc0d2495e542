"""Lookahead decoding without a model: the step's tree, the window update and the n-gram pool."""
import pytest
import torch

from methods.base import ConfigError, Verification, build_proposer
from methods.lookahead import layout

CPU = torch.device("cpu")


def make(level=3, window=2, guess=2):
    return build_proposer("lookahead", {"level": level, "window": window, "guess": guess}, vocab_size=100, device=CPU)


def test_layout_worked_example():
    # N=3, W=2, a full window (2 rows), one candidate chain (2 tokens). Construction order:
    # 0 root | 1 c1, 2 c2 (chain) | 3 r0[0], 4 r0[1] (chain under root) | 5 r1[0] under 3, 6 r1[1] under 4
    tree, order, acceptable, last = layout(3, 2, 2, 1)
    assert order == [0, 1, 3, 2, 4, 5, 6]
    assert tree.parents == (-1, 0, 0, 1, 2, 2, 4)
    assert tree.depth.tolist() == [0, 1, 1, 2, 2, 2, 3]  # r1[1] at position root + 1 + 1 + 1
    assert acceptable.tolist() == [True, True, False, True, False, False, False]
    assert last == [5, 6]
    # r1[1] sees the root, r0[0], r0[1] and itself: the causal context of positions 1..3
    assert tree.path_to(6) == [0, 2, 4, 6]


def test_window_update_and_pool_worked_example():
    la = make()
    la.reset(torch.tensor([10, 11, 12, 13]), 0, None)
    assert len(la.rows) == 1 and all(t in (10, 11, 12, 13) for t in la.rows[0])
    la.rows = [[1, 2], [3, 4]]  # a full window: rows [[a, b], [c, d]]
    draft = la.propose(torch.tensor([7]))  # no n-gram starts with 7: no candidates
    assert draft.tokens.tolist() == [7, 1, 2, 3, 4] and not draft.acceptable[1:].any()
    argmax = torch.zeros(5, dtype=torch.long)
    argmax[la._last_row] = torch.tensor([5, 6])  # greedy tokens e, f at the last row
    la.update(draft, Verification([0], [9], torch.zeros(5, 100), argmax))
    assert la.pool == {1: [(3, 5)], 2: [(4, 6)]}
    assert la.rows == [[3, 4], [5, 6]]


def test_candidates_come_from_the_pool_of_the_root():
    la = make(guess=2)
    la.reset(torch.tensor([10, 11]), 0, None)
    la.rows = [[1, 2]]  # still filling: one row
    for rest in [(8, 9), (5, 6), (7, 7)]:
        la._add(3, rest)
    assert la.pool[3] == [(5, 6), (7, 7)]  # at most G per key, the oldest dropped
    la._add(3, (5, 6))
    assert la.pool[3] == [(7, 7), (5, 6)]  # seen again: moved to the newest end
    d = la.propose(torch.tensor([0, 3]))
    # root 3; chains (7 7) and (5 6) are acceptable; the window row (1 2) is not
    toks, ok = d.tokens.tolist(), d.acceptable.tolist()
    assert toks[0] == 3 and sorted(t for t, a in zip(toks[1:], ok[1:]) if a) == [5, 6, 7, 7]
    assert sorted(t for t, a in zip(toks, ok) if not a) == [1, 2]


def test_window_fills_one_row_per_step():
    la = make(level=4, window=2)
    la.reset(torch.tensor([10, 11]), 0, None)
    for step in range(4):
        d = la.propose(torch.tensor([1]))
        argmax = torch.full((d.tree.size,), 40 + step)
        la.update(d, Verification([0], [1], torch.zeros(d.tree.size, 100), argmax))
        assert len(la.rows) == min(step + 2, 3)
    assert la.pool  # the window was full on the last steps


@pytest.mark.parametrize("params, message", [
    ({"level": 1}, "method.level must be an integer from 2"),
    ({"window": 0}, "method.window must be an integer from 1"),
    ({"guess": -1}, "method.guess must be an integer from 0"),
    ({"size": 3}, "no parameter"),
])
def test_bad_parameters(params, message):
    with pytest.raises(ConfigError, match=message):
        build_proposer("lookahead", params, vocab_size=100, device=CPU)
