"""On a CUDA device (skipped elsewhere, and reported as skipped): every method through each engine (hf,
static, static with compiled steps and CUDA graphs) equals CPU fp32 greedy in fp32; in fp16 the match rate
and first divergence are measured and printed.

No weights travel: the model is the tiny random Llama of conftest.py. ``scripts/gpu_check.sh`` runs this file.
"""
import pytest
import torch

from methods.base import build_proposer
from methods.decode import generate
from methods.engine import HFEngine, StaticEngine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
CUDA = torch.device("cuda")
PROMPTS = [[1, 5, 9, 33, 4, 5, 9, 33, 4, 5, 9], [1, 70, 71, 72, 73, 74, 75, 76, 77], [1, 2, 3, 2, 3, 2, 3]]
METHODS = [("vanilla", {}), ("tr", {}), ("pld", {}), ("lookahead", {})]


def _cpu_greedy(model, prompt, n):
    return model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def models(tiny_model):
    import copy

    return tiny_model, copy.deepcopy(tiny_model).to(CUDA)


def _compiled(model):
    """The static engine with compiled steps and CUDA graphs."""
    return StaticEngine(model, compile=True, mode="reduce-overhead")


_compiled.name = "static-compiled"
ENGINES = [HFEngine, StaticEngine, _compiled]


@pytest.mark.parametrize("engine", ENGINES, ids=["hf", "static", "static-compiled"])
@pytest.mark.parametrize("name, params", METHODS, ids=[m for m, _ in METHODS])
def test_fp32_on_cuda_equals_cpu_greedy(models, engine, name, params):
    cpu, gpu = models
    proposer = build_proposer(name, params, vocab_size=96, device=CUDA)
    for prompt in PROMPTS:
        gen = generate(engine(gpu), proposer, prompt, max_new_tokens=48, stop_ids=set())
        assert gen.token_ids == _cpu_greedy(cpu, prompt, 48), prompt


@pytest.mark.parametrize("engine", [HFEngine, StaticEngine], ids=["hf", "static"])
def test_fp16_match_rate(models, engine, capsys):
    """fp16 is not expected to be token-identical to fp32; report how far it goes before the first divergence."""
    cpu, gpu = models
    half = gpu.half()
    try:
        for name, params in METHODS:
            rates = []
            for prompt in PROMPTS:
                proposer = build_proposer(name, params, vocab_size=96, device=CUDA)
                got = generate(engine(half), proposer, prompt, max_new_tokens=48, stop_ids=set()).token_ids
                ref = _cpu_greedy(cpu, prompt, 48)
                first = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), len(ref))
                rates.append((sum(a == b for a, b in zip(got, ref)) / len(ref), first))
            with capsys.disabled():
                print(f"\nfp16 {engine.name} {name}: match rate {sum(r for r, _ in rates) / len(rates):.3f}, "
                      f"first divergence at tokens {[f for _, f in rates]} of 48")
            assert all(len(r) == 2 for r in rates)
    finally:
        gpu.float()
