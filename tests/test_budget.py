"""The per-step draft budget (``methods.budget``, ``runtime.budget``, ``runtime.spec_off_above``): the choice on worked
examples, the cut of a draft, and every method lossless under it at every batch size on both engines, greedy and
sampled."""
import json
import math

import pytest
import torch

from methods import budget as budget_module
from methods.base import Draft, build_proposer, registry
from methods.budget import Budget, Cost, Odds, Offer, choose, cut
from methods.calibrate import row_counts
from methods.decode import Request, decode_all
from methods.sampling import Sampler, Sampling
from methods.tree import Tree
from tests.test_batch import MAX_NEW, PROMPTS, TURNS, engines

CPU = torch.device("cpu")


def chain(n: int, keys=None) -> Offer:
    return Offer(tuple(range(-1, n - 1)), list(range(n)), keys or [0] * n, [True] * n)


def kept(offers, cost, odds=None, **kw) -> list[list[int]]:
    return [k for k, _ in choose(offers, odds or Odds(), cost, **kw)[0]]


# ------------------------------------------------------------------ the choice, on worked examples
# With no history every node's odds given its parent are the prior, 0.5: a chain's nodes are worth 0.5, 0.25, 0.125...


def test_a_free_forward_keeps_everything_and_a_dear_one_nothing():
    offers = [chain(4), Offer((-1, 0, 0, 1), [0, 1, 1, 2], [0] * 4, [True] * 4)]
    assert kept(offers, lambda rows, slots: 7.0) == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert kept(offers, lambda rows, slots: 1.0 * slots) == [[0], [0]]  # a draft token costs a whole plain step


def test_the_known_best_prefix_of_a_chain():
    # One row, cost 1 + 0.1 per draft token: keeping n of the chain gives (1 + 0.5 + ... + 0.5**n) / (1 + 0.1 n):
    # n = 0: 1.0, 1: 1.364, 2: 1.458, 3: 1.442, 4: 1.382: two.
    assert kept([chain(6)], lambda rows, slots: 1 + 0.1 * (slots - rows)) == [[0, 1, 2]]


def test_the_rows_compete_for_one_forward():
    # A row whose first draft was always accepted (key 1) against one whose never was (key 2): with a cost that pays
    # for odds above 0.4 only, the sure row keeps its chain and the other none.
    odds = Odds()
    for _ in range(40):
        odds.learn((-1, 0, 1), [0, 1, 2], [0, 1, 1], [True] * 3, [0, 1, 2])
        odds.learn((-1, 0), [0, 1], [0, 2], [True] * 2, [0])
    assert odds.p(1, 1) > 0.9 and odds.p(1, 2) < 0.2
    got = kept([chain(3, [0, 1, 1]), chain(3, [0, 2, 2])], lambda rows, slots: rows + 0.8 * (slots - rows), odds)
    assert got == [[0, 1, 2], [0]]


def test_a_whole_draft_is_kept_whole_or_not_at_all():
    window = Offer((-1, 0, 0, 0, 1), [0, 1, 1, 1, 2], [0] * 5, [True, True, False, False, False], whole=True)
    assert kept([window], lambda rows, slots: 1.0) == [[0, 1, 2, 3, 4]]
    assert kept([window], lambda rows, slots: 1 + 0.2 * (slots - rows)) == [[0]]  # 0.5 for 4 tokens: 1.5/1.8


def test_sampled_siblings_are_kept_in_their_order():
    # Root's children 1 and 2 drawn in that order; 1's key never accepted, 2's always: without order 2 alone would
    # be kept, with it 2 only after 1.
    odds = Odds()
    for _ in range(40):
        odds.learn((-1, 0, 0), [0, 1, 1], [0, 1, 2], [True] * 3, [0, 2])
    star = Offer((-1, 0, 0), [0, 1, 1], [0, 1, 2], [True] * 3)
    cost = lambda rows, slots: rows + 0.3 * (slots - rows)  # noqa: E731
    assert kept([star], cost, odds) == [[0, 2]]
    star.ordered = True
    assert kept([star], cost, odds) in ([[0]], [[0, 1, 2]])


