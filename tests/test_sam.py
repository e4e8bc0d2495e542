"""Suffix automata (methods.automata) and SAM-Decoding's methods (methods.proposers.sam): worked examples, a
property test against brute-force search, the chain budget's choice, and lossless decoding on the tiny model."""
import random

import pytest
import torch

from methods.automata import (
    SEPARATOR,
    FrozenAutomaton,
    SuffixAutomaton,
    corpus_automaton,
    load_corpus,
    reference_layout,
    save_corpus,
)
from methods.autotree import choose_chain_caps
from methods.base import build_proposer
from methods.common import HarnessError
from methods.decode import generate
from methods.engine import StaticEngine
from methods.proposers.sam import DYNAMIC, MEMORY, STATIC, Retrieval
from methods.tree import Tree, graft, load_template
from tests.helpers import generate_greedy

CPU = torch.device("cpu")


# --- the automaton --------------------------------------------------------------------------------------

def test_hand_worked_matches():
    sam = SuffixAutomaton([1, 2, 3, 1, 2])
    state, length = sam.walk([1, 2])
    assert length == 2 and sam.continuation(state, 9) == [3, 1, 2]  # first "1 2" ends at 2
    state, length = sam.advance(state, length, 3)
    assert length == 3 and sam.continuation(state, 9) == [1, 2]
    assert sam.advance(state, length, 5) == (0, 0)  # 5 never occurs
    state, length = sam.walk([9, 9, 2, 3])  # falls back: "2 3" is the longest suffix in the text
    assert length == 2 and sam.continuation(state, 1) == [1]
    # "abab" has the states of the textbook: root, a, ab, b (a clone), aba, abab
    sam = SuffixAutomaton([0, 1, 0, 1])
    assert sam.states == 5 and sorted(sam.length) == [0, 1, 2, 3, 4]


def brute_match(text: list[int], query: list[int]) -> tuple[int, int]:
    """(longest suffix of query occurring in text, index after its first occurrence in text)."""
    for n in range(len(query), 0, -1):
        suffix = query[len(query) - n:]
        for i in range(len(text) - n + 1):
            if text[i:i + n] == suffix:
                return n, i + n
    return 0, 0


@pytest.mark.parametrize("seed", range(6))
def test_matches_equal_brute_force_search(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 5, 12])
    seq = [rng.randrange(alphabet) for _ in range(rng.randint(20, 160))]
    # The dynamic automaton, grown as a request grows: at every point, the match of (text so far + root).
    r = Retrieval(None, static_bias=0)
    for i in range(1, len(seq)):
        r.sync(torch.tensor(seq[: i + 1]))
        best = r.best(seq[i])
        length, end = brute_match(seq[:i], seq[: i + 1])
        assert (best.length if best else 0) == length, (seed, i)
        if best:
            assert r.dynamic.end[best.state] == end and r.dynamic.length[best.state] >= best.length
    # Frozen, the same automaton answers the same walks.
    grown = SuffixAutomaton(seq)
    frozen = grown.freeze()
    for _ in range(50):
        q = [rng.randrange(alphabet + 1) for _ in range(rng.randint(1, 12))]
        s, n = grown.walk(q)
        assert frozen.walk(q) == (s, n) and n == brute_match(seq, q)[0]
        assert frozen.continuation(s, 7) == grown.continuation(s, 7) == seq[brute_match(seq, q)[1]:][:7]
        if n:  # how often the match occurs (the static tree's weights)
            assert frozen.count[s] == sum(seq[i:i + n] == q[-n:] for i in range(len(seq) - n + 1))


def test_a_frozen_automaton_saves_and_loads_without_pickle(tmp_path):
    frozen = SuffixAutomaton([4, 5, 6, 4, 5, 7]).freeze()
    frozen.save(tmp_path / "a.npz")
    back = FrozenAutomaton.load(tmp_path / "a.npz")
    assert back.walk([4, 5]) == frozen.walk([4, 5]) and back.continuation(frozen.walk([4, 5])[0], 5) == [6, 4, 5, 7]
    four = frozen.walk([4])[0]
    assert back.count.tolist() == frozen.count.tolist() and back.frequent_tree(four, 9, 8) == frozen.frequent_tree(
        four, 9, 8)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(HarnessError, match="not a saved suffix automaton"):
        FrozenAutomaton.load(tmp_path / "bad.npz")


