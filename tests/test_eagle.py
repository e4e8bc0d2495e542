"""EAGLE and EAGLE-2 on a tiny random Llama: the head loader, drafting against a from-scratch reference, losslessness."""
import json

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from methods.base import build_proposer
from methods.common import HarnessError
from methods.decode import generate
from methods.heads.eagle import EagleHead, head_config, load_head, random_head, save_head
from tests.checkpoints import hub_snapshot, save_eagle_head

CPU = torch.device("cpu")


def build(model, name="eagle", **params):
    return build_proposer(name, {"head": "random", **params}, vocab_size=model.config.vocab_size, device=CPU,
                          target=model)


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_loads_a_head_in_the_published_layout(tiny_model, tmp_path, fmt):
    state = save_eagle_head(tmp_path / "head", tiny_model.config, fmt,
                             extra={"layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)})
    head = load_head(str(tmp_path / "head"), tiny_model.config)
    assert torch.equal(head.fc.weight, state["fc.weight"])
    assert torch.equal(head.layers[0].mlp.down_proj.weight, state["layers.0.mlp.down_proj.weight"])
    assert isinstance(head.layers[0].input_layernorm, torch.nn.Identity)  # EAGLE's layer has no input norm
    p = build_proposer("eagle", {"head": str(tmp_path / "head")}, vocab_size=96, device=CPU, target=tiny_model)
    assert p.summary()["head"] == str(tmp_path / "head")


@pytest.mark.parametrize("case, message", [
    (dict(reshape="layers.0.mlp.up_proj.weight"), "layers.0.mlp.up_proj.weight has shape (3, 3), but the target "
                                                 "(hidden size 64) needs (128, 64)"),
    (dict(drop=("fc.bias", "layers.0.self_attn.q_proj.weight")), "lacks fc.bias, layers.0.self_attn.q_proj.weight"),
    (dict(extra={"layers.1.mlp.up_proj.weight": torch.zeros(1)}), "keys this head does not know: layers.1.mlp"),
])
def test_a_wrong_checkpoint_is_refused_naming_key_and_shapes(tiny_model, tmp_path, case, message):
    save_eagle_head(tmp_path / "head", tiny_model.config, **case)
    with pytest.raises(HarnessError, match="EAGLE head") as e:
        load_head(str(tmp_path / "head"), tiny_model.config)
    assert message in str(e.value)


def test_a_head_of_another_model_is_refused(tiny_model, tmp_path):
    save_eagle_head(tmp_path / "head", tiny_model.config)
    cfg = json.loads((tmp_path / "head" / "config.json").read_text())
    (tmp_path / "head" / "config.json").write_text(json.dumps({**cfg, "hidden_size": 4096}))
    with pytest.raises(HarnessError, match="for hidden size 4096 .* the target has 64"):
        load_head(str(tmp_path / "head"), tiny_model.config)


def test_a_hub_id_is_fetched_as_a_hub_id_even_with_a_suffix(tiny_model, hub_cache):
    """'yuhuili/EAGLE-Vicuna-7B-v1.3' ends in '.3' but is no file here: it is read from the hub (its cache)."""
    repo = "yuhuili/EAGLE-Vicuna-7B-v1.3"
    with pytest.raises(HarnessError) as e:
        build_proposer("eagle", {"head": repo}, vocab_size=96, device=CPU, target=tiny_model)
    assert str(e.value).startswith(f"the checkpoint is not in the local cache: download {repo} or set method.head=PATH")
    state = save_eagle_head(hub_snapshot(hub_cache, repo), tiny_model.config)
    p = build_proposer("eagle", {"head": repo}, vocab_size=96, device=CPU, target=tiny_model)
    assert torch.equal(p.head.fc.weight, state["fc.weight"]) and p.summary()["head"] == repo


def test_a_head_without_fc_bias_loads_when_its_config_says_so(tiny_model, tmp_path):
    """EAGLE's Llama-3 heads have ``"bias": false`` in config.json and no ``fc.bias``; EAGLE reads the key
    (default true), and so do we: such a head loads and drafts; a bias it did not declare is refused."""
    save_eagle_head(tmp_path / "nobias", tiny_model.config, bias=False)
    p = build_proposer("eagle2", {"head": str(tmp_path / "nobias")}, vocab_size=96, device=CPU, target=tiny_model)
    assert p.head.fc.bias is None
    prompt = [1, 5, 7, 9, 11]
    ref = tiny_model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)[0, 5:].tolist()
    assert generate(tiny_model, p, prompt, max_new_tokens=20, stop_ids=set()).token_ids == ref
    save_eagle_head(tmp_path / "stray", tiny_model.config, bias=False, extra={"fc.bias": torch.zeros(64)})
    with pytest.raises(HarnessError, match="keys this head does not know: fc.bias"):
        load_head(str(tmp_path / "stray"), tiny_model.config)


@pytest.mark.parametrize("bias, dtype", [(True, torch.float16), (False, torch.float32)])
def test_a_saved_head_loads_back_to_the_same_weights_and_outputs(tiny_model, tmp_path, bias, dtype):
    """save_head writes the layout load_head reads (both from methods.proposers.eagle's one definition): a head with its
    own shapes and rotary base, with or without fc's bias, loads back with the same config, weights (as stored:
    fp16 rounds them once) and features; a second save replaces the head in the folder and keeps other files."""
    torch.manual_seed(0)
    rope = {"rope_theta": 5000.0, "rope_type": "default"}
    head = EagleHead(head_config(tiny_model.config, intermediate_size=96, rope_parameters=rope), bias)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_((torch.randn_like(p) * 0.1).to(dtype))  # weights the stored dtype holds exactly
    folder = tmp_path / "head"
    save_head(head, folder, dtype=dtype, extra_json={"train_log.json": {"epochs": []}})
    assert sorted(f.name for f in folder.iterdir()) == ["config.json", "model.safetensors", "train_log.json"]
    config = json.loads((folder / "config.json").read_text())
    assert config["torch_dtype"] == str(dtype).removeprefix("torch.") and config.get("bias", True) is bias
    loaded = load_head(str(folder), tiny_model.config)
    assert (loaded.fc.bias is not None) is bias
    assert loaded.config.intermediate_size == 96 and loaded.config.rope_parameters["rope_theta"] == 5000.0
    mine, theirs = head.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    n, h = 7, tiny_model.config.hidden_size
    embeds, feats = torch.randn(1, n, h), torch.randn(1, n, h)
    mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
    with torch.no_grad():
        outs = [m.eval()(embeds, feats, torch.arange(n)[None], mask, DynamicCache(config=m.config))
                for m in (head, loaded)]
    assert torch.equal(*outs)
    (folder / "notes.txt").write_text("kept")
    with torch.no_grad():
        head.fc.weight.zero_()
    save_head(head, folder, dtype=dtype)
    assert torch.equal(load_head(str(folder), tiny_model.config).fc.weight, head.fc.weight)
    assert (folder / "notes.txt").read_text() == "kept" and (folder / "train_log.json").is_file()
    assert [f.name for f in tmp_path.iterdir()] == ["head"]  # no temporary or set-aside folder left behind


def _rope_error(rotary, positions, head_dim, theta):
    """Largest error of the rotary cos/sin tables at ``positions`` against a float64 computation."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.double()[:, None] * inv[None]
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = rotary(torch.empty(1, dtype=torch.float32), positions[None])
    return max((cos[0].double() - angles.cos()).abs().max(), (sin[0].double() - angles.sin()).abs().max())


def test_the_head_keeps_fp32_rotary_frequencies_in_fp16():
    """Cast to fp16 with its target, the head's rotary inv_freq stayed fp16 and its angles were off by about
    0.24 rad at position 1000 (head_dim 128): acceptance fell on every GPU run. Now its tables are exact."""
    cfg = LlamaConfig(vocab_size=96, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096)
    target = LlamaForCausalLM(cfg).half()
    p = build_proposer("eagle", {"head": "random"}, vocab_size=96, device=CPU, target=target)
    assert p.head.fc.weight.dtype == torch.float16 and p.head.rotary.inv_freq.dtype == torch.float32
    positions = torch.tensor([1000, 1500, 2047, 4000])
    assert _rope_error(p.head.rotary, positions, 128, 10000.0) < 1e-3


def test_the_head_takes_its_own_rotary_base(tiny_model, tmp_path):
    """A head's config.json that names its rotary base (EAGLE's Llama-3 head: rope_theta 500000) is followed,
    whatever the target's."""
    save_eagle_head(tmp_path / "head", tiny_model.config, config_extra={"rope_theta": 500000.0})
    head = load_head(str(tmp_path / "head"), tiny_model.config)
    assert head.config.rope_parameters["rope_theta"] == 500000.0
    assert _rope_error(head.rotary, torch.tensor([300, 511]), 16, 500000.0) < 1e-5


