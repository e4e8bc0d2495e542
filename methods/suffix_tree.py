"""SuffixDecoding's suffix tree: every substring (up to ``max_depth`` tokens) of a set of token sequences, with how
often it occurs, and the drafts that its most frequent continuations make.

Oliaro et al., "SuffixDecoding" (arXiv 2411.04975, NeurIPS 2025). This is the structure of Snowflake's
arctic-inference (snowflakedb/ArcticInference at 9d4643881608178f0f58a33d1b61919ca246997f, identical to the
0.3.0 release: ``csrc/suffix_decoding/suffix_tree.cc``), rebuilt here so that it drafts token for token what the
library drafts (``tests/test_suffix.py`` holds the two to each other, drafts and ``parents``, where the library is
installed), with the library's tree one setting away (``native``).

What it holds. Each sequence (an id and its tokens) contributes every suffix, cut to ``max_depth`` tokens, as a
path from the root; a node is a run of tokens on such paths (path compression: a run where nothing branches and
nothing ends is one node), and its ``count`` is how many suffixes pass through or end at it, that is, how often
its string occurs in the sequences. A node's children are kept ranked by count, most first; among equal counts the
order is the history of the counts' changes (below), which matters, since the drafts follow the first child.

Worked example, one sequence ``[1 2 3 1 2 4]``, ``max_depth`` 24::

    root (6)
    |- "1 2" (2) -> "3 1 2 4" (1), "4" (1)          "1 2" occurs twice: once before 3, once before 4
    |- "2" (2)   -> "3 1 2 4" (1), "4" (1)
    |- "3 1 2 4" (1)
    '- "4" (1)

    speculate([1 2], ...) matches "1 2"... but only a match shorter than the context counts (the last token
    alone: "2", 2 occurrences), and its continuation "3" has probability 1/2: a draft [3] of score 0.5 when
    max_spec_factor * 1 allows one token.

How it drafts (``speculate``): for every match length m from 1 up (the context's last m tokens, while they occur),
at most ``min(max_spec_tokens, floor(m * max_spec_factor + max_spec_offset))`` tokens follow the match, each with
the probability of its path (the running product of child count over parent count), stopping under
``min_token_prob``; a draft's score is the sum of its tokens' probabilities and the best score wins, a later
(longer) match on a tie. A chain (``tree=False``) follows the first child; a tree (``tree=True``) takes nodes best
first from a priority queue (``parents`` gives its shape). The arithmetic is the library's, in 32-bit floats, and
its priority queue pops equal probabilities in the order of libstdc++'s binary heap (``_Heap``), so that ties fall
out alike.

How the ranking moves (the library's sibling lists): a new child joins its parent's children last; a child whose
count grows from c moves, when the sibling before it counts c or c + 1, to before the first sibling of that
count; a child whose count falls from c moves to just before the first later sibling counting less than c.
"""
from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, field

from methods.common import HarnessError

_F32 = struct.Struct("f")


def f32(x: float) -> float:
    """``x`` rounded to a 32-bit float (the library computes in float: an operation on two floats done in double and
    rounded once gives the float result exactly)."""
    return _F32.unpack(_F32.pack(x))[0]


@dataclass
class Draft:
    """What ``speculate`` returns (the library's ``Draft``): tokens after the context, each one's parent index (-1:
    the context's last token), probability, their sum and the match length it came from."""

    token_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0


class _Node:
    """A run of ``length`` tokens, ``text[start:start + length]`` (``text``: some sequence where the run occurs,
    after the string of its parent), that ``count`` suffixes reach; ``kids`` by first token, ``ranked`` by count."""

    __slots__ = ("count", "text", "start", "length", "parent", "kids", "ranked")

    def __init__(self, count: int, text: list[int], start: int, length: int, parent: "_Node | None"):
        self.count, self.text, self.start, self.length, self.parent = count, text, start, length, parent
        self.kids: dict[int, _Node] = {}
        self.ranked: list[_Node] = []

    def first(self) -> int:
        return self.text[self.start]

    def adopt(self, child: "_Node") -> None:
        """A new child, ranked last (its count, 1, is the least)."""
        self.kids[child.first()] = child
        self.ranked.append(child)

    def swap(self, old: "_Node", new: "_Node") -> None:
        """``new`` takes ``old``'s key and rank (the same count)."""
        self.kids[new.first()] = new
        self.ranked[self.ranked.index(old)] = new

    def run(self, count: int) -> tuple[int, int]:
        """(first, end) rank of the children counting ``count``."""
        key = _negcount
        return (bisect_left(self.ranked, -count, key=key), bisect_right(self.ranked, -count, key=key))