def test_a_corpus_keeps_its_sequences_apart(tmp_path):
    path = tmp_path / "c.npz"
    save_corpus(path, [[1, 2, 3], [1, 2, 9, 9]], {"model": "tiny"})
    sequences, about = load_corpus(path)
    assert [s.tolist() for s in sequences] == [[1, 2, 3], [1, 2, 9, 9]] and about == {"model": "tiny"}
    frozen, about = corpus_automaton(path, tmp_path / "cache")
    assert len(about["sha256"]) == 16 and list((tmp_path / "cache").glob("*.npz"))
    state, length = frozen.walk([2, 3])
    assert length == 2 and frozen.continuation(state, 5) == []  # the first sequence ends there: nothing follows
    assert SEPARATOR not in frozen.continuation(frozen.walk([1, 2])[0], 9)
    cached, _ = corpus_automaton(path, tmp_path / "cache")  # the second time from the cache
    assert cached.walk([9, 9]) == frozen.walk([9, 9])
    with pytest.raises(HarnessError, match="no SAM corpus"):
        load_corpus(tmp_path / "missing.npz")


def corpus_of(sequences) -> FrozenAutomaton:
    sam = SuffixAutomaton()
    for seq in sequences:
        sam.extend(seq + [SEPARATOR])
    return sam.freeze()


def test_the_static_tree_takes_the_most_frequent_continuations_best_first():
    """SAM-Decoding's static tree (samd_sam_only/sam/static_sam.py StaticSAM.gen_draft, commit 18c41f0) on a corpus
    where "1" is followed by 5 seven times (then 6 three times, 8 four times), by 2 six times (then 3 five times, 4
    once) and by 7 twice: each node's probability is its share of its parent's occurrences times the parent's."""
    corpus = corpus_of([[1, 2, 3]] * 5 + [[1, 2, 4]] + [[1, 5, 6]] * 3 + [[1, 5, 8]] * 4 + [[1, 7]] * 2)
    one = corpus.walk([1])[0]
    assert int(corpus.count[one]) == 15
    # 5 (7/15), 2 (6/15), 2's 3 (6/15 x 5/6), 5's 8 (4/15), 5's 6 (3/15), 7 (2/15), 2's 4 (1/15); parents are the
    # nodes' indices in that order (the root, the match, is node 0); the separators never count as children
    assert corpus.frequent_tree(one, size=20, width=8) == [(0, 5), (0, 2), (2, 3), (1, 8), (1, 6), (0, 7), (2, 4)]
    assert corpus.frequent_tree(one, size=4, width=8) == [(0, 5), (0, 2), (2, 3)]  # the root counts in the size
    # width 2: each node offers its 2 most frequent children (not 7), and depth 2 is full after 3 and 8
    assert corpus.frequent_tree(one, size=20, width=2) == [(0, 5), (0, 2), (2, 3), (1, 8)]
    # equal counts, equal probabilities: the order the corpus made the transitions in decides, as in the reference
    for first, second in ((2, 3), (3, 2)):
        corpus = corpus_of([[1, first], [1, second]])
        assert corpus.frequent_tree(corpus.walk([1])[0], 9, 8) == [(0, first), (0, second)]


