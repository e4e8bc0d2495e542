"""Every shipped model config's architecture, as a tiny random model: every method, on both engines, emits
exactly ``generate``'s greedy tokens in fp32 (vocabulary size, grouped-query attention, head size, rotary
base and scaling, tied or untied embeddings all vary between them)."""
import pytest
import torch

from evaluation.shapes import LLAMA31_ROPE, SHAPES, tiny
from methods.base import build_proposer
from methods.common import ROOT
from methods.decode import generate
from methods.engine import HFEngine, StaticEngine
from tests.helpers import generate_greedy, tiny_llama

CPU = torch.device("cpu")
# One per distinct architecture: Vicuna 7B/13B/33B and Llama-2 share LLaMA's (test_one_architecture_per_config).
ARCHITECTURES = {"vicuna-7b": {}, "llama-2-7b-chat": {}, "llama-3-8b-instruct": {}, "smollm2-135m": {},
                 "llama-3.1 rotary scaling": dict(rope_scaling=LLAMA31_ROPE, max_position_embeddings=131072)}
METHODS = [("vanilla", {}), ("tr", {}), ("pld", {}), ("lookahead", {}), ("eagle", {"head": "random"}),
           ("eagle2", {"head": "random", "total_tokens": 30})]


def test_one_architecture_per_config():
    assert sorted(SHAPES) == sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
    for name in ("vicuna-13b", "vicuna-33b"):
        assert {k: v for k, v in tiny(name).items() if k != "rms_norm_eps"} == \
            {k: v for k, v in tiny("vicuna-7b").items() if k != "rms_norm_eps"}


@pytest.fixture(scope="module", params=list(ARCHITECTURES), ids=list(ARCHITECTURES))
def arch(request):
    name = request.param
    overrides = ARCHITECTURES[name]
    model = tiny_llama(name.split(" ")[0] if name in SHAPES else "llama-3-8b-instruct", **overrides)
    prompts = [[5, 900, 17, 33, 4, 900, 17, 33, 4, 900, 17], list(range(1000, 1040)) + [1000, 1001, 1002]]
    refs = [generate_greedy(model, p, 32) for p in prompts]
    return model, prompts, refs


@pytest.mark.slow  # 60 cases, vocabularies up to 128k: minutes on a CPU
@pytest.mark.parametrize("engine", [HFEngine, StaticEngine], ids=["hf", "static"])
@pytest.mark.parametrize("method, params", METHODS, ids=[m for m, _ in METHODS])
def test_every_method_equals_generate(arch, engine, method, params):
    model, prompts, refs = arch
    e = engine(model)
    for prompt, ref in zip(prompts, refs):
        p = build_proposer(method, params, vocab_size=model.config.vocab_size, device=CPU, target=model)
        gen = generate(e, p, prompt, max_new_tokens=32, stop_ids=set())
        assert gen.token_ids == ref, (method, prompt[:3])
        assert sum(gen.accept_lengths) == len(gen.token_ids)
