"""Suffix automata over token ids: the longest earlier match of a sequence's end, in amortised O(1) per token.

The suffix automaton of a text recognises exactly its substrings. Its states are classes of
substrings that end at the same set of positions; each state keeps the longest length of its
class (``length``), a suffix link to the state of its longest suffix outside the class
(``link``), its transitions (``next``) and where its strings first end (``end``: the index one past
their first occurrence, so ``tokens[end:]`` is what followed it). Walking the automaton with a
*cursor* ``(state, length)`` token by token tracks the longest suffix of the walked sequence that
occurs in the text: on a token without a transition the cursor falls back along suffix links to a
shorter suffix (``advance``).

Worked example, the text ``[1 2 3 1 2]``::

    cursor after walking 1 2    -> (state of "1 2", 2); "1 2" first ends at 2: tokens[2:] = [3 1 2]
    advance by 3                -> length 3 ("1 2 3"), first end 3: continuation [1 2]
    advance by 5 (not in text)  -> (root, 0): nothing matches

Two forms: ``SuffixAutomaton`` grows one token at a time (the prompt and output of a request, the
classic online construction: amortised O(1) per token); ``FrozenAutomaton`` is the same automaton
in flat arrays (transitions sorted per state), built once from a corpus and saved with numpy, never
pickled. Both answer ``advance`` and ``continuation`` alike. The frozen one also knows how often
each state's strings occur (``count``) and drafts a tree of a match's most frequent continuations
(``frequent_tree``), as SAM-Decoding's static automaton does for its SAM-only method.

The construction is the textbook one (Blumer et al. 1985); SAM-Decoding (hyx1999/SAM-Decoding,
``samd/sam/dyn_sam.py``) uses the same automaton with the first end position per state. Ours adds
transitions to a state in the same order as the reference's (the order ``frequent_tree`` breaks ties by).
"""
from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from pathlib import Path

import numpy as np

from methods.common import HarnessError, atomic