def test_sam_drafts_the_static_tree_breadth_first(tmp_path):
    path = tmp_path / "c.npz"
    save_corpus(path, [[1, 2, 3]] * 5 + [[1, 2, 4]] + [[1, 5, 6]] * 3 + [[1, 5, 8]] * 4 + [[1, 7]] * 2, {})
    sam = build_proposer("sam", {"corpus": str(path)}, vocab_size=16, device=CPU)
    draft = sam.propose(torch.tensor([9, 1]))  # the root 1 matches the corpus (length 1): 1 + int(4 x 1) nodes
    assert draft.info == {"drafter": STATIC, "match": 1}
    # taken as 5, 2, 2's 3, 5's 8; verified breadth-first
    assert draft.tree.parents == (-1, 0, 0, 1, 2) and draft.tokens.tolist() == [1, 5, 2, 8, 3]


def test_reference_layout_joins_the_sequences_and_adds_every_token(tmp_path):
    """SAM-Decoding's corpus tools: one text, EOS after each sequence (not doubled), then each vocabulary id."""
    text = reference_layout([[5, 6], [7, 2]], eos=2, vocab=9)
    assert text[:5] == [5, 6, 2, 7, 2] and text[5:] == [t for i in range(9) for t in ([i, 2] if i != 2 else [2])]
    save_corpus(tmp_path / "r.npz", [text], {})
    frozen, _ = corpus_automaton(tmp_path / "r.npz", tmp_path / "cache")
    state, length = frozen.walk([6, 2, 7])  # a match across two sequences
    assert length == 3 and frozen.continuation(state, 3) == [2, 0, 2]  # and a chain running on into the next
    assert frozen.walk([8])[1] == 1  # a token no sequence holds matches itself


# --- the choice of drafter, the chain, the graft ----------------------------------------------------------

def test_the_static_match_counts_its_bias_less_and_ties_go_to_the_dynamic_one():
    corpus = SuffixAutomaton([7, 1, 2, 3, 4, 5, 6, 8] + [SEPARATOR]).freeze()
    context = torch.tensor([9, 1, 2, 3, 4, 5, 0, 9, 1, 2, 3, 4, 5])  # the request repeats "9 1 2 3 4 5"
    r = Retrieval(corpus, static_bias=5)
    r.sync(context)
    best = r.best(5)
    assert (best.source, best.length) == (DYNAMIC, 6) and r.chain(best, 3) == [0, 9, 1]
    r = Retrieval(corpus, static_bias=0)  # the corpus matches "1 2 3 4 5" (5) but the request "9 1 2 3 4 5" (6)
    r.sync(context)
    assert r.best(5).source == DYNAMIC
    r.sync(torch.tensor([8, 1, 2, 3, 4, 5]))  # a new request: only the corpus has "1 2 3 4 5" now
    r.reset()
    r.sync(torch.tensor([8, 1, 2, 3, 4, 5]))
    best = r.best(5)
    assert (best.source, best.length, best.score) == (STATIC, 5, 5) and r.chain(best, 9) == [6, 8]


def test_the_dynamic_chain_prefers_a_match_with_a_full_continuation():
    # "1 2" last occurred just before the end (one token after it), first at the start (many after it)
    r = Retrieval(None, static_bias=0)
    context = torch.tensor([1, 2, 5, 6, 7, 8, 3, 1, 2, 4, 1, 2])
    r.sync(context)
    best = r.best(2)
    assert best.length == 2 and r.chain(best, 4) == [5, 6, 7, 8]


def test_the_walk_to_an_earlier_match():
    """The longest match "1 2" first ends with 4 tokens after it, its suffix "2" with 10 (Retrieval's example)."""
    context = torch.tensor([2, 5, 6, 7, 8, 1, 2, 4, 3, 9, 1, 2])
    chains = {}
    for walk in (None, 0, 1):
        r = Retrieval(None, static_bias=0, walk=walk)
        r.sync(context)
        best = r.best(2)
        assert best.length == 2
        chains[walk] = (r.chain(best, 4), r.chain(best, 5))
    assert chains[None] == ([4, 3, 9, 1], [4, 3, 9, 1])  # samd_sam_only: the longest match's own continuation
    assert chains[0] == ([4, 3, 9, 1], [5, 6, 7, 8, 1])  # ours: n tokens must follow
    assert chains[1] == ([5, 6, 7, 8], [5, 6, 7, 8, 1])  # samd's to_anc: n_predicts = n + 1 (the root) must follow