def test_a_padded_engine_pays_for_its_widest_row():
    # hf computes every row at the widest row's size: one long row costs as if both were long.
    # ragged: + 0.5 for 1 token: 2.5 / 2.2, + 0.25: 2.75 / 2.4 (best); padded: 2.5 / 2.4 (best), 2.75 / 2.8.
    cost = lambda rows, slots: rows + 0.2 * (slots - rows)  # noqa: E731
    ragged = kept([chain(3), chain(1)], cost, ragged=True)
    padded = kept([chain(3), chain(1)], cost, ragged=False, engine_rows=2)
    assert ragged == [[0, 1, 2], [0]] and padded == [[0, 1], [0]]


def test_unacceptable_nodes_are_never_worth_a_token():
    o = Offer((-1, 0, 1), [0, 1, 2], [0] * 3, [True, True, False])
    assert kept([o], lambda rows, slots: 1 + 1e-3 * slots) == [[0, 1]]


def test_the_cost_grid_is_interpolated_and_extrapolated():
    cost = Cost({1: {1: 10.0, 2: 12.0, 4: 20.0}, 4: {1: 30.0, 2: 40.0, 4: 80.0}})
    assert cost(1, 3) == 16.0 and cost(4, 8) == 40.0 and cost(1, 8) == 36.0
    assert cost(8, 8) == 2 * cost(4, 4)  # past the grid's rows: as many forwards' worth more
    assert Cost({1: {1: 5.0, 2: 4.0, 4: 9.0}})(1, 2) == 4.5  # a noisy dip pooled away: never cheaper for more
    assert row_counts(8, True) == [1, 2, 4, 8] and row_counts(6, True) == [1, 2, 4, 6] and row_counts(6, False) == [6]


def test_a_cut_draft_keeps_its_nodes_and_says_which():
    tree = Tree.from_parents((-1, 0, 0, 1, 2))
    q = torch.arange(5.0)[:, None].expand(5, 3)
    draft = Draft(torch.tensor([7, 8, 9, 10, 11]), tree, q=q, keys=[0, 1, 2, 3, 4])
    small = cut(draft, [0, 2, 4])
    assert small.tokens.tolist() == [7, 9, 11] and small.tree.parents == (-1, 0, 1)
    assert small.kept == [0, 2, 4] and small.keys == [0, 2, 4] and small.q[:, 0].tolist() == [0.0, 2.0, 4.0]
    assert cut(draft, [0, 1, 2, 3, 4]) is draft


def test_settings_are_checked():
    from methods.budget import check_settings
    from methods.common import HarnessError

    with pytest.raises(HarnessError, match="runtime.budget=sometimes is not a budget; use one of off, auto"):
        check_settings("sometimes", None)
    with pytest.raises(HarnessError, match="runtime.spec_off_above=-1 must be a number of rows"):
        check_settings("off", -1)


# ------------------------------------------------------------------ lossless under the budget

# A cost where a draft token costs 0.3 of a row's plain step: the prior's first draft pays, its grandchildren do not,
# and what the odds learn moves the cut, so that drafts are cut at many places (checked below).
PARTIAL = Cost({r: {n: 10.0 * r + 3.0 * r * (n - 1) for n in (1, 2, 4, 8, 16, 32, 64, 128)} for r in (1, 2, 4, 8)})


def decode(engine, proposer, batch: int, budget: Budget, sampling: Sampling | None = None):
    proposers = [proposer] + [proposer.fork() for _ in range(batch - 1)]
    requests = [Request(p, MAX_NEW, t, Sampler(sampling, i, t) if sampling else None)
                for i, (p, t) in enumerate(zip(PROMPTS, TURNS))]
    return decode_all(engine, proposers, requests, stop_ids=set(), budget=budget)


@pytest.fixture(scope="module")
def reference(tiny_models):
    cache = {}

    def get(layers, engine_name, sampling=None):
        key = layers, engine_name, sampling
        if key not in cache:
            engine = engines(tiny_models(layers))[engine_name]
            vanilla = build_proposer("vanilla", {}, vocab_size=96, device=CPU)
            cache[key] = [g.token_ids for g in decode(engine, vanilla, 1, Budget(), sampling)]
        return cache[key]

    return get