def _negcount(node: _Node) -> int:
    return -node.count


def _grow(node: _Node) -> None:
    """``node.count`` + 1, its rank among its siblings moved as the library's ``_increment_count`` moves it."""
    parent, c = node.parent, node.count
    if parent is not None:
        ranked = parent.ranked
        lo, hi = parent.run(c)
        i = ranked.index(node, lo, hi)
        if i > 0 and ranked[i - 1].count <= c + 1:
            to = parent.run(ranked[i - 1].count)[0]  # the first sibling counting what the one before it counts
            del ranked[i]
            ranked.insert(to, node)
    node.count = c + 1


def _shrink(node: _Node) -> None:
    """``node.count`` - 1, its rank moved as the library's ``_decrement_count`` moves it."""
    parent, c = node.parent, node.count
    if parent is not None:
        ranked = parent.ranked
        lo, hi = parent.run(c)
        i = ranked.index(node, lo, hi)
        if hi - 1 != i:  # to the end of its count's run, just before the first sibling counting less
            del ranked[i]
            ranked.insert(hi - 1, node)
    node.count = c - 1


class _Heap:
    """std::priority_queue over (prob, ...) tuples with libstdc++'s push_heap and pop_heap, largest prob first:
    among equal probabilities it pops what the library's queue pops."""

    __slots__ = ("a",)

    def __init__(self):
        self.a: list[tuple] = []

    def __bool__(self) -> bool:
        return bool(self.a)

    def push(self, item: tuple) -> None:
        a = self.a
        a.append(item)
        self._sift_up(len(a) - 1, 0, item)

    def _sift_up(self, hole: int, top: int, item: tuple) -> None:
        a, p = self.a, item[0]
        parent = (hole - 1) // 2
        while hole > top and a[parent][0] < p:
            a[hole] = a[parent]
            hole = parent
            parent = (hole - 1) // 2
        a[hole] = item

    def pop(self) -> tuple:
        a = self.a
        top, last = a[0], a.pop()
        n = len(a)
        if n:  # __adjust_heap from the root with the last item, over the n items left
            hole = second = 0
            while second < (n - 1) // 2:
                second = 2 * (second + 1)
                if a[second][0] < a[second - 1][0]:
                    second -= 1
                a[hole] = a[second]
                hole = second
            if n % 2 == 0 and second == (n - 2) // 2:
                second = 2 * (second + 1)
                a[hole] = a[second - 1]
                hole = second - 1
            self._sift_up(hole, 0, last)
        return top