def test_reference_mode_walks_and_pads_as_the_reference_does():
    def chain(method, context, **params):
        proposer = build_proposer(method, {"corpus": None, **params}, vocab_size=16, device=CPU)
        return proposer.propose(torch.tensor(context)).tokens.tolist()

    context = [2, 5, 6, 7, 8, 1, 2, 4, 3, 9, 1, 2]  # Retrieval's example
    # sam never walks (samd_sam_only): a chain of 5 from "1 2" itself, as long as its continuation
    for reference in (False, True):
        assert chain("sam", context, max_draft=5, alpha=0, reference=reference) == [2, 4, 3, 9, 1]
    # sam_tr: a chain of 4 from "1 2" (4 follow it); samd's to_anc wants 40 of 40 with the root, 4 + 1 here
    assert chain("sam_tr", context, max_draft=4, threshold=2) == [2, 4, 3, 9, 1]
    assert chain("sam_tr", context, max_draft=4, threshold=2, reference=True) == [2, 5, 6, 7, 8]
    # "1 2 3" is followed by 2 tokens and has no shorter match elsewhere: samd pads its chain with token 0
    assert chain("sam_tr", [1, 2, 3, 1, 2, 3], max_draft=4, threshold=2) == [3, 1, 2]
    assert chain("sam_tr", [1, 2, 3, 1, 2, 3], max_draft=4, threshold=2, reference=True) == [3, 1, 2, 0, 0]
    with pytest.raises(HarnessError, match="reference=true .* neither max_draft=auto, merge=true nor a memory"):
        build_proposer("sam_tr", {"corpus": None, "reference": True, "max_draft": "auto"}, vocab_size=16, device=CPU)


def test_sam_tr_takes_samd_trs_tree():
    """samd/config/token_recycle.json (commit 18c41f0): 60 drafts, depth 5, its nodes' children as listed there."""
    tree = load_template("samd-tr")
    assert tree.size == 61 and tree.max_depth == 5
    assert [int((tree.depth == d).sum()) for d in range(1, 6)] == [7, 20, 21, 8, 4]
    kids = tree.children()
    assert kids[0] == [1, 2, 3, 4, 5, 6, 7] and kids[1] == [8, 9, 10, 11, 12, 13] and kids[13] == []
    assert kids[28] == [49, 50] and kids[37] == [53, 54] and kids[49] == [57, 58] and kids[53] == [60]
    assert build_proposer("sam_tr", {"corpus": None}, vocab_size=16, device=CPU).drafter.tree.parents == tree.parents


def test_graft_shares_the_tree_prefix():
    tree = Tree.from_parents((-1, 0, 0, 1))
    new, tokens = graft(tree, [5, 7, 3, 9], [3, 4])
    assert new.parents == (-1, 0, 0, 1, 2)  # 3 is node 2's token: only 4 is new, under it
    assert [tokens[i] for i in new.path_to(new.size - 1)] == [5, 3, 4]
    new, tokens = graft(tree, [5, 7, 3, 9], [7, 9])  # wholly inside the tree: nothing added
    assert new.parents == tree.parents and tokens == [5, 7, 3, 9]
    new, tokens = graft(tree, [5, 7, 3, 9], [1, 1])  # nothing shared: a new branch under the root
    assert new.size == 6 and [tokens[i] for i in new.path_to(5)] == [5, 1, 1]


