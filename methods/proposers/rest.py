"""REST (He et al., arXiv 2311.08252): draft trees retrieved from a datastore of text, by suffix array.

Every step searches a datastore (a token corpus, ``method.datastore``) for the longest suffix of
the committed sequence, its newest token (the root) included, of ``max_token_span`` tokens down to
``min_token_span``. The occurrences of that suffix, at most ``max_matches`` of them (the first in
suffix-array order), each give the up to ``depth`` tokens that followed it; the trie of these
continuations is cut down to a draft tree:

1. every trie node (a prefix of some continuations) counts the continuations that run through it,
   and the ``num_draft`` most frequent nodes are kept;
2. the reference's cut: while the kept nodes' paths hold more than ``num_draft`` distinct tokens
   in all (each path counted on its own), the node whose path holds the most goes. So a tree has
   at most ``num_draft`` drafts and usually far fewer: the budget bounds the summed depths of its
   nodes (with repeated tokens in a path counted once), not their number.

Ties, broken arbitrarily by the reference's hash maps, go here to the shallower, then the
lexicographically first node in step 1, and in step 2 to the node of fewer occurrences, then the
deeper, then the lexicographically first; so the kept nodes always form a trie. No match at any span:
a root-only step, as in vanilla decoding (the reference verifies a dummy draft, token 100).

Worked example, a datastore of the sequences ``[5 1 2 3]``, ``[7 1 2 3 4]``, ``[1 2 9]``, and the context
``[8 1 2]``: the span 3 suffix ``8 1 2`` never occurs, the span 2 suffix ``1 2`` three times, followed by
``3`` (its sequence ends there), ``3 4`` and ``9``. The nodes count ``3``: 2, ``3 4``: 1, ``9``: 1. With
``num_draft=3`` all three are kept, but their paths hold 1 + 2 + 1 = 4 > 3 distinct tokens, so ``3 4``
goes and the root ``2`` gets the children ``3`` and ``9``; with ``num_draft=4`` nothing goes and ``3``
gets the child ``4``.

This follows Spec-Bench (hemingkx/Spec-Bench, commit fd2c1cd): the spans and defaults of
``evaluation/inference_rest.py`` (``--num-draft 64``, ``--max-token-span 16``, spans 16 down to 2, the
root in the query), the span loop of ``generate_candidates_and_draft_buffer`` in
``model/rest/rest/model/utils.py``, and DraftRetriever's ``Reader.search`` and ``cut_to_choices`` in
``model/rest/DraftRetriever/src/lib.rs`` (its defaults ``k=5000`` occurrences, ``long=10`` tokens each,
the prefix counts, the top ``choices``, the cut). Where we differ: the datastore keeps its sequences
apart (the reference joins them end to end, so a continuation may run into the next one), an
occurrence with nothing after it is skipped (the reference would fail on a match with only such
occurrences), and the datastore is the SAM corpus format (``methods.automata.save_corpus``: made with
``python -m scripts.make_sam_corpus``, from the model's own answers or from texts the user brings,
as the reference builds its datastores from ShareGPT or UltraChat) with its suffix array built here,
once per file and kept in the cache (``python -m methods.proposers.rest --datastore FILE`` builds it ahead).
"""
from __future__ import annotations

import argparse
import hashlib
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from methods.automata import SEPARATOR, load_corpus, save_corpus
from methods.base import Draft, Proposer, register
from methods.common import CACHE, ROOT, HarnessError, atomic, exit_on_error
from methods.params import artefact, param
from methods.tree import Tree

MAKE = "python -m scripts.make_sam_corpus --model MODEL [--texts FILE.jsonl] --out PATH"


def suffix_array(text: np.ndarray) -> np.ndarray:
    """The start positions of ``text``'s suffixes in lexicographic order (a suffix before its extensions),
    by prefix doubling: O(n log n) per doubling, as many doublings as the longest repeat needs.

    >>> suffix_array(np.array([2, 1, 2, 1])).tolist()  # 1 < 1 2 1 < 2 1 < 2 1 2 1
    [3, 1, 2, 0]
    """
    n = len(text)
    rank = np.unique(text, return_inverse=True)[1].astype(np.int64)  # suffixes ranked by their first token
    order = np.argsort(rank, kind="stable")
    span = 1
    while span < n:  # ranked by their first 2 x span tokens: the rank of the first span, then the next one's
        following = np.full(n, -1, dtype=np.int64)
        following[: n - span] = rank[span:]
        key = rank * (n + 1) + following + 1
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.concatenate(([0], np.cumsum(ordered[1:] != ordered[:-1])))
        if rank[order[-1]] == n - 1:  # all distinct: sorted
            break
        span *= 2
    return order