class SuffixAutomaton:
    """A suffix automaton that grows with its text.

    >>> sam = SuffixAutomaton([1, 2, 3, 1, 2])
    >>> state, length = sam.walk([1, 2, 3])
    >>> length, sam.continuation(state, 5)
    (3, [1, 2])
    """

    def __init__(self, tokens=()):
        self.next: list[dict[int, int]] = [{}]
        self.link = [-1]
        self.length = [0]
        self.end = [0]
        self.tokens: list[int] = []
        self.last = 0  # the state of the whole text
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def states(self) -> int:
        return len(self.length)

    def extend(self, tokens) -> None:
        """Append ``tokens`` to the text (the online construction: one new state per token, at most one clone)."""
        nxt, link, length, end, text = self.next, self.link, self.length, self.end, self.tokens
        for t in tokens:
            text.append(t)
            cur = len(length)
            nxt.append({})
            link.append(0)
            length.append(length[self.last] + 1)
            end.append(len(text))
            p = self.last
            while p != -1 and t not in nxt[p]:
                nxt[p][t] = cur
                p = link[p]
            if p != -1:
                q = nxt[p][t]
                if length[p] + 1 == length[q]:
                    link[cur] = q
                else:  # q's class splits: its strings of length <= length[p] + 1 move to a clone
                    clone = len(length)
                    nxt.append(dict(nxt[q]))
                    link.append(link[q])
                    length.append(length[p] + 1)
                    end.append(end[q])
                    while p != -1 and nxt[p].get(t) == q:
                        nxt[p][t] = clone
                        p = link[p]
                    link[q] = link[cur] = clone
            self.last = cur

    def advance(self, state: int, length: int, token: int) -> tuple[int, int]:
        """The cursor after ``token``: the longest suffix of (cursor's match + token) that occurs in the text."""
        nxt, link, lengths = self.next, self.link, self.length
        while state and token not in nxt[state]:
            state = link[state]
            length = lengths[state]
        target = nxt[state].get(token)
        return (target, length + 1) if target is not None else (0, 0)

    def settle(self, state: int, length: int) -> tuple[int, int]:
        """A cursor made before ``extend`` in the state that holds its match now (an extension can split the
        cursor's class, moving its shorter strings to a clone)."""
        while state and length <= self.length[self.link[state]]:
            state = self.link[state]
        return state, length

    def walk(self, tokens, state: int = 0, length: int = 0) -> tuple[int, int]:
        for t in tokens:
            state, length = self.advance(state, length, t)
        return state, length

    def continuation(self, state: int, n: int) -> list[int]:
        """Up to ``n`` tokens that followed the first occurrence of ``state``'s strings."""
        start = self.end[state]
        return self.tokens[start: start + n]

    def occurrences(self) -> np.ndarray:
        """How often each state's strings occur in the text (its number of end positions).

        Every prefix of the text ends at one position of its own, in the state made when its last token came
        (``length == end``); a clone (``length < end``) has none of its own. A state's positions are its own and
        those of the states whose suffix link leads to it, so the counts add up the links, longest state first.

        >>> SuffixAutomaton([1, 2, 1, 2]).occurrences()[1:].tolist()   # states "1", "(1) 2", "(1) 2 1", "(1 2) 1 2"
        [2, 2, 1, 1]
        """
        link = self.link
        count = [int(n == e) for n, e in zip(self.length, self.end)]
        count[0] = 0  # the root (the empty string) is never a match
        for s in np.argsort(-np.array(self.length), kind="stable")[:-1].tolist():  # all but the root, the shortest
            if link[s] > 0:
                count[link[s]] += count[s]
        return np.array(count, dtype=np.int64)

    def freeze(self) -> "FrozenAutomaton":
        """The same automaton in flat arrays (for a corpus: built once, saved, loaded without pickling), with every
        state's occurrence count and its transitions ranked by how often their targets occur, most first, ties in
        the order the transitions were made (``FrozenAutomaton.frequent_tree``)."""
        sizes = np.fromiter((len(d) for d in self.next), dtype=np.int64, count=self.states)
        offsets = np.zeros(self.states + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        keys = np.empty(int(offsets[-1]), dtype=np.int64)
        targets = np.empty(int(offsets[-1]), dtype=np.int64)
        ranked = np.empty(int(offsets[-1]), dtype=np.int64)
        count = self.occurrences()
        at = 0
        for d in self.next:
            slot = {}
            for k in sorted(d):
                keys[at], targets[at], slot[k] = k, d[k], at
                at += 1
            # A dict iterates in insertion order and sorted() is stable: ties stay in the order they were made.
            ranked[at - len(d): at] = [slot[k] for k in sorted(d, key=lambda k: -count[d[k]])]
        return FrozenAutomaton(offsets, keys, targets, np.array(self.link, dtype=np.int64),
                               np.array(self.length, dtype=np.int64), np.array(self.end, dtype=np.int64),
                               np.array(self.tokens, dtype=np.int64), count, ranked)


def _ints(a: np.ndarray) -> array:
    out = array("q")
    out.frombytes(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    return out


class _Candidate:
    """A node waiting in ``frequent_tree``'s heap. It compares by its negated probability alone, as the reference's
    heap items do (``SearchItem``, ``dataclass(order=True)`` with every other field ``compare=False``), so that
    among equal probabilities ``heapq``'s own order picks the same node as there."""

    __slots__ = ("key", "token", "state", "parent", "depth")

    def __init__(self, key: float, token: int, state: int, parent: int, depth: int):
        self.key, self.token, self.state, self.parent, self.depth = key, token, state, parent, depth

    def __lt__(self, other: "_Candidate") -> bool:
        return self.key < other.key


class FrozenAutomaton:
    """A suffix automaton in arrays: state ``s``'s transitions are ``keys[offsets[s]:offsets[s+1]]`` (sorted)
    to ``targets[...]``; ``link``, ``length``, ``end`` and ``count`` (occurrences) per state; ``ranked[offsets[s]:
    offsets[s+1]]`` the indices of ``s``'s transitions, the most frequent target first; ``tokens`` the text."""

    FIELDS = ("offsets", "keys", "targets", "link", "length", "end", "tokens", "count", "ranked")

    def __init__(self, offsets, keys, targets, link, length, end, tokens, count, ranked):
        self.offsets, self.keys, self.targets = offsets, keys, targets
        self.link, self.length, self.end, self.tokens = link, length, end, tokens
        self.count, self.ranked = count, ranked
        # The walk reads plain int64 arrays (a token's lookup is a bisection in one state's keys): indexing one
        # gives a Python int at once, where a numpy scalar costs a microsecond; 8 bytes an entry either way.
        self._offsets, self._keys, self._targets, self._link, self._length, self._count, self._ranked = (
            _ints(a) for a in (offsets, keys, targets, link, length, count, ranked))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def states(self) -> int:
        return len(self.length)

    def _next(self, state: int, token: int) -> int | None:
        lo, hi = self._offsets[state], self._offsets[state + 1]
        i = bisect_left(self._keys, token, lo, hi)
        return self._targets[i] if i < hi and self._keys[i] == token else None

    def advance(self, state: int, length: int, token: int) -> tuple[int, int]:
        target = self._next(state, token)
        while target is None and state:
            state = self._link[state]
            length = self._length[state]
            target = self._next(state, token)
        return (target, length + 1) if target is not None else (0, 0)

    def walk(self, tokens, state: int = 0, length: int = 0) -> tuple[int, int]:
        for t in tokens:
            state, length = self.advance(state, length, t)
        return state, length

    def continuation(self, state: int, n: int) -> list[int]:
        """Up to ``n`` tokens that followed the first occurrence of ``state``'s strings, within its sequence."""
        start = int(self.end[state])
        out = self.tokens[start: start + n]
        cut = np.flatnonzero(out == SEPARATOR)
        return out[: cut[0] if len(cut) else len(out)].tolist()

    def frequent_tree(self, state: int, size: int, width: int) -> list[tuple[int, int]]:
        """A tree of the most frequent continuations of ``state``'s strings, best first: ``(parent, token)`` of each
        node after the root (node 0, the match itself), in the order they were taken; at most ``size`` nodes with
        the root and ``width`` per depth.

        SAM-Decoding's SAM-only method drafts this from its static automaton (hyx1999/SAM-Decoding 18c41f0,
        ``samd_sam_only/sam/static_sam.py``: ``StaticSAM.gen_draft`` lines 182-215, ``init_topk_next`` lines
        137-146): a heap of candidates keyed by the product, along their path, of each token's share of its parent
        state's occurrences, starting from the root at probability 1; each one taken offers its state's ``width``
        most frequent transitions; a candidate whose depth already has ``width`` nodes is dropped. The products are
        formed in the same order as there, so that equal probabilities stay equal and ties fall out alike.
        ``SEPARATOR`` (between a corpus's sequences) is never offered.

        >>> sam = SuffixAutomaton([1, 2, 4, 1, 2, 4, 1, 3, 1, 2]).freeze()   # "1": 4 times, 3 of them "1 2"
        >>> sam.frequent_tree(sam.walk([1])[0], size=4, width=8)   # 2 (p 3/4), its 4 (3/4 x 2/3), 4's 1 (1/2 x 1)
        [(0, 2), (1, 4), (2, 1)]
        """
        offsets, keys, targets, ranked, count = self._offsets, self._keys, self._targets, self._ranked, self._count
        heap = [_Candidate(-1.0, -1, state, -1, 0)]
        nodes: list[tuple[int, int]] = []
        per_depth: dict[int, int] = {}
        while heap and len(nodes) < size:
            c = heapq.heappop(heap)
            if per_depth.get(c.depth, 0) >= width:
                continue
            per_depth[c.depth] = per_depth.get(c.depth, 0) + 1
            index = len(nodes)
            nodes.append((c.parent, c.token))
            if len(nodes) == size:
                break
            total, offered = count[c.state], 0
            for i in range(offsets[c.state], offsets[c.state + 1]):
                if offered == width:
                    break
                slot = ranked[i]
                token, child = keys[slot], targets[slot]
                if token == SEPARATOR:
                    continue
                heapq.heappush(heap, _Candidate(c.key * (count[child] / total), token, child, index, c.depth + 1))
                offered += 1
        return nodes[1:]

    def save(self, path: Path) -> None:
        with atomic(Path(path)) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **{k: getattr(self, k) for k in self.FIELDS})

    @classmethod
    def load(cls, path: Path) -> "FrozenAutomaton":
        try:
            with np.load(path, allow_pickle=False) as z:
                return cls(*(z[k] for k in cls.FIELDS))
        except (OSError, ValueError, KeyError) as e:
            raise HarnessError(f"{path} is not a saved suffix automaton ({type(e).__name__}); delete it to build "
                               f"it again") from None


# ---------------------------------------------------------------- corpora: token sequences for a static automaton

SEPARATOR = -1  # between a corpus's sequences in its automaton: no token matches it, so no match spans two
FORMAT = 2  # of a cached corpus automaton (2: with count and ranked); in its file name, so an older one is not read


def reference_layout(sequences, eos: int, vocab: int) -> list[int]:
    """The corpus as SAM-Decoding's corpus tools lay it out, one sequence: each sequence then every vocabulary id
    as a sequence of its own, each followed by ``eos`` unless it ends with it (hyx1999/SAM-Decoding 18c41f0,
    ``tools/gen_sam_alpaca.py`` and ``tools/gen_sam_alpaca_sam_only.py`` lines 39-46; ``StaticSAM.add_batch_tokens``
    in ``samd/sam/static_sam.py`` lines 32-36). One text, so a match or a chain may run on into the next
    sequence, and every token matches at least itself, as there; saved as one sequence, its automaton is theirs.

    >>> reference_layout([[5, 6], [7, 2]], eos=2, vocab=3)
    [5, 6, 2, 7, 2, 0, 2, 1, 2, 2]
    """
    out: list[int] = []
    for s in [*sequences, *([i] for i in range(vocab))]:
        out.extend(s)
        if s[-1] != eos:
            out.append(eos)
    return out


def save_corpus(path: Path, sequences: list[list[int]], about: dict) -> None:
    """A corpus file: ``.npz`` with the sequences' tokens end to end (``tokens``, uint16 where the ids fit),
    their lengths (``lengths``) and ``about`` (JSON: the model, where the sequences come from)."""
    import json

    flat = np.fromiter((t for s in sequences for t in s), dtype=np.int64)
    dtype = np.uint16 if flat.size == 0 or flat.max() < 2 ** 16 else np.uint32
    with atomic(Path(path)) as tmp:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, tokens=flat.astype(dtype), lengths=np.array([len(s) for s in sequences]),
                                about=np.array(json.dumps(about)))


