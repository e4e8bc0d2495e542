"""The shared engine on a tiny random Llama: acceptance, KV commit through real forwards, greedy equality."""
import pytest
import torch

from methods.base import Draft, Proposer, build_proposer
from methods.common import HarnessError
from methods.decode import generate
from methods.engine import HFEngine, StaticEngine
from methods.tree import Tree, additive_mask
from methods.verify import accept, greedy
from tests.helpers import generate_greedy


def test_accept_worked_examples():
    t = Tree.from_parents((-1, 0, 0, 1, 2))  # 0 -> {1, 2}; 1 -> 3; 2 -> 4
    # target's next tokens at each node: after root 7, after node1 9, after node2 8 ...
    argmax = torch.tensor([7, 9, 8, 1, 1])
    assert int(accept(torch.tensor([5, 7, 3, 9, 4]), argmax, t)) == 3  # path 0-1-3
    assert int(accept(torch.tensor([5, 3, 7, 9, 8]), argmax, t)) == 4  # path 0-2-4 (skips index 3)
    assert int(accept(torch.tensor([5, 3, 4, 9, 8]), argmax, t)) == 0  # nothing: bonus only
    # both depth-1 children right (duplicate drafts): the first in BFS order wins
    assert int(accept(torch.tensor([5, 7, 7, 9, 9]), argmax, t)) == 3


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_greedy_from_topk_breaks_ties_like_argmax(k):
    logits = torch.tensor([
        [0.0, 1.0, 1.0, 0.5, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],   # three maxima: the first (1) wins
        [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0],   # more maxima than k: full argmax (0)
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0],
    ])
    argmax, top = greedy(logits, k)
    assert argmax.tolist() == logits.argmax(-1).tolist() == [1, 0, 9]
    assert top.shape == (3, k)
    assert greedy(logits)[1] is None
    rand = torch.randn(50, 1000).round(decimals=1)  # many ties
    assert torch.equal(greedy(rand, k)[0], rand.argmax(-1))


def test_tree_mask_shape_and_values():
    t = Tree.from_parents((-1, 0, 0, 1))
    m = additive_mask(t.ancestors, past=2, dtype=torch.float32)
    assert m.shape == (1, 1, 4, 6)
    allowed = (m[0, 0] == 0).int().tolist()
    assert allowed == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 1]]


@pytest.fixture(params=[HFEngine, StaticEngine], ids=["hf", "static"])
def engine(request, tiny_model):
    """Each engine test runs on both engines: the reference and the lean one."""
    return request.param(tiny_model)


class Oracle(Proposer):
    """Drafts a tree whose true path zigzags: wrong first child, right second child, and so on.

    Tree (-1, 0, 0, 1, 2, 4): node 1 wrong, node 2 right, node 3 under the wrong one,
    node 4 right, node 5 right or wrong by step parity. Accepted paths [0, 2, 4(, 5)]
    are not a prefix of the node order, so every step exercises the KV gather.
    """

    name = "oracle"
    tree = Tree.from_parents((-1, 0, 0, 1, 2, 4))

    def __init__(self, reference, n_prompt):
        self.ref, self.n_prompt, self.steps = reference, n_prompt, 0

    def propose(self, context):
        k = len(context) - self.n_prompt  # tokens generated so far; ref[k] is next
        nxt = self.ref[k:k + 3] + [0, 0, 0]
        wrong = (nxt[0] + 1) % 96
        last = nxt[2] if self.steps % 2 else (nxt[2] + 1) % 96
        self.steps += 1
        toks = [int(context[-1]), wrong, nxt[0], 5, nxt[1], last]
        return Draft(torch.tensor(toks), self.tree)


def test_vanilla_engine_equals_generate(tiny_model, engine):
    for prompt in ([1, 5, 9, 33, 4], [1, 70, 71, 72, 73, 74, 75, 76, 77]):
        ref = generate_greedy(tiny_model, prompt, 40)
        van = build_proposer("vanilla", {}, vocab_size=96, device=torch.device("cpu"))
        gen = generate(engine, van, prompt, max_new_tokens=40, stop_ids=set())
        assert gen.token_ids == ref
        assert gen.accept_lengths == [1] * 40


def test_tree_verification_is_lossless_and_accepts_the_zigzag_path(tiny_model, engine):
    prompt = [1, 5, 9, 33, 4]
    ref = generate_greedy(tiny_model, prompt, 60)
    gen = generate(engine, Oracle(ref, len(prompt)), prompt, max_new_tokens=50, stop_ids=set())
    assert gen.token_ids == ref[:50]
    # prefill 1, then steps of 3 (path 0-2-4 + bonus) and 4 (0-2-4-5 + bonus), alternating, cut at the budget
    assert gen.accept_lengths[:5] == [1, 3, 4, 3, 4]
    assert sum(gen.accept_lengths) == 50


def test_stop_token_ends_generation_and_is_counted(tiny_model, engine):
    prompt = [1, 5, 9, 33, 4]
    ref = generate_greedy(tiny_model, prompt, 30)
    stop = ref[12]
    first = ref.index(stop)
    gen = generate(engine, Oracle(ref + [0] * 10, len(prompt)), prompt, max_new_tokens=30, stop_ids={stop})
    assert gen.token_ids == ref[: first + 1]
    assert gen.stop == "eos" and sum(gen.accept_lengths) == first + 1


def test_unknown_method_lists_the_known_ones():
    with pytest.raises(HarnessError, match=r"unknown method 'trr'; known: .*vanilla"):
        build_proposer("trr", {}, vocab_size=10, device=torch.device("cpu"))


def test_vanilla_refuses_parameters():
    with pytest.raises(HarnessError, match="method .vanilla. has no parameter k; it takes none"):
        build_proposer("vanilla", {"k": 3}, vocab_size=10, device=torch.device("cpu"))


@pytest.mark.parametrize("name, params", [
    ("tr", {}), ("tr", {"start": "prompt", "tree": "grown-n30-d6"}), ("pld", {}),
    ("lookahead", {}), ("lookahead", {"level": 3, "window": 4, "guess": 2}),
])
def test_every_method_equals_greedy_on_the_tiny_model(tiny_model, engine, name, params):
    prompt = [1, 5, 9, 33, 4, 5, 9, 33, 4, 5, 9]  # repetitive, so that lookups and n-grams find something
    ref = generate_greedy(tiny_model, prompt, 60)
    proposer = build_proposer(name, params, vocab_size=96, device=torch.device("cpu"))
    for turn in range(2):  # a second request on the same proposer (state carried or reset by the method)
        gen = generate(engine, proposer, prompt, max_new_tokens=60, stop_ids=set(), turn=turn)
        assert gen.token_ids == ref
        assert sum(gen.accept_lengths) == 60
