"""The lean static engine against the reference forward, on tiny random Llamas built here."""
import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from methods.common import HarnessError
from methods.engine import HFEngine, StaticEngine, build_engine, kv
from methods.tree import Tree, load_template
from tests.helpers import generate_greedy, tiny_llama


def _logits_close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pack", [False, True])
def test_same_function_as_the_reference_forward(tiny_model, pack):
    """Prefill, a tree, a commit of a path that skips nodes, a chain after it: logits and hidden states agree."""
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(96, (150,), generator=gen)  # past the first 64 slots and their rotary table
    tree = Tree.from_parents((-1, 0, 0, 1, 2, 2, 4))
    drafts = torch.randint(96, (tree.size,), generator=gen)
    hf, st = HFEngine(tiny_model), StaticEngine(tiny_model, pack=pack)
    out = {}
    for e in (hf, st):
        e.start(8)  # smaller than needed: the static cache grows
        a = e.forward(prompt, hidden=True)
        last = e.forward(prompt[:0].new_tensor([5]), last_only=True)[0]
        e.commit(150, [])  # drop it again
        b = e.forward(drafts, tree, hidden=True)
        e.commit(150, [0, 2, 4, 6])
        c = e.forward(torch.tensor([7, 8, 9]))
        out[e.name] = (a, last, b, c, e.length)
    (a1, l1, b1, c1, n1), (a2, l2, b2, c2, n2) = out["hf"], out["static"]
    for x, y in [(a1[0], a2[0]), (a1[1], a2[1]), (l1, l2), (b1[0], b2[0]), (b1[1], b2[1]), (c1[0], c2[0])]:
        _logits_close(x, y)
    assert l1.shape == (1, 96) and n1 == n2 == 150 + 4 + 3


def test_tree_nodes_see_exactly_their_ancestors(tiny_model):
    """Each node's logits equal a plain causal forward of the prefix plus its own root-to-node path."""
    tree = load_template("paper")
    gen = torch.Generator().manual_seed(2)
    prompt, drafts = torch.randint(96, (9,), generator=gen), torch.randint(96, (tree.size,), generator=gen)
    st = StaticEngine(tiny_model)
    st.start(200)
    st.forward(prompt)
    logits, _ = st.forward(drafts, tree)
    for node in (0, 1, 7, 30, tree.size - 1):
        path = tree.path_to(node)
        ref = tiny_model(torch.cat([prompt, drafts[path]])[None]).logits[0, -1]
        _logits_close(logits[node], ref)


def test_rejected_entries_stay_in_place_and_are_never_seen(tiny_model):
    """Committing a path moves only its entries; stale slots past the length are masked on the next step."""
    st = StaticEngine(tiny_model)
    st.start(64)
    st.forward(torch.arange(1, 11))
    tree = Tree.from_parents((-1, 0, 0, 0, 3))
    st.forward(torch.tensor([11, 50, 51, 12, 13]), tree)
    keys_before = st.cache.keys[0][:, :, 14].clone()  # node 4's entry (slot 10 + 4)
    st.commit(10, [0, 3, 4])
    assert st.length == 13 and torch.equal(st.cache.keys[0][:, :, 14], keys_before)  # left where it was
    logits, _ = st.forward(torch.tensor([14]))
    ref = tiny_model(torch.tensor([list(range(1, 12)) + [12, 13, 14]])).logits[0, -1]
    _logits_close(logits[0], ref)


def test_static_kv_commit_moves_the_path():
    cache = kv.StaticKV(layers=2, kv_heads=1, head_dim=1, capacity=16, dtype=torch.float32, device="cpu")
    cache.keys[0, :, 0, :, 0] = torch.arange(16.0)
    cache.commit(8, [0, 2, 5])
    assert cache.length == 11 and cache.keys[0, 0, 0, 8:11, 0].tolist() == [8.0, 10.0, 13.0]
    cache.commit(8, [0, 1])  # a prefix: no copy
    assert cache.length == 10 and cache.keys[0, 1, 0, 8:11, 0].tolist() == [8.0, 10.0, 13.0]
    cache.reserve(40)
    assert cache.capacity >= 40 and cache.keys[0, 0, 0, 9, 0] == 10.0 and cache.row(0)[0][0, 0, 9, 0] == 10.0