def load_corpus(path: Path) -> tuple[list[np.ndarray], dict]:
    """(sequences, about) of a corpus file written by ``save_corpus``."""
    import json

    try:
        with np.load(path, allow_pickle=False) as z:
            tokens, lengths, about = z["tokens"].astype(np.int64), z["lengths"], json.loads(str(z["about"]))
    except FileNotFoundError:
        raise HarnessError(f"no SAM corpus at {path}; give method.corpus=PATH (a file of python -m "
                           f"scripts.make_sam_corpus), or method.corpus=null for none") from None
    except (OSError, ValueError, KeyError) as e:
        raise HarnessError(f"{path} is not a SAM corpus file ({type(e).__name__}: {e}); make one with python -m "
                           f"scripts.make_sam_corpus") from None
    if int(lengths.sum()) != len(tokens):
        raise HarnessError(f"{path}: its lengths add up to {int(lengths.sum())} tokens but it holds {len(tokens)}; "
                           f"make it again with python -m scripts.make_sam_corpus")
    return np.split(tokens, np.cumsum(lengths)[:-1]) if len(lengths) else [], about


def corpus_automaton(path: Path, cache: Path) -> tuple[FrozenAutomaton, dict]:
    """The frozen automaton of a corpus file (sequences joined by ``SEPARATOR``) and the corpus's ``about`` with
    ``sha256`` (the file's content hash, 16 digits) added; built once and kept in ``cache`` under that hash."""
    import hashlib

    path = Path(path)
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError as e:
        raise HarnessError(f"cannot read the SAM corpus {path} ({e.strerror}); give method.corpus=PATH, or "
                           f"method.corpus=null for none") from None
    sequences, about = load_corpus(path)
    about = {**about, "sha256": digest}
    saved = cache / f"{path.stem}-{digest}-f{FORMAT}.npz"
    if saved.is_file():
        return FrozenAutomaton.load(saved), about
    sam = SuffixAutomaton()
    for s in sequences:
        sam.extend(s.tolist())
        sam.extend((SEPARATOR,))
    frozen = sam.freeze()
    frozen.save(saved)
    return frozen, about
