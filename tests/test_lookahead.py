"""Lookahead decoding without a model: the step's tree, the window's filling and update, the n-gram pool, all
as the reference (Spec-Bench's model/lade) lays them out, and the reference's seeded window; and with a tiny model,
losslessness and the reference's tokens per step."""
import random

import pytest
import torch

from methods.base import Verification, build_proposer
from methods.common import HarnessError
from methods.decode import generate
from methods.proposers.lookahead import layout

CPU = torch.device("cpu")


def make(level=3, window=2, guess=2, **extra):
    return build_proposer("lookahead", {"level": level, "window": window, "guess": guess, **extra},
                          vocab_size=100, device=CPU)


def test_layout_worked_example():
    # N=3, W=2, a full window: level 0 [a] (W-1 tokens), level 1 [c, d] (W tokens); one pooled n-gram (g1 g2).
    # Construction: 0 root | 1 g1, 2 g2 | 3 a (level 0, under the root) | 4 c (column 0, under the root) | 5 d
    # (column 1, under a)
    tree, order, acceptable, last = layout((1, 2), 1, 2)
    assert order == [0, 1, 3, 4, 2, 5]
    assert tree.parents == (-1, 0, 0, 0, 1, 2)
    assert tree.depth.tolist() == [0, 1, 1, 1, 2, 2]  # c at root + 1, d at root + 2: position root + column + level
    assert acceptable.tolist() == [True, True, False, False, True, False]
    assert last == [3, 5]
    assert tree.path_to(5) == [0, 2, 5]  # d sees the root, a and itself
    _, _, acceptable, _ = layout((1, 2), 1, 2, reference_bonus=True)
    assert acceptable.tolist() == [True, True, False, False, False, False]  # the n-gram's last token: never


def test_the_reference_window_has_27_nodes_for_5_7_7():
    tree, _, acceptable, last = layout((6, 7, 7, 7), 0, 4)
    assert tree.size == 1 + 27 and not acceptable[1:].any() and len(last) == 7
    assert [int((tree.depth == d).sum()) for d in range(1, 10)] == [2, 3, 4, 4, 4, 4, 3, 2, 1]


def test_window_fills_from_the_prompt_then_the_pool_grows():
    """N=4, W=2: W+N-3 = 3 seeds from the prompt, forwarded under the prompt's last token (the reference's
    prefill); each filling step drops every level's first token and adds the new level without its first."""
    la = make(level=4, window=2)
    la.reset(torch.tensor([10, 11, 12]), 0, None)
    d = la.propose(torch.tensor([10, 11, 12, 13]))
    seeds = la.levels[0]
    assert len(seeds) == 3 and set(seeds) <= {10, 11, 12, 13}
    assert d.tokens.tolist() == [13] + seeds and d.tree.is_chain and not d.acceptable[1:].any()

    def step(argmax_value):
        d = la.propose(torch.tensor([1]))
        argmax = torch.full((d.tree.size,), argmax_value)
        la.update(d, Verification([0], [1], torch.zeros(d.tree.size, 100), argmax))
        return d

    la.update(d, Verification([0], [1], torch.zeros(4, 100), torch.tensor([9, 20, 21, 22])))
    assert la.levels == [seeds[1:], [20, 21, 22]]
    step(30)
    assert la.levels == [seeds[2:], [21, 22], [30, 30]] and la.full  # W-1, W, W
    assert la.pool == {}
    d = step(40)
    assert la.pool == {1: [(21, 30, 40)], seeds[2]: [(22, 30, 40)]}
    assert la.levels == [[22], [30, 30], [40, 40]]
    assert d.tree.size == 1 + 1 + 2 * 2


def test_reference_seeds_the_window_as_the_reference_draws_it():
    """reference=true: Spec-Bench's jacobi_greedy_search_multilevel calls random.seed(10) at every generate call,
    then W+N-3 times random.choice over the whole prompt (its copy_from). For N=5, W=7 (9 draws) from this prompt,
    duplicates and the last token included in the population, that gives the tokens below."""
    prompt = [5, 9, 9, 2, 7, 9, 4, 31]
    expected = [5, 4, 31, 5, 2, 31, 31, 7, 9]
    saved = random.getstate()
    try:
        random.seed(10)  # the reference's own procedure, on the global module as it runs it
        assert [random.choice(prompt) for _ in range(5 + 7 - 3)] == expected
    finally:
        random.setstate(saved)
    la = make(level=5, window=7, reference=True)
    for _ in range(2):  # reseeded per request: the second request draws the same tokens again
        la.reset(torch.tensor(prompt[:-1]), 0, None)
        draft = la.propose(torch.tensor(prompt))
        assert la.levels == [expected] and draft.tokens.tolist() == [31] + expected
    assert random.getstate() == saved  # a private generator: the global random module is left alone
    la = make(level=5, window=7)
    la.reset(torch.tensor(prompt[:-1]), 0, None)
    la.propose(torch.tensor(prompt))
    assert la.levels != [expected]  # the default keeps its own seeds (torch's generator, seed 0)


