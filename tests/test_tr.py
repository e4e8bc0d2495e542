"""Token Recycling without a model: drafting, update, duplicates, start policies, tree fitting."""
import json

import pytest
import torch

from methods.base import Verification, build_proposer
from methods.common import HarnessError
from methods.engine import Engine
from methods.proposers.tr import fit_tree
from methods.tree import TreeError, load_template

CPU = torch.device("cpu")


def make(tmp_path, parents, k=2, vocab=16, start="hot", **params):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"parents": parents}))
    return build_proposer("tr", {"k": k, "tree": str(path), "start": start, **params}, vocab_size=vocab, device=CPU)


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


# --- method.reference=true: the reference's end of a request (methods.base.Ending) ---------------------------

class Counting(Engine):
    """A target without a model, for worked examples: after token t it predicts t + 1, then t + 3 (its top-2),
    whatever the position or the context."""

    name, device, vocab = "counting", CPU, 32

    def __init__(self):
        self.cached = 0

    def start(self, capacity: int, rows: int = 1) -> None:
        self.cached = 0

    def open(self, row: int, capacity: int) -> None:
        self.cached = 0

    def length_of(self, row: int) -> int:
        return self.cached

    def forward(self, tokens, tree=None, *, row=0, last_only=False, hidden=False):
        logits = torch.zeros(len(tokens), self.vocab)
        rows = torch.arange(len(tokens))
        logits[rows, (tokens + 1) % self.vocab], logits[rows, (tokens + 3) % self.vocab] = 2.0, 1.0
        self.cached += len(tokens)
        return (logits[-1:] if last_only else logits), None

    def commit(self, start: int, path: list[int], row: int = 0) -> None:
        self.cached = start + len(path)


def _counting(tmp_path, reference: bool):
    """TR with a chain of 2 rank-0 drafts over ``Counting``'s vocabulary, hot: every row t holds [t + 1, t + 2], so
    that every step accepts its whole chain and a row the target writes, [t + 1, t + 3], shows; but row 11 is
    empty, so that a step rooted at 11 drafts 0, 1 and commits one token."""
    tr = make(tmp_path, [-1, 0, 1], vocab=Counting.vocab, reference=reference)
    tr.M[:, 0], tr.M[:, 1] = ((torch.arange(Counting.vocab) + i) % Counting.vocab for i in (1, 2))
    tr.M[11] = 0
    return Counting(), tr


def _written(tr) -> list[int]:
    """The rows the target wrote: [t + 1, t + 3]."""
    v = Counting.vocab
    return [t for t in range(v) if tr.M[t].tolist() == [(t + 1) % v, (t + 3) % v]]


@pytest.mark.parametrize("budget, stop_ids, ours, theirs, extra", [
    # Forwards from the prompt [0, 1, 2] (its last token roots the first): F1 commits 3 4 5, F2 6 7 8, F3 9 10 11.
    # 9 tokens: ours ends on F3, the reference (past 2) goes on to 11: F4, rooted at 11's empty row, commits one
    # token (12; 10 exist) and is learned from: rows 11, 0 and 1 (its drafts); F5 (13 14 15: 13 exist) stops it
    # unlearned, so rows 12, 13, 14 keep their old value.
    (9, set(), [2, 3, 4, 5, 6, 7, 8, 9, 10], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [1, 3]),
    # 7 tokens: F3 makes 9 = 7 + 2, which stops the reference before it learns: rows 8, 9, 10 stay unwritten.
    (7, set(), [2, 3, 4, 5, 6, 7, 8, 9, 10], [2, 3, 4, 5, 6, 7], []),
    # A stop token among F2's accepted drafts (7) stops both; the reference does not learn F2's rows 5, 6, 7.
    (20, {7}, [2, 3, 4, 5, 6, 7], [2, 3, 4], []),
    # A stop token as F1's bonus (5) stops both after F1's update: no difference.
    (20, {5}, [2, 3, 4], [2, 3, 4], []),
])
def test_reference_ending_worked_example(tmp_path, budget, stop_ids, ours, theirs, extra):
    """Which rows each end of a request writes, ours and the reference's (Luowaterbi/TokenRecycling, commit
    1b4c05c, evaluation/inference_recycling.py lines 99-137); the answer is the same."""
    from methods.decode import generate

    answers = []
    for reference, rows in ((False, ours), (True, theirs)):
        engine, tr = _counting(tmp_path, reference)
        gen = generate(engine, tr, [0, 1, 2], max_new_tokens=budget, stop_ids=stop_ids)
        assert _written(tr) == rows
        assert gen.extra_forwards == (extra if reference else None)
        assert tr.node_accepts[0] == len(gen.accept_lengths)  # the forwards past the answer count nowhere
        answers.append((gen.token_ids, gen.accept_lengths, gen.stop))
    assert answers[0] == answers[1]
    tokens, lengths, _ = answers[0]
    assert tokens == list(range(3, 3 + len(tokens))) and sum(lengths) == len(tokens)