class Datastore:
    """Token sequences, each followed by ``SEPARATOR`` (which no query holds, so no match spans two), and the
    suffix array of that text (``suffixes``: given, or built)."""

    def __init__(self, sequences, suffixes: np.ndarray | None = None):
        self.sequences = len(sequences)
        text = np.concatenate([np.append(np.asarray(s, dtype=np.int64), SEPARATOR) for s in sequences]) \
            if sequences else np.zeros(0, dtype=np.int64)
        self._text = array("q", text.tobytes())  # what the search slices: its slices compare as tuples do
        self.text = np.frombuffer(self._text, dtype=np.int64)  # the same memory, for numpy
        self.suffixes = suffixes if suffixes is not None and len(suffixes) == len(text) else suffix_array(text)

    def __len__(self) -> int:
        return len(self.text) - self.sequences  # tokens, the separators left out

    @classmethod
    def load(cls, path: Path, cache: Path) -> tuple["Datastore", dict]:
        """The datastore of a corpus file and the corpus's ``about`` with ``sha256`` (the file's content hash, 16
        digits), ``suffix_array`` (its file in ``cache``, named by that hash) and ``build_seconds`` (None: it was
        there)."""
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()[:16]
        sequences, about = load_corpus(path)
        saved = cache / f"{path.stem}-{digest}.npy"
        try:
            cached = np.load(saved, allow_pickle=False)
        except (OSError, ValueError):  # not built yet, or unreadable: built again
            cached = None
        t0 = time.perf_counter()
        store = cls(sequences, cached)
        built = store.suffixes is not cached
        if built:
            with atomic(saved) as tmp, open(tmp, "wb") as f:
                np.save(f, store.suffixes)
        return store, {**about, "sha256": digest, "suffix_array": str(saved),
                       "build_seconds": round(time.perf_counter() - t0, 3) if built else None}

    def retrieve(self, context: list[int], spans: range, max_matches: int, depth: int) -> tuple[int, np.ndarray]:
        """(the longest span n in ``spans`` whose last n tokens of ``context`` occur followed by a token, the
        continuations) or (0, none): the up to ``depth`` tokens after each of its first ``max_matches``
        occurrences in suffix-array order, one row each, ``SEPARATOR`` past a sequence's end; the rows are
        in lexicographic order.

        >>> Datastore([[5, 1, 2, 3], [7, 1, 2, 3, 4], [1, 2, 9]]).retrieve([8, 1, 2], range(3, 1, -1), 9, 3)
        (2, array([[ 3, -1, -1],
               [ 3,  4, -1],
               [ 9, -1, -1]]))
        """
        for n in spans:
            query = array("q", context[-n:])
            if len(query) < n:
                continue
            key = lambda i: self._text[i: i + n]  # noqa: E731  (the suffix at i, cut to the query's length)
            lo, hi = bisect_left(self.suffixes, query, key=key), bisect_right(self.suffixes, query, key=key)
            starts = self.suffixes[lo:hi] + n
            starts = starts[self.text[starts] != SEPARATOR][:max_matches]
            if len(starts):
                rows = self.text[np.minimum(starts[:, None] + np.arange(depth), len(self.text) - 1)]
                rows[np.logical_or.accumulate(rows == SEPARATOR, axis=1)] = SEPARATOR  # cut at the sequence's end
                return n, rows
        return 0, np.zeros((0, depth), dtype=np.int64)


def trie(rows: np.ndarray, num_draft: int) -> tuple[list[int], list[int]]:
    """The draft nodes of the continuations ``rows`` (``Datastore.retrieve``'s, in lexicographic order), chosen as
    the module docstring says: (their tokens, their parents), breadth-first, a parent numbered in [root, nodes].

    >>> trie(np.array([[3, -1], [3, 4], [9, -1]]), num_draft=3), trie(np.array([[3, -1], [3, 4], [9, -1]]), 4)
    (([3, 9], [0, 0]), ([3, 9, 4], [0, 0, 1]))
    """
    m, width = rows.shape
    same = np.zeros(rows.shape, dtype=bool)  # same[i, d]: row i starts with row i - 1's first d + 1 tokens
    same[1:] = np.logical_and.accumulate(rows[1:] == rows[:-1], axis=1)
    levels, firsts, counts = [], [], []  # per node (the rows sharing d + 1 first tokens): d, its first row, rows
    for d in range(width):
        first = np.flatnonzero(~same[:, d])
        count = np.diff(first, append=m)
        real = rows[first, d] != SEPARATOR
        levels.append(np.full(int(real.sum()), d)), firsts.append(first[real]), counts.append(count[real])
    level, first, count = (np.concatenate(a) for a in (levels, firsts, counts))
    kept = np.lexsort((first, level, -count))[:num_draft]  # the most frequent; ties: the shallower, the first
    paths = {i: rows[first[i], : level[i] + 1].tolist() for i in kept.tolist()}
    distinct = {i: len(set(p)) for i, p in paths.items()}
    total = sum(distinct.values())
    for i in sorted(paths, key=lambda i: (-distinct[i], count[i], -level[i], first[i])):  # the reference's cut
        if total <= num_draft:
            break
        total -= distinct.pop(i)
        del paths[i]
    ordered = sorted(paths, key=lambda i: (level[i], first[i]))  # breadth-first, siblings in their parent's order
    number = {tuple(paths[i]): k for k, i in enumerate(ordered, start=1)}
    return [paths[i][-1] for i in ordered], [number.get(tuple(paths[i][:-1]), 0) for i in ordered]


