"""Batched decoding (``runtime.batch_size``, ``methods.decode.decode_batch``): every method, at every batch size, gives
every row exactly the tokens of batch-1 vanilla decoding, on both engines; a method whose state lives within a request
drafts exactly as at batch size 1 (its accept lengths equal), so no slot's state leaks into another's."""
import pytest
import torch

from methods.base import build_proposer, registry
from methods.decode import generate
from methods.engine import HFEngine, StaticEngine
from methods.sampling import Sampler, Sampling
from tests import helpers

CPU = torch.device("cpu")
MAX_NEW = 24
# Seven requests of different lengths, two of them a question's second turn (turn=1), so that slots take new requests
# while others decode (continuous batching) and rows differ in length and in tree size.
_g = torch.Generator().manual_seed(1)
PROMPTS = [torch.randint(3, 96, (int(n),), generator=_g).tolist() for n in (5, 31, 12, 44, 8, 20, 27)]
PROMPTS[2] = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 6]  # repeats, for the copying drafters
TURNS = [0, 0, 1, 0, 0, 1, 0]


def engines(model):
    return {"static": StaticEngine(model, pack=False), "hf": HFEngine(model)}


def within_request(proposer) -> bool:
    """Its drafts learn nothing from earlier requests (Token Recycling's hot matrix, SuffixDecoding's global tree and
    SpS's chain length do: ``Proposer.memory``)."""
    return proposer.memory == "none"


def batched(engine, proposer, batch: int, sampling: Sampling | None = None, chunk: int = 0):
    """Every request decoded in ``batch`` slots (``tests.helpers.batched`` over this file's requests)."""
    return helpers.batched(engine, proposer, batch, PROMPTS, MAX_NEW, TURNS, sampling, chunk)


