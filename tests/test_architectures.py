"""Every shipped model config's architecture, as a tiny random model: every method, on both engines, emits
exactly ``generate``'s greedy tokens in fp32 (the architecture itself (Llama, Qwen2, Qwen3, Gemma 3), vocabulary
size, grouped-query attention, head size, rotary base and scaling, sliding windows, tied or untied embeddings all
vary between them)."""
import pytest
import torch

from methods.base import build_proposer, registry
from methods.common import ROOT
from methods.decode import generate
from methods.engine import HFEngine, StaticEngine
from methods.tree import Tree
from scripts.shapes import SHAPES, tiny
from tests.helpers import batched, generate_greedy, tiny_llama

CPU = torch.device("cpu")
# Gemma 3 as a tiny model: six layers (five sliding-window, one global, as its pattern), a window of 16 positions
# that the prompts and answers outgrow, and an untied head (tied, its argmax follows the token embeddings and would
# not notice a wrong window). Its vocabulary is 8,192 tokens, as in scripts/gpu_check.py's dry run: the 262k one
# made every step's logits and EAGLE's draft heads most of this test's time, and every method meets it on the real
# Gemma 3 270M (tests/test_gemma.py); Qwen's 152k and Llama-3's 128k stay here.
GEMMA = dict(num_hidden_layers=6, sliding_window=16, tie_word_embeddings=False, vocab_size=8192)
# One per distinct architecture: Vicuna 7B/13B/33B and Llama-2 share LLaMA's, DeepSeek-R1-Distill-Llama-8B
# Llama-3.1's (test_one_architecture_per_config).
ARCHITECTURES = {"vicuna-7b": {}, "llama-2-7b-chat": {}, "llama-3-8b-instruct": {}, "smollm2-135m": {},
                 "llama-3.1-8b-instruct": {}, "qwen2.5-7b-instruct": {"vocab_size": 8192}, "qwen3-8b": {},
                 "gemma3-270m": GEMMA}  # Qwen2's biases at a small vocabulary: Qwen3 keeps the family's 152k
METHODS = sorted(registry())  # every registered method, with its example settings (Proposer.example)
# make test: every method meets Llama's parts on both engines, with grouped heads, rotary scaling and the 128k
# vocabulary (Llama-3.1), and Gemma 3's windows on both engines (and batched on the ragged engine); the methods whose
# own code reads the shape (the vocabulary-sized matrix, a head's rotary and lm_head, a drafter's layers) meet every
# other architecture (Qwen2's biases, Qwen3's norms and 152k vocabulary, LLaMA-1/2's full heads, SmolLM2's tied
# embeddings). Every (architecture, method, engine) runs in make test-long.
FAMILIES = ("llama-3.1-8b-instruct", "gemma3-270m")
SHAPE_METHODS = ("vanilla", "tr", "eagle3", "sps")
MAX_NEW = 20  # past Gemma 3's window of 16 with the longer prompt's 43 tokens


def matrix(arch: str, method: str) -> bool:
    """Whether (arch, method) runs in make test (else in make test-long)."""
    return arch in FAMILIES or method in SHAPE_METHODS


def test_one_architecture_per_config():
    assert sorted(SHAPES) == sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
    same = {"vicuna-13b": "vicuna-7b", "vicuna-33b": "vicuna-7b",
            "deepseek-r1-distill-llama-8b": "llama-3.1-8b-instruct"}
    for name, like in same.items():
        ignored = ("rms_norm_eps", "eos_token_id")
        assert {k: v for k, v in tiny(name).items() if k not in ignored} == \
            {k: v for k, v in tiny(like).items() if k not in ignored}
    assert set(ARCHITECTURES) == set(SHAPES) - set(same)


@pytest.fixture(scope="module")
def arch(request):
    """``arch(layers)``: the architecture's tiny model of at least ``layers`` layers (EAGLE-3 reads layers 2, L/2
    and L-3), its prompts and ``generate``'s tokens for each, built once per depth."""
    name, built = request.param, {}
    prompts = [[5, 900, 17, 33, 4, 900, 17, 33, 4, 900, 17], list(range(1000, 1040)) + [1000, 1001, 1002]]

    def make(layers: int):
        overrides = ARCHITECTURES[name]
        layers = max(layers, overrides.get("num_hidden_layers", 2))
        if layers not in built:
            model = tiny_llama(name, **{**overrides, "num_hidden_layers": layers})
            built[layers] = model, prompts, [generate_greedy(model, p, MAX_NEW) for p in prompts]
        return built[layers]

    return make


