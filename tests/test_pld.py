"""Prompt lookup without a model: n-gram matching on worked examples."""
import pytest
import torch

from methods.base import ConfigError, build_proposer
from methods.pld import lookup

CPU = torch.device("cpu")
t = torch.tensor


def test_no_match_gives_a_root_only_draft():
    pld = build_proposer("pld", {}, vocab_size=100, device=CPU)
    d = pld.propose(t([1, 2, 3, 4]))
    assert d.tokens.tolist() == [4] and d.tree.size == 1


def test_longest_ngram_first():
    # last 3-gram (7 8 9) occurs at 0 -> continue with 1; the 1-gram (9) alone also occurs at 5 -> 3
    ctx = t([7, 8, 9, 1, 2, 9, 3, 7, 8, 9])
    assert lookup(ctx, max_ngram=3, num_pred=2).tolist() == [1, 2]
    assert lookup(ctx, max_ngram=1, num_pred=2).tolist() == [1, 2]  # 9 at 2 comes before 9 at 5


def test_several_matches_the_earliest_wins():
    ctx = t([5, 6, 1, 5, 6, 2, 5, 6])
    assert lookup(ctx, max_ngram=2, num_pred=1).tolist() == [1]


def test_match_at_the_very_end_is_cut_at_the_sequence_end():
    # the last 2-gram (3 3, at 2) occurs earlier only at 1, overlapping it: the draft is the one token left
    ctx = t([0, 3, 3, 3])
    assert lookup(ctx, max_ngram=2, num_pred=10).tolist() == [3]
    # a match ending right before the last token drafts just that token
    assert lookup(t([4, 9, 4]), max_ngram=1, num_pred=5).tolist() == [9, 4]


def test_the_trailing_ngram_does_not_match_itself():
    assert lookup(t([1, 2]), max_ngram=3, num_pred=3).tolist() == []
    assert lookup(t([2]), max_ngram=3, num_pred=3).tolist() == []


def test_draft_is_a_chain_rooted_at_the_last_token():
    pld = build_proposer("pld", {"max_ngram": 2, "num_pred_tokens": 3}, vocab_size=100, device=CPU)
    d = pld.propose(t([4, 5, 6, 9, 4, 5, 7, 4, 5]))
    assert d.tokens.tolist() == [5, 6, 9, 4] and d.tree.is_chain and d.tree.size == 4


@pytest.mark.parametrize("params, message", [
    ({"max_ngram": 0}, "method.max_ngram must be an integer from 1"),
    ({"num_pred_tokens": 1.5}, "method.num_pred_tokens must be an integer"),
    ({"n": 3}, "no parameter"),
])
def test_bad_parameters(params, message):
    with pytest.raises(ConfigError, match=message):
        build_proposer("pld", params, vocab_size=100, device=CPU)