def test_build_engine_refuses_what_cannot_work(tiny_model):
    assert isinstance(build_engine(tiny_model, {"name": "hf"}), HFEngine)
    assert isinstance(build_engine(tiny_model, {"name": "static", "pack": "auto"}), StaticEngine)
    with pytest.raises(HarnessError, match="unknown engine 'turbo'; known: hf, static"):
        build_engine(tiny_model, {"name": "turbo"})
    with pytest.raises(HarnessError, match="engine 'static' has no parameter turbo; known: pack, compile"):
        build_engine(tiny_model, {"name": "static", "turbo": True})
    with pytest.raises(HarnessError, match="engine.compile must be one of auto, false, graphs, true, got 'yes'"):
        build_engine(tiny_model, {"name": "static", "compile": "yes"})
    with pytest.raises(HarnessError, match="engine.compile=graphs records CUDA graphs, and this model is on the cpu"):
        build_engine(tiny_model, {"name": "static", "compile": "graphs"})
    auto = build_engine(tiny_model, {"name": "static"})  # compile=auto: eager on a CPU, and the summary says so
    assert auto.summary()["step"] == "eager" and auto._graphs is None and auto._compiled is None
    assert build_engine(tiny_model, {"name": "hf"}).summary()["step"] == "eager"
    with pytest.raises(HarnessError, match="engine.compile_mode must be one of default, reduce-overhead"):
        build_engine(tiny_model, {"name": "static", "compile": True, "compile_mode": "fastest"})
    with pytest.raises(HarnessError, match="engine.pack must be one of auto, true, false"):
        build_engine(tiny_model, {"name": "static", "pack": "yes"})
    half = tiny_llama(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1).half()
    with pytest.raises(HarnessError, match="engine.pack=true needs the CPU with float32 or bfloat16"):
        build_engine(half, {"name": "static", "pack": True})
    # bfloat16 packs only where the CPU has the instructions (an AVX2-only EPYC has not: oneDNN raised there).
    bf16 = half.to(torch.bfloat16)
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert build_engine(bf16, {"name": "static", "pack": True}).pack
    else:
        with pytest.raises(HarnessError, match="bfloat16: a CPU with AVX-512 or AVX-NE-CONVERT"):
            build_engine(bf16, {"name": "static", "pack": True})
    auto = build_engine(bf16, {"name": "static", "pack": "auto"})
    assert not auto.pack or torch.ops.mkldnn._is_mkldnn_bf16_supported()
    auto.start(4)
    assert auto.forward(torch.tensor([1, 2, 3]))[0].shape == (3, 32)
    mistral = MistralForCausalLM(MistralConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(HarnessError, match="engine=static runs the llama, qwen2, qwen3, gemma3_text architectures; this model is 'mistral'. Use engine=hf"):
        build_engine(mistral, {"name": "static"})


ARCHS = ["llama-3-8b-instruct", "vicuna-7b", "qwen3-8b", "qwen2.5-7b-instruct", "gemma3-270m"]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_cuda_graph_step_is_the_eager_step(arch):
    """engine.compile=graphs' step (``StaticEngine._step``: static shapes, the mask and positions computed from the
    committed length and the tree's ancestors, a span bucket of masked slots, padding nodes) run eagerly on the CPU,
    with grouped heads folded as on CUDA: every step's tokens equal ``model.generate`` for a tree (TR's paper tree),
    chains padded to prepared sizes (PLD), hidden states handed on (EAGLE-2), past a sliding window (Gemma 3), after
    the cache grew (its graphs dropped)."""
    from methods.base import build_proposer
    from methods.decode import generate
    from scripts.gpu_check import ARCH_OVERRIDES

    model = tiny_llama(arch, vocab_size=512, **(ARCH_OVERRIDES[arch](2) if arch in ARCH_OVERRIDES else {}))
    engine = StaticEngine(model, pack=False, compile="graphs")
    for layer in engine.layers:  # as on CUDA (folded heads; the CPU passes enable_gqa)
        layer.fold = layer.heads != layer.kv_heads
    engine.prepare_span = 256
    steps = []
    record = engine._graphs.step
    engine._graphs.step = lambda span, *inputs: steps.append((span, inputs[0].shape[0])) or record(span, *inputs)
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(1, 512, (40,), generator=gen).tolist() * 2  # repeats: drafts get accepted
    for name, params in [("tr", {}), ("pld", {}), ("eagle2", {"head": "random", "total_tokens": 16})]:
        p = build_proposer(name, params, vocab_size=512, device=torch.device("cpu"), target=model)
        engine.prepare(p.step_sizes())
        for ids, new in ((prompt, 40), (prompt * 3, 16)):  # the second grows the cache: graphs dropped
            before = len(steps)
            got = generate(engine, p, ids, max_new_tokens=new, stop_ids=set())
            assert got.token_ids == generate_greedy(model, ids, new), (arch, name)
            assert len(steps) - before == len(got.accept_lengths) - got.prefill_step  # every step took that path
    assert {n for _, n in steps} >= {81, 16, 2, 4}  # the paper tree, EAGLE-2's, PLD's chains padded
    assert {s for s, _ in steps} >= {256, 512}


def test_folded_grouped_heads_are_the_same_attention():
    """Folding each K/V head's group of queries into its query rows (what CUDA runs) is ``enable_gqa``'s function."""
    model = tiny_llama("llama-3-8b-instruct", vocab_size=512)
    tree = Tree.from_parents((-1, 0, 0, 1, 2, 2))
    gen = torch.Generator().manual_seed(6)
    prompt, drafts = torch.randint(512, (70,), generator=gen), torch.randint(512, (6,), generator=gen)
    out = []
    for fold in (False, True):
        engine = StaticEngine(model, pack=False)
        for layer in engine.layers:
            layer.fold = fold and layer.heads != layer.kv_heads
        assert fold == any(layer.fold for layer in engine.layers)
        engine.start(128)
        engine.forward(prompt)
        out.append(engine.forward(drafts, tree)[0])
    _logits_close(out[0], out[1])


@pytest.mark.slow  # torch.compile
def test_compiled_steps_equal_eager_greedy_one_graph_per_size(tiny_model, tmp_path):
    """engine.compile=true: vanilla and TR tokens equal ``model.generate``; the steps compile once per size
    (the span grows without recompiling); a fresh start finds the compiled code in the disk cache."""
    from torch._dynamo.utils import counters

    from methods.base import build_proposer
    from methods.decode import generate

    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(1, 96, (50,), generator=gen).tolist()  # no pad id 0: generate would mask it
    ref = generate_greedy(tiny_model, prompt, 90)
    counters.clear()
    engine = build_engine(tiny_model, {"name": "static", "compile": True})
    (tmp_path / "six.json").write_text('{"parents": [-1, 0, 0, 1, 1, 2]}')
    for method, params in [("vanilla", {}), ("tr", {"tree": str(tmp_path / "six.json")})]:
        p = build_proposer(method, params, vocab_size=96, device=torch.device("cpu"), target=tiny_model)
        assert generate(engine, p, prompt, max_new_tokens=90, stop_ids=set()).token_ids == ref  # spans 64 -> 256
    long = torch.randint(1, 96, (300,), generator=gen).tolist()  # the cache grows past its first capacity
    ref_long = generate_greedy(tiny_model, long, 20)
    assert generate(engine, p, long, max_new_tokens=20, stop_ids=set()).token_ids == ref_long
    assert counters["stats"]["unique_graphs"] == 2  # n = 1 and n = 6, whatever the span and capacity
    counters.clear()
    torch._dynamo.reset()  # forget the compiled code in memory, as a new process would
    again = build_engine(tiny_model, {"name": "static", "compile": True})
    p = build_proposer("vanilla", {}, vocab_size=96, device=torch.device("cpu"), target=tiny_model)
    assert generate(again, p, prompt, max_new_tokens=20, stop_ids=set()).token_ids == ref[:20]
    assert counters["inductor"]["fxgraph_cache_hit"] >= 1


def test_engines_restore_fp32_rotary_frequencies_of_a_cast_model():
    """``model.half()`` casts the rotary inv_freq too (0.9 rad off at position 4000, head_dim 128); the engines
    recompute it in fp32, so a cast model decodes with exact positions."""
    from tests.test_eagle import _rope_error

    model = tiny_llama(vocab_size=64, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096).half()
    assert model.model.rotary_emb.inv_freq.dtype == torch.float16
    for engine in (HFEngine, StaticEngine):
        engine(model)
        assert model.model.rotary_emb.inv_freq.dtype == torch.float32
        assert _rope_error(model.model.rotary_emb, torch.tensor([1000, 4000]), 128, 10000.0) < 1e-3
        model.half()


def test_expanded_kv_heads_compute_the_same_attention(tiny_model):
    """On CUDA the static engine expands grouped K/V heads before attention (no fused kernel takes a mask with
    ``enable_gqa``); the expanded path, forced here on the CPU, gives the same logits as ``enable_gqa``."""
    tree = Tree.from_parents((-1, 0, 0, 1, 2, 2, 4))
    gen = torch.Generator().manual_seed(4)
    prompt, drafts = torch.randint(96, (70,), generator=gen), torch.randint(96, (tree.size,), generator=gen)
    out = []
    for expand in (False, True):
        st = StaticEngine(tiny_model, pack=False)
        for layer in st.layers:
            layer.expand = expand
        st.start(128)
        st.forward(prompt)
        out.append(st.forward(drafts, tree)[0])
    _logits_close(out[0], out[1])
    summary = StaticEngine(tiny_model).summary()
    assert summary["attention"]["gqa"] == "enable_gqa"  # the CPU keeps enable_gqa: its fused kernel takes it
    assert summary["attention"]["backend"] in ("FLASH_ATTENTION", "MATH", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")


@pytest.mark.slow  # torch.compile
@pytest.mark.long  # compiled steps equal eager ones: the test above (one graph per size); this: PLD's padded sizes
def test_compiled_engine_prepares_every_step_size_before_timing(tiny_model):
    """engine.compile=true with PLD (drafts of 1 to 11 nodes): ``prepare`` compiles the powers of two that cover
    them before anything is timed; decoding then pads each step up to a prepared size, compiles nothing more,
    and stays token-identical to ``generate``."""
    from torch._dynamo.utils import counters

    from methods.base import build_proposer
    from methods.decode import generate
    from methods.engine.static import graph_sizes

    p = build_proposer("pld", {"num_pred_tokens": 10}, vocab_size=96, device=torch.device("cpu"))
    assert graph_sizes(p.step_sizes()) == [1, 2, 4, 8, 16]
    torch._dynamo.reset()
    engine = build_engine(tiny_model, {"name": "static", "compile": True})
    engine.prepare(p.step_sizes())
    compiled = engine.summary()["compiled"]
    assert compiled["graphs"] == [1, 2, 4, 8, 16] and compiled["seconds"] > 0
    counters.clear()
    for prompt in ([1, 5, 9, 33, 4, 5, 9, 33, 4, 5, 9, 33, 4], [1, 2, 3, 2, 3, 2, 3, 2, 3]):
        ref = generate_greedy(tiny_model, prompt, 40)
        gen = generate(engine, p, prompt, max_new_tokens=40, stop_ids=set())
        assert gen.token_ids == ref
    assert max(gen.accept_lengths) > 1  # drafts were accepted: padded steps of several sizes ran
    assert counters["stats"]["unique_graphs"] == 0 and engine.summary()["compiled"]["compiled_while_timed"] == []


def test_unmasked_attention_is_the_masked_attention(tiny_model):
    """A one-token step and a prompt from slot 0 attend without a mask over their own span (``_unmasked``), one-token
    rows through the decode kernel where it builds (``engine.decode_attention=auto``): the same logits as the masked
    path, alone and as rows of a packed forward beside a tree row and a later chunk."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(96, (n,), generator=gen) for n in (5, 70, 130)]
    tree = Tree.from_parents((-1, 0, 0, 1))
    drafts = torch.randint(96, (tree.size,), generator=gen)
    one = torch.tensor([11])
    out = {}
    for label in ("unmasked", "masked", "auto"):
        st = StaticEngine(tiny_model, attention="auto" if label == "auto" else "sdpa")
        if label == "masked":
            st._unmasked = lambda *args: False
        st.start(300, rows=3)
        alone = [st.forward(p, row=r)[0] for r, p in enumerate(prompts)]
        step = st.forward(one, row=0)[0]
        rows = st.forward_rows([0, 1, 2], [one, drafts, prompts[2][:9]], [None, tree, None])
        out[label] = alone + [step] + [logits for logits, _ in rows]
    assert StaticEngine(tiny_model)._unmasked(0, 70, None) and not StaticEngine(tiny_model)._unmasked(3, 2, None)
    for a, b, c in zip(out["unmasked"], out["masked"], out["auto"]):
        _logits_close(a, b)
        _logits_close(c, b)


def test_fused_linears_share_the_model_weights(tiny_model):
    """q/k/v and gate/up run as one linear each; the model's own weights become views of it (held once, its own
    forward unchanged), and a second engine over the model fuses in place; plain RMSNorms as one rms_norm call give
    the module's numbers exactly."""
    x = torch.arange(12)[None] % 96
    before = tiny_model(x).logits
    first, second = StaticEngine(tiny_model, pack=False), StaticEngine(tiny_model, pack=False)
    attn = tiny_model.model.layers[0].self_attn
    fused = first.layers[0].qkv_proj.weight
    assert fused.shape[0] == attn.q_proj.out_features + attn.k_proj.out_features + attn.v_proj.out_features
    assert attn.k_proj.weight.data_ptr() == fused[attn.q_proj.out_features].data_ptr()
    assert second.layers[0].qkv_proj.weight.data_ptr() == fused.data_ptr()
    torch.testing.assert_close(tiny_model(x).logits, before, rtol=0, atol=0)
    h = torch.randn(7, tiny_model.config.hidden_size)
    norm = tiny_model.model.layers[0].input_layernorm
    assert first.layers[0].norm1 is not norm and torch.equal(first.layers[0].norm1(h), norm(h))


def test_native_decode_attention_is_sdpa_and_batch_independent():
    """The engine's decode kernel (methods/engine/native.py): torch's attention to rounding for rows of different
    spans, grouped heads and a sliding window, and a row's result bit for bit the same alone as in a batch."""
    import torch.nn.functional as F

    from methods.engine import native

    if native.kernel() is None:
        pytest.skip(f"the kernel could not be built here: {native.error()}")
    gen = torch.Generator().manual_seed(4)
    keys, values = torch.randn(5, 2, 300, 16, generator=gen), torch.randn(5, 2, 300, 16, generator=gen)
    q = torch.randn(3, 6, 16, generator=gen)  # 3 rows, 6 query heads on 2 K/V heads
    rows, starts, ends = [4, 0, 2], [0, 0, 37], [290, 1, 77]
    out = native.decode_attention(q, keys, values, rows, starts, ends, 0.25)
    for i, (r, a, e) in enumerate(zip(rows, starts, ends)):
        ref = F.scaled_dot_product_attention(q[i][None, :, None], keys[r, :, a:e][None], values[r, :, a:e][None],
                                             scale=0.25, enable_gqa=True)[0, :, 0]
        torch.testing.assert_close(out[i], ref, rtol=1e-5, atol=1e-6)
        alone = native.decode_attention(q[i:i + 1], keys, values, [r], [a], [e], 0.25)
        assert torch.equal(alone[0], out[i])


def test_engine_attention_setting(tiny_model):
    """engine.attention: auto takes the kernel where it runs, sdpa never; the summary names it; native where it
    cannot run is one line."""
    from methods.engine import native

    assert StaticEngine(tiny_model, attention="sdpa").summary()["decode_attention"] == "sdpa"
    auto = StaticEngine(tiny_model).summary()["decode_attention"]
    assert auto == ("native" if native.kernel() is not None else "sdpa")
    with pytest.raises(HarnessError, match="engine.decode_attention=native"):
        StaticEngine(tiny_llama(seed=0).to(torch.bfloat16), attention="native")
