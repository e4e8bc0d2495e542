"""REST (methods.proposers.rest): the suffix array and the retrieval against brute force, the trie's choice of nodes on
worked examples and random corpora, lossless decoding on the tiny model, and the errors of a bad datastore."""
import random
from collections import Counter

import numpy as np
import pytest
import torch

from methods.automata import SEPARATOR, save_corpus
from methods.base import build_proposer
from methods.common import HarnessError
from methods.decode import generate
from methods.engine import StaticEngine
from methods.proposers.rest import Datastore, suffix_array, trie
from methods.tree import Tree
from tests.helpers import generate_greedy

CPU = torch.device("cpu")


# --- brute force ------------------------------------------------------------------------------------------

def brute_retrieve(sequences, context, spans, max_matches, depth):
    """(span, continuations) by scanning the joined text for every span, longest first."""
    text = [t for s in sequences for t in (*s, SEPARATOR)]
    for n in spans:
        query = context[-n:]
        if len(query) < n:
            continue
        hits = sorted((text[p:], p) for p in range(len(text) - n + 1)
                      if text[p:p + n] == query and text[p + n] != SEPARATOR)[:max_matches]
        if hits:
            rows = [text[p + n:p + n + depth] for _, p in hits]
            return n, [r[:r.index(SEPARATOR)] if SEPARATOR in r else r for r in rows]
    return 0, []


def brute_trie(continuations, num_draft):
    """The module docstring's rule on prefix tuples: count, keep the most frequent, cut, number breadth-first."""
    counts = Counter(tuple(c[:k]) for c in continuations for k in range(1, len(c) + 1))
    kept = sorted(counts, key=lambda p: (-counts[p], len(p), p))[:num_draft]
    distinct = {p: len(set(p)) for p in kept}
    total = sum(distinct.values())
    for p in sorted(kept, key=lambda p: (-distinct[p], counts[p], -len(p), p)):
        if total <= num_draft:
            break
        total -= distinct.pop(p)
    nodes = sorted(distinct, key=lambda p: (len(p), p))
    number = {p: i for i, p in enumerate(nodes, start=1)}
    return [p[-1] for p in nodes], [number.get(p[:-1], 0) for p in nodes]


def rows_of(continuations, depth):
    return np.array([c + [SEPARATOR] * (depth - len(c)) for c in continuations], dtype=np.int64).reshape(-1, depth)


# --- the suffix array, the retrieval, the trie ------------------------------------------------------------

