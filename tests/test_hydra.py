"""Hydra (methods.proposers.hydra): the published layouts, drafts that read their path, lossless decoding, the
trainer."""
import json

import pytest
import torch
from torch.nn import functional as F

from methods.base import Verification, build_proposer
from methods.common import HarnessError
from methods.decode import generate
from methods.engine import StaticEngine
from methods.heads import eagle_train
from methods.heads.hydra import HydraHeads, load_heads, save_heads, train, validate
from tests.checkpoints import save_hydra_heads
from tests.helpers import generate_greedy

CPU = torch.device("cpu")
PROMPTS = [[3, 4, 5, 6, 3, 4, 5], [40, 41, 42], [7] * 6]


def reference_logits(state: dict, i: int, x: torch.Tensor, layers: int, prefix: bool) -> torch.Tensor:
    """Head i as Spec-Bench's hydra_heads compute it, from the published tensors: ResBlock(h, i + 1), the
    repeated ResBlock(h), the head's lm_head with its bias."""
    def block(j):
        return f"hydra_mlp.{i}.{2 * j + 1 if prefix else j}"

    w = lambda k: state[f"{block(0)}.{k}"]  # noqa: E731
    y = x @ w("res_connection.weight").T + w("res_connection.bias") + F.silu(x @ w("linear.weight").T +
                                                                           w("linear.bias"))
    for j in range(1, layers):
        y = y + F.silu(y @ state[f"{block(j)}.linear.weight"].T + state[f"{block(j)}.linear.bias"])
    lm = f"hydra_lm_head.{i}.{'1.' if prefix else ''}"
    return y @ state[f"{lm}weight"].T + state[f"{lm}bias"]


