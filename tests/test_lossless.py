"""Lossless on the real embedded model (fp32, CPU): every method's tokens equal vanilla's, question by question.

The sample is stratified: two questions per Spec-Bench task, the two mt_bench ones with both turns
(turn 2 built on the method's own turn-1 answer).
"""
import pytest
import torch

from evaluation.config import compose_config
from evaluation.data import load_bench
from evaluation.runner import Runner
from methods.base import Proposer, known_methods, registry

MAX_NEW = 20
SAMPLE = load_bench(None, limit_per_category=2)
ONE_PER_TASK = load_bench(None, limit_per_category=1)  # the settings beyond a method's defaults, and sampling


@pytest.fixture(scope="module")
def loaded(embedded):
    """The session's embedded model, as a runner takes it: every runner here decodes with it (none changes it)."""
    model, tok, _ = embedded
    return model, tok, torch.device("cpu")


def runner(loaded, *overrides):
    cfg = compose_config([*overrides, f"bench.max_new_tokens={MAX_NEW}", "model.device=cpu", "model.dtype=float32"])
    return Runner(cfg, loaded=loaded)


def answers(r: Runner, questions=SAMPLE):
    return {q.question_id: r.answer(q)["choices"][0] for q in questions}


@pytest.fixture(scope="module")
def reference(loaded):
    return answers(runner(loaded, "method=vanilla"))


def test_sample_is_stratified():
    assert len(SAMPLE) == 12 and sum(len(q.turns) == 2 for q in SAMPLE) == 2
    assert len(ONE_PER_TASK) == 6 and sum(len(q.turns) == 2 for q in ONE_PER_TASK) == 1


# Every registered method with its defaults on the embedded model (its shipped heads, corpus and drafter: the
# model config's artefacts), quicker where a setting only shortens the run; then settings that take other paths.
QUICKER = {"eagle2": ["method.total_tokens=20"], "sam_eagle2": ["method.total_tokens=20"],
           "sps": ["method.drafter=self:20", "method.topk=4", "method.schedule=constant"]}  # 20 of 30 layers
VARIANTS = [
    ["method=tr", "engine=hf"],                      # on the reference engine (the reference ran the lean one)
    ["method=tr", "method.start=cold"],
    ["method=tr", "method.start=prompt"],
    ["method=tr", "method.tree=probe"],              # 64 drafts, depth 8
    ["method=tr", "method.tree=grown-n30-d6"],       # a grown template
    ["method=tr", "method.k=3", "method.fit_tree_to_k=true"],  # the paper tree clipped to ranks < 3
    ["method=pld", "method.max_ngram=1", "method.num_pred_tokens=4"],
    ["method=lookahead", "method.level=3", "method.window=4", "method.guess=3"],
    ["method=sam", "method.corpus=null", "method.max_draft=8"],
    ["method=sam_tr", "method.merge=true", "method.tree=grown-n30-d6"],   # chain and tree in one tree
    ["method=sam_tr", "method.tree=auto", "method.max_draft=auto"],       # sized for this device
    ["method=sam_eagle2", "method.total_tokens=20", "method.merge=true"],
]
DEFAULTS = [[f"method={name}", *QUICKER.get(name, [])] for name in known_methods() if name != "vanilla"]


def stateful(name: str) -> bool:
    """A method that keeps state across questions (TR's hot start, SAM's automaton): the questions in a row test it."""
    return registry()[name].state_dict is not Proposer.state_dict


# A stateful method's defaults on the 12 questions (its state carried through them); every other case on one
# question per task, which still meets every task's prompts.
CASES = [pytest.param(o, SAMPLE if stateful(o[0][7:]) else ONE_PER_TASK, id=",".join(o)) for o in DEFAULTS] + \
    [pytest.param(o, ONE_PER_TASK, id=",".join(o)) for o in VARIANTS]


@pytest.mark.parametrize("overrides,questions", CASES)
@pytest.mark.slow
def test_method_is_lossless(reference, loaded, overrides, questions):
    r = runner(loaded, *overrides)
    if stateful(r.method):
        r.answer(SAMPLE[0])  # a warm-up pass, so that it drafts from a filled state (TR's hot start)
    got = answers(r, questions)
    for qid in got:
        ref = reference[qid]
        assert got[qid]["token_ids"] == ref["token_ids"], f"question {qid}"
        assert got[qid]["turns"] == ref["turns"]
    accepted = [a for c in got.values() for a in c["accept_lengths"]]
    assert max(accepted) > 1, "no draft was ever accepted: the proposer is not drafting"


# At temperature > 0 every method reproduces vanilla sampling with the same seed (methods.sampling): every
# registered method, on one question per task (the mt_bench one with both turns), and merged SAM+TR.
SAMPLED = ["sampling.temperature=1.0", "sampling.top_p=0.95", "sampling.seed=1"]


@pytest.fixture(scope="module")
def sampled_reference(loaded):
    return answers(runner(loaded, "method=vanilla", *SAMPLED), ONE_PER_TASK)


@pytest.mark.parametrize("overrides", DEFAULTS + [["method=sam_tr", "method.merge=true"]], ids=lambda o: ",".join(o))
@pytest.mark.slow
def test_method_samples_exactly_vanillas_tokens(sampled_reference, reference, loaded, overrides):
    r = runner(loaded, *overrides, *SAMPLED)
    got = answers(r, ONE_PER_TASK)
    for qid, ref in sampled_reference.items():
        assert got[qid]["token_ids"] == ref["token_ids"], f"question {qid}"
    assert any(got[q]["token_ids"] != reference[q]["token_ids"] for q in got), "sampling gave the greedy tokens"
    assert max(a for c in got.values() for a in c["accept_lengths"]) > 1, "no draft was ever accepted"