class SuffixTree:
    """The suffix tree of sequences that grow token by token (``extend``) and leave whole (``remove``).

    >>> t = SuffixTree(24)
    >>> t.extend(0, [1, 2, 3, 1, 2, 4])
    >>> d = t.speculate([5, 1, 2], max_spec_tokens=8, max_spec_factor=1.0, max_spec_offset=0.0, min_token_prob=0.1,
    ...                 tree=True)
    >>> d.token_ids, d.parents, d.probs, d.match_len   # "1 2" goes on with 3 or with 4, each 1/2: two tokens at most
    ([3, 4], [-1, -1], [0.5, 0.5], 2)
    """

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = _Node(0, [], 0, 0, None)
        self.seqs: dict[int, list[int]] = {}
        self.ends: dict[int, deque] = {}  # per sequence, the nodes where its last max_depth suffixes end

    def extend(self, seq: int, tokens) -> None:
        for t in tokens:
            self._append(seq, int(t))

    def _append(self, seq: int, token: int) -> None:
        text = self.seqs.setdefault(seq, [])
        ends = self.ends.setdefault(seq, deque())
        root = self.root
        ends.append(root)  # the empty suffix, which this token starts
        root.count += 1
        if len(ends) > self.max_depth:
            ends.popleft()  # that suffix has max_depth tokens: it grows no more
        text.append(token)
        end = len(text)  # text[end - 1] is the new token
        for i, node in enumerate(ends):
            child = node.kids.get(token)
            if child is None:
                if node.count == 1 and node is not root:  # a leaf this suffix alone reaches: its run grows
                    node.text, node.start = text, end - 1 - node.length
                    node.length += 1
                else:
                    new = _Node(1, text, end - 1, 1, node)
                    node.adopt(new)
                    ends[i] = new
            elif node.count == child.count + 1 and node is not root:
                # Every other occurrence of node's string goes on into child, and this suffix ends at node: it joins
                # them, and node's run takes child's first token (child's whole run when it has one token).
                if child.length == 1:
                    child.count += 1
                    child.text, child.start, child.length = text, end - 1 - node.length, node.length + 1
                    parent = child.parent = node.parent
                    parent.swap(node, child)
                    ends[i] = child
                else:
                    del node.kids[token]
                    node.text, node.start = text, end - 1 - node.length
                    node.length += 1
                    child.start += 1
                    child.length -= 1
                    node.kids[child.first()] = child
            elif child.length == 1:
                _grow(child)
                ends[i] = child
            else:  # the suffix goes into child's run: split off its first token
                mid = _Node(child.count, text, end - 1, 1, node)
                node.swap(child, mid)
                child.start += 1
                child.length -= 1
                child.parent = mid
                mid.kids[child.first()] = child
                mid.ranked.append(child)
                _grow(mid)
                ends[i] = mid

    def remove(self, seq: int) -> None:
        """Every suffix of sequence ``seq`` leaves the tree; a node whose count falls to 0 goes with its subtree, and
        the last node each suffix reached merges with its only child where no suffix ends between them (as the
        library does, so that the runs, and with them the queue's ties, stay the library's)."""
        text = self.seqs.pop(seq, [])
        self.ends.pop(seq, None)
        root = self.root
        for start in range(len(text)):
            node, idx = root, start
            root.count -= 1
            while idx < len(text):
                child = node.kids.get(text[idx])
                if child is None:
                    break
                if child.count > 1:
                    _shrink(child)
                else:
                    del node.kids[text[idx]]
                    node.ranked.remove(child)
                    break
                idx += child.length
                node = child
            if node is not root and len(node.kids) == 1:
                (child,) = node.kids.values()
                if child.count == node.count:
                    child.start -= node.length
                    child.length += node.length
                    child.parent = node.parent
                    node.parent.swap(node, child)

    def _match(self, context) -> tuple[_Node | None, int]:
        """The node where ``context`` ends, and how far into its run (None: it does not occur)."""
        node, idx = self.root, 0
        for t in context:
            if idx >= node.length:
                node = node.kids.get(t)
                if node is None:
                    return None, -1
                idx = 0
            if node.text[node.start + idx] != t:
                return None, -1
            idx += 1
        return node, idx

    def speculate(self, context, max_spec_tokens: int, max_spec_factor: float, max_spec_offset: float,
                  min_token_prob: float, tree: bool) -> Draft:
        """The best-scoring draft after ``context`` over every match length (module docstring)."""
        context = [int(t) for t in context]
        factor, offset, floor = f32(max_spec_factor), f32(max_spec_offset), f32(min_token_prob)
        best = Draft()
        for m in range(1, len(context)):
            node, idx = self._match(context[len(context) - m:])
            if node is None:
                break
            most = max(min(max_spec_tokens, int(f32(f32(m * factor) + offset) + 1e-6)), 0)
            draft = (self._tree(node, idx, most, floor) if tree else self._chain(node, idx, most, floor))
            if draft.score >= best.score:
                best = draft
                best.match_len = m
        return best

    @staticmethod
    def _chain(node: _Node, idx: int, most: int, floor: float) -> Draft:
        d, prob, score = Draft(), 1.0, 0.0
        while len(d.token_ids) < most and prob >= floor:
            if idx < node.length:
                d.parents.append(len(d.token_ids) - 1)
                d.token_ids.append(node.text[node.start + idx])
                d.probs.append(prob)
                score = f32(score + prob)
                idx += 1
            else:
                if not node.ranked:
                    break
                child = node.ranked[0]
                prob = f32(prob * f32(child.count / node.count))
                node, idx = child, 0
        d.score = score
        return d

    @staticmethod
    def _tree(node: _Node, idx: int, most: int, floor: float) -> Draft:
        d, score, heap = Draft(), 0.0, _Heap()
        heap.push((1.0, node, idx, -1))
        while len(d.token_ids) < most and heap:
            prob, node, idx, parent = heap.pop()
            if idx < node.length:
                d.token_ids.append(node.text[node.start + idx])
                d.parents.append(parent)
                d.probs.append(prob)
                score = f32(score + prob)
                heap.push((prob, node, idx + 1, len(d.token_ids) - 1))
            else:
                for child in node.ranked:
                    p = f32(f32(prob * child.count) / node.count)
                    if p < floor:
                        break
                    heap.push((p, child, 0, parent))
        d.score = score
        return d

    def check(self) -> None:
        """Raise AssertionError where the tree is not what its sequences make (for tests): every node's count is
        the number of suffixes ending at or passing through it, and its children are ranked by count."""
        reached: dict[int, int] = {}
        for text in self.seqs.values():
            for start in range(len(text)):
                node, idx, depth = self.root, start, 0
                reached[id(node)] = reached.get(id(node), 0) + 1
                stop = min(len(text), start + self.max_depth)
                while idx < stop:
                    node = node.kids[text[idx]]
                    assert node.text[node.start:node.start + node.length] == text[idx:idx + node.length]
                    idx += node.length
                    assert idx <= stop, "a suffix ends inside a run"
                    reached[id(node)] = reached.get(id(node), 0) + 1
        stack = [self.root]
        while stack:
            node = stack.pop()
            assert node.count == reached.get(id(node), 0), "a count is not the number of suffixes through it"
            assert sorted(node.ranked, key=id) == sorted(node.kids.values(), key=id)
            assert all(a.count >= b.count for a, b in zip(node.ranked, node.ranked[1:]))
            stack.extend(node.ranked)


