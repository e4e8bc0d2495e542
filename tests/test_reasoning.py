"""Reasoning workloads: SpecTTS-Bench's questions, its paradigms (thinking twice, Best-of-N, the reference's own loop,
a forced end of thinking) token-identical to vanilla, the numbers long outputs need, and acceptance simulated over
recorded answers equal to decoding, on the embedded model and tiny random ones."""
import pytest
import torch

from evaluation.records.bench import QUESTION_FILES, fetch, load_bench, read_questions, sha256
from evaluation.records.grading import grade, repetition
from evaluation.records.metrics import long_stats, position_table
from evaluation.running.config import compose_config
from evaluation.running.paradigms import THINK_TWICE, Paradigm, final_answer, paradigm
from evaluation.running.runner import Runner
from methods.base import build_proposer
from methods.common import HarnessError
from methods.decode import Request, decode_all
from methods.engine import StaticEngine
from tests.helpers import tiny_llama

QUESTIONS = load_bench(None, "spec_tts", question_ids=[1, 61])  # an AIME 2024 and a MATH-500 question


def test_the_question_file_is_specs_and_pinned():
    questions = read_questions(fetch("spec_tts"))
    assert sha256(fetch("spec_tts")) == QUESTION_FILES["spec_tts"].sha256
    assert [(q.category, q.question_id) for q in questions[::30]] == [("aime24", 1), ("aime25", 31), ("math500", 61),
                                                                      ("gpqa", 91)]
    assert all(q.solution for q in questions) and len(questions) == 120
    sample = load_bench(None, "spec_tts", limit_per_category=2)  # spec_tts_sample
    assert [q.question_id for q in sample] == [1, 2, 31, 32, 61, 62, 91, 92]


def test_answers_are_graded_against_the_solutions():
    aime24, aime25, math500, gpqa = (load_bench(None, "spec_tts", question_ids=[i])[0] for i in (1, 31, 63, 91))
    assert grade(aime24, r"... so the answer is \boxed{204}.") and not grade(aime24, r"\boxed{205}")
    assert grade(aime25, r"\boxed{70}") and not grade(aime25, "70, unboxed")
    assert grade(math500, r"thus $\boxed{\dfrac{14}{3}}$") and not grade(math500, r"\boxed{\frac{3}{14}}")
    assert grade(gpqa, r"\boxed{10^-4 eV}") and not grade(gpqa, r"\boxed{10^-8 eV}")
    assert grade(load_bench(None, question_ids=[81])[0], r"\boxed{1}") is None  # Spec-Bench's: no solution
    assert repetition([5, 6, 7, 8] * 10)["distinct_4grams"] < 0.3 and repetition(list(range(40)))["longest_repeat"] == 0


def test_thinking_twice_asks_again_with_the_final_answer():
    assert final_answer("<think>a</think>The answer is 5.", "</think>") == "The answer is 5."
    assert final_answer("thinking ran out", "</think>") == ""  # as the reference: no round-2 sentence then
    assert final_answer("The answer is 5.", None) == "The answer is 5."  # a model that does not think
    assert THINK_TWICE.startswith("\nPreviously I tried to solve the problem.") and "<answer> {answer} </answer>" \
        in THINK_TWICE


@pytest.mark.parametrize("bench, sampling, message", [
    ({"num_choices": 4}, {}, "bench.num_choices=4 at temperature 0 would give 4 equal answers"),
    ({"rounds": 0}, {}, "bench.rounds must be 1 or more, got 0"),
    ({"bon_reference": True}, {"temperature": 0.6}, "bench.bon_reference=true is SpecTTS-Bench's Best-of-N loop"),
    ({"force_end_of_thinking": True}, {}, "needs the model's end-of-thinking text"),
])
def test_paradigms_that_cannot_run_are_one_line(bench, sampling, message):
    from methods.sampling import Sampling

    with pytest.raises(HarnessError, match=message.replace("(", r"\(").replace(")", r"\)")):
        paradigm(bench, Sampling(**sampling), QUESTIONS, None)
    with pytest.raises(HarnessError, match="questions \\[81\\] have several turns"):
        paradigm({"rounds": 2}, Sampling(), load_bench(None, question_ids=[81]), None)


def test_questions_without_a_solution_are_said_once(tmp_path):
    from evaluation.running.runner import ungraded

    f = tmp_path / "q.jsonl"
    f.write_text('{"question_id": 1, "category": "aime24", "turns": ["What is 1+1?"], "solution": "2"}\n'
                 '{"question_id": 2, "category": "aime24", "turns": ["What is 2+2?"]}\n')
    cfg = compose_config(["bench=spec_tts_smoke", f"bench.path={f}"])
    [line] = ungraded(cfg, read_questions(f))
    assert line.startswith(f"1 of 2 question(s) of {f} have no 'solution' (2): their answers are not graded")
    assert ungraded(compose_config([]), load_bench(None, question_ids=[81])) == []  # Spec-Bench: nothing to grade


def runner(embedded, *overrides, batch=1) -> Runner:
    model, tok, _ = embedded
    cfg = compose_config(["bench=spec_tts_smoke", "bench.max_new_tokens=16", "model.device=cpu",
                          "model.dtype=float32", f"runtime.batch_size={batch}", *overrides])
    return Runner(cfg, loaded=(model, tok, torch.device("cpu")))