def test_chain_caps_follow_cost():
    flat = {n: 1.0 for n in range(1, 82)}  # every size costs a plain step: drafting is free
    chains = [(5, 39, a) for a in range(10)] + [(30, 39, 39)] * 10
    caps = dict(choose_chain_caps(chains, 100, flat, threshold=5, most=39)["caps"])
    assert caps[5] == 9 and caps[25] == 39  # as far as anything was accepted (the shortest cap of equal worth)
    steep = {n: 1.0 + 0.1 * (n - 1) for n in range(1, 82)}  # each drafted token costs a tenth of a step
    choice = choose_chain_caps(chains, 100, steep, threshold=5, most=39)
    caps = dict(choice["caps"])
    assert 1 <= caps[5] < 9  # short matches: the rarely accepted tail does not pay for its rows
    assert caps[25] == 39  # long matches accept everything: worth the rows
    assert caps[7] == caps[5] and caps[15] == caps[25]  # ranges without steps take their neighbour's cap
    assert choice["expected_speedup_vs_uncapped"] > 1


# --- lossless on the tiny model ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_corpus(tiny_model, tmp_path_factory):
    """A corpus of the tiny model's own greedy continuations of a few prompts (one of them the tests' own)."""
    path = tmp_path_factory.mktemp("corpus") / "tiny.npz"
    sequences = [p + generate_greedy(tiny_model, p, 40) for p in ([3, 4, 5], [10, 11], [20, 21, 22, 23])]
    save_corpus(path, sequences, {"model": "tiny"})
    return str(path)


PROMPTS = [[3, 4, 5], [40, 41, 42, 43, 44], [7] * 6, [20, 21, 22, 23, 24]]


@pytest.mark.parametrize("method,params", [
    ("sam", {}),
    ("sam", {"reference": True}),
    ("sam", {"max_draft": 4, "threshold": 2, "static_bias": 0}),
    ("sam_tr", {}),
    ("sam_tr", {"reference": True}),
    ("sam_tr", {"tree": "grown-n30-d6", "merge": True, "threshold": 2}),
    ("sam_tr", {"start": "hot", "first_step": "tree", "max_draft": 6}),
    ("sam_eagle2", {"head": "random", "total_tokens": 12}),
    ("sam_eagle2", {"head": "random", "total_tokens": 12, "merge": True, "threshold": 2}),
])
def test_sam_methods_are_lossless(tiny_model, tiny_corpus, method, params):
    proposer = build_proposer(method, {"corpus": tiny_corpus, **params}, vocab_size=96, device=CPU,
                              target=tiny_model)
    engine = StaticEngine(tiny_model)
    drafters = set()
    for turn, prompt in enumerate(PROMPTS):
        gen = generate(engine, proposer, prompt, max_new_tokens=48, stop_ids=set(), turn=turn)
        assert gen.token_ids == generate_greedy(tiny_model, prompt, 48), (method, params, prompt)
        assert len(gen.step_info) == len(gen.accept_lengths) == len(gen.draft_nodes)
        drafters |= {i["drafter"] for i in gen.step_info if i}
    summary = proposer.summary()
    assert set(summary["steps_by_drafter"]) == drafters
    chains = {d for d in drafters if d.endswith((DYNAMIC, STATIC))}
    assert chains, f"no step drafted a retrieved chain: {drafters}"
    assert sum(summary["accepted_drafts_by_drafter"].values()) > 0


def test_reference_mode_is_lossless_on_a_corpus_in_the_references_layout(tiny_model, tiny_corpus, tmp_path):
    sequences, _ = load_corpus(tiny_corpus)
    path = tmp_path / "reference.npz"
    save_corpus(path, [reference_layout([s.tolist() for s in sequences], eos=2, vocab=96)], {})
    for method in ("sam", "sam_tr"):
        proposer = build_proposer(method, {"corpus": str(path), "reference": True}, vocab_size=96, device=CPU)
        engine = StaticEngine(tiny_model)
        for turn, prompt in enumerate(PROMPTS):
            gen = generate(engine, proposer, prompt, max_new_tokens=48, stop_ids=set(), turn=turn)
            assert gen.token_ids == generate_greedy(tiny_model, prompt, 48), (method, prompt)
        assert proposer.summary()["steps_by_drafter"].get(STATIC), method