def test_a_head_that_names_no_rotary_base_gets_eagles_default_not_the_targets(tmp_path):
    """EAGLE builds a head whose config.json has no rope keys with base 10000, unscaled (``_init_rope``), as
    EAGLE-3's Llama-3.1 head is, whatever its target's (500000 and Llama-3 scaling there)."""
    from scripts.shapes import random_model

    target = random_model("llama-3.1-8b-instruct", small=True).config
    save_eagle_head(tmp_path / "head", target)
    head = load_head(str(tmp_path / "head"), target)
    rope = head.config.rope_parameters
    assert rope["rope_theta"] == 10000.0 and rope["rope_type"] == "default" and "factor" not in rope
    assert _rope_error(head.rotary, torch.tensor([300, 511]), head.config.head_dim, 10000.0) < 1e-4  # fp32 angles


@pytest.mark.parametrize("params, message", [
    ({"head": None}, "needs a draft head and the model config names none"),
    ({"head": "random", "topk": 0}, "method.topk must be an integer from 1 to 64"),
    ({"head": "random", "topk": 2}, "uses ranks up to 3, which needs method.topk > 3"),
    ({"head": "/nowhere/head"}, "method.head=/nowhere/head: no such folder here, and not a hub id"),
    ({"head": "random", "k": 3}, "has no parameter k"),
])
def test_bad_parameters(tiny_model, params, message):
    with pytest.raises(HarnessError) as e:
        build_proposer("eagle", params, vocab_size=96, device=CPU, target=tiny_model)
    assert message in str(e.value)


