"""Token Recycling without a model: drafting, update, duplicates, start policies, tree fitting."""
import json

import pytest
import torch

from methods.base import Verification, build_proposer
from methods.common import HarnessError
from methods.proposers.tr import fit_tree
from methods.tree import TreeError, load_template

CPU = torch.device("cpu")


def make(tmp_path, parents, k=2, vocab=16, start="hot"):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"parents": parents}))
    return build_proposer("tr", {"k": k, "tree": str(path), "start": start}, vocab_size=vocab, device=CPU)


def test_drafting_from_a_hand_written_matrix(tmp_path):
    # tree: root -> ranks 0, 1; rank-0 child -> ranks 0, 1; its rank-0 child -> rank 0
    #        0
    #      1   2
    #     3 4
    #     5
    tr = make(tmp_path, [-1, 0, 0, 1, 1, 3])
    tr.M[5] = torch.tensor([7, 3])
    tr.M[7] = torch.tensor([9, 4])
    tr.M[9] = torch.tensor([11, 12])
    draft = tr.propose(torch.tensor([1, 2, 5]))  # root = 5, the last committed token
    assert draft.tokens.tolist() == [5, 7, 3, 9, 4, 11]
    assert draft.tree.parents == (-1, 0, 0, 1, 1, 3)


def test_zero_rows_draft_token_zero(tmp_path):
    tr = make(tmp_path, [-1, 0, 0, 1])
    assert tr.propose(torch.tensor([6])).tokens.tolist() == [6, 0, 0, 0]


def _logits(rows, vocab=16):
    """Logits whose top-2 are the given (first, second) token pairs."""
    lg = torch.zeros(len(rows), vocab)
    for i, (a, b) in enumerate(rows):
        lg[i, a], lg[i, b] = 2.0, 1.0
    return lg


def _verified(path, logits, k=2):
    return Verification(path, [1], logits, logits.argmax(-1), logits.topk(k, dim=-1).indices)


def test_update_writes_every_verified_node(tmp_path):
    tr = make(tmp_path, [-1, 0, 0, 1])
    draft = tr.propose(torch.tensor([5]))  # [5, 0, 0, 0] from a zero matrix
    draft.tokens[:] = torch.tensor([5, 7, 3, 9])  # pretend the rows held these
    logits = _logits([(7, 1), (9, 2), (4, 5), (13, 14)])
    tr.update(draft, _verified([0, 1], logits))
    assert tr.M[5].tolist() == [7, 1]
    assert tr.M[7].tolist() == [9, 2]  # accepted draft
    assert tr.M[3].tolist() == [4, 5]  # rejected draft: written too
    assert tr.M[9].tolist() == [13, 14]
    assert tr.M[0].tolist() == [0, 0]


def test_duplicates_last_node_in_bfs_order_wins(tmp_path):
    tr = make(tmp_path, [-1, 0, 0, 1])
    draft = tr.propose(torch.tensor([5]))
    draft.tokens[:] = torch.tensor([5, 8, 8, 8])  # token 8 at nodes 1, 2 and 3
    logits = _logits([(1, 2), (3, 4), (5, 6), (10, 11)])
    tr.update(draft, _verified([0], logits))
    assert tr.M[8].tolist() == [10, 11]
    draft.tokens[:] = torch.tensor([8, 6, 8, 6])  # root and node 2 share a token
    tr.update(draft, _verified([0], logits))
    assert tr.M[8].tolist() == [5, 6] and tr.M[6].tolist() == [10, 11]


def test_start_policies(tmp_path):
    hot, cold = make(tmp_path, [-1, 0], start="hot"), make(tmp_path, [-1, 0], start="cold")
    for tr in (hot, cold):
        tr.M[3] = torch.tensor([4, 5])
        tr.reset(torch.tensor([1, 2]), 1, None)  # second turn: both keep the matrix
        assert tr.M[3].tolist() == [4, 5]
        tr.reset(torch.tensor([1, 2]), 0, None)  # a new question
    assert hot.M[3].tolist() == [4, 5] and cold.M.abs().sum() == 0

    prompt = make(tmp_path, [-1, 0], start="prompt")
    assert prompt.wants_prompt_logits and not hot.wants_prompt_logits
    prompt.M[3] = torch.tensor([4, 5])
    ids = torch.tensor([2, 9, 2])
    prompt.reset(ids, 0, _logits([(1, 2), (3, 4), (6, 7)]))
    assert prompt.M[3].tolist() == [0, 0]  # zeroed for the new question
    assert prompt.M[9].tolist() == [3, 4] and prompt.M[2].tolist() == [6, 7]  # later position wins