def decoded(r: Runner, questions=QUESTIONS) -> dict:
    out = []
    r.answer_all(questions, out.append)
    return {rec["question_id"]: rec for rec in out}


@pytest.mark.slow  # the embedded model
@pytest.mark.parametrize("paradigm_overrides, batch", [
    (["bench.rounds=2"], 1),
    (["bench.num_choices=4", "sampling.temperature=0.6"], 4),
    pytest.param(["bench.num_choices=3", "bench.bon_reference=true", "sampling.temperature=0.6"], 1,
                 marks=pytest.mark.long),  # the same loop as thinking twice, its prompts repeating the question
], ids=["think-twice", "best-of-4", "reference-loop"])
def test_every_paradigm_is_token_identical_to_vanilla(embedded, paradigm_overrides, batch):
    """Thinking twice (greedy), Best-of-4 at temperature 0.6 as a batch of 4, and the reference's loop: each method's
    answers equal vanilla's under the same settings, turn for turn; Best-of-N's samples differ from each other."""
    vanilla = decoded(runner(embedded, "method=vanilla", *paradigm_overrides, batch=batch))
    first = vanilla[1]
    turns = first["choices"][0]["token_ids"]
    assert first["paradigm"]["choice"] == ([0, 0] if "bench.rounds=2" in paradigm_overrides else
                                           [0, 1, 2, 3] if batch == 4 else [0, 0, 0])
    if "sampling.temperature=0.6" in paradigm_overrides:
        assert len({tuple(t) for t in turns}) == len(turns), "the samples are all alike"
    for method in (["method=tr", "method.tree=grown-n30-d6"], ["method=pld"]):  # a learning drafter, a copying one
        got = decoded(runner(embedded, *method, *paradigm_overrides, batch=batch))
        for qid, rec in vanilla.items():
            assert got[qid]["choices"][0]["token_ids"] == rec["choices"][0]["token_ids"], (method, qid)
    assert first["choices"][0]["correct"] == [False] * len(turns)  # graded (a 135M model does not solve AIME)


def test_a_forced_end_of_thinking_is_fed_step_by_step_and_stays_lossless():
    """Past the threshold, each step's root is the next forced token (the target's own dropped) and commits only its
    bonus token: vanilla and Token Recycling give the same tokens, the forced ones in place."""
    model = tiny_llama("llama-3-8b-instruct", vocab_size=512)
    engine = StaticEngine(model)
    prompt, forced = list(range(100, 140)) * 2, [7, 8, 9]
    outs = {}
    for method in ("vanilla", "tr"):
        p = build_proposer(method, {}, vocab_size=512, device=torch.device("cpu"), target=model)
        [outs[method]] = decode_all(engine, [p], [Request(prompt, 24, force=(10, forced))], stop_ids=set())
    v, t = outs["vanilla"], outs["tr"]
    assert v.token_ids == t.token_ids and v.token_ids[10:13] == forced
    forced_steps = [i for i, info in enumerate(t.step_info or []) if info and info.get("forced")]
    assert len(forced_steps) == 3 and all(t.accept_lengths[i] == 1 for i in forced_steps)


@pytest.mark.slow  # the embedded model
def test_long_output_numbers_and_simulated_acceptance(embedded, tmp_path):
    """On the embedded model's answers: the numbers by position and the reasoning table's are computed from the
    per-step records; PLD's, SAM's and SuffixDecoding's acceptance simulated over vanilla's answers equals their
    decoding, step for step."""
    from evaluation.reporting.simulate import simulate
    from evaluation.running.config import method_params

    tok = embedded[1]
    runs = {m: decoded(runner(embedded, f"method={m}", "bench.max_new_tokens=64"))
            for m in ("vanilla", "pld", "sam", "suffix")}
    base = list(runs["vanilla"].values())
    stats = long_stats(list(runs["pld"].values()), base)
    assert stats["mat"] > 1 and stats["speedup"] > 0 and 0 <= stats["long_range"] <= 1
    assert stats["itl_p99"] >= stats["itl_p50"] >= 0 and stats["accept_rate_1"] >= stats["accept_rate_2"]
    positions = position_table(base, 16)
    assert list(positions.index[:2]) == [0, 16] and (positions["mat"] == 1).all()
    r = runner(embedded, "method=vanilla", "bench.max_new_tokens=64")
    prompts = {(q.question_id, 0): Paradigm().prompt(r.spec, r.tok, q, 0, [], r.marker) for q in QUESTIONS}
    for method in ("pld", "sam", "suffix"):  # suffix: its global tree fed in the run's order, as in the run
        cfg = compose_config(["model=smollm2-135m", f"method={method}"])
        name, params = method_params(cfg)
        sim = simulate(base, prompts, lambda: build_proposer(name, params, vocab_size=len(tok),
                                                             device=torch.device("cpu")))
        for rec in sim:
            assert rec["choices"][0]["accept_lengths"] == runs[method][rec["question_id"]]["choices"][0][
                "accept_lengths"], (method, rec["question_id"])