class NativeTree:
    """arctic-inference's own suffix tree (its C++ extension, what vLLM's ``method="suffix"`` drafts with), behind
    ``SuffixTree``'s methods: the ``backend=arctic`` of ``method=suffix``."""

    def __init__(self, max_depth: int):
        self.tree = native()(max_depth)

    def extend(self, seq: int, tokens) -> None:
        self.tree.extend(seq, [int(t) for t in tokens])

    def remove(self, seq: int) -> None:
        self.tree.remove(seq)

    def speculate(self, context, max_spec_tokens: int, max_spec_factor: float, max_spec_offset: float,
                  min_token_prob: float, tree: bool) -> Draft:
        d = self.tree.speculate([int(t) for t in context], max_spec_tokens, max_spec_factor, max_spec_offset,
                                min_token_prob, tree)
        return Draft(list(d.token_ids), list(d.parents), list(d.probs), d.score, d.match_len)


ARCTIC = "arctic-inference==0.3.0"  # the release whose trees the tests hold ours to (make arctic installs it)


def native():
    """arctic-inference's suffix tree class, or a one-line error that says how to install it."""
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree as Native
    except ImportError:
        raise HarnessError(f"method.backend=arctic needs {ARCTIC} (its C++ suffix tree): run make arctic, or set "
                           f"method.backend=python") from None
    return Native


def have_native() -> bool:
    try:
        native()
    except HarnessError:
        return False
    return True


# The cache's operations, as its log records them: [op, request, n, n tokens]
START, ADD, STOP = 0, 1, 2


