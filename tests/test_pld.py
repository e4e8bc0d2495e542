"""Prompt lookup without a model: n-gram matching on worked examples."""
import pytest
import torch

from methods.base import build_proposer
from methods.common import HarnessError
from methods.proposers.pld import PromptLookup, lookup

CPU = torch.device("cpu")
t = torch.tensor


def test_no_match_gives_a_root_only_draft():
    pld = build_proposer("pld", {}, vocab_size=100, device=CPU)
    d = pld.propose(t([1, 2, 3, 4]))
    assert d.tokens.tolist() == [4] and d.tree.size == 1


def test_longest_ngram_first():
    # last 3-gram (7 8 9) occurs at 0 -> continue with 1; the 1-gram (9) alone also occurs at 5 -> 3
    ctx = t([7, 8, 9, 1, 2, 9, 3, 7, 8, 9])
    for rule in ("spec_bench", "transformers"):
        assert lookup(ctx, max_ngram=3, num_pred=2, rule=rule).tolist() == [1, 2]
        assert lookup(ctx, max_ngram=1, num_pred=2, rule=rule).tolist() == [1, 2]  # 9 at 2 comes before 9 at 5


def test_several_matches_the_earliest_wins():
    ctx = t([5, 6, 1, 5, 6, 2, 5, 6])
    for rule in ("spec_bench", "transformers"):
        assert lookup(ctx, max_ngram=2, num_pred=1, rule=rule).tolist() == [1]


def test_the_issue_example_spec_bench_finds_no_full_continuation():
    """Spec-Bench's find_candidate_pred_tokens: a match counts only with num_pred_tokens after it (and its
    continuation starting before the last n-gram); transformers' takes the earliest with any continuation."""
    ctx = t(list(range(1, 16)) + [20, 21, 22, 30, 20, 21, 22])
    assert lookup(ctx, 3, 10, "spec_bench").tolist() == []
    assert lookup(ctx, 3, 10, "transformers").tolist() == [30, 20, 21, 22]
    assert lookup(ctx, 3, 4, "spec_bench").tolist() == [30, 20, 21, 22]  # a full 4-token continuation


def test_spec_bench_falls_back_to_a_smaller_n():
    # 2-gram (1 2) at 0 and 5: only the one at 0 has 3 tokens after it that start before the last 2-gram
    ctx = t([1, 2, 7, 8, 9, 1, 2, 4, 1, 2])
    assert lookup(ctx, 2, 3, "spec_bench").tolist() == [7, 8, 9]
    # with 6 tokens wanted, no occurrence of (1 2) has them; the 1-gram (2) at 1 has: 7 8 9 1 2 4
    assert lookup(ctx, 2, 6, "spec_bench").tolist() == [7, 8, 9, 1, 2, 4]
    # a continuation may run into the last n-gram, but must start before it: (3) at 0 continues with 1 2 3
    assert lookup(t([3, 1, 2, 3]), 1, 3, "spec_bench").tolist() == [1, 2, 3]
    # (3 3) at 0 would continue at 2, the start of the last 2-gram itself: refused; the 1-gram (3) at 0 is taken
    assert lookup(t([3, 3, 3, 3]), 2, 1, "spec_bench").tolist() == [3]
    assert lookup(t([3, 3, 3]), 2, 1, "spec_bench").tolist() == [3]


def test_transformers_rule_cuts_a_match_at_the_sequence_end():
    # the last 2-gram (3 3, at 2) occurs earlier only at 1, overlapping it: the draft is the one token left
    ctx = t([0, 3, 3, 3])
    assert lookup(ctx, max_ngram=2, num_pred=10, rule="transformers").tolist() == [3]
    assert lookup(ctx, max_ngram=2, num_pred=10, rule="spec_bench").tolist() == []
    # a match ending right before the last token drafts just that token
    assert lookup(t([4, 9, 4]), max_ngram=1, num_pred=5, rule="transformers").tolist() == [9, 4]


def test_the_trailing_ngram_does_not_match_itself():
    for rule in ("spec_bench", "transformers"):
        assert lookup(t([1, 2]), max_ngram=3, num_pred=3, rule=rule).tolist() == []
        assert lookup(t([2]), max_ngram=3, num_pred=3, rule=rule).tolist() == []


def test_draft_is_a_chain_rooted_at_the_last_token():
    pld = build_proposer("pld", {"max_ngram": 2, "num_pred_tokens": 3}, vocab_size=100, device=CPU)
    d = pld.propose(t([4, 5, 6, 9, 4, 5, 7, 4, 5]))
    assert d.tokens.tolist() == [5, 6, 9, 4] and d.tree.is_chain and d.tree.size == 4


@pytest.mark.parametrize("params, message", [
    ({"max_ngram": 0}, "method.max_ngram must be an integer from 1"),
    ({"num_pred_tokens": 1.5}, "method.num_pred_tokens must be an integer"),
    ({"n": 3}, "no parameter"),
    ({"match": "hf"}, "method.match must be one of spec_bench, transformers"),
])
def test_bad_parameters(params, message):
    with pytest.raises(HarnessError, match=message):
        build_proposer("pld", params, vocab_size=100, device=CPU)


@pytest.mark.parametrize("rule", ["spec_bench", "transformers"])
def test_the_index_drafts_what_the_search_of_the_whole_sequence_drafts(rule):
    """Step by step over random sequences of few symbols (many repeats), the proposer (its n-gram index, a lookup
    that costs the same at any length) drafts exactly ``lookup``'s tokens (a search of the whole sequence)."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        seq = torch.randint(0, 4 + trial % 5, (120,), generator=gen)
        p = PromptLookup(3, 5, rule)
        for end in range(1, len(seq) + 1):
            draft = p.propose(seq[:end])
            assert draft.tokens[1:].tolist() == lookup(seq[:end], 3, 5, rule).tolist(), (trial, end)
            if len(draft.tokens) > 1:  # how far back the copy comes from
                assert seq[end - draft.info["reach"]: end - draft.info["reach"] + len(draft.tokens) - 1].tolist() \
                    == draft.tokens[1:].tolist()