@pytest.mark.slow  # every method x 8 architectures x 2 engines, vocabularies up to 152k: minutes on a CPU
@pytest.mark.parametrize("engine", [HFEngine, StaticEngine], ids=["hf", "static"])
@pytest.mark.parametrize("arch,method", [
    pytest.param(a, m, id=f"{a}-{m}", marks=() if matrix(a, m) else pytest.mark.long)
    for a in ARCHITECTURES for m in METHODS], indirect=["arch"])
def test_every_method_equals_generate(arch, engine, method, tmp_path):
    cls = registry()[method]
    model, prompts, refs = arch(cls.min_layers)
    e = engine(model)
    params = cls.example(tmp_path, prompts)
    for prompt, ref in zip(prompts, refs):
        p = build_proposer(method, params, vocab_size=model.config.vocab_size, device=CPU, target=model)
        gen = generate(e, p, prompt, max_new_tokens=MAX_NEW, stop_ids=set())
        assert gen.token_ids == ref, (method, prompt[:3])
        assert sum(gen.accept_lengths) == len(gen.token_ids)


@pytest.mark.parametrize("engine", [HFEngine, StaticEngine], ids=["hf", "static"])
def test_sliding_window_layers_see_their_window_in_tree_and_batched_steps(engine):
    """Gemma 3's sliding-window layers (window 16) in a tree step after 30 and after 45 committed tokens, the two
    rows in one batched forward: every node's logits are the model's own over its prefix and path (which the
    stock forward windows itself). Without the window they are off by tens (a wrong window moved no argmax on a
    tied head, hence a logits check)."""
    model = tiny_llama("gemma3-270m", **GEMMA)
    tree = Tree.from_parents((-1, 0, 0, 1, 3))  # root, two children, a path of depth 3 under the first
    tokens = torch.tensor([7, 8, 9, 10, 11])
    prefixes = [torch.arange(200, 230), torch.arange(300, 345)]
    e = engine(model)
    e.start(128, rows=2)
    for r, prefix in enumerate(prefixes):
        e.open(r, 128)
        e.forward(prefix, row=r)
    outs = e.forward_rows([0, 1], [tokens, tokens], [tree, tree])
    for prefix, (logits, _) in zip(prefixes, outs):
        for node in range(len(tree.parents)):
            path, at = [], node
            while at >= 0:
                path.insert(0, int(tokens[at]))
                at = tree.parents[at]
            with torch.no_grad():
                want = model(torch.cat([prefix, torch.tensor(path)])[None]).logits[0, -1]
            assert (logits[node] - want).abs().max() < 1e-3, node


@pytest.mark.slow  # every method x 2 engines
@pytest.mark.parametrize("engine", [pytest.param(HFEngine, marks=pytest.mark.long), StaticEngine], ids=["hf", "static"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("arch", ["gemma3-270m"], indirect=True)
def test_every_method_equals_generate_batched(arch, engine, method, tmp_path):
    """Gemma 3's windows, which narrow each row's mask by its own positions, in batched steps (Llama's: tests/
    test_batch.py; Qwen's norms and biases act per token, as the one-row test above holds them): three requests
    through two slots (the third takes the slot the first one frees; prompts prefilled in chunks of 5 along the
    steps where the engine is ragged), every row exactly ``generate``'s tokens."""
    cls = registry()[method]
    model, prompts, refs = arch(cls.min_layers)
    requests = prompts + [prompts[1][:9]]
    refs = refs + [generate_greedy(model, requests[2], MAX_NEW)]
    params = cls.example(tmp_path, requests)
    first = build_proposer(method, params, vocab_size=model.config.vocab_size, device=CPU, target=model)
    out = batched(engine(model), first, 2, requests, MAX_NEW, chunk=5)
    assert [g.token_ids for g in out] == refs, method
    assert max(max(g.batch_rows or [1]) for g in out) == 2  # rows were verified together
