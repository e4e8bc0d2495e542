"""EAGLE-3 (methods.proposers.eagle3): the engines' layer taps, the published layout computed as EAGLE-3 does,
drafts from the head's own cache agreeing with a pass from scratch, lossless decoding."""
import copy
import math

import pytest
import torch
from torch.nn import functional as F

from methods.base import Verification, build_proposer
from methods.common import HarnessError
from methods.decode import generate
from methods.engine import HFEngine, StaticEngine
from methods.heads.eagle3 import feature_layers, load_head
from tests.checkpoints import save_eagle3_head
from tests.helpers import generate_greedy, tiny_llama

CPU = torch.device("cpu")
PROMPTS = [[3, 4, 5, 6, 3, 4, 5], [40, 41, 42], [7] * 6]


@pytest.fixture(scope="module")
def deep():
    """A tiny 8-layer Llama: EAGLE-3 reads layers 2, 4 and 5."""
    torch.manual_seed(0)
    model = tiny_llama(num_hidden_layers=8, max_position_embeddings=512).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    return model


def taps(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hs = model(ids[None], output_hidden_states=True).hidden_states
    return torch.cat([hs[i][0] for i in feature_layers(model.config.num_hidden_layers)], dim=-1)


@pytest.mark.parametrize("engine", [StaticEngine, HFEngine])
def test_the_engines_hand_back_the_inputs_of_the_tapped_layers(deep, engine):
    ids = torch.tensor([5, 9, 13, 2, 30, 31, 8])
    e = engine(deep)
    e.start(32)
    _, got = e.forward(ids[:4], hidden=(2, 4, 5))
    _, more = e.forward(ids[4:], hidden=(2, 4, 5))
    assert torch.allclose(torch.cat([got, more]), taps(deep, ids), atol=1e-4)


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def reference(state: dict, config, embeds: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """EAGLE-3's head over a chain (eagle/model/cnets.py, written out from the published tensors): fc, the two
    input norms side by side into causal attention (rotary, grouped keys), the MLP, the final norm, lm_head."""
    eps, n, h = config.rms_norm_eps, g.shape[0], config.hidden_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    d = h // heads
    x = g @ state["fc.weight"].T
    c = torch.cat([rms(embeds, state["midlayer.input_layernorm.weight"], eps),
                   rms(x, state["midlayer.hidden_norm.weight"], eps)], dim=-1)
    a = "midlayer.self_attn."
    q = (c @ state[f"{a}q_proj.weight"].T).view(n, heads, d).transpose(0, 1)
    k = (c @ state[f"{a}k_proj.weight"].T).view(n, kv_heads, d).transpose(0, 1)
    v = (c @ state[f"{a}v_proj.weight"].T).view(n, kv_heads, d).transpose(0, 1)
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2).float() / d)) if hasattr(config, "rope_theta") else \
        1.0 / (config.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
    ang = torch.arange(n).float()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    rot = lambda t: torch.cat([-t[..., d // 2:], t[..., : d // 2]], -1)  # noqa: E731
    q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
    att = (q @ k.transpose(1, 2)) / math.sqrt(d) + torch.full((n, n), float("-inf")).triu(1)
    o = (att.softmax(-1) @ v).transpose(0, 1).reshape(n, h) @ state[f"{a}o_proj.weight"].T
    x = x + o
    m = rms(x, state["midlayer.post_attention_layernorm.weight"], eps)
    x = x + (F.silu(m @ state["midlayer.mlp.gate_proj.weight"].T) * (m @ state["midlayer.mlp.up_proj.weight"].T)) \
        @ state["midlayer.mlp.down_proj.weight"].T
    draft = rms(x, state["norm.weight"], eps) @ state["lm_head.weight"].T  # [n, draft_vocab]
    full = torch.full((n, config.vocab_size), float("-inf"))
    tokens = torch.arange(draft.shape[-1]) + state["d2t"] if "d2t" in state else torch.arange(draft.shape[-1])
    full[:, tokens] = draft
    return full


def test_a_published_head_computes_as_eagle3_does_and_drafts_from_its_cache(deep, tmp_path):
    """The root's candidates are the top tokens of the reference head run over every committed pair from scratch,
    after the proposer fed them in two pieces through its cache; draft tokens lie in the draft vocabulary."""
    state = save_eagle3_head(tmp_path / "e3", deep.config, draft_vocab=64)
    p = build_proposer("eagle3", {"head": str(tmp_path / "e3"), "total_tokens": 12, "depth": 2}, vocab_size=96,
                       device=CPU, target=deep)
    assert p.wants_hidden == (2, 4, 5) and p.lm_head is None
    seq = torch.tensor([5, 9, 13, 2, 30, 31, 8, 7])
    g = taps(deep, seq)
    embed = deep.get_input_embeddings()
    p.reset(seq[:5], 0, None, g[:4])
    p.propose(seq[:5])
    p.update(None, Verification(path=[0, 1, 2], new_tokens=[], logits=None, argmax=None, hidden=g[4:7]))
    draft = p.propose(seq)
    with torch.no_grad():
        want = reference(state, deep.config, embed(seq[1:]), g[:7])  # pairs (g_j, x_{j+1}), j = 0..6
        got = p.head.logits(p.head(embed(seq[1:])[None], g[None, :7], torch.arange(7).view(1, -1),
                                   torch.zeros(1, 1, 7, 7).masked_fill_(torch.ones(7, 7).triu(1).bool(),
                                                                        float("-inf")), None)[0], 96)
    assert torch.allclose(got, want, atol=1e-4)
    top = want[-1].topk(10).indices.tolist()
    first = [int(t) for t, d in zip(draft.tokens, draft.tree.depth) if d == 1]
    assert set(first) <= set(top) and len(first) >= 1
    allowed = set((torch.arange(64) + state["d2t"]).tolist())
    assert set(draft.tokens[1:].tolist()) <= allowed


@pytest.mark.parametrize("case,message", [
    ({"drop": ["midlayer.hidden_norm.weight"]}, "lacks midlayer.hidden_norm.weight"),
    ({"reshape": "midlayer.self_attn.q_proj.weight"},
     r"q_proj.weight has shape \(3, 3\), but the target .* needs \(64, 128\)"),
    ({"drop": ["d2t"]}, "lacks d2t"),
    ({"target_hidden_size": 32}, "target_hidden_size 32 beside hidden size 64"),
])
def test_a_wrong_checkpoint_is_refused_naming_the_problem(deep, tmp_path, case, message):
    save_eagle3_head(tmp_path / "e3", deep.config, draft_vocab=64, **case)
    with pytest.raises(HarnessError, match=message):
        load_head(str(tmp_path / "e3"), deep.config)


def test_a_shallow_target_and_a_missing_head_are_named(deep, tiny_model):
    with pytest.raises(HarnessError, match="needs at least 8 layers; this target has 2"):
        build_proposer("eagle3", {"head": "random"}, vocab_size=96, device=CPU, target=tiny_model)
    with pytest.raises(HarnessError, match="needs an EAGLE-3 head"):
        build_proposer("eagle3", {}, vocab_size=96, device=CPU, target=deep)


@pytest.mark.parametrize("engine,draft_vocab", [(StaticEngine, 64), (HFEngine, None)], ids=["static-d2t", "hf-full"])
def test_lossless(deep, tmp_path, engine, draft_vocab):
    save_eagle3_head(tmp_path / "e3", deep.config, draft_vocab=draft_vocab)
    p = build_proposer("eagle3", {"head": str(tmp_path / "e3"), "total_tokens": 20}, vocab_size=96, device=CPU,
                       target=deep)
    e = engine(deep)
    for prompt in PROMPTS:
        gen = generate(e, p, prompt, max_new_tokens=40, stop_ids={17})
        assert gen.token_ids == generate_greedy(deep, prompt, 40, eos_token_id=17)


def test_trained_head_learns_the_targets_tokens_and_loads_back(deep, tmp_path):
    """The trainer (training-time test over 2 depths, a 48-token draft vocabulary, an MLP narrower than the
    target's) on the tiny model's own greedy continuations: depth 1's held-out accuracy rises; the saved head
    (fp16, d2t, its own intermediate_size) loads back computing the same."""
    from methods.heads import eagle3, eagle_train

    torch.manual_seed(0)
    seqs = [torch.randint(3, 96, (4,)).tolist() for _ in range(40)]
    seqs = [s + generate_greedy(deep, s, 24) for s in seqs]
    with torch.no_grad():
        data = eagle_train.features(deep, seqs, [4] * len(seqs), CPU, layers=(2, 4, 5))
    tokens = eagle3.draft_vocabulary(data[8:], 48)
    assert len(tokens) == 48 and bool((tokens.diff() > 0).all())
    head = eagle3.new_head(deep.config, tokens, intermediate_size=deep.config.intermediate_size // 2)
    embed, lm_head = deep.get_input_embeddings(), deep.lm_head.requires_grad_(False)
    before = eagle3.validate(head, embed, data[:8], 2)
    log = eagle3.train(head, embed, lm_head, data[8:], data[:8], minutes=5, lr=3e-3, unroll=2, positions=16,
                       max_steps=400, log=lambda s: None)
    assert log["steps"] == 400 and len(log["top1_per_depth"]) == 2
    assert log["top1_per_depth"][0] > before[0] + 0.1, (before, log)
    eagle3.save_head(head, tmp_path / "trained", {"train_log.json": log})
    back = load_head(str(tmp_path / "trained"), deep.config).eval()
    assert torch.equal(back.tokens(), tokens) and back.config.intermediate_size == deep.config.intermediate_size // 2
    assert eagle3.validate(back, embed, data[:8], 2) == pytest.approx(log["top1_per_depth"], abs=0.03)


def test_features_beyond_fp16s_range_are_stored_finite(deep):
    """A target whose residual stream passes fp16's 65,504 (Gemma 3's does) gets finite stored features (bf16
    there), where fp16 would store inf and EAGLE-3's training would turn to NaN; small ones stay fp16."""
    from methods.heads import eagle_train

    big = copy.deepcopy(deep)
    with torch.no_grad():
        big.get_input_embeddings().weight.mul_(1e8)
    seqs = [[5, 6, 7, 8, 9, 10]]
    for model, dtype in ((deep, torch.float16), (big, torch.bfloat16)):
        with torch.no_grad():
            (record,) = eagle_train.features(model, seqs, [4], CPU, layers=(0, 2))
        assert record["taps"].dtype == dtype and bool(record["taps"].float().isfinite().all())
    assert record["taps"].float().abs().max() > 65504


def test_at_temperature_it_samples_exactly_vanillas_tokens(deep, tmp_path):
    from methods.sampling import Sampling
    from tests.test_sampling import decode_all

    save_eagle3_head(tmp_path / "e3", deep.config, draft_vocab=64)
    settings = Sampling(temperature=1.0, top_p=0.95, seed=1)
    got = decode_all(deep, "eagle3", {"head": str(tmp_path / "e3"), "total_tokens": 20}, settings)
    assert [t for t, *_ in got] == [t for t, *_ in decode_all(deep, "vanilla", {}, settings)]