def test_state_round_trip_and_summary(tmp_path):
    a, b = make(tmp_path, [-1, 0]), make(tmp_path, [-1, 0])
    a.M[3] = torch.tensor([4, 5])
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.M, b.M)
    s = a.summary()
    assert s["adjacency_bytes"] == 16 * 2 * 2 and s["adjacency_dtype"] == "torch.int16"


def test_matrix_dtype_fits_the_vocabulary():
    assert build_proposer("tr", {}, vocab_size=32000, device=CPU).M.dtype == torch.int16
    big = build_proposer("tr", {}, vocab_size=49152, device=CPU)
    assert big.M.dtype == torch.int32 and big.M.shape == (49152, 8)
    assert big.summary()["adjacency_bytes"] == 49152 * 8 * 4  # 1.5 MiB


@pytest.mark.parametrize("params, error, message", [
    ({"k": 0}, HarnessError, "method.k must be an integer from 1"),
    ({"k": "8"}, HarnessError, "method.k must be an integer"),
    ({"start": "warm"}, HarnessError, "method.start must be one of hot, cold, prompt"),
    ({"kk": 3}, HarnessError, "no parameter"),
    ({"k": 4}, TreeError, "needs method.k >= 8"),
    ({"tree": "nope"}, TreeError, "no tree template 'nope'"),
])
def test_bad_parameters(params, error, message):
    with pytest.raises(error, match=message):
        build_proposer("tr", params, vocab_size=100, device=CPU)


def test_fit_tree_rule():
    paper = load_template("paper")
    assert fit_tree(paper, 8) is paper
    k4 = fit_tree(paper, 4)
    assert int(k4.rank.max()) == 3 and k4.max_depth == 6
    # each kept node keeps min(c, 4) children; nodes under a dropped node vanish
    assert torch.bincount(k4.depth).tolist()[:2] == [1, 4]
    k1 = fit_tree(paper, 1)
    assert k1.is_chain and k1.size == 7  # the rank-0 path of depth 6
    k12 = fit_tree(paper, 12)
    assert k12.children_counts()[0] == 12 and k12.size == 81 + 3 * 4
    tr = build_proposer("tr", {"k": 4, "fit_tree_to_k": True}, vocab_size=100, device=CPU)
    assert tr.tree.size == k4.size


def test_first_step_is_a_full_tree_as_in_the_reference(tiny_model):
    """The reference (Luowaterbi/TokenRecycling recycling_forward) prefills the prompt but its last token: the
    first step is a tree rooted at the prompt's last token, which can accept several tokens at once and writes
    the rows of every node it verified. ``first_step=prefill`` keeps the prefill's single token. Tokens are
    the same either way."""
    from methods.decode import generate

    prompt = [1, 5, 9, 33, 4, 5, 9, 33, 4]
    ref = tiny_model.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)[0, 9:].tolist()
    tree_first = build_proposer("tr", {}, vocab_size=96, device=CPU)
    assert tree_first.drafts_first
    gen = generate(tiny_model, tree_first, prompt, max_new_tokens=30, stop_ids=set())
    assert gen.token_ids == ref and not gen.prefill_step and sum(gen.accept_lengths) == 30
    again = generate(tiny_model, tree_first, prompt, max_new_tokens=30, stop_ids=set())  # hot: M knows the text
    assert again.token_ids == ref and again.accept_lengths[0] > 1
    prefill_first = build_proposer("tr", {"first_step": "prefill"}, vocab_size=96, device=CPU)
    gen = generate(tiny_model, prefill_first, prompt, max_new_tokens=30, stop_ids=set())
    assert gen.token_ids == ref and gen.prefill_step and gen.accept_lengths[0] == 1
    with pytest.raises(HarnessError, match="method.first_step must be one of tree, prefill"):
        build_proposer("tr", {"first_step": "draft"}, vocab_size=96, device=CPU)
