"""method.tree=auto: the cost curve, the choice (a plain step when nothing beats it), the saved tree, losslessness."""
import json
from functools import partial

import pytest
import torch

import evaluation.running.runner
from evaluation.records.answers import read_answers
from evaluation.records.equality import compare
from evaluation.running.config import compose_config
from evaluation.running.runner import run
from methods import calibrate
from methods.autotree import choose_tree, cost_curve, expected_length
from methods.base import build_proposer
from methods.tree import Tree, load_template

CPU = torch.device("cpu")


def test_cost_curve_interpolates_and_never_falls():
    rows = [{"tokens": 1, "ms": 10.0}, {"tokens": 4, "ms": 10.0}, {"tokens": 8, "ms": 30.0}, {"tokens": 16, "ms": 20.0}]
    c = cost_curve(rows)
    assert sorted(c) == list(range(1, 17))
    assert c[2] == 10.0 and c[6] == pytest.approx(17.5)
    assert c[8] == c[12] == c[16] == 25.0  # 30 then 20 violate the order: pooled into their mean
    # one slow sample early does not make every larger size dear; the fastest repeat is taken
    spiky = [{"tokens": n, "ms": 99.0, "ms_min": m} for n, m in [(1, 10.0), (2, 11.0), (3, 19.0), (4, 12.0), (8, 14.0)]]
    c = cost_curve(spiky)
    assert c[3] == c[4] == c[8] == pytest.approx(15.0) and c[1] == 10.0 and c[2] == 11.0  # (19 + 12 + 14) / 3


def test_expected_length_by_hand():
    p = [[0.5, 0.2], [0.4, 0.1]]
    tree = Tree.from_parents((-1, 0, 0, 1))  # d1 r0 (0.5), d1 r1 (0.2), d2 r0 under the first (0.5 * 0.4)
    assert expected_length(p, tree) == pytest.approx(1 + 0.5 + 0.2 + 0.2)
    assert expected_length(p, Tree.from_parents((-1,))) == 1.0


def test_choice_follows_the_cost_and_falls_back_to_the_plain_step():
    p = [[0.5]]  # one rank: chains, E(n) = 1 + 0.5 + 0.25 + ...
    pick = lambda cost: choose_tree(p, cost, k=1)  # noqa: E731
    # 10 ms per token forwarded: no draft pays for itself
    steep = pick({n: 10.0 * n for n in range(1, 9)})
    assert steep["drafts"] == 0 and steep["tree"].size == 1 and steep["expected_speedup"] == 1.0
    # 1.5 tokens for 12 ms (0.125/ms) beats 1 for 10 (0.1) and 1.75 for 16 (0.109)
    mid = pick({1: 10.0, 2: 12.0, 3: 16.0, 4: 40.0})
    assert mid["drafts"] == 1 and mid["tree"].parents == (-1, 0)
    assert mid["expected_speedup"] == pytest.approx(0.125 / 0.1)
    # free drafts: the deepest chain allowed
    flat = pick({n: 10.0 for n in range(1, 17)})
    assert flat["tree"].parents == Tree.chain(9).parents  # depth capped at 8
    assert [s["drafts"] for s in flat["scores"]] == list(range(16))


def test_measured_candidates_decide_when_given():
    """Scored by the MAT each candidate reached, not by the model's E(n)."""
    p = [[0.9, 0.5]]
    cost = {n: 10.0 + n for n in range(1, 40)}
    model = choose_tree(p, cost, k=2)
    assert model["drafts"] > 2  # the model believes in big trees
    measured = choose_tree(p, cost, k=2, measured={1: 1.5, 2: 1.2, 8: 1.6})
    assert [s["drafts"] for s in measured["scores"]] == [0, 1, 2, 8]
    assert measured["drafts"] == 1 and measured["expected_speedup"] == pytest.approx((1.5 / 12) / (1 / 11))
    assert choose_tree(p, cost, k=2, measured={1: 1.05, 4: 1.2})["drafts"] == 0  # nothing beats a plain step


def test_one_measurement_per_process_for_engines_that_cost_the_same(tiny_model, monkeypatch):
    """Two methods side by side on one model (two static engines) share one cost measurement, so that tree=auto
    with and without a budget draft the same tree; another batch size, engine kind or thread count is measured
    on its own."""
    from methods.engine import HFEngine, StaticEngine

    measured = []
    monkeypatch.setattr(calibrate, "_COSTS", {})
    monkeypatch.setattr(calibrate, "measure_cost", lambda engine, rows=1: measured.append((engine, rows)) or [])
    a, b, hf = StaticEngine(tiny_model), StaticEngine(tiny_model), HFEngine(tiny_model)
    assert calibrate.engine_cost(a, 2) is calibrate.engine_cost(b, 2) and measured == [(a, 2)]
    calibrate.engine_cost(b, 4)
    calibrate.engine_cost(hf, 2)
    b.threads = (a.threads or torch.get_num_threads()) + 1
    calibrate.engine_cost(b, 2)
    assert measured == [(a, 2), (b, 4), (hf, 2), (b, 2)]
    key = next(iter(calibrate._COSTS))
    calibrate._COSTS[key] = (lambda: None, [])  # the model measured under this key was freed
    calibrate.engine_cost(a, 2)
    assert measured[-1] == (a, 2)  # a model that took its id is measured anew