@pytest.mark.parametrize("seed", range(8))
def test_the_suffix_array_sorts_every_suffix(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([1, 2, 3, 7, 50])
    text = [rng.randrange(-1, alphabet) for _ in range(rng.randint(0, 300))]  # -1: the separator, repeated
    assert suffix_array(np.array(text, dtype=np.int64)).tolist() == sorted(range(len(text)), key=lambda i: text[i:])


def test_the_worked_example():
    store = Datastore([[5, 1, 2, 3], [7, 1, 2, 3, 4], [1, 2, 9]])
    span, rows = store.retrieve([8, 1, 2], range(3, 1, -1), 5000, 10)
    assert span == 2 and rows[:, :2].tolist() == [[3, SEPARATOR], [3, 4], [9, SEPARATOR]]
    assert trie(rows, 3) == ([3, 9], [0, 0])  # 1 + 2 + 1 distinct tokens > 3: "3 4" is cut
    assert trie(rows, 4) == ([3, 9, 4], [0, 0, 1])
    assert trie(rows, 1) == ([3], [0])  # the most frequent node alone
    assert len(store) == 12 and store.sequences == 3


def test_the_longest_span_wins_and_a_sequence_end_is_no_match():
    store = Datastore([[1, 2, 3, 4], [9, 2, 3, 5], [6, 2, 3]])
    assert store.retrieve([1, 2, 3], range(3, 1, -1), 99, 4)[0] == 3  # "1 2 3": only 4 follows
    span, rows = store.retrieve([1, 2, 3], range(2, 1, -1), 99, 4)  # "2 3": 4 and 5; the end of [6 2 3] skipped
    assert span == 2 and rows[:, 0].tolist() == [4, 5]
    assert store.retrieve([7, 6, 2, 3], range(4, 1, -1), 99, 4)[0] == 2  # "6 2 3" only where nothing follows
    assert store.retrieve([0, 8], range(2, 1, -1), 99, 4)[0] == 0
    assert store.retrieve([3], range(16, 1, -1), 99, 4)[0] == 0  # a context shorter than every span


def test_the_first_matches_in_suffix_array_order_are_used():
    store = Datastore([[1, 2, 9], [1, 2, 5, 5], [1, 2, 7]])
    span, rows = store.retrieve([1, 2], range(2, 1, -1), 2, 3)
    assert rows[:, 0].tolist() == [5, 7]  # the lexicographically first two continuations, 9 left out


def test_repeated_tokens_count_once_in_the_cut():
    rows = rows_of([[4, 4, 4]], 3)
    assert trie(rows, 3) == ([4, 4, 4], [0, 1, 2])  # paths hold 1 + 1 + 1 distinct tokens: nothing is cut
    assert trie(rows_of([[4, 5, 6]], 3), 3) == ([4, 5], [0, 1])  # 1 + 2 + 3 > 3, then 1 + 2 = 3


def test_most_frequent_nodes_are_kept():
    rows = rows_of(sorted([[1, 2]] * 3 + [[1, 3]] * 2 + [[4]]), 2)
    # counts 1: 5, 1 2: 3, 1 3: 2, 4: 1; kept for 3: 1, 1 2, 1 3, whose 5 distinct tokens > 3 cut the rarer 1 3
    assert trie(rows, 3) == ([1, 2], [0, 1])
    assert trie(rows, 2) == ([1], [0])  # 1 and 1 2 kept, 1 + 2 > 2 distinct tokens: 1 2 is cut
    assert trie(rows, 64) == ([1, 4, 2, 3], [0, 0, 1, 1])


@pytest.mark.parametrize("seed", range(12))
def test_retrieval_and_trie_equal_brute_force(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 4, 8])
    sequences = [[rng.randrange(alphabet) for _ in range(rng.randint(1, 40))] for _ in range(rng.randint(1, 8))]
    store = Datastore(sequences)
    for _ in range(30):
        context = [rng.randrange(alphabet + 1) for _ in range(rng.randint(1, 10))]
        spans = range(rng.randint(1, 6), rng.randint(0, 1), -1)
        max_matches, depth, num_draft = rng.choice([1, 3, 50]), rng.randint(1, 6), rng.choice([1, 4, 8, 64])
        span, rows = store.retrieve(context, spans, max_matches, depth)
        want_span, continuations = brute_retrieve(sequences, context, spans, max_matches, depth)
        assert span == want_span and rows.tolist() == rows_of(continuations, depth).tolist(), (seed, context)
        if span:
            tokens, parents = trie(rows, num_draft)
            assert (tokens, parents) == brute_trie(continuations, num_draft), (seed, context, num_draft)
            tree = Tree.from_parents([-1, *parents])  # breadth-first, or it raises
            paths = {tuple(tokens[i - 1] for i in tree.path_to(n)[1:]) for n in range(1, tree.size)}
            assert all(any(list(p) == c[:len(p)] for c in continuations) for p in paths)
            assert 1 <= len(tokens) <= num_draft and sum(len(set(p)) for p in paths) <= num_draft


# --- the datastore file, the proposer ---------------------------------------------------------------------

def test_the_suffix_array_is_built_once_and_cached(tmp_path):
    path = tmp_path / "store.npz"
    save_corpus(path, [[1, 2, 3], [1, 2, 4]], {"model": "tiny"})
    store, about = Datastore.load(path, tmp_path / "cache")
    assert about["build_seconds"] is not None and len(about["sha256"]) == 16 and about["model"] == "tiny"
    cached, again = Datastore.load(path, tmp_path / "cache")
    assert again["build_seconds"] is None and cached.suffixes.tolist() == store.suffixes.tolist()
    (tmp_path / "cache" / f"store-{about['sha256']}.npy").write_bytes(b"garbage")  # unreadable: built again
    rebuilt, third = Datastore.load(path, tmp_path / "cache")
    assert third["build_seconds"] is not None and rebuilt.suffixes.tolist() == store.suffixes.tolist()


