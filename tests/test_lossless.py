"""Lossless on the real embedded model (fp32, CPU): every method's tokens equal vanilla's, question by question.

The questions: one per Spec-Bench task, the mt_bench one with both turns (turn 2 built on the method's own turn-1
answer); a method that keeps state across questions (TR's hot start, SAM's automaton) decodes them in a row after a
warm-up on another question, so that each drafts from the state the ones before it left. In ``make test`` every
method decodes the first two (the two-turn writing question and a translation: short prompts, whose prefill is not
most of the time) with its defaults; in ``make test-long`` every method that keeps state or copies from the context
decodes all six (the long summarization and RAG prompts it copies from), the head methods the first three (a head
drafts from the target's features whatever the task), and the variants (other settings) the first three.
Sampling: TR here, every method in ``make test-long`` (every method samples vanilla's tokens on the tiny models in
tests/test_sampling.py).
"""
import pytest
import torch

from evaluation.records.bench import load_bench
from evaluation.running.config import compose_config
from evaluation.running.runner import Runner
from methods.base import Proposer, known_methods, registry
from tests import golden

MAX_NEW = 20
ONE_PER_TASK = load_bench(None, limit_per_category=1)
WARM_UP = next(q for q in load_bench(None, limit_per_category=2) if q not in ONE_PER_TASK and len(q.turns) == 1)
# The variants (settings other than a method's defaults) take the first three: the two-turn question, translation and
# the long summarization prompt. A prefix, so that a stateful method meets each in the state the batch-1 record's run
# (all six in a row) left.
VARIANT_QUESTIONS = ONE_PER_TASK[:3]
SHORT_QUESTIONS = ONE_PER_TASK[:2]  # make test's: the same prefix
# Sampling: a two-turn question (the second turn on the method's own sampled answer), a long context that the
# copying drafters draft from, and a math answer (every method samples every task's prompts on the tiny model:
# tests/test_sampling.py).
SAMPLED_QUESTIONS = [q for q in ONE_PER_TASK if q.category in ("writing", "summarization", "math_reasoning")]
SHORT_SAMPLED = [q for q in SAMPLED_QUESTIONS if q.category != "summarization"]  # make test's


@pytest.fixture(scope="module")
def loaded(embedded):
    """The session's embedded model, as a runner takes it: every runner here decodes with it (none changes it)."""
    model, tok, _ = embedded
    return model, tok, torch.device("cpu")


def runner(loaded, *overrides):
    cfg = compose_config([*overrides, f"bench.max_new_tokens={MAX_NEW}", "model.device=cpu", "model.dtype=float32"])
    return Runner(cfg, loaded=loaded)


def answers(r: Runner, questions=ONE_PER_TASK):
    return {q.question_id: r.answer(q)["choices"][0] for q in questions}


class Reference(dict):
    """Vanilla's answers by question id, each decoded when first asked for (a process that runs only the sampled
    cases decodes only their questions)."""

    def __init__(self, r: Runner):
        super().__init__()
        self.r, self.questions = r, {q.question_id: q for q in ONE_PER_TASK}

    def __missing__(self, qid):
        self[qid] = self.r.answer(self.questions[qid])["choices"][0]
        return self[qid]


@pytest.fixture(scope="module")
def reference(loaded):
    return Reference(runner(loaded, "method=vanilla"))


def test_sample_is_stratified():
    assert WARM_UP.question_id not in {q.question_id for q in ONE_PER_TASK}
    assert len(ONE_PER_TASK) == 6 and sum(len(q.turns) == 2 for q in ONE_PER_TASK) == 1
    assert len(SAMPLED_QUESTIONS) == 3 and sum(len(q.turns) == 2 for q in SAMPLED_QUESTIONS) == 1
    assert [q.category for q in VARIANT_QUESTIONS] == ["writing", "translation", "summarization"]
    assert [q.category for q in SHORT_QUESTIONS] == ["writing", "translation"]


# Every registered method with its defaults on the embedded model (its shipped heads, corpus and drafter: the
# model config's artefacts), quicker where a setting only shortens the run; then settings that take other paths.
QUICKER = {"eagle2": ["method.total_tokens=20"], "sam_eagle2": ["method.total_tokens=20"]}
SMALL_TREE = "method.tree=grown-n30-d6"  # a grown template; where a case is about another setting, a cheaper step
VARIANTS = [
    ["method=tr", "engine=hf", SMALL_TREE],          # on the reference engine (the reference ran the lean one)
    ["method=tr", "method.start=cold", SMALL_TREE],
    ["method=tr", "method.start=prompt", SMALL_TREE],
    ["method=tr", "method.tree=probe"],              # 64 drafts, depth 8
    ["method=tr", "method.k=3", "method.fit_tree_to_k=true"],  # the paper tree clipped to ranks < 3
    ["method=pld", "method.max_ngram=1", "method.num_pred_tokens=4"],
    ["method=lookahead", "method.level=3", "method.window=4", "method.guess=3"],
    ["method=sam", "method.corpus=null", "method.max_draft=8"],
    ["method=sam_tr", "method.merge=true", "method.tree=grown-n30-d6"],   # chain and tree in one tree
    ["method=sam_tr", "method.tree=auto", "method.max_draft=auto"],       # sized for this device
    ["method=sam_eagle2", "method.total_tokens=20", "method.merge=true"],
    ["method=sam", "method.memory=run", "method.memory_tree=true"],      # the run's memory, both chains as a tree
    ["method=suffix", "method.tree=true", "method.backend=python"],      # our trees, drafting trees
    ["method=suffix", "method.max_cached_requests=0"],                   # no global tree
    ["method=pia", "method.reference=true"],                             # SpecTTS-Bench's loop
    ["method=pia", "method.memory=run"],
]
DEFAULTS = [[f"method={name}", *QUICKER.get(name, [])] for name in known_methods() if name != "vanilla"]