@pytest.mark.parametrize("engine_name", ["static", "hf"])
@pytest.mark.parametrize("method", list(registry()))
def test_every_method_is_lossless_under_the_budget_at_every_batch_size(tiny_models, reference, tmp_path, method,
                                                                      engine_name, monkeypatch):
    """Token-identical to batch-1 vanilla with drafts cut at many places and steps taken plain without drafting (the
    proposer told so: ``Proposer.skipped``, counted here)."""
    cls = registry()[method]
    skipped = []
    monkeypatch.setattr(cls, "skipped", lambda self, draft, result, _own=cls.skipped: skipped.append(1) or
                        _own(self, draft, result))
    monkeypatch.setattr(budget_module, "FREE", 0.0)  # any drafting's time counts: a draft cut to nothing pauses it
    layers = max(2, cls.min_layers)
    model = tiny_models(layers)
    engine = engines(model)[engine_name]
    params = cls.example(tmp_path, PROMPTS)
    cuts = 0
    for batch in (1, 2, 4, 8):
        budget = Budget("auto", cost=PARTIAL, ragged=engine.ragged)
        got = decode(engine, build_proposer(method, params, vocab_size=96, device=CPU, target=model), batch, budget)
        assert [g.token_ids for g in got] == reference(layers, engine_name), f"batch {batch}"
        for g in got:
            assert len(g.expected_lengths) == len(g.accept_lengths)
            offered = g.offered_nodes or g.draft_nodes
            assert all(k <= o for k, o in zip(g.draft_nodes, offered))
            cuts += sum(1 < k < o for k, o in zip(g.draft_nodes, offered)) + sum(k == 1 < o for k, o in
                                                                                 zip(g.draft_nodes, offered))
    if cls.drafts:
        assert cuts, "the budget never cut a draft: the test proves nothing"
        assert skipped, "the budget never paused the drafting"


def test_the_slots_share_one_pause(tiny_model, reference, monkeypatch):
    """Drafts that never pay (a draft token costs a whole plain step): the rows draft the first two steps, then rest,
    and after each rest one row probes, not each slot on its own: 2 B + a probe per rest of asked drafts in all."""
    monkeypatch.setattr(budget_module, "FREE", 0.0)
    engine = engines(tiny_model)["static"]
    dear = Cost({r: {n: 10.0 * n for n in (1, 2, 4, 8, 16, 32, 64, 128)} for r in (1, 2, 4, 8)})
    batch = 4
    got = decode(engine, build_proposer("tr", {}, vocab_size=96, device=CPU), batch, Budget("auto", cost=dear))
    assert [g.token_ids for g in got] == reference(2, "static")
    offered = [g.offered_nodes or g.draft_nodes for g in got]  # None: no step of the request was cut
    asked = sum(o > 1 for steps in offered for o in steps)
    steps = max(map(len, offered)) * len(got)  # more than the batch's steps
    assert 2 * batch < asked <= 2 * batch + steps.bit_length(), asked


@pytest.mark.parametrize("method", ["tr", "pld", "lookahead", "eagle2", "sam_tr"])
def test_sampled_rows_under_the_budget_draw_what_vanilla_draws(tiny_models, reference, tmp_path, method):
    cls = registry()[method]
    model = tiny_models(max(2, cls.min_layers))
    engine = engines(model)["static"]
    settings = Sampling(temperature=1.0, top_p=0.95, seed=4)
    proposer = build_proposer(method, cls.example(tmp_path, PROMPTS), vocab_size=96, device=CPU, target=model)
    got = decode(engine, proposer, 4, Budget("auto", cost=PARTIAL), settings)
    assert [g.token_ids for g in got] == reference(max(2, cls.min_layers), "static", settings)


