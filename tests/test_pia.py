"""PIA (``method=pia``, Ant Group's Lookahead as SpecTTS-Bench runs it): its n-gram trie on worked examples, its
memory across requests, and ``reference=true`` step for step with SpecTTS-Bench's own loop on the embedded model
(the reference's accept lengths, recorded once by running its code: tests/data/pia_reference.json)."""
import json
from pathlib import Path

import pytest
import torch

from evaluation.records.bench import load_bench
from evaluation.running.config import compose_config
from evaluation.running.paradigms import Paradigm
from evaluation.running.runner import Runner
from methods.base import Preparation, build_proposer
from methods.decode import generate
from methods.engine import StaticEngine
from methods.proposers.pia import NgramTrie
from tests import helpers

CPU = torch.device("cpu")
REFERENCE = json.loads((Path(__file__).parent / "data" / "pia_reference.json").read_text())


def test_a_tokens_branches_are_the_n_grams_that_followed_it():
    """``1 2 3 1 2 4`` with branches of 2 tokens: after 1 came "2 3" and "2 4"; the root 2 after 1 drafts 3 and 4,
    the more frequent first (an input counts 1, an output 1e-4), depth first. A draft shorter than ``depth`` tokens
    gives way to the root's own branches ("3 1" and "4" after 2), as does a token before it with none."""
    trie = NgramTrie(2, set())
    trie.add_prompt([1, 2, 3, 1, 2, 4])
    tokens, parents, ends = trie.draft(1, 2, size=8, depth=2)
    assert tokens[1:] == [3, 4] and parents == [-1, 0, 0] and all(ends)
    assert trie.draft(1, 2, size=8, depth=4)[0][1:] == trie.draft(7, 2, size=8, depth=4)[0][1:] == [3, 1, 4]
    trie.add_prompt([1, 2, 4])  # "2 4" after 1 now twice: it goes first
    assert trie.draft(1, 2, size=8, depth=2)[0][1:] == [4, 3]


def test_the_answers_n_grams_wait_for_their_branch():
    """An answer's n-gram goes in once the ``branch`` tokens after it exist (the rest at its end, ``final``); a
    request's prompt leaves with its frequencies alone (another request's, still running, stays), the answers'
    n-grams stay."""
    trie = NgramTrie(2, set())
    trie.add_prompt([9, 8])
    trie.add_prompt([9, 8, 7])  # another slot's request
    buffer = trie.add_output([], [5, 6], final=False)
    assert buffer == [5, 6] and 5 not in trie.trees  # 5's branch needs two tokens after it: none yet past 6
    buffer = trie.add_output(buffer, [7], final=False)
    assert buffer == [6, 7] and list(trie.trees[5].kids) == [6]
    assert trie.add_output(buffer, [], final=True) == [] and list(trie.trees[6].kids) == [7]
    trie.remove_prompt([9, 8])
    assert trie.trees[9].kids[8].fin == 1.0 and trie.trees[5].kids[6].fout == 1.0
    trie.remove_prompt([9, 8, 7])
    assert trie.trees[9].kids[8].fin == trie.trees[8].kids[7].fin == 0.0 and trie.trees[6].kids[7].fout == 1.0


def test_a_full_draft_keeps_the_frequent_and_accepts_only_along_branches():
    """After 1: "4" and "5" twice each in answers, "2" five times in prompts (once "2 3"), "7" three times, "6"
    twice. Five nodes for a draft of four: the two most frequent outputs (4, 5) and the heaviest others (2, 7) are
    in, and the next token's weight (6's, 2) is the bar, which 3 (once, under 2) does not reach: 2's only child left
    out, 2 is forwarded but ends no branch, so it is never accepted (the reference's search paths)."""
    trie = NgramTrie(2, set())
    for tokens in ([1, 4], [1, 4], [1, 5], [1, 5]):
        trie.add_output([], tokens, final=True)
    for tokens in ([1, 2, 3], *[[1, 2]] * 4, [1, 6], [1, 6], *[[1, 7]] * 3):
        trie.add_prompt(tokens)
    tokens, parents, ends = trie.draft(0, 1, size=4, depth=3)
    assert tokens[1:] == [2, 7, 6] and parents == [-1, 0, 0, 0] and ends == [True, False, True, True]


