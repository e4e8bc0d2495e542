"""SuffixDecoding (``method=suffix``): its suffix trees on worked examples, held step for step to arctic-inference's
(the library's C++ trees, its ``SuffixDecodingCache``, and that cache as vLLM drives it over real answers), its memory
across requests (what it remembers, the warm-up's left out, a resumed run's replayed), on tiny and embedded models."""
import random

import pytest
import torch

from evaluation.records.bench import load_bench
from evaluation.running.config import compose_config
from evaluation.running.paradigms import Paradigm
from evaluation.running.runner import Runner
from methods.base import build_proposer
from methods.common import load_torch_safe, save_torch_atomic
from methods.engine import StaticEngine
from methods.suffix_tree import SuffixCache, SuffixTree, f32
from tests import helpers

CPU = torch.device("cpu")
SPEC = dict(max_spec_tokens=8, max_spec_factor=1.0, max_spec_offset=0.0, min_token_prob=0.1)


def arctic():
    """arctic-inference's suffix decoding module (make setup builds it: make arctic)."""
    try:
        import arctic_inference.suffix_decoding as lib
    except ImportError:
        pytest.fail("arctic-inference is not installed: run make arctic (make setup does)")
    return lib


def test_counts_ranks_and_drafts_of_a_worked_example():
    """``5 1 2 5 1 3 5 1 3 5``: "1" occurs 3 times, twice before 3. The child "3" joined "1"'s children after "2",
    with "2"'s count; its count then grew past "2"'s, which moved it first. From the context ``9 5 1`` the match "1"
    (m = 1) allows one token, 3 with probability 2/3; the match "5 1" (m = 2) two: 3 (2/3), then 5, which follows
    "5 1 3" both times (2/3 x 1): score 4/3, the best ("9 5 1" does not occur)."""
    t = SuffixTree(24)
    t.extend(0, [5, 1, 2, 5, 1, 3, 5, 1, 3, 5])
    t.check()
    one = t.root.kids[1]
    assert one.count == 3 and [c.first() for c in one.ranked] == [3, 2] and [c.count for c in one.ranked] == [2, 1]
    d = t.speculate([9, 5, 1], tree=False, **SPEC)
    assert (d.token_ids, d.parents, d.match_len) == ([3, 5], [-1, 0], 2)
    assert d.probs == [f32(2 / 3), f32(2 / 3)] and d.score == f32(f32(2 / 3) + f32(2 / 3))
    d = t.speculate([9, 5, 1], tree=False, **{**SPEC, "min_token_prob": 0.7})  # 2/3 < 0.7: nothing after 1
    assert d.token_ids == [] and d.score == 0
    t.remove(0)
    assert t.root.count == 0 and not t.root.kids


def test_a_tie_is_broken_as_the_librarys_heap_breaks_it():
    """Equal probabilities pop from the tree's priority queue in the order of libstdc++'s binary heap: "1 2" goes on
    with 3 or 4 (1/2 each), the earlier child first."""
    t = SuffixTree(24)
    t.extend(0, [1, 2, 3, 1, 2, 4])
    d = t.speculate([5, 1, 2], tree=True, **SPEC)
    assert (d.token_ids, d.parents, d.probs) == ([3, 4], [-1, -1], [0.5, 0.5])


def streams(seed: int, ops: int, vocab: int):
    """Random appends, removals and contexts, many of them repeating earlier text (so that counts tie and grow)."""
    rng = random.Random(seed)
    live, text, nxt = [], {}, 0
    for _ in range(ops):
        r = rng.random()
        if r < 0.05 and live:
            s = live.pop(rng.randrange(len(live)))
            yield "remove", s, None
        elif r < 0.15 or not live:
            live.append(nxt)
            text[nxt] = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
            yield "extend", nxt, text[nxt]
            nxt += 1
        else:
            s, src = rng.choice(live), text[rng.choice(live)]
            i = rng.randrange(len(src))
            toks = src[i:i + rng.randrange(1, 6)] if rng.random() < 0.5 else [rng.randrange(vocab)]
            text[s] += toks
            yield "extend", s, toks
        if live and rng.random() < 0.5:
            src = text[rng.choice(live)]
            k = rng.randrange(0, 28)
            yield "speculate", None, (src[len(src) - k:], rng.choice([1, 4, 24]), rng.choice([1.0, 0.5, 2.0]),
                                      rng.choice([0.0, 1.0]), rng.choice([0.1, 0.0, 0.3]))