@pytest.fixture
def datastore(tmp_path):
    path = tmp_path / "store.npz"
    save_corpus(path, [[5, 1, 2, 3], [7, 1, 2, 3, 4], [1, 2, 9]], {"model": "tiny"})
    return str(path)


def test_the_draft_is_rooted_at_the_context_end(datastore):
    rest = build_proposer("rest", {"datastore": datastore, "num_draft": 4}, vocab_size=96, device=CPU)
    d = rest.propose(torch.tensor([8, 1, 2]))
    assert d.tokens.tolist() == [2, 3, 9, 4] and d.tree.parents == (-1, 0, 0, 1)
    d = rest.propose(torch.tensor([8, 6]))  # no match: a root-only step
    assert d.tokens.tolist() == [6] and d.tree.size == 1
    assert rest.step_sizes() == list(range(1, 6))
    summary = rest.summary()
    assert summary["datastore_tokens"] == 12 and summary["steps_by_matched_span"] == {0: 1, 2: 1}
    assert (summary["num_draft"], summary["max_token_span"], summary["min_token_span"]) == (4, 16, 2)


@pytest.mark.parametrize("params, message", [
    ({"datastore": None}, r"method.datastore=null: REST drafts only from a datastore"),
    ({"datastore": "no/such.npz"}, r"method.datastore=no/such.npz: no such file; make it with python -m "
                                   r"scripts.make_sam_corpus"),
    ({"min_token_span": 5, "max_token_span": 3}, r"method.min_token_span=5 exceeds method.max_token_span=3"),
    ({"num_draft": 0}, r"method.num_draft must be an integer from 1"),
])
def test_bad_settings_are_one_clear_error(datastore, params, message):
    with pytest.raises(HarnessError, match=message):
        build_proposer("rest", {"datastore": datastore, **params}, vocab_size=96, device=CPU)


def test_a_malformed_datastore_is_one_clear_error(tmp_path, datastore):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(HarnessError, match=r"method.datastore=.*bad.npz: .*not a SAM corpus file.*make_sam_corpus"):
        build_proposer("rest", {"datastore": str(bad)}, vocab_size=96, device=CPU)
    with pytest.raises(HarnessError, match=r"holds token 9, outside the model's 8-token vocabulary; make it for this"):
        build_proposer("rest", {"datastore": datastore}, vocab_size=8, device=CPU)  # another model's datastore


# --- lossless on the tiny model ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_datastore(tiny_model, tmp_path_factory):
    """The tiny model's own greedy continuations of a few prompts: drafts that get accepted."""
    path = tmp_path_factory.mktemp("rest") / "tiny.npz"
    save_corpus(path, [p + generate_greedy(tiny_model, p, 40) for p in ([3, 4, 5], [10, 11], [20, 21, 22])],
                {"model": "tiny"})
    return str(path)


@pytest.mark.parametrize("params", [{}, {"num_draft": 6, "depth": 4}, {"max_token_span": 3, "min_token_span": 1}])
def test_rest_is_lossless(tiny_model, tiny_datastore, params):
    rest = build_proposer("rest", {"datastore": tiny_datastore, **params}, vocab_size=96, device=CPU)
    engine = StaticEngine(tiny_model)
    accepted = []
    for turn, prompt in enumerate([[3, 4, 5], [40, 41, 42, 43], [20, 21, 22, 23], [7] * 5]):
        gen = generate(engine, rest, prompt, max_new_tokens=48, stop_ids=set(), turn=turn)
        assert gen.token_ids == generate_greedy(tiny_model, prompt, 48), (params, prompt)
        accepted += gen.accept_lengths[1:]
    assert max(accepted) > 1, "no draft was ever accepted"