def reference_top(proposer, model, context, path_tokens):
    """From scratch, no cache reuse: the head's top-k after the committed context and the draft tokens on a path."""
    with torch.no_grad():
        feats = model(context[None, :-1], output_hidden_states=True).hidden_states[-1][0]  # f_0 .. f_{L-2}
        head, embed = proposer.head, model.get_input_embeddings()
        cache = DynamicCache(config=head.config)
        n = len(context) - 1
        mask = torch.full((n, n), torch.finfo(feats.dtype).min).triu(1)[None, None]
        out = head(embed(context[1:])[None], feats[None], torch.arange(n)[None], mask, cache)[0, -1]
        for i, t in enumerate(path_tokens):  # each draft: (the previous predicted feature, its token)
            out = head(embed(torch.tensor([[t]])), out.view(1, 1, -1), torch.tensor([[n + i]]),
                       torch.zeros(1, 1, 1, n + i + 1), cache)[0, -1]
        return model.get_output_embeddings()(out).topk(proposer.width).indices.tolist()


@pytest.mark.parametrize("name", ["eagle", "eagle2"])
def test_drafts_equal_a_from_scratch_reference(tiny_model, name):
    """Every draft node holds its parent path's top-ranked continuation under the head, computed without caches."""
    torch.manual_seed(1)
    p = build(tiny_model, name, topk=4, **({"tree": "eagle"} if name == "eagle" else {"total_tokens": 12}))
    prompt = [1, 5, 7, 9, 11, 13, 2, 4]
    gen = generate(tiny_model, p, prompt, max_new_tokens=12, stop_ids=set())  # several steps: the cache in use
    context = torch.tensor(prompt + gen.token_ids)
    draft = p.propose(context)
    tree, tokens = draft.tree, draft.tokens.tolist()
    assert tokens[0] == context[-1]
    if name == "eagle2":
        assert tree.size == 12 and tree.max_depth <= 6  # depth 5 expansions after the root's top-k
    for v in range(1, tree.size):
        path = tree.path_to(v)
        top = reference_top(p, tiny_model, context, [tokens[u] for u in path[1:-1]])
        if name == "eagle":
            assert tokens[v] == top[int(tree.rank[v])], f"node {v}"
        else:  # dynamic: one of the parent's top-k, siblings distinct
            assert tokens[v] in top, f"node {v}"
    siblings = {}
    for v in range(1, tree.size):
        siblings.setdefault(tree.parents[v], []).append(tokens[v])
    assert all(len(s) == len(set(s)) for s in siblings.values())
    assert p.cache.get_seq_length() == len(context) - 1  # drafts are dropped from the head's cache