def one_by_one(engine, proposer, sampling: Sampling | None = None):
    return [generate(engine, proposer, p, max_new_tokens=MAX_NEW, stop_ids=set(), turn=TURNS[i],
                     sampler=Sampler(sampling, i, TURNS[i]) if sampling else None) for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def vanilla(tiny_models):
    """Batch-1 vanilla greedy on each tiny model depth used, per engine."""
    cache = {}

    def get(layers, engine_name):
        if (layers, engine_name) not in cache:
            model = tiny_models(layers)
            proposer = build_proposer("vanilla", {}, vocab_size=96, device=CPU)
            cache[layers, engine_name] = [g.token_ids for g in one_by_one(engines(model)[engine_name], proposer)]
        return cache[layers, engine_name]

    return get


@pytest.mark.parametrize("engine_name", ["static", "hf"])
@pytest.mark.parametrize("method", list(registry()))
def test_every_method_is_lossless_at_every_batch_size(tiny_models, vanilla, tmp_path, method, engine_name):
    cls = registry()[method]
    layers = max(2, cls.min_layers)
    model = tiny_models(layers)
    engine = engines(model)[engine_name]
    params = cls.example(tmp_path, PROMPTS)
    reference = vanilla(layers, engine_name)
    first = build_proposer(method, params, vocab_size=96, device=CPU, target=model)
    alone = one_by_one(engine, first)
    for batch, chunk in ((2, 8), (4, 0), (8, 5)):  # prompts whole and alone, or in chunks along the steps
        proposer = build_proposer(method, params, vocab_size=96, device=CPU, target=model)
        got = batched(engine, proposer, batch, chunk=chunk)
        assert [g.token_ids for g in got] == reference, f"batch {batch}"
        most = max(max(g.batch_rows or [1]) for g in got)  # the rows were batched (in chunks, a long prompt may
        assert most == min(batch, len(PROMPTS)) if not chunk else most > 1  # join after short requests finished)
        if within_request(first):
            assert [g.accept_lengths for g in got] == [g.accept_lengths for g in alone], f"batch {batch}"
    if cls.drafts:
        assert max(n for g in alone for n in g.draft_nodes) > 1, "nothing drafted"


@pytest.mark.parametrize("method", ["vanilla", "tr", "pld", "lookahead", "eagle2"])
def test_sampled_rows_draw_what_they_draw_alone(tiny_models, tmp_path, method):
    """At temperature > 0 a row's draws are keyed by its question, turn and position, so that the rows it shares a
    batch with change none of them."""
    cls = registry()[method]
    model = tiny_models(max(2, cls.min_layers))
    engine = engines(model)["static"]
    params = cls.example(tmp_path, PROMPTS)
    settings = Sampling(temperature=1.0, top_p=0.95, seed=4)
    reference = [g.token_ids for g in one_by_one(engine, build_proposer("vanilla", {}, vocab_size=96, device=CPU),
                                                 settings)]
    got = batched(engine, build_proposer(method, params, vocab_size=96, device=CPU, target=model), 4, settings, 7)
    assert [g.token_ids for g in got] == reference


def test_each_tr_row_learns_from_its_own_tokens(tiny_model):
    """With a cold start each slot's matrix is its own, cleared at every first turn: each first turn drafts at
    B = 4 exactly as at batch size 1 (the same accept lengths), so a row's verified nodes and their top-K reach its
    own matrix, and a hot start's MAT under load moves only because its matrix is shared."""
    engine = engines(tiny_model)["static"]
    alone = one_by_one(engine, build_proposer("tr", {"start": "cold"}, vocab_size=96, device=CPU))
    got = batched(engine, build_proposer("tr", {"start": "cold"}, vocab_size=96, device=CPU), 4)
    first = [i for i, turn in enumerate(TURNS) if turn == 0]
    assert [got[i].accept_lengths for i in first] == [alone[i].accept_lengths for i in first]
    assert max(max(g.batch_rows or [1]) for g in got) == 4 and max(n for i in first for n in got[i].accept_lengths) > 1


def test_batch_one_is_the_one_request_loop(tiny_model):
    """decode_batch with one slot is generate: the same tokens, steps and draft sizes."""
    engine = engines(tiny_model)["static"]
    alone = one_by_one(engine, build_proposer("tr", {}, vocab_size=96, device=CPU))
    got = batched(engine, build_proposer("tr", {}, vocab_size=96, device=CPU), 1)
    assert [(g.token_ids, g.accept_lengths, g.draft_nodes) for g in got] == \
        [(g.token_ids, g.accept_lengths, g.draft_nodes) for g in alone]
    assert all(g.batch_rows is None for g in got)


@pytest.mark.parametrize("engine_name", ["static", "hf"])
def test_padding_is_counted(tiny_model, engine_name):
    """Each step records its forward's rows and the drafts' token positions it computed: on the hf engine the widest
    row's nodes times the rows (padded), on the static engine (ragged) the sum of the rows' nodes, the prompt chunks
    that rode along left out."""
    engine = engines(tiny_model)[engine_name]
    got = batched(engine, build_proposer("pld", {}, vocab_size=96, device=CPU), 3, chunk=4)
    steps = [(r, s, n) for g in got for r, s, n in zip(g.batch_rows, g.forward_slots, g.draft_nodes) if r]
    assert all(s >= r * 1 and s >= n for r, s, n in steps)
    if engine.ragged:  # a step's slots are the sum of its rows' nodes: a row wider than the others has more
        assert any(s < r * n for r, s, n in steps)
    else:  # every row padded to the widest
        assert all(s >= r * n for r, s, n in steps) and any(s > r * n for r, s, n in steps)


# --- the runner: runtime.batch_size on the embedded model ------------------------------------------------------

BATCH_RUN = ["bench.question_ids=[81,82,161,277,321]", "bench.max_new_tokens=10", "warmup=0", "runtime.progress=false"]
TR = ["method=tr", "method.tree=grown-n30-d6", "runtime.batch_size=3"]


@pytest.mark.slow
def test_a_killed_batched_run_resumes_without_losing_or_repeating_an_answer(tmp_path, monkeypatch, reuse_embedded):
    """Questions are written as their last turn finishes, whatever the other slots hold; a run killed after two
    answers keeps them, and the rerun answers every other question once, each token-identical to vanilla's."""
    from evaluation.records.answers import AnswerWriter, read_answers
    from evaluation.running.config import compose_config
    from evaluation.running.runner import run

    ref = tmp_path / "vanilla"
    run(compose_config([*BATCH_RUN, "method=vanilla"]), ref)
    out, real_append, written = tmp_path / "tr", AnswerWriter.append, []

    def append_then_kill(self, rec):
        real_append(self, rec)
        written.append(rec["question_id"])
        if len(written) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(AnswerWriter, "append", append_then_kill)
    with pytest.raises(KeyboardInterrupt):
        run(compose_config([*BATCH_RUN, *TR]), out)
    monkeypatch.setattr(AnswerWriter, "append", real_append)
    assert [r["question_id"] for r in read_answers(out)] == written
    run(compose_config([*BATCH_RUN, *TR]), out)
    got, want = read_answers(out), read_answers(ref)
    assert sorted(r["question_id"] for r in got) == sorted(r["question_id"] for r in want)  # each once
    assert {r["question_id"]: r["choices"][0]["token_ids"] for r in got} == \
        {r["question_id"]: r["choices"][0]["token_ids"] for r in want}
    assert len({r["clock"]["segment"] for r in got}) == 2 and {r["clock"]["batch_size"] for r in got} == {3}
    assert max(max(r["choices"][0].get("batch_rows", [1])) for r in got) == 3
    multi = [r for r in got if len(r["choices"][0]["turns"]) == 2]
    assert multi and all(r["clock"]["turns"][0][1] <= r["clock"]["turns"][1][0] for r in multi)  # turn 2 after 1


def test_batch_stats_count_every_forward_once():
    """Two rows sharing forwards: 3 forwards of width 4 (one a row alone), so 12 positions, 7 of them real."""
    from evaluation.records.metrics import batch_stats

    def rec(seg, turns, nodes, rows, slots, first, wall, new):
        return {"clock": {"segment": seg, "turns": turns, "batch_size": 2},
                "choices": [{"new_tokens": new, "wall_time": wall, "first_token_time": first,
                             "draft_nodes": nodes, "batch_rows": rows, "forward_slots": slots}]}

    records = [rec("a", [[0.0, 2.0]], [0, 4, 2], [0, 2, 2], [0, 8, 8], [0.5], [2.0], [9]),
               rec("a", [[0.5, 3.0]], [0, 1, 4, 3], [0, 2, 2, 1], [0, 8, 8, 4], [1.0], [2.5], [6]),
               rec("b", [[10.0, 11.0]], [0], [0], [0], [0.25], [1.0], [1])]
    s = batch_stats(records)
    assert s["throughput"] == 16 / (3.0 + 1.0)  # both parts of the run, each from its first start to its last end
    assert s["forward_tokens"] == (8 + 8 + 4) / 3 and s["padding"] == pytest.approx(1 - 14 / 20)
    assert s["ttft_p50"] == 0.5 and s["tpot_mean"] == pytest.approx(((2.0 - 0.5) / 8 + (2.5 - 1.0) / 5) / 2)


def test_tree_cost_is_measured_for_the_batch(tiny_model):
    """tree=auto's cost under load: one forward verifies every row's star of N tokens."""
    from methods.autotree import measure_cost

    engine = StaticEngine(tiny_model, pack=False)
    rows = measure_cost(engine, sizes=(1, 4), contexts=(16,), repeats=1, rows=3)
    assert [(r["rows"], r["tokens"]) for r in rows] == [(3, 1), (3, 4)] and engine.last_slots == 12
    assert engine.cache.lengths == [16, 16, 16]  # the drafts were dropped again


def test_a_batched_turns_time_is_not_read_as_a_slow_step():
    """In a batch a turn's wall time includes the rows beside it (a short answer waits for none, but shares every
    forward): the busy-machine signal of a turn much slower per step than the median is not taken from it."""
    from evaluation.records.metrics import load_stats

    def rec(batch, seconds):
        return {"clock": {"segment": "a", "turns": [[0.0, seconds]], "batch_size": batch},
                "choices": [{"decode_time": [seconds], "decoding_steps": [9], "prefill_step": [True],
                             "wall_time": [seconds], "new_tokens": [9]}]}

    alone = [rec(1, 1.0), rec(1, 1.0), rec(1, 9.0)]
    assert load_stats(alone)["step_spread"] == 9.0
    assert load_stats([rec(8, s) for s in (1.0, 1.0, 9.0)])["step_spread"] is None


def test_packed_weights_serve_the_forwards_they_won():
    """engine.pack=auto on a machine where plain won one token and packed won 8 and 32 (an AMX Xeon, fp32): the
    batch's many-token forwards get the packed kernel, a lone sequence's one-token steps the plain one."""
    from methods.engine.tuning import pack_from

    amx = {"pack": False, "ms": {"packed": {"1": 39.9, "8": 47.7, "32": 75.2}, "plain": {"1": 29.4, "8": 54.5,
                                                                                     "32": 76.8}}}
    assert pack_from(amx) == 8
    assert pack_from({"pack": True, "ms": {"packed": {1: 1.0, 8: 3.0}, "plain": {1: 2.0, 8: 2.0}}}) is None
    assert pack_from({"pack": True, "ms": {"packed": {1: 1.0, 8: 1.0}, "plain": {1: 2.0, 8: 2.0}}}) == 1
    assert pack_from({"pack": True}) == 1 and pack_from({"pack": False}) is None  # no times: as it says