@pytest.mark.parametrize("arch", ["mlp", "prefix-mlp"])
def test_loads_the_published_layout_and_computes_as_hydra_does(tiny_model, tmp_path, arch):
    state = save_hydra_heads(tmp_path / "h", tiny_model.config, arch=arch, layers=3)
    heads = load_heads(str(tmp_path / "h"), tiny_model.config).eval()
    assert (heads.arch, len(heads.heads), heads.layers, heads.own_lm_heads) == (arch, 4, 3, True)
    for i in range(4):
        x = torch.randn(5, (i + 2) * 64)
        want = reference_logits(state, i, x, 3, arch == "prefix-mlp")
        assert torch.allclose(heads.logits(i, x, None), want, atol=1e-4), i
    if arch == "prefix-mlp":  # the prefix is a one-layer LlamaModel run causally over the target's features
        feats = torch.randn(1, 9, 64)
        want = state["prefix_model"](inputs_embeds=feats).last_hidden_state
        mask = torch.zeros(1, 1, 9, 9).masked_fill_(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf"))
        got = heads.prefix(feats, torch.arange(9).view(1, -1), mask)
        assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("case,message", [
    ({"drop": ["hydra_mlp.2.0.res_connection.bias"]}, "lacks hydra_mlp.2.0.res_connection.bias"),
    ({"reshape": "hydra_mlp.1.0.linear.weight"},
     r"hydra_mlp.1.0.linear.weight has shape \(3, 3\), but the target .* needs \(64, 192\)"),
    ({"arch": "prefix-mlp", "drop": ["prefix_embeding_layer.norm.weight"]}, "lacks prefix_embeding_layer.norm"),
    ({"differ": "hydra_mlp.0.2.linear.weight"}, "hydra_mlp.0.2.linear.weight differs from the first repeated"),
    ({"grounded": False}, "grounded_heads is false.*Medusa heads"),
    ({"hydra_head_arch": "cross-attn"}, "hydra_head_arch 'cross-attn' is not one this harness runs"),
    ({"hidden_state_offset": 2}, "hidden_state_offset 2 reads an inner layer"),
])
def test_a_wrong_checkpoint_is_refused_naming_the_problem(tiny_model, tmp_path, case, message):
    save_hydra_heads(tmp_path / "h", tiny_model.config, layers=3, **case)
    with pytest.raises(HarnessError, match=message):
        load_heads(str(tmp_path / "h"), tiny_model.config)


def test_missing_heads_and_shallow_heads_are_named(tiny_model, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(HarnessError, match="has no config.json"):
        load_heads(str(tmp_path / "empty"), tiny_model.config)
    with pytest.raises(HarnessError, match="needs Hydra heads.*scripts.train_hydra"):
        build_proposer("hydra", {}, vocab_size=96, device=CPU, target=tiny_model)
    save_hydra_heads(tmp_path / "h", tiny_model.config, heads=2)
    with pytest.raises(HarnessError, match="tree 'medusa' has depth 4, but the Hydra head has 2 heads"):
        build_proposer("hydra", {"head": str(tmp_path / "h"), "tree": "medusa"}, vocab_size=96, device=CPU,
                       target=tiny_model)
    p = build_proposer("hydra", {"head": str(tmp_path / "h")}, vocab_size=96, device=CPU, target=tiny_model)
    assert p.tree.max_depth == 2 and p.tree.size == 39 and p.summary()["tree"] == "medusa to depth 2"


@pytest.mark.parametrize("arch", ["mlp", "prefix-mlp"])
def test_every_node_is_its_heads_choice_after_its_own_path(tiny_model, tmp_path, arch):
    """Brute force: each draft node is the rank-th top token of head depth-1 over (p, the embeddings of the root
    and of the node's ancestors), p recomputed from scratch over all committed features (the prefix's cache,
    fed in two pieces, must agree with one pass)."""
    save_hydra_heads(tmp_path / "h", tiny_model.config, arch=arch)
    p = build_proposer("hydra", {"head": str(tmp_path / "h")}, vocab_size=96, device=CPU, target=tiny_model)
    seq = torch.tensor([5, 9, 13, 2, 30, 31, 8, 7])
    with torch.no_grad():
        feats = tiny_model(seq[None], output_hidden_states=True).hidden_states[-1][0]  # [8, 64]
    p.reset(seq[:5], 0, None, feats[:4])  # committed 0..3, root seq[4]
    p.propose(seq[:5])
    p.update(None, Verification(path=[0, 1, 2], new_tokens=[], logits=None, argmax=None, hidden=feats[4:7]))
    draft = p.propose(seq)  # committed 0..6, root seq[7]
    with torch.no_grad():
        if arch == "prefix-mlp":
            full = torch.zeros(1, 1, 7, 7).masked_fill_(~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf"))
            base = p.heads.prefix(feats[None, :7], torch.arange(7).view(1, -1), full)[0, -1]
        else:
            base = feats[6]
        tree, embed = draft.tree, tiny_model.get_input_embeddings()
        assert int(draft.tokens[0]) == 7
        for node in range(1, tree.size):
            path = []
            a = tree.parents[node]
            while a > 0:
                path.append(a)
                a = tree.parents[a]
            x = torch.cat([base, embed(torch.tensor(7)), *[embed(draft.tokens[a]) for a in reversed(path)]])
            top = p.heads.logits(int(tree.depth[node]) - 1, x[None], None).topk(10).indices[0]
            assert int(draft.tokens[node]) == int(top[tree.rank[node]]), node


@pytest.mark.parametrize("arch,own", [("mlp", True), ("prefix-mlp", False)], ids=["mlp-own", "prefix-shared"])
def test_lossless(tiny_model, tmp_path, arch, own):
    save_hydra_heads(tmp_path / "h", tiny_model.config, arch=arch, own=own)
    p = build_proposer("hydra", {"head": str(tmp_path / "h")}, vocab_size=96, device=CPU, target=tiny_model)
    engine = StaticEngine(tiny_model)
    for prompt in PROMPTS:
        gen = generate(engine, p, prompt, max_new_tokens=40, stop_ids={17})
        assert gen.token_ids == generate_greedy(tiny_model, prompt, 40, eos_token_id=17)


@pytest.mark.parametrize("arch,labels", [("mlp", "greedy"), ("prefix-mlp", "teacher")])
def test_trained_heads_learn_the_targets_tokens_and_load_back(tiny_model, tmp_path, arch, labels):
    """The trainer on the tiny model's own greedy continuations: head 0's held-out accuracy rises; saved
    heads (fp16, the target's lm_head shared) load back computing the same."""
    torch.manual_seed(0)
    seqs = [torch.randint(3, 96, (4,)).tolist() for _ in range(40)]
    seqs = [s + generate_greedy(tiny_model, s, 24) for s in seqs]
    with torch.no_grad():
        data = eagle_train.features(tiny_model, seqs, [4] * len(seqs), CPU)
    heads = HydraHeads(tiny_model.config, 3, 2, arch)
    embed, lm_head = tiny_model.get_input_embeddings(), tiny_model.lm_head.requires_grad_(False)
    before = validate(heads, embed, lm_head, data[:8])
    log = train(heads, embed, lm_head, data[8:], data[:8], minutes=5, lr=3e-3, positions=16, labels=labels,
                dropout=0.1, max_steps=800, log=lambda s: None)
    assert log["steps"] == 800 and len(log["top1_per_head"]) == 3
    assert log["top1_per_head"][0] > before[0] + 0.1, (before, log)
    save_heads(heads, tmp_path / "trained", {"train_log.json": log})
    back = load_heads(str(tmp_path / "trained"), tiny_model.config).eval()
    assert not back.own_lm_heads and json.loads((tmp_path / "trained" / "train_log.json").read_text())["steps"]
    assert validate(back, embed, lm_head, data[:8]) == pytest.approx(log["top1_per_head"], abs=0.02)
