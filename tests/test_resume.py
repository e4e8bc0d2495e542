"""A resumed run is the run it would have been: stopped after any answer and resumed in a new runner, every answer
(its tokens and every step's accept length) equals an uninterrupted run's, at batch size 1 and 2, for the methods
that keep state across questions (Token Recycling's hot matrix, which a batch's slots share; SAM+TR; SuffixDecoding's
global tree, replayed from its log) and those
whose state lives in one request (Lookahead's pool, REST's retrievals), on the embedded model.

The stop lands just after an answer is written (``Runner.answer_all``'s ``checkpoint`` has saved its snapshot), as
Ctrl-C does in effect: a stop later in the step goes back to the same snapshot. The snapshot goes through the file
format the runner writes (``proposer_state.pt``, read back as tensors and plain values only); the command line's
kill and resume: tests/test_cli.py."""
import pytest
import torch

from evaluation.records.bench import load_bench
from evaluation.running.config import compose_config
from evaluation.running.runner import Runner
from methods.common import load_torch_safe, save_torch_atomic

# mt_bench's two turns, translation, summarization (its shortest prompt), qa
QUESTIONS = load_bench(None, question_ids=[81, 161, 277, 321])
STOP_AFTER = 1  # answers written before the stop
CASES = [["method=tr", "method.tree=grown-n30-d6"], ["method=sam_tr", "method.tree=grown-n30-d6"],
         ["method=suffix", "method.tree=true"], ["method=pia", "method.memory=run"], ["method=lookahead"],
         ["method=rest"]]


class Stop(Exception):
    pass


def runner(embedded, batch: int, overrides: list[str]) -> Runner:
    model, tok, _ = embedded
    cfg = compose_config([*overrides, "bench.max_new_tokens=24", "model.device=cpu", "model.dtype=float32",
                          f"runtime.batch_size={batch}"])
    return Runner(cfg, loaded=(model, tok, torch.device("cpu")))


def steps(records: list[dict]) -> dict:
    return {r["question_id"]: (r["choices"][0]["token_ids"], r["choices"][0]["accept_lengths"]) for r in records}


def case(batch: int, overrides: list[str]):
    """In make test: batch 2 for the methods whose slots share state (TR's hot matrix, SuffixDecoding's global tree);
    the rest (batch 1; SAM+TR's, the same matrix as TR's; Lookahead's, whose state lives in its requests, and REST's)
    in make test-long."""
    keep = batch == 2 and overrides[0] in ("method=tr", "method=suffix")
    return pytest.param(batch, overrides, marks=() if keep else pytest.mark.long,
                        id=f"{overrides[0].removeprefix('method=')}-batch{batch}")


@pytest.mark.slow  # the embedded model, three runs per case
@pytest.mark.parametrize("batch,overrides", [case(b, o) for o in CASES for b in (1, 2)])
def test_a_stopped_run_resumes_to_the_answers_of_an_unbroken_one(embedded, tmp_path, batch, overrides):
    whole = []
    r = runner(embedded, batch, overrides)
    r.answer(QUESTIONS[-1])  # a warm-up: the state is not empty when the run starts
    warm = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in r.proposer.state_dict().items()}
    r.answer_all(QUESTIONS, whole.append)

    first, saved = [], tmp_path / "proposer_state.pt"

    def done(rec):
        first.append(rec)
        if len(first) == STOP_AFTER:
            raise Stop

    r = runner(embedded, batch, overrides)
    r.proposer.load_state_dict(warm) if warm else r.answer(QUESTIONS[-1])
    with pytest.raises(Stop):
        r.answer_all(QUESTIONS, done, checkpoint=lambda snapshot: save_torch_atomic(saved, snapshot))
    snapshot = load_torch_safe(saved)
    assert len(snapshot["slots"]) == batch and (batch == 1 or snapshot["flight"]), "nothing was in flight"

    rest = []
    r = runner(embedded, batch, overrides)  # a new process: new proposers, a new engine
    answered = {rec["question_id"] for rec in first}
    r.answer_all([q for q in QUESTIONS if q.question_id not in answered], rest.append, resume=snapshot)
    assert steps(first + rest) == steps(whole)