def test_a_saved_state_loads_into_the_same_trie(tmp_path):
    """The trie, the slot's buffer and the reset rule's prompt, saved as a run saves them and loaded into a new
    proposer mid-request: the same drafts after, ties and all."""
    import random

    from methods.common import load_torch_safe, save_torch_atomic

    rng = random.Random(0)
    answers = [[rng.randrange(6) for _ in range(30)] for _ in range(3)]
    p = build_proposer("pia", {"memory": "run", "decoding_length": 16, "branch_length": 4}, vocab_size=8, device=CPU)
    for a in answers[:2]:
        p.reset(torch.tensor([7, 1, 2]), 0, None)
        for i in range(1, 20):
            p.propose(torch.tensor([7, 1, 2, 3] + a[:i]))
        p.finish(a)
    p.reset(torch.tensor([7, 1, 2]), 0, None)
    p.propose(torch.tensor([7, 1, 2, 3] + answers[2][:8]))
    save_torch_atomic(tmp_path / "state.pt", p.state_dict())
    q = build_proposer("pia", {"memory": "run", "decoding_length": 16, "branch_length": 4}, vocab_size=8, device=CPU)
    q.reset(torch.tensor([0]), 0, None)  # another request's: the load replaces it
    q.load_state_dict(load_torch_safe(tmp_path / "state.pt", map_location="cpu"))
    for i in range(8, 30):
        ctx = torch.tensor([7, 1, 2, 3] + answers[2][:i])
        a, b = p.propose(ctx), q.propose(ctx)
        assert a.tokens.tolist() == b.tokens.tolist() and a.tree.parents == b.tree.parents
    assert {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in p.state_dict().items()} == {
        k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in q.state_dict().items()}


def test_memory_run_keeps_earlier_answers_and_the_warm_up_leaves(tiny_model):
    """``memory=run``: a second pass over the same prompts drafts their earlier answers; ``memory=request`` drafts
    as the first pass; after the warm-up the trie is empty again. Tokens are greedy's throughout."""
    engine = StaticEngine(tiny_model, pack=False)
    prompts = [[5, 6, 7, 8, 9, 10], [20, 21, 22, 23], [5, 6, 7, 30, 31]]
    vanilla = [g.token_ids for g in helpers.batched(engine, build_proposer("vanilla", {}, vocab_size=96, device=CPU),
                                                     1, prompts, 24)]
    mats = {}
    for memory in ("run", "request"):
        p = build_proposer("pia", {"memory": memory}, vocab_size=96, device=CPU)
        runs = [helpers.batched(engine, p, 2, prompts, 24) for _ in range(2)]
        assert all([g.token_ids for g in run] == vanilla for run in runs)
        mats[memory] = [sum(len(g.token_ids) for g in run) / sum(len(g.accept_lengths) for g in run) for run in runs]
        p.after_warmup()
        assert not p.trie.trees
    assert mats["run"][1] > 1.5 * mats["request"][1] and mats["request"][1] == mats["request"][0]


def reference_case(embedded, tokens: int, qids: list[int]):
    """Our ``reference=true`` on the embedded model over ``qids`` in a row at ``tokens`` new tokens, each question's
    forwards (the answer's accept lengths, the last one's cut at the budget, then those past the answer) against the
    reference's."""
    model, tok, _ = embedded
    r = Runner(compose_config(["method=vanilla", "model.device=cpu", "model.dtype=float32"]),
               loaded=(model, tok, CPU))
    pia = build_proposer("pia", {"reference": True}, vocab_size=model.config.vocab_size, device=CPU)
    pia.prepare(Preparation(engine=r.engine, model_name=r.spec.name, stop_ids=r.stop_ids, prompts=None, cache=None))
    want = REFERENCE["cases"][str(tokens)]
    for q in load_bench(None, question_ids=qids):
        g = generate(r.engine, pia, Paradigm().prompt(r.spec, r.tok, q, 0, [], r.marker), max_new_tokens=tokens,
                     stop_ids=r.stop_ids)
        ref, n = want[str(q.question_id)], len(g.accept_lengths)
        assert g.accept_lengths[:-1] == ref[:n - 1] and ref[n - 1] >= g.accept_lengths[-1], q.question_id
        assert (g.extra_forwards or []) == ref[n:], q.question_id


@pytest.mark.slow  # the embedded model
def test_reference_is_spectts_benchs_pia_step_for_step(embedded):
    reference_case(embedded, 48, [81, 161])  # the first two of the recorded four: the same state in between


@pytest.mark.long
def test_reference_is_spectts_benchs_pia_step_for_step_on_the_smoke_questions(embedded):
    reference_case(embedded, 128, [81, 82, 161, 162, 241, 242, 321, 322, 401, 402, 481, 482])
