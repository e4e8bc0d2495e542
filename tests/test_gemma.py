"""The second embedded model, Gemma 3 270M (``model=gemma3-270m``: another family than SmolLM2, a 262K-token
SentencePiece vocabulary, sliding-window layers): its vanilla tokens are ``generate``'s on both engines, and every
method whose artefacts the model config names (its corpus, its trained heads) emits exactly vanilla's (fp32, CPU), on
two questions (mt_bench's first, both turns, and a 725-token summarization prompt past the 512-token sliding
window), 16 tokens a turn, to keep make test short: every step of this model takes a 262K-wide row of logits.
Every method on all six tasks, 60 questions and 128 tokens: results/MEASUREMENTS.md (every turn identical)."""
import pytest

from evaluation.records.bench import load_bench
from evaluation.running.config import compose_config
from evaluation.running.models import load_model
from evaluation.running.prompts import prompt_ids
from evaluation.running.runner import Runner
from methods.base import registry
from methods.params import artefact_keys
from tests.helpers import generate_greedy, shipped_spec

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gemma")]
MAX_NEW = 16
QUESTIONS = load_bench(None, limit_per_category=1)[:3:2]  # mt_bench (two turns), summarization
# Every registered method whose artefacts (heads, corpus, drafter) the model config names: from the registry, so that
# a head trained for Gemma brings its method in.
_ARTEFACTS = compose_config(["model=gemma3-270m"]).model.artefacts
METHODS = [f"method={m}" for m, c in sorted(registry().items())
           if m != "vanilla" and all(_ARTEFACTS.get(k) for k in artefact_keys([c.Params]))]


@pytest.fixture(scope="module")
def gemma():
    model, tok, device = load_model(shipped_spec("gemma3-270m", device="cpu", dtype="float32"))
    return model, tok, device


def answers(loaded, *overrides) -> dict[int, list[list[int]]]:
    """Every question's tokens, turn by turn."""
    cfg = compose_config(["model=gemma3-270m", *overrides, f"bench.max_new_tokens={MAX_NEW}", "model.device=cpu",
                          "model.dtype=float32", "warmup=0"])
    r = Runner(cfg, loaded=loaded)
    return {q.question_id: r.answer(q)["choices"][0]["token_ids"] for q in QUESTIONS}


@pytest.fixture(scope="module")
def vanilla(gemma):
    return answers(gemma, "method=vanilla")


def test_it_is_gemma_3_as_converted_from_the_package(gemma):
    model, tok, _ = gemma
    cfg = model.config
    assert (cfg.model_type, cfg.vocab_size, cfg.num_hidden_layers, cfg.head_dim, cfg.sliding_window) == \
        ("gemma3_text", 262144, 18, 256, 512)
    assert cfg.layer_types.count("full_attention") == 3 and len(tok) == 262144


def test_vanilla_is_generate_on_both_engines(gemma, vanilla):
    model, tok, _ = gemma
    spec = shipped_spec("gemma3-270m")
    assert [len(q.turns) for q in QUESTIONS] == [2, 1]
    assert len(prompt_ids(spec, tok, QUESTIONS[1].turns, [])) > model.config.sliding_window
    for q in QUESTIONS:
        ids = prompt_ids(spec, tok, q.turns[:1], [])
        first = vanilla[q.question_id][0]  # the first turn (a stop string may end it before generate does)
        assert first and first == generate_greedy(model, ids, MAX_NEW, eos_token_id=tok.eos_token_id)[:len(first)]
    assert answers(gemma, "method=vanilla", "engine=hf") == vanilla


KEEP = ()  # in make test: vanilla on both engines (above); every method in make test-long (a tiny Gemma 3 of this
#   architecture runs the methods on both engines: tests/test_architectures.py)


@pytest.mark.parametrize("method", [m if m in KEEP else pytest.param(m, marks=pytest.mark.long) for m in METHODS],
                         ids=[m.split("=")[1] for m in METHODS])
def test_every_method_is_lossless(gemma, vanilla, method):
    cheaper = ["method.tree=grown-n30-d6"] if method == "method=tr" else []  # 31 rows of 262K logits a step, not 81
    assert answers(gemma, method, *cheaper) == vanilla