def test_window_update_and_pool_worked_example():
    """The module docstring's example: N=3, W=2, level 0 [a], level 1 [c, d], new tokens [e, f], root r."""
    a, c, d_, e, f, r = 1, 3, 4, 5, 6, 7
    la = make()
    la.reset(torch.tensor([10, 11]), 0, None)
    la.levels = [[a], [c, d_]]
    draft = la.propose(torch.tensor([r]))  # no n-gram starts with r: no candidates
    assert draft.tokens.tolist() == [r, a, c, d_] and not draft.acceptable[1:].any()
    argmax = torch.zeros(4, dtype=torch.long)
    argmax[la._last] = torch.tensor([e, f])
    la.update(draft, Verification([0], [9], torch.zeros(4, 100), argmax))
    assert la.pool == {r: [(c, e)], a: [(d_, f)]}
    assert la.levels == [[d_], [e, f]]


def test_candidates_come_from_the_pool_of_the_root_once_the_window_is_full():
    la = make(guess=2)
    la.reset(torch.tensor([10, 11]), 0, None)
    for rest in [(8, 9), (5, 6), (7, 7)]:
        la._add(3, rest)
    assert la.pool[3] == [(5, 6), (7, 7)]  # at most G per key, the oldest dropped
    la._add(3, (5, 6))
    assert la.pool[3] == [(7, 7), (5, 6)]  # seen again: moved to the newest end
    la.levels = [[1, 2, 3]]  # filling: the reference verifies no n-gram yet
    assert la.propose(torch.tensor([0, 3])).acceptable[1:].sum() == 0
    la.levels = [[1], [2, 4]]  # full
    d = la.propose(torch.tensor([0, 3]))
    toks, ok = d.tokens.tolist(), d.acceptable.tolist()
    assert toks[0] == 3 and sorted(t for t, a in zip(toks[1:], ok[1:]) if a) == [5, 6, 7, 7]
    assert sorted(t for t, a in zip(toks, ok) if not a) == [1, 2, 4]


@pytest.mark.parametrize("mode, committed", [({}, 3), ({"reference_bonus": True}, 2), ({"reference": True}, 2)])
def test_a_fully_matched_ngram_commits_n_tokens_or_the_references_n_minus_1(mode, committed):
    """N=3: the pooled n-gram (5 6) after root 3 is right in full. The reference's verification stops at N-2
    matched tokens, committing 2 (3, then 5 6 minus the bonus); ours commits 5, 6 and the bonus. reference=true
    implies reference_bonus."""
    from methods.verify import accept

    la = make(level=3, window=2, guess=1, **mode)
    la.reset(torch.tensor([3]), 0, None)
    la.levels = [[1], [2, 4]]
    la._add(3, (5, 6))
    d = la.propose(torch.tensor([3]))
    greedy = {3: 5, 5: 6, 6: 8}  # the target's next token after each node's token (the window's: anything)
    argmax = torch.tensor([greedy.get(int(t), 0) for t in d.tokens])
    best = int(accept(d.tokens, argmax, d.tree, d.acceptable))
    assert len(d.tree.path_to(best)) == committed  # accepted nodes, root included = tokens committed with the bonus


def test_lossless_on_the_reference_settings(tiny_model):
    for mode, most in (({}, 5), ({"reference_bonus": True}, 4), ({"reference": True}, 4)):
        p = build_proposer("lookahead", mode, vocab_size=96, device=CPU)
        for prompt in ([1, 2, 3] * 12, [1, 40, 41, 40, 41, 40, 7]):
            ref = tiny_model.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False)[0, len(prompt):]
            gen = generate(tiny_model, p, prompt, max_new_tokens=60, stop_ids=set())
            assert gen.token_ids == ref.tolist() and not gen.prefill_step and gen.accept_lengths[0] == 1
            assert max(gen.accept_lengths) <= most


def test_step_sizes_cover_every_step(tiny_model):
    p = build_proposer("lookahead", {"level": 4, "window": 3, "guess": 2}, vocab_size=96, device=CPU)
    sizes = set()
    for prompt in ([1, 2, 3] * 10, [5, 9, 5, 9, 5, 7, 5, 9]):
        p.reset(torch.tensor(prompt[:-1]), 0, None)
        ctx = torch.tensor(prompt)
        for _ in range(12):
            d = p.propose(ctx)
            sizes.add(d.tree.size)
            argmax = torch.randint(1, 10, (d.tree.size,))
            p.update(d, Verification([0], [int(argmax[0])], torch.zeros(d.tree.size, 96), argmax))
            ctx = torch.cat([ctx, argmax[:1]])
    assert sizes <= set(p.step_sizes())


@pytest.mark.parametrize("params, message", [
    ({"level": 2}, "method.level must be an integer from 3"),
    ({"window": 1}, "method.window must be an integer from 2"),
    ({"guess": -1}, "method.guess must be an integer from 0"),
    ({"reference_bonus": "yes"}, "method.reference_bonus must be true or false"),
    ({"reference": 1}, "method.reference must be true or false"),
    ({"size": 3}, "no parameter"),
])
def test_bad_parameters(params, message):
    with pytest.raises(HarnessError, match=message):
        build_proposer("lookahead", params, vocab_size=100, device=CPU)