def test_a_missing_corpus_is_one_clear_error(tiny_model, tmp_path):
    with pytest.raises(HarnessError, match="method.corpus=.*no such file.*make_sam_corpus"):
        build_proposer("sam", {"corpus": str(tmp_path / "none.npz")}, vocab_size=96, device=CPU)
    with pytest.raises(HarnessError, match="method.max_draft must be an integer from 1 to 1024 or auto"):
        build_proposer("sam", {"max_draft": 0}, vocab_size=96, device=CPU)


def test_tr_in_the_hybrid_learns_from_chain_steps(tiny_model, tiny_corpus):
    """Every verified node writes its row, whichever drafter drafted it (as SAM-Decoding's TR does)."""
    proposer = build_proposer("sam_tr", {"corpus": tiny_corpus, "start": "hot"}, vocab_size=96, device=CPU)
    engine = StaticEngine(tiny_model)
    gen = generate(engine, proposer, [3, 4, 5], max_new_tokens=40, stop_ids=set())
    assert any(i and i["drafter"] == STATIC for i in gen.step_info)  # the corpus holds this very continuation
    tr = proposer.drafter
    seq = [3, 4, 5] + gen.token_ids
    rows = int((tr.M != 0).any(dim=1).sum())
    assert rows >= len(set(seq[:-1])) - 1  # the chain steps' tokens have rows too
    assert int(tr.node_accepts[0]) == proposer.steps["tr"]  # TR's template statistics count its own steps only


# --- the run's memory (method.memory=run) ----------------------------------------------------------------

def test_the_memory_matches_earlier_answers_beside_the_request():
    """memory=run: a third automaton over the run's answers. A request whose own text has no match drafts what
    followed the match in an earlier answer, within that answer (never across into the next); a tie goes to the
    request's own text; memory_tree drafts both chains as one tree; after the warm-up the memory is empty."""
    p = build_proposer("sam", {"corpus": None, "memory": "run", "threshold": 2, "alpha": 0}, vocab_size=96,
                       device=CPU)
    for answer in ([40, 41, 42, 43], [50, 51, 52]):
        p.reset(torch.tensor([1]), 0, None)
        p.finish(answer)
    p.reset(torch.tensor([9]), 0, None)
    d = p.propose(torch.tensor([9, 5, 41, 42]))
    assert d.info["drafter"] == MEMORY and d.tokens.tolist() == [42, 43]  # not on into the next answer's 50
    d = p.propose(torch.tensor([9, 5, 41, 42, 7, 41, 42]))  # "41 42" also in the request itself: its own first
    assert d.info["drafter"] == DYNAMIC and d.tokens.tolist() == [42, 7, 41]  # the text before the root
    q = build_proposer("sam", {"corpus": None, "memory": "run", "memory_tree": True, "threshold": 2, "alpha": 0},
                       vocab_size=96, device=CPU)
    q.load_state_dict(p.state_dict())
    q.reset(torch.tensor([9]), 0, None)
    d = q.propose(torch.tensor([9, 5, 41, 42, 7, 41, 42]))
    assert d.tree.parents == (-1, 0, 0, 1) and d.tokens.tolist() == [42, 7, 43, 41]
    assert q.summary()["memory_answers"] == 2 and q.memory == "run"
    q.after_warmup()
    assert q.summary()["memory_answers"] == 0


def test_the_memory_is_lossless_and_drafts_a_second_pass(tiny_model):
    engine = StaticEngine(tiny_model, pack=False)
    prompts = [[5, 6, 7, 8, 9, 10], [20, 21, 22], [5, 6, 7, 30, 31]]
    want = [generate_greedy(tiny_model, p, 24) for p in prompts]
    p = build_proposer("sam", {"corpus": None, "memory": "run"}, vocab_size=96, device=CPU)
    passes = [[generate(engine, p, ids, max_new_tokens=24, stop_ids=set()) for ids in prompts] for _ in range(2)]
    assert all([g.token_ids for g in run] == want for run in passes)
    mat = [sum(len(g.token_ids) for g in run) / sum(len(g.accept_lengths) for g in run) for run in passes]
    assert mat[1] > 1.5 * mat[0]
