"""Medusa (methods.proposers.medusa): the published layout, the sparse tree's drafts, lossless decoding, the trainer."""
import json

import pytest
import torch
from torch.nn import functional as F

from methods.base import build_proposer
from methods.common import HarnessError
from methods.decode import generate
from methods.engine import StaticEngine
from methods.heads import eagle_train
from methods.heads.medusa import MedusaHeads, load_heads, save_heads, train, validate
from methods.tree import load_template
from tests.checkpoints import save_medusa_heads
from tests.helpers import generate_greedy

CPU = torch.device("cpu")
PROMPTS = [[3, 4, 5, 6, 3, 4, 5], [40, 41, 42], [7] * 6]


def test_loads_the_published_layout_and_computes_as_medusa_does(tiny_model, tmp_path):
    state = save_medusa_heads(tmp_path / "m", tiny_model.config)
    heads = load_heads(str(tmp_path / "m"), tiny_model.config)
    assert len(heads.heads) == 5 and heads.own_lm_head
    f = torch.randn(64)
    x = f + F.silu(state["2.0.linear.weight"] @ f + state["2.0.linear.bias"])  # head 2: ResBlock, its own lm_head
    assert torch.allclose(heads(f, None)[2], state["2.1.weight"] @ x, atol=1e-5)


@pytest.mark.parametrize("case,message", [
    ({"drop": ["3.0.linear.bias"]}, "lacks 3.0.linear.bias"),
    ({"reshape": "1.0.linear.weight"}, r"1.0.linear.weight has shape \(3, 3\), but the target .* needs \(64, 64\)"),
])
def test_a_wrong_checkpoint_is_refused_naming_the_key(tiny_model, tmp_path, case, message):
    save_medusa_heads(tmp_path / "m", tiny_model.config, **case)
    with pytest.raises(HarnessError, match=message):
        load_heads(str(tmp_path / "m"), tiny_model.config)


def test_missing_files_and_configs_are_named(tiny_model, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(HarnessError, match="has no config.json"):
        load_heads(str(tmp_path / "empty"), tiny_model.config)
    save_medusa_heads(tmp_path / "m", tiny_model.config)
    (tmp_path / "m" / "config.json").write_text("{}")
    with pytest.raises(HarnessError, match="needs medusa_num_heads"):
        load_heads(str(tmp_path / "m"), tiny_model.config)
    with pytest.raises(HarnessError, match="needs Medusa heads.*scripts.train_medusa"):
        build_proposer("medusa", {}, vocab_size=96, device=CPU, target=tiny_model)


def test_a_tree_deeper_than_the_heads_is_refused_and_the_default_is_cut_to_them(tiny_model, tmp_path):
    save_medusa_heads(tmp_path / "m", tiny_model.config, heads=3)
    with pytest.raises(HarnessError, match="tree 'medusa' has depth 4, but the Medusa head has 3 heads"):
        build_proposer("medusa", {"head": str(tmp_path / "m"), "tree": "medusa"}, vocab_size=96, device=CPU,
                       target=tiny_model)
    p = build_proposer("medusa", {"head": str(tmp_path / "m")}, vocab_size=96, device=CPU, target=tiny_model)
    full = load_template("medusa")
    assert p.tree.max_depth == 3 and p.tree.parents == full.parents[:p.tree.size] and p.tree.size == 62
    assert p.summary()["tree"] == "medusa to depth 3"
    with pytest.raises(HarnessError, match="needs method.topk > 9"):
        build_proposer("medusa", {"head": "random", "topk": 5}, vocab_size=96, device=CPU, target=tiny_model)


def test_the_shipped_tree_is_spec_benchs_mc_sim_7b_63():
    tree = load_template("medusa")
    assert (tree.size, tree.max_depth, int(tree.rank.max())) == (64, 4, 9)
    assert tree.children_counts()[:3] == [10, 10, 7]  # 10 first tokens; under the first, 10; under the second, 7


def test_a_node_takes_its_depths_head_and_its_rank(tiny_model, tmp_path):
    save_medusa_heads(tmp_path / "m", tiny_model.config)
    p = build_proposer("medusa", {"head": str(tmp_path / "m")}, vocab_size=96, device=CPU, target=tiny_model)
    p.feature = torch.randn(64)
    draft = p.propose(torch.tensor([5, 6, 7]))
    top = p.heads(p.feature, None).topk(10, dim=-1).indices  # [heads, 10]
    tree = draft.tree
    assert int(draft.tokens[0]) == 7
    for i in range(1, tree.size):
        assert int(draft.tokens[i]) == int(top[tree.depth[i] - 1, tree.rank[i]])


@pytest.mark.parametrize("own", [True, False], ids=["own-lm-heads", "shared-lm-head"])
def test_lossless(tiny_model, tmp_path, own):
    save_medusa_heads(tmp_path / "m", tiny_model.config, own=own)
    p = build_proposer("medusa", {"head": str(tmp_path / "m")}, vocab_size=96, device=CPU, target=tiny_model)
    engine = StaticEngine(tiny_model)
    for prompt in PROMPTS:
        gen = generate(engine, p, prompt, max_new_tokens=40, stop_ids={17})
        assert gen.token_ids == generate_greedy(tiny_model, prompt, 40, eos_token_id=17)


def test_saved_heads_load_back_and_train_toward_the_targets_tokens(tiny_model, tmp_path):
    """The trainer on the tiny model's own greedy continuations: head 0's held-out accuracy rises from the
    identity start's; saving and loading keep the heads (fp16) and share the target's lm_head."""
    torch.manual_seed(0)
    seqs = [torch.randint(3, 96, (4,)).tolist() for _ in range(40)]
    seqs = [s + generate_greedy(tiny_model, s, 24) for s in seqs]
    with torch.no_grad():
        data = eagle_train.features(tiny_model, seqs, [4] * len(seqs), CPU)
    heads = MedusaHeads(64, 3, 1)
    for m in heads.modules():
        if isinstance(m, torch.nn.Linear):
            m.weight.data.zero_(), m.bias.data.zero_()
    lm_head = tiny_model.lm_head.requires_grad_(False)
    before = validate(heads, lm_head, data[:8])
    log = train(heads, lm_head, data[8:], data[:8], minutes=5, lr=3e-3, positions=16, max_steps=1500,
                log=lambda s: None)
    assert log["steps"] == 1500 and len(log["top1_per_head"]) == 3
    assert log["top1_per_head"][0] > before[0] + 0.1, (before, log)
    save_heads(heads, tmp_path / "trained", {"train_log.json": log})
    back = load_heads(str(tmp_path / "trained"), tiny_model.config)
    assert not back.own_lm_head and json.loads((tmp_path / "trained" / "train_log.json").read_text())["steps"] > 0
    f = data[0]["feats"][5].float()
    assert torch.allclose(back(f, lm_head), heads(f, lm_head), atol=0.05)