@pytest.mark.parametrize("vocab,depth", [(3, 4), (3, 24), (12, 8), (50, 24)])
def test_our_trees_draft_what_the_librarys_trees_draft(vocab, depth):
    """Appends, removals and speculations in both modes on our tree and the library's C++ one (arctic-inference
    0.3.0): every draft equal, tokens, parents, probabilities, score and match length; counts and ranks as the
    sequences make them."""
    native = arctic()._C.SuffixTree
    for seed in range(6):
        ours, lib = SuffixTree(depth), native(depth)
        for op, seq, arg in streams(seed, 300, vocab):
            if op == "extend":
                ours.extend(seq, arg)
                lib.extend(seq, arg)
            elif op == "remove":
                ours.remove(seq)
                lib.remove(seq)
            else:
                context, most, factor, offset, floor = arg
                for tree in (False, True):
                    a, b = lib.speculate(context, most, factor, offset, floor, tree), ours.speculate(
                        context, most, factor, offset, floor, tree)
                    assert (a.token_ids, a.parents, a.probs, a.score, a.match_len) == (
                        b.token_ids, b.parents, b.probs, b.score, b.match_len), (seed, context, tree)
        ours.check()
        assert lib.check_integrity() == ""


@pytest.mark.parametrize("max_cached", [-1, 0, 2])
def test_our_cache_drafts_what_the_librarys_cache_drafts(max_cached):
    """Requests started, grown, stopped and evicted (FIFO, ``max_cached_requests``) side by side in our
    ``SuffixCache`` and the library's ``SuffixDecodingCache``: every speculation equal."""
    lib = arctic().SuffixDecodingCache(max_tree_depth=12, max_cached_requests=max_cached)
    ours = SuffixCache(12, max_cached)
    rng = random.Random(max_cached)
    active, text, nxt = [], {}, 0
    for _ in range(600):
        if rng.random() < 0.1 or not active:
            prompt = [rng.randrange(6) for _ in range(rng.randrange(0, 15))]
            lib.start_request(nxt, prompt)
            ours.start(nxt, prompt)
            active.append(nxt)
            text[nxt] = list(prompt)
            nxt += 1
        elif rng.random() < 0.08:
            r = active.pop(rng.randrange(len(active)))
            lib.stop_request(r)
            ours.stop(r)
        else:
            r = rng.choice(active)
            toks = [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
            lib.add_active_response(r, toks)
            ours.add(r, toks)
            text[r] += toks
            for tree in (False, True):
                a = lib.speculate(r, text[r], max_spec_tokens=8, use_tree_spec=tree)
                b, _ = ours.speculate(r, text[r], tree=tree, **SPEC)
                assert (a.token_ids, a.parents, a.probs, a.score, a.match_len) == (
                    b.token_ids, b.parents, b.probs, b.score, b.match_len)
        assert set(lib.cached_requests) == set(ours.cached)


@pytest.mark.slow  # the embedded model
def test_drafts_over_real_answers_are_arctic_inferences_as_vllm_drives_it(embedded):
    """Spec-Bench questions answered by the embedded model with ``method=suffix`` (its global tree on, the two-turn
    question's second turn on its first answer), then every step of every answer replayed through our proposer and
    through the library's cache driven as vLLM's suffix proposer drives it (``scripts.suffix_parity``): every draft
    the library's, chain and tree, with our trees and with the library's."""
    from scripts.suffix_parity import compare

    model, tok, _ = embedded
    questions = load_bench(None, question_ids=[81, 241, 321])  # mt_bench's two turns, a summary, qa
    cfg = compose_config(["method=suffix", "bench.max_new_tokens=40", "model.device=cpu", "model.dtype=float32"])
    r = Runner(cfg, loaded=(model, tok, CPU))
    records = []
    r.answer_all(questions, records.append)
    prompts = {}
    for rec, q in zip(records, questions):
        for t in range(len(rec["choices"][0]["turns"])):
            prompts[q.question_id, t] = Paradigm().prompt(r.spec, r.tok, q, t, rec["choices"][0]["turns"][:t],
                                                          r.marker)
    for backend in ("python", "arctic"):
        for tree in ("false", "true"):
            steps, diffs = compare(records, prompts, [f"method.backend={backend}", f"method.tree={tree}"])
            assert steps > 100 and diffs == [], (backend, tree, diffs[:3])


PROMPTS = [[5, 6, 7, 8, 9, 10], [20, 21, 22], [5, 6, 7, 30, 31], [40, 41, 42, 43]]


def decode(engine, proposer, prompts, batch: int = 1):
    return helpers.batched(engine, proposer, batch, prompts, 24)


@pytest.mark.parametrize("batch", [1, 3])
def test_the_global_tree_remembers_earlier_answers(tiny_model, batch):
    """The same prompts twice in one run: the second time, the global tree holds the first answers, so drafts run
    long; without it (max_cached_requests=0) the second pass drafts as the first. Tokens are greedy's throughout."""
    engine = StaticEngine(tiny_model, pack=False)
    vanilla = [g.token_ids for g in decode(engine, build_proposer("vanilla", {}, vocab_size=96, device=CPU), PROMPTS)]
    mat = {}
    for cached in (10000, 0):
        p = build_proposer("suffix", {"max_cached_requests": cached}, vocab_size=96, device=CPU)
        first, second = decode(engine, p, PROMPTS, batch), decode(engine, p, PROMPTS, batch)
        assert [g.token_ids for g in first] == vanilla == [g.token_ids for g in second]
        mat[cached] = [sum(map(len, (g.token_ids for g in run))) / sum(len(g.accept_lengths) for g in run)
                       for run in (first, second)]
        assert p.summary()["memory_answers"] == (2 * len(PROMPTS) if cached else 0)
        assert p.memory == ("run" if cached else "none")
    assert mat[10000][1] > 2 * mat[10000][0]
    assert mat[0][1] == mat[0][0]  # without it a request drafts from itself alone, whatever ran before it


def test_the_warm_up_leaves_the_memory_unless_kept():
    """``after_warmup`` empties the global tree (``warmup_memory=false``, the default) or keeps it."""
    for keep in (False, True):
        p = build_proposer("suffix", {"warmup_memory": keep}, vocab_size=96, device=CPU)
        p.reset(torch.tensor([1, 2]), 0, None)
        p.finish([7, 8, 9, 7, 8, 9])
        p.after_warmup()
        p.reset(torch.tensor([3, 4]), 0, None)
        draft = p.propose(torch.tensor([3, 4, 7, 8]))
        assert (draft.info["drafter"] == "memory") == keep  # the running answer alone, or with the warm-up's
        assert p.summary()["memory_answers"] == (2 if keep else 1)


def test_a_saved_state_replays_into_the_same_cache(tmp_path):
    """Mid-way through a request, the state (the cache's log, the slot's request) saved as a run saves it, loaded
    into a new proposer: every later draft the same, ties and all."""
    rng = random.Random(3)
    answers = [[rng.randrange(5) for _ in range(40)] for _ in range(4)]
    p = build_proposer("suffix", {"tree": True, "max_cached_requests": 2}, vocab_size=8, device=CPU)
    for a in answers[:3]:
        p.reset(torch.tensor([1, 2, 3]), 0, None)
        for i in range(1, 20):
            p.propose(torch.tensor([1, 2, 3] + a[:i]))
        p.finish(a)
    p.reset(torch.tensor([4, 1]), 0, None)
    p.propose(torch.tensor([4, 1] + answers[3][:10]))
    save_torch_atomic(tmp_path / "state.pt", p.state_dict())
    q = build_proposer("suffix", {"tree": True, "max_cached_requests": 2}, vocab_size=8, device=CPU)
    q.reset(torch.tensor([4, 1]), 0, None)
    q.load_state_dict(load_torch_safe(tmp_path / "state.pt", map_location="cpu"))
    for i in range(10, 40):
        ctx = torch.tensor([4, 1] + answers[3][:i])
        a, b = p.propose(ctx), q.propose(ctx)
        assert a.tokens.tolist() == b.tokens.tolist() and a.tree.parents == b.tree.parents
    assert p.cache.log == q.cache.log and sorted(p.cache.cached) == sorted(q.cache.cached)


def test_a_draft_is_the_speculation_in_breadth_first_order():
    """The library's tree comes best first (parents before children); the verifier's draft is the same tree, root
    first, breadth first, each node keyed by its probability's tenth for a per-step budget."""
    p = build_proposer("suffix", {"tree": True, "max_spec_factor": 4.0}, vocab_size=96, device=CPU)
    p.reset(torch.tensor([9]), 0, None)
    d = p.propose(torch.tensor([9, 1, 2, 3, 1, 2, 4, 4, 1, 2]))
    raw = p.last  # "1 2" goes on 3 (1/3), 4 (1/3) ... best first
    paths = {tuple(raw.token_ids[j] for j in _path(raw.parents, i)) for i in range(len(raw.token_ids))}
    tokens, parents = d.tokens.tolist(), d.tree.parents
    ours = {tuple(tokens[j + 1] for j in _path([q - 1 for q in parents[1:]], i - 1)) for i in range(1, len(tokens))}
    assert tokens[0] == 2 and paths == ours and list(d.tree.depth.tolist()) == sorted(d.tree.depth.tolist())
    assert d.keys == [0] + [1 + min(9, int(prob * 10)) for prob in _bfs_probs(raw)]


def _path(parents, i):
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


def _bfs_probs(raw):
    from methods.tree import Tree

    _, order = Tree.breadth_first([-1] + [p + 1 for p in raw.parents])
    return [raw.probs[i - 1] for i in order[1:]]


@pytest.mark.parametrize("setting, says", [("method.tree=true", "both modes run"),
                                           ("method.max_spec_tokens=auto", "the library has none")])
def test_parity_refuses_what_it_cannot_compare(tmp_path, capsys, setting, says):
    from scripts.suffix_parity import main

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt_token_ids": [1, 2], "generated_token_ids": [3, 4]}\n')
    with pytest.raises(SystemExit) as e:
        main(["--traces", str(trace), "--set", setting])
    assert e.value.code == 2 and says in capsys.readouterr().err