class SuffixCache:
    """SuffixDecoding's two kinds of tree: one per active request, over its prompt and its output so far, and one
    global tree over the responses of up to ``max_cached_requests`` requests, the active ones' included as they
    grow (-1: no bound; 0: no global tree), the oldest leaving first. ``speculate`` drafts from both and keeps the
    better score, the request's own tree on a tie.

    The logic of arctic-inference's ``SuffixDecodingCache`` (``arctic_inference/suffix_decoding/cache.py``, commit
    9d46438, as vLLM's ``SuffixDecodingProposer`` drives it): ``start``, ``add``, ``stop`` and ``speculate`` are its
    ``start_request``, ``add_active_response``, ``stop_request`` and ``speculate`` (requests named by integers here;
    a global sequence id goes to each started request in turn, as there). Every change is logged (``log``), so that
    a cache is rebuilt exactly, ties and all, by replaying it (``replay``): what a resumed run restores. The log
    leaves the prompts out (the request trees of the requests still active are rebuilt from their context:
    ``rebuild``), so that it holds about one int per answer token.
    """

    def __init__(self, max_depth: int, max_cached_requests: int, tree: type = SuffixTree):
        self.max_depth, self.max_cached, self.make = max_depth, max_cached_requests, tree
        self.clear()

    def clear(self) -> None:
        """Empty, as new (in place: the slots of a batch share it)."""
        self.global_tree = self.make(self.max_depth)
        self.local: dict[int, object] = {}  # active request -> its tree
        self.cached: dict[int, int] = {}  # request -> its global sequence, oldest first
        self.request_of: dict[int, int] = {}  # global sequence -> request
        self.next_seq = 0
        self.next_request = 0  # the id ``new_request`` hands out next
        self.log = array("q")

    def new_request(self) -> int:
        self.next_request += 1
        return self.next_request - 1

    def _record(self, op: int, request: int, tokens=()) -> None:
        self.log.extend((op, request, len(tokens)))
        self.log.extend(tokens)

    def start(self, request: int, prompt: list[int]) -> None:
        self._record(START, request)
        self.next_request = max(self.next_request, request + 1)
        self.local[request] = self.make(self.max_depth)
        self.local[request].extend(0, prompt)
        if self.max_cached == 0:
            return
        if request in self.cached:
            self.evict(request)
        while True:  # the next id not held by an active request
            seq = self.next_seq
            self.next_seq = (seq + 1) & 0x7FFFFFFF
            if seq not in self.request_of or self.request_of[seq] not in self.local:
                break
        if seq in self.request_of:  # a wrapped-around id still cached: that response goes
            self.cached.pop(self.request_of.pop(seq))
            self.global_tree.remove(seq)
        self.cached[request], self.request_of[seq] = seq, request
        while 0 < self.max_cached < len(self.cached):
            self.evict(next(r for r, s in self.cached.items() if s != seq))

    def evict(self, request: int) -> None:
        seq = self.cached.pop(request)
        del self.request_of[seq]
        self.global_tree.remove(seq)

    def add(self, request: int, tokens: list[int]) -> None:
        self._record(ADD, request, tokens)
        self.local[request].extend(0, tokens)
        if request in self.cached:
            self.global_tree.extend(self.cached[request], tokens)

    def stop(self, request: int) -> None:
        self._record(STOP, request)
        del self.local[request]

    def rebuild(self, request: int, tokens: list[int]) -> None:
        """Active ``request``'s own tree made anew from its ``tokens`` (its prompt, then its answer so far), after a
        ``replay``, whose log holds no prompt."""
        self.local[request] = self.make(self.max_depth)
        self.local[request].extend(0, tokens)

    def speculate(self, request: int, context: list[int], max_spec_tokens: int, max_spec_factor: float,
                  max_spec_offset: float, min_token_prob: float, tree: bool) -> tuple[Draft, bool]:
        """(the better draft after ``context``, whether it came from the global tree)."""
        context = context[-self.max_depth:]
        args = (max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob, tree)
        own = self.local[request].speculate(context, *args)
        other = self.global_tree.speculate(context, *args)
        return (own, False) if own.score >= other.score else (other, True)

    def replay(self, log) -> None:
        """This cache emptied, then every logged change of ``log`` (another cache's ``log``) made again: the global
        tree as it was, and the active requests' own trees without their prompts (``rebuild`` them)."""
        self.clear()
        log, at = list(log), 0
        while at < len(log):
            op, request, n = log[at: at + 3]
            tokens, at = log[at + 3: at + 3 + n], at + 3 + n
            if op == START:
                self.start(request, tokens)
            elif op == ADD:
                self.add(request, tokens)
            elif op == STOP:
                self.stop(request)
            else:
                raise HarnessError(f"a saved suffix cache has an unknown operation {op}; delete the run's state to "
                                   f"start its method afresh")