# drafters from the context and corpora: every task's prompt shapes them
COPYING = ("pld", "lookahead", "rest", "sam", "suffix", "pia")


def stateful(name: str) -> bool:
    """A method that keeps state across questions (TR's hot start, SAM's automaton): the questions in a row test it."""
    return registry()[name].state_dict is not Proposer.state_dict


def lossless_cases() -> list:
    """make test: every method's defaults on SHORT_QUESTIONS; make test-long: the same on their full set, and the
    variants."""
    return ([pytest.param(c, False, id=",".join(c)) for c in DEFAULTS]
            + [pytest.param(c, True, marks=pytest.mark.long, id=",".join(c) + "-full") for c in DEFAULTS]
            + [pytest.param(c, True, marks=pytest.mark.long, id=",".join(c)) for c in VARIANTS])


@pytest.mark.parametrize("overrides, full", lossless_cases())
@pytest.mark.slow
def test_method_is_lossless(reference, loaded, overrides, full):
    r = runner(loaded, *overrides)
    if stateful(r.method):
        r.answer(WARM_UP)  # so that it drafts from a filled state (TR's hot start) from the first question on
    every_task = overrides in DEFAULTS and (stateful(r.method) or r.method in COPYING)
    got = answers(r, SHORT_QUESTIONS if not full else ONE_PER_TASK if every_task else VARIANT_QUESTIONS)
    for qid in got:
        ref = reference[qid]
        assert got[qid]["token_ids"] == ref["token_ids"], f"question {qid}"
        assert got[qid]["turns"] == ref["turns"]
    accepted = [a for c in got.values() for a in c["accept_lengths"]]
    assert max(accepted) > 1, "no draft was ever accepted: the proposer is not drafting"
    record = golden.load().get(golden.key(overrides))  # a method newer than the record has none
    if record is not None and "auto" not in ",".join(overrides):  # a tree sized by timing differs by machine
        # runtime.batch_size=1 decodes as the one-request loop did before batching: every step the same
        assert {str(q): golden.record(c) for q, c in got.items()} == {str(q): record[str(q)] for q in got}


def test_batch_one_record_covers_every_case():
    """Every case of the record is still run, and every method of the project has its defaults in it."""
    cases = {golden.key(o) for o in [["method=vanilla"], *DEFAULTS, *VARIANTS]}
    assert set(golden.load()) <= cases
    from methods.base import PROPOSERS
    ours = [n for n, cls in registry().items() if cls.__module__.startswith(PROPOSERS)]
    assert all(any(k.split(",")[0] == f"method={n}" for k in golden.load()) for n in ours)


# At temperature > 0 every method reproduces vanilla sampling with the same seed (methods.sampling): every
# registered method, and merged SAM+TR (sampled_cases).
SAMPLED = ["sampling.temperature=1.0", "sampling.top_p=0.95", "sampling.seed=1"]


@pytest.fixture(scope="module")
def sampled_reference(loaded):
    return Reference(runner(loaded, "method=vanilla", *SAMPLED))


def sampled_cases() -> list:
    """make test: TR (a grown tree: a cheaper step) on SHORT_SAMPLED; make test-long: every method there, and on all
    of SAMPLED_QUESTIONS."""
    cases = DEFAULTS + [["method=sam_tr", "method.merge=true"]]
    return ([pytest.param(["method=tr", SMALL_TREE], False, id=f"method=tr,{SMALL_TREE}")]
            + [pytest.param(c, False, marks=pytest.mark.long, id=",".join(c)) for c in cases]
            + [pytest.param(c, True, marks=pytest.mark.long, id=",".join(c) + "-full") for c in cases])


@pytest.mark.parametrize("overrides, full", sampled_cases())
@pytest.mark.slow
def test_method_samples_exactly_vanillas_tokens(sampled_reference, reference, loaded, overrides, full):
    r = runner(loaded, *overrides, *SAMPLED)
    got = answers(r, SAMPLED_QUESTIONS if full else SHORT_SAMPLED)
    for qid in got:
        ref = sampled_reference[qid]
        assert got[qid]["token_ids"] == ref["token_ids"], f"question {qid}"
    assert any(got[q]["token_ids"] != reference[q]["token_ids"] for q in got), "sampling gave the greedy tokens"
    assert max(a for c in got.values() for a in c["accept_lengths"]) > 1, "no draft was ever accepted"