def test_sam_decodings_ending_forwards_once_more(tmp_path):
    """SAM-Decoding's loop (hyx1999/SAM-Decoding, commit 18c41f0, samd/samd_model.py lines 253-272) stops once the
    tokens before the pending bonus reach the budget, or once a forward's root and accepted drafts hold a stop
    token, and learns from every forward: a stop token as a bonus roots one more forward, learned from."""
    from methods.decode import generate
    from methods.proposers.sam import SamTokenRecycling

    ending = SamTokenRecycling.REFERENCE_ENDING
    engine, tr = _counting(tmp_path, False)
    tr.ending = ending  # the loop's rule whatever the proposer: TR's drafts stand for SAM's here
    gen = generate(engine, tr, [0, 1, 2], max_new_tokens=20, stop_ids={5})
    assert gen.token_ids == [3, 4, 5] and gen.stop == "eos" and gen.extra_forwards == [3]  # F2: 6 7 8 after 5
    assert _written(tr) == [2, 3, 4, 5, 6, 7]
    engine, tr = _counting(tmp_path, False)
    tr.ending = ending
    gen = generate(engine, tr, [0, 1, 2], max_new_tokens=9, stop_ids=set())  # 9 exist after F3; F4 makes 10
    assert gen.extra_forwards == [1] and _written(tr) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    sam_tr = build_proposer("sam_tr", {"reference": True}, vocab_size=96, device=CPU)
    assert sam_tr.ending is ending and build_proposer("sam_tr", {}, vocab_size=96, device=CPU).ending is None
    assert build_proposer("tr", {"reference": True}, vocab_size=96, device=CPU).ending.past == 2


@pytest.mark.parametrize("method", ["tr", "sam_tr"])
def test_reference_mode_changes_no_answer(tiny_model, method):
    """Hot, over several requests: the tokens are greedy decoding's; from the same matrix, a request's accept
    lengths and TR's node statistics are those of our ending; the forwards past the answer are recorded apart,
    and their time is not the answer's. (The last prompt ends with the stop token: the root of TR's first step,
    which ends nothing.)"""
    from methods.decode import generate

    prompts = [[1, 5, 9, 33, 4, 5, 9, 33, 4], [1, 7, 7, 20, 3], [1, 60, 61, 62], [1, 5, 9, 33, 4, 2]]
    ours = build_proposer(method, {"reference": True}, vocab_size=96, device=CPU)
    ours.ending = None  # the same drafts (sam_tr's reference retrieval too), our end
    theirs = build_proposer(method, {"reference": True}, vocab_size=96, device=CPU)
    tr_ours, tr_theirs = (getattr(p, "drafter", p) for p in (ours, theirs))
    extra = []
    for i, prompt in enumerate(prompts * 2):
        budget = 12 + 5 * i
        ref = tiny_model.generate(torch.tensor([prompt]), max_new_tokens=budget, do_sample=False)[0, len(prompt):]
        tr_theirs.load_state_dict(tr_ours.state_dict())
        a = generate(tiny_model, ours, prompt, max_new_tokens=budget, stop_ids={2})
        b = generate(tiny_model, theirs, prompt, max_new_tokens=budget, stop_ids={2})
        assert a.token_ids == b.token_ids == ref.tolist()[: len(a.token_ids)]
        assert a.accept_lengths == b.accept_lengths and sum(b.accept_lengths) == len(b.token_ids)
        assert torch.equal(tr_ours.node_accepts, tr_theirs.node_accepts)
        assert a.extra_forwards is None and b.wall_time == b.prefill_time + b.decode_time
        extra += b.extra_forwards
    assert extra and len(extra) <= 2 * len(prompts) * 2  # one or two forwards past the budget at most


@pytest.mark.slow
def test_a_run_records_the_forwards_past_the_answer_apart(tmp_path, reuse_embedded):
    """method.reference=true through the runner: the forwards past the answer land in the answer record as
    ``extra_forwards`` and ``extra_time``, and in no step count."""
    from evaluation.records.answers import read_answers
    from evaluation.running.config import compose_config
    from evaluation.running.runner import run

    out = run(compose_config(["method=tr", "method.reference=true", "warmup=0", "runtime.progress=false",
                              "bench.question_ids=[161]", "bench.max_new_tokens=8"]), tmp_path / "run")
    c = read_answers(out)[0]["choices"][0]
    assert c["extra_forwards"][0] and all(n >= 1 for n in c["extra_forwards"][0]) and c["extra_time"][0] > 0
    assert sum(c["accept_lengths"]) == sum(c["new_tokens"]) == 8 and len(c["accept_lengths"]) == sum(
        c["decoding_steps"])