def test_drafting_stops_while_more_rows_than_the_switch_are_busy(tiny_model, reference):
    engine = engines(tiny_model)["static"]
    got = decode(engine, build_proposer("tr", {}, vocab_size=96, device=CPU), 4, Budget(off_above=3))
    assert [g.token_ids for g in got] == reference(2, "static")
    steps = [(r, n, o) for g in got for r, n, o in zip(g.batch_rows, g.draft_nodes, g.offered_nodes or g.draft_nodes)]
    assert all(n == 1 == o for r, n, o in steps if r > 3)  # four busy: no tree drafted
    assert any(n > 1 for r, n, _ in steps if 0 < r <= 3)  # the last three requests: verified


RUN = ["bench.question_ids=[81,161,277]", "bench.max_new_tokens=12", "warmup=0", "runtime.progress=false"]


def test_a_budgeted_run_records_its_cut_and_its_odds_survive_a_kill(tmp_path, monkeypatch, reuse_embedded):
    """``evaluation.run ... runtime.budget=auto`` on the embedded model: the engine's cost grid measured and kept in
    the summary, every turn token-identical to vanilla's, each step's drafted nodes and predicted accept length in
    the answers; killed after its first answer, the rerun loads the odds it had learned by then."""
    import evaluation.running.runner
    import methods.budget
    from evaluation.records.answers import AnswerWriter, read_answers
    from evaluation.running.config import compose_config
    from evaluation.running.runner import Runner, run
    from methods import calibrate

    # the grid measured here, into this test's cache, at three sizes (the run's cost model is what is tested)
    monkeypatch.setattr(evaluation.running.runner, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(calibrate, "BUDGET_SIZES", (1, 4, 16))
    monkeypatch.setattr(calibrate, "BUDGET_REPEATS", 1)
    # drafts that look sure at first, so that the first answer verifies some whatever a busy machine's grid says
    monkeypatch.setattr(methods.budget, "PRIOR", 0.95)
    ref = tmp_path / "vanilla"
    run(compose_config([*RUN, "method=vanilla"]), ref)
    budgeted = [*RUN, "method=pld", "runtime.budget=auto", "runtime.batch_size=2"]
    out, real_append = tmp_path / "pld", AnswerWriter.append

    def kill(self, rec):
        real_append(self, rec)
        raise KeyboardInterrupt

    monkeypatch.setattr(AnswerWriter, "append", kill)
    with pytest.raises(KeyboardInterrupt):
        run(compose_config(budgeted), out)
    monkeypatch.setattr(AnswerWriter, "append", real_append)
    loaded, real_restore = [], Runner._restore

    def restore(self, resume, *args):
        loaded.append(sum(v for _, _, v in resume["budget"]["tries"]))
        return real_restore(self, resume, *args)

    monkeypatch.setattr(Runner, "_restore", restore)
    run(compose_config(budgeted), out)
    assert loaded and loaded[0] > 0  # the odds learned before the kill
    got, want = read_answers(out), read_answers(ref)
    assert {r["question_id"]: r["choices"][0]["token_ids"] for r in got} == \
        {r["question_id"]: r["choices"][0]["token_ids"] for r in want}
    for r in got:
        c = r["choices"][0]
        assert len(c["offered_nodes"]) == len(c["expected_lengths"]) == len(c["draft_nodes"])
        assert all(k <= o for k, o in zip(c["draft_nodes"], c["offered_nodes"]))
        assert any(e is not None and e >= 1 for e in c["expected_lengths"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["budget"]["policy"] == "auto" and set(summary["budget"]["cost_ms"]) == {"1", "2"}
    assert set(summary["budget"]["cost_ms"]["2"]) == {"1", "4", "16"}
    assert len(list((tmp_path / "cache" / "budget").glob("*.json"))) == 1


def test_the_odds_replay_scores_each_node_before_its_step_teaches_the_odds():
    """``scripts.odds_replay``: a one-node draft accepted twice: predicted 0.5 (the prior), then what one hit taught."""
    from scripts.odds_replay import replay

    step = [((-1, 0), [0, 1], [0, 0], [True, True], [0, 1])]
    loss, by_depth = replay([step, step])
    second = Odds()
    second.forget()
    second.learn(*step[0])
    second.forget()
    p = second.p(1, 0)
    assert loss == pytest.approx((math.log(2) - math.log(p)) / 2)
    assert by_depth == {1: (pytest.approx((0.5 + p) / 2), 1.0, 2)}