@pytest.mark.parametrize("name, params", [("eagle", {}), ("eagle2", {}), ("eagle2", {"depth": 2, "total_tokens": 5}),
                                          ("eagle", {"topk": 4})])
def test_lossless_with_a_random_head(tiny_model, name, params):
    for prompt in ([1, 5, 7, 9, 11], [1, 2, 3] * 12, [1, 40, 41, 40, 41, 40]):
        p = build(tiny_model, name, **params)
        gen = generate(tiny_model, p, prompt, max_new_tokens=40, stop_ids={17})
        ref = tiny_model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=17)
        assert gen.token_ids == ref[0, len(prompt):].tolist()
        assert sum(gen.accept_lengths) == len(gen.token_ids)


def test_a_head_that_knows_the_answer_gets_long_acceptances(tiny_model):
    """Drafting is not only lossless but useful: a head trained on the target's own greedy text drafts it."""
    torch.manual_seed(0)
    prompt = [1, 5, 7, 9]
    p = build(tiny_model, "eagle2", depth=4, total_tokens=16)
    with torch.no_grad():
        ids = tiny_model.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False)[0]
        feats = tiny_model(ids[None], output_hidden_states=True).hidden_states[-1][0]
    head: EagleHead = p.head.train().requires_grad_(True)
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    n = len(ids) - 1
    mask = torch.full((n, n), torch.finfo(feats.dtype).min).triu(1)[None, None]
    lm = tiny_model.get_output_embeddings()
    for _ in range(150):
        out = head(tiny_model.get_input_embeddings()(ids[1:])[None].detach(), feats[None, :-1], torch.arange(n)[None],
                   mask, DynamicCache(config=head.config))[0]
        loss = (out[:-1] - feats[1:-1]).abs().mean() + 0.1 * torch.nn.functional.cross_entropy(lm(out[:-1]), ids[2:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    head.eval().requires_grad_(False)
    gen = generate(tiny_model, p, prompt, max_new_tokens=60, stop_ids=set())
    assert gen.token_ids == ids[len(prompt):].tolist()
    assert len(gen.token_ids) / len(gen.accept_lengths) > 2.0


def test_eagle2_depth_counts_expansions_after_the_root(tiny_model):
    """As in EAGLE-2's code: the root's top-k, then ``depth`` expansions, so drafts reach depth + 1; with room
    for every candidate (10 + 100 per expansion) all of them are drafted."""
    p = build(tiny_model, "eagle2", topk=10, depth=2, total_tokens=211)
    prompt = [1, 5, 7, 9, 11]
    with torch.no_grad():
        hidden = tiny_model(torch.tensor([prompt]), output_hidden_states=True).hidden_states[-1][0]
    p.reset(torch.tensor(prompt), 0, None, hidden)
    tree = p.propose(torch.tensor(prompt + [3])).tree  # the prompt and the root, the target's first token
    assert tree.max_depth == 3 and tree.size == 211
    assert [int((tree.depth == d).sum()) for d in (1, 2, 3)] == [10, 100, 100]


@pytest.mark.parametrize("pack", [True, False])
def test_the_drafts_lm_head_is_packed_as_the_engine_packs(tiny_model, pack):
    """engine.pack (measured by auto, or set) decides for the head's lm_head too, through the prepare hook."""
    from methods.base import Preparation
    from methods.engine import build_engine

    engine = build_engine(tiny_model, {"name": "static", "pack": pack})
    p = build(tiny_model)
    assert p.lm_head.use_packed  # a CPU in fp32: packed unless the engine says otherwise
    p.prepare(Preparation(engine=engine, model_name="tiny", stop_ids=set(), prompts=lambda n: [], cache=None))
    assert p.lm_head.use_packed is pack
    ids = [3, 17, 42, 5, 9]
    assert generate(engine, p, ids, max_new_tokens=12, stop_ids=set()).token_ids == \
        generate(engine, build_proposer("vanilla", {}, vocab_size=96, device=CPU), ids, max_new_tokens=12,
                 stop_ids=set()).token_ids


def test_a_new_head_can_be_narrower_than_the_target(tiny_model):
    """``scripts.train_eagle --intermediate-size``: a random head's MLP that wide, the rest the target's shapes."""
    narrow, full = random_head(tiny_model.config, 0, 24), random_head(tiny_model.config, 0)
    assert narrow.layers[0].mlp.up_proj.weight.shape == (24, tiny_model.config.hidden_size)
    assert full.config.intermediate_size == tiny_model.config.intermediate_size != 24
    assert narrow.fc.weight.shape == full.fc.weight.shape


def test_a_head_for_a_windowed_target_keeps_every_entry():
    """A head for Gemma 3 (sliding-window layers of 512 positions): its one layer attends over the whole context,
    so a cache made from its config keeps every entry past the target's window (``scripts.train_eagle``'s
    validation drafts 525 positions in)."""
    from transformers import Gemma3TextConfig

    from scripts.shapes import tiny

    head = random_head(Gemma3TextConfig(**{k: v for k, v in tiny("gemma3-270m").items() if k != "model_type"}), 0)
    cache = DynamicCache(config=head.config)
    n = 525
    with torch.no_grad():
        head(torch.zeros(1, n, head.config.hidden_size), torch.zeros(1, n, head.config.hidden_size),
             torch.arange(n)[None], torch.zeros(1, 1, n, n), cache)
        out = head(torch.zeros(1, 1, head.config.hidden_size), torch.zeros(1, 1, head.config.hidden_size),
                   torch.tensor([[n]]), torch.zeros(1, 1, 1, n + 1), cache)
    assert cache.get_seq_length() == n + 1 and out.shape == (1, 1, head.config.hidden_size)


def test_a_head_for_gemma_3_takes_one_rotary_setting():
    """Gemma 3's rotary table is by layer type; a head's one layer takes the full-attention entry, and the shipped
    Gemma head keeps the top-level setting it was trained with (base 10,000)."""
    import json

    from transformers import Gemma3TextConfig

    from methods.common import ROOT
    from methods.heads.eagle import head_config, head_rope
    from scripts.shapes import tiny

    target = Gemma3TextConfig(**{k: v for k, v in tiny("gemma3-270m").items() if k != "model_type"})
    full = target.rope_parameters["full_attention"]["rope_theta"]
    assert full != target.rope_parameters["sliding_attention"]["rope_theta"]
    assert head_config(target).rope_parameters["rope_theta"] == full
    raw = json.loads((ROOT / "data/eagle/gemma3-270m/config.json").read_text())
    config = head_config(target, **head_rope(raw))
    assert config.rope_parameters["rope_theta"] == 10000.0 and "full_attention" not in config.rope_parameters