def datastore_path(ref: str | None) -> Path:
    """``method.datastore``: a corpus file as given, or relative to the project root."""
    if ref is None:
        raise HarnessError(f"method.datastore=null: REST drafts only from a datastore; give method.datastore=PATH, a "
                           f"token corpus file ({MAKE})")
    path = Path(ref).expanduser()
    for candidate in (path,) if path.is_absolute() else (path, ROOT / path):
        if candidate.is_file():
            return candidate
    raise HarnessError(f"method.datastore={ref}: no such file; make it with {MAKE.replace('PATH', ref)}")


@register
class Rest(Proposer):
    name = "rest"
    token_only = True

    @dataclass
    class Params:  # Spec-Bench's REST row (evaluation/inference_rest.py, DraftRetriever's search defaults)
        datastore: str | None = param(None, "the datastore: a token corpus file (python -m scripts.make_sam_corpus); "
                                      "in a run, the model config's artefacts.rest_datastore",
                                      config=artefact("rest_datastore"))
        num_draft: int = param(64, "at most this many draft nodes, and the budget of the reference's cut (module "
                               "docstring)", low=1, high=1024)
        max_token_span: int = param(16, "match the newest n tokens (the root included) in the datastore, n from this "
                                    "down to min_token_span", low=1, high=1024)
        min_token_span: int = param(2, "the shortest suffix searched (the reference's 2)", low=1, high=1024)
        max_matches: int = param(5000, "use the first this many occurrences of the match, in suffix-array order "
                                 "(DraftRetriever's k)", low=1)
        depth: int = param(10, "each occurrence contributes the up to this many tokens after it: the deepest draft "
                           "(DraftRetriever's long)", low=1, high=1024)

    @classmethod
    def example(cls, folder, prompts) -> dict:
        """A datastore of the prompts themselves, so that drafts are accepted at times."""
        path = Path(folder) / "rest_example.npz"
        save_corpus(path, prompts, {"source": "Rest.example: the prompts"})
        return {"datastore": str(path)}

    def __init__(self, params: Params, store: Datastore, about: dict):
        self.params, self.store, self.about = params, store, about
        self.spans = range(params.max_token_span, params.min_token_span - 1, -1)
        self.matched = Counter()  # steps by matched span (0: none)

    @classmethod
    def check(cls, params: Params) -> None:
        if params.min_token_span > params.max_token_span:
            raise HarnessError(f"method.min_token_span={params.min_token_span} exceeds method.max_token_span="
                               f"{params.max_token_span}; give a min_token_span of at most max_token_span")
        datastore_path(params.datastore)

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device) -> "Rest":
        path = datastore_path(params.datastore)
        try:
            store, about = Datastore.load(path, CACHE / "rest")
        except HarnessError as e:
            raise HarnessError(f"method.datastore={params.datastore}: {e}") from None
        if len(store) and int(store.text.max()) >= vocab_size:
            raise HarnessError(f"method.datastore={params.datastore} holds token {int(store.text.max())}, outside the "
                               f"model's {vocab_size}-token vocabulary; make it for this model ({MAKE})")
        return cls(params, store, about)

    def propose(self, context: torch.Tensor) -> Draft:
        p = self.params
        span, rows = self.store.retrieve(context[-p.max_token_span:].tolist(), self.spans, p.max_matches, p.depth)
        self.matched[span] += 1
        tokens, parents = trie(rows, p.num_draft) if span else ([], [])
        drafts = torch.tensor(tokens, dtype=context.dtype, device=context.device)
        return Draft(torch.cat([context[-1:], drafts]), Tree.from_parents([-1, *parents]).to(context.device))

    def step_sizes(self) -> list[int]:
        return list(range(1, self.params.num_draft + 2))  # the root and 0..num_draft drafts

    def summary(self) -> dict:
        p = self.params
        return {"datastore": p.datastore, "num_draft": p.num_draft, "max_token_span": p.max_token_span,
                "min_token_span": p.min_token_span, "max_matches": p.max_matches, "depth": p.depth,
                "datastore_tokens": len(self.store), "datastore_sequences": self.store.sequences,
                "datastore_about": self.about, "steps_by_matched_span": dict(sorted(self.matched.items()))}


@exit_on_error
def main(argv=None) -> None:
    """``python -m methods.proposers.rest --datastore FILE``: build a corpus file's suffix array into the cache
    ahead of a run."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--datastore", required=True, help="a token corpus file (python -m scripts.make_sam_corpus)")
    args = ap.parse_args(argv)
    path = datastore_path(args.datastore)
    store, about = Datastore.load(path, CACHE / "rest")
    how = "already built" if about["build_seconds"] is None else f"built in {about['build_seconds']} s"
    print(f"{path}: {len(store)} tokens in {store.sequences} sequences; suffix array {how}: {about['suffix_array']}")


if __name__ == "__main__":
    main()