def test_tr_keeps_the_chosen_tree_in_its_state():
    auto = build_proposer("tr", {"tree": "auto"}, vocab_size=96, device=CPU)
    assert auto.tree.size == 1  # a plain step until a tree is chosen
    paper = load_template("paper")
    auto.set_tree(paper, {"drafts": paper.size - 1})
    state = auto.state_dict()
    resumed = build_proposer("tr", {"tree": "auto"}, vocab_size=96, device=CPU)
    resumed.load_state_dict(state)
    assert resumed.tree.parents == paper.parents and resumed.summary()["auto"] == {"drafts": paper.size - 1}
    fixed = build_proposer("tr", {"tree": "grown-n30-d6"}, vocab_size=96, device=CPU)
    with pytest.raises(ValueError, match="drafts with another tree than 'grown-n30-d6'"):
        fixed.load_state_dict(state)


@pytest.mark.slow
@pytest.mark.long  # the choice and its cost: the tests above; the shipped calibration: the test below
def test_auto_run_on_the_embedded_model(tmp_path, monkeypatch, capsys, reuse_embedded):
    """Calibrated on our own prompts (cached), costed on this engine, saved as tree.json, and lossless; the
    calibration says so when it starts and, with no terminal, logs a line per tree."""
    monkeypatch.setattr(calibrate, "PROMPTS", 4)
    monkeypatch.setattr(calibrate, "TOKENS", 12)
    monkeypatch.setattr(calibrate, "CANDIDATES", (1, 3))
    monkeypatch.setattr(calibrate, "CANDIDATE_PROMPTS", 3)
    monkeypatch.setattr(calibrate, "CANDIDATE_TOKENS", 8)
    # the engine's cost at the sizes the candidates' trees (1 and 3 drafts) are costed from, once each
    monkeypatch.setattr(calibrate, "measure_cost", partial(calibrate.measure_cost, sizes=(1, 2, 4, 8), repeats=1))
    monkeypatch.setattr(evaluation.running.runner, "CACHE", tmp_path / "cache")  # the runner's Preparation.cache
    common = ["bench.question_ids=[81,161,321]", "bench.max_new_tokens=24", "warmup=1", "runtime.progress=false"]
    auto = run(compose_config(["method=tr", "method.tree=auto", *common]), tmp_path / "auto")
    said = capsys.readouterr().out
    assert "tree=auto: calibrating smollm2-135m with K=8, start=hot (once; cached in" in said
    assert "tree=auto calibration: probe tree (1/3, " in said and "tree=auto calibration: 3 drafts: MAT" in said
    vanilla = run(compose_config(["method=vanilla", *common]), tmp_path / "vanilla")
    assert compare(read_answers(vanilla), read_answers(auto))[2] == []
    state = json.loads((auto / "summary.json").read_text())["method_state"]
    choice = state["auto"]
    saved = json.loads((auto / "tree.json").read_text())
    assert saved["parents"] == state["tree_parents"] and len(saved["parents"]) == choice["drafts"] + 1
    best = max(choice["scores"], key=lambda s: s["tokens_per_ms"])
    assert best["drafts"] == choice["drafts"] and [s["drafts"] for s in choice["scores"]] == [0, 1, 3]
    assert all(s["mat"] >= 1 for s in choice["scores"]) and choice["mat_source"] == "calibration decode"
    assert choice["calibration"]["prompts"].startswith("evaluation.running.own_prompts.calibration_prompts(4)")
    assert len(list((tmp_path / "cache" / "autotree").glob("*.json"))) == 1
    # the saved tree is a template a later run can draft with
    assert load_template(str(auto / "tree.json")).parents == tuple(saved["parents"])


@pytest.mark.slow
def test_the_embedded_defaults_never_calibrate(tmp_path, monkeypatch, reuse_embedded):
    """The embedded model's calibration for the shipped TR defaults comes with the project (data/autotree/):
    a first tree=auto run only measures this machine's cost."""
    from evaluation.running.runner import Runner

    def no_decoding(*args, **kwargs):
        raise AssertionError("tree=auto calibrated although the project ships this calibration")

    monkeypatch.setattr(evaluation.running.runner, "CACHE", tmp_path / "empty-cache")
    monkeypatch.setattr(calibrate, "_decode", no_decoding)
    monkeypatch.setattr(calibrate, "measure_cost", partial(calibrate.measure_cost, sizes=(1, 4, 16, 32), repeats=1))
    runner = Runner(compose_config(["method=tr", "method.tree=auto"]))
    shipped = list(calibrate.SHIPPED.glob(f"{runner.spec.name}-k{runner.proposer.k}-{runner.proposer.start}-*.json"))
    assert len(shipped) == 1
    saved = json.loads(shipped[0].read_text())
    assert runner.proposer.auto["calibration"] == saved["source"]
    assert runner.proposer.tree.size == runner.proposer.auto["drafts"] + 1
    assert set(saved["measured"]) == {str(n) for n in calibrate.CANDIDATES}
