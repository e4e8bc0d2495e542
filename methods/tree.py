"""Draft trees as data.

A tree is a parent array in breadth-first order: node 0 is the root (the newest
committed token, not yet in the KV cache) and ``parents[i] < i`` for every other
node. Everything the verifier needs (depth, ancestor mask, leaf paths) is derived
once per topology and cached, so proposers that reuse a static template pay for it
once per process.

Worked example, the tree::

        0            parents = (-1, 0, 0, 1)
       / \\          depth   = [0, 1, 1, 2]
      1   2          leaves  = [2, 3]   paths: [0, 2], [0, 1, 3]
      |
      3              ancestors(3) = {0, 1, 3}   (a node is its own ancestor)

Node ``i`` is forwarded at position ``L + depth[i]`` (``L`` = committed length) and
attends to the committed prefix plus its own ancestors, which is exactly the
causal context of the path it lies on.
"""
from __future__ import annotations

import json
import operator
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path

import torch

from methods.common import DATA, HarnessError

TEMPLATES = DATA / "trees"


class TreeError(HarnessError):
    """A parent array that does not describe a breadth-first tree."""


@dataclass(frozen=True, eq=False)
class Tree:
    parents: tuple[int, ...]
    depth: torch.Tensor = field(repr=False)  # [n] long
    ancestors: torch.Tensor = field(repr=False)  # [n, n] bool, ancestors[i, j]: j is on the root->i path
    parent_index: torch.Tensor = field(repr=False)  # [n] long, parents with the root pointing at itself
    rank: torch.Tensor = field(repr=False)  # [n] long, index among siblings (root: 0)
    is_chain: bool = field(repr=False)  # parents == (-1, 0, 1, ..., n-2): plain causal attention suffices
    paths: tuple[tuple[int, ...], ...] = field(repr=False)  # paths[i]: node indices root..i, host-side

    @cached_property
    def ranks(self) -> list[int]:
        """``rank`` host-side: each node's index among its siblings (a per-step budget's key, ``Draft.keys``)."""
        return self.rank.tolist()

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return len(self.paths[-1]) - 1  # BFS order: the last node is among the deepest (host-side: no sync)

    def leaf_paths(self) -> list[list[int]]:
        """Root-to-leaf node paths, leaves in BFS order."""
        has_child = set(p for p in self.parents[1:])
        return [self.path_to(i) for i in range(self.size) if i not in has_child]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node``."""
        return list(self.paths[node])

    def children(self) -> list[list[int]]:
        """Every node's children, in index order."""
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for i, p in enumerate(self.parents[1:], start=1):
            kids[p].append(i)
        return kids

    def children_counts(self) -> list[int]:
        return [len(c) for c in self.children()]

    def to(self, device: torch.device | str) -> "Tree":
        return _tree_on(self.parents, str(device))

    def cut(self, depth: int) -> "Tree":
        """The nodes of depth at most ``depth`` (a prefix: the order is breadth-first).

        >>> Tree.from_children_counts([2, 1]).cut(1).parents
        (-1, 0, 0)
        """
        return _tree_on(self.parents[:sum(len(p) <= depth + 1 for p in self.paths)], "cpu")

    @staticmethod
    def from_parents(parents) -> "Tree":
        return _tree_on(_integers(parents, "parents"), "cpu")

    @staticmethod
    def breadth_first(parents: list[int]) -> tuple["Tree", list[int]]:
        """A tree given parent-first but not breadth-first: (the tree, ``order``), where
        ``order[i]`` is the input index of the tree's node ``i``.

        >>> tree, order = Tree.breadth_first([-1, 0, 1, 0])   # 0 -> {1, 3}, 1 -> 2
        >>> tree.parents, order
        ((-1, 0, 0, 1), [0, 1, 3, 2])
        """
        children: dict[int, list[int]] = {}
        for i, p in enumerate(parents[1:], start=1):
            if not 0 <= p < i:
                raise TreeError(f"node {i} has parent {p}; parents must come before their children")
            children.setdefault(p, []).append(i)
        order = [0]
        for node in order:  # the list grows while it is walked: a breadth-first traversal
            order.extend(children.get(node, []))
        new = {old: i for i, old in enumerate(order)}
        return Tree.from_parents([-1] + [new[parents[old]] for old in order[1:]]), order

    @staticmethod
    def chain(n: int) -> "Tree":
        """A root followed by ``n - 1`` drafts, each the child of the previous one."""
        return Tree.from_parents((-1, *range(n - 1)))

    @staticmethod
    def from_children_counts(counts: list[int]) -> "Tree":
        """Build a tree from per-node child counts given in BFS order (the form paper templates use).
        Trailing zeros (the last leaves) may be left out.

        >>> Tree.from_children_counts([2, 1]).parents
        (-1, 0, 0, 1)
        """
        parents = [-1]
        for node, c in enumerate(_integers(counts, "children counts")):
            if node >= len(parents):
                raise TreeError(f"children counts list node {node}, but only {len(parents)} nodes exist by then")
            parents.extend([node] * c)
        if len(parents) < len(counts):
            raise TreeError(f"children counts describe {len(parents)} nodes but list {len(counts)}")
        return Tree.from_parents(parents)


def _integers(values, what: str) -> tuple[int, ...]:
    """``values`` as ints; a float (``0.7``), a string or a bool is refused, never truncated."""
    shown = values
    try:
        values = list(values) if not isinstance(values, (str, bytes)) else None
        if values is None or any(isinstance(v, bool) for v in values):
            raise TypeError
        return tuple(operator.index(v) for v in values)
    except TypeError:
        raise TreeError(f"tree {what} must be a list of integers, got {shown!r:.80}") from None


def _validate(parents: tuple[int, ...]) -> None:
    if not parents or parents[0] != -1:
        raise TreeError("a tree needs a root: parents[0] must be -1")
    for i, p in enumerate(parents[1:], start=1):
        if not 0 <= p < i:
            raise TreeError(f"node {i} has parent {p}; a breadth-first parent array needs 0 <= parent < node")
    depth = [0] * len(parents)
    for i, p in enumerate(parents[1:], start=1):
        depth[i] = depth[p] + 1
        if depth[i] < depth[i - 1] or (depth[i] == depth[i - 1] and p < parents[i - 1]):
            raise TreeError(f"node {i} breaks breadth-first order (depth {depth[i]} after {depth[i - 1]})")


@lru_cache(maxsize=256)
def _tree_on(parents: tuple[int, ...], device: str) -> Tree:
    _validate(parents)
    n = len(parents)
    paths: list[tuple[int, ...]] = [(0,)]
    for i in range(1, n):
        paths.append(paths[parents[i]] + (i,))
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i, path in enumerate(paths):
        anc[i, list(path)] = True
    depth = torch.tensor([len(p) - 1 for p in paths])
    parent_index = torch.tensor((0, *parents[1:]))
    rank = [0] * n
    for i in range(2, n):
        rank[i] = rank[i - 1] + 1 if parents[i] == parents[i - 1] else 0
    is_chain = parents == tuple(range(-1, n - 1))
    return Tree(parents, depth.to(device), anc.to(device), parent_index.to(device), torch.tensor(rank).to(device),
                is_chain, tuple(paths))


def load_template(name_or_path: str) -> Tree:
    """A static tree from ``data/trees/NAME.json`` or a JSON file path.

    The file holds ``"children"``: per-node child counts level by level (a list of
    lists, breadth-first: level ``d`` one count per node of depth ``d``), or ``"parents"``:
    a parent array. Every error in it names the file.
    """
    path = Path(name_or_path).expanduser()
    if not path.suffix:
        path = TEMPLATES / f"{name_or_path}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in TEMPLATES.glob("*.json")))
        raise TreeError(f"no tree template '{name_or_path}'; known: {known}, or a path to a .json file")
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
        if "parents" in spec:
            return Tree.from_parents(spec["parents"])
        return Tree.from_children_counts(_levels(spec["children"]))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        why = "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else e
        raise TreeError(f"tree file {path} is malformed ({why}); it needs 'children' (levels) or 'parents'") \
            from None
    except TreeError as e:
        raise TreeError(f"tree file {path}: {e}") from None


def _levels(levels: list[list[int]]) -> list[int]:
    """The child counts of ``"children"``'s levels in one breadth-first list; levels grouped otherwise than one
    count per node of their depth are refused (flattened, they would be read as another tree).

    >>> _levels([[2], [1, 0], [0]])
    [2, 1, 0, 0]
    """
    counts: list[int] = []
    nodes = 1  # at depth 0: the root
    for depth, level in enumerate(levels):
        level = _integers(level, f"children level {depth}")
        if len(level) != nodes:
            has = "one node, the root" if depth == 0 else f"{nodes} node(s), the sum of level {depth - 1}"
            raise TreeError(f"children level {depth} lists {len(level)} count(s) {list(level)!r:.60} but depth "
                            f"{depth} has {has}; give one count per node")
        counts += level
        nodes = sum(level)
    return counts


HEADS_TREE = "medusa"  # mc_sim_7b_63: Spec-Bench's tree for Medusa and Hydra (their medusa_choices, hydra_choices)


def heads_tree(name: str | None, heads: int, method: str) -> tuple[Tree, str]:
    """The static tree of a proposer with ``heads`` heads, one per depth, and its name: the template ``name``
    (refused if deeper than the heads), or for None mc_sim_7b_63 cut to the heads' depth."""
    if name is None:
        tree = load_template(HEADS_TREE)
        return tree.cut(heads), HEADS_TREE + ("" if heads >= tree.max_depth else f" to depth {heads}")
    tree = load_template(name)
    if tree.max_depth > heads:
        raise TreeError(f"tree '{name}' has depth {tree.max_depth}, but the {method} head has {heads} heads: give "
                        f"a tree of depth at most {heads}, or leave method.tree out ({HEADS_TREE} to the heads' depth)")
    return tree, name


def grow_tree(accept: list[list[float]], n_drafts: int, max_depth: int, k: int, reach_depth: bool = False) -> Tree:
    """The draft tree of ``n_drafts`` nodes (depth <= ``max_depth``, ranks < ``k``) with the largest
    expected accepted length, under a model where a node of rank ``r`` at depth ``d`` is correct
    with probability ``accept[d-1][r]`` given that its parent is (rows past the table's end reuse its
    last row). A node's value is the product along its path, which never grows with depth, so
    taking nodes greedily by value, a node's next sibling becoming a candidate once it is taken
    (children take ranks 0..c-1), yields the best tree for the node budget. ``reach_depth`` first
    takes the rank-0 path down to ``max_depth`` (for ablations over depth). Ties go to the
    shallower, lower-rank node.

    >>> grow_tree([[0.6, 0.3], [0.5, 0.2]], n_drafts=3, max_depth=2, k=2).parents
    (-1, 0, 0, 1)
    >>> grow_tree([[0.6, 0.3], [0.1, 0.1]], n_drafts=3, max_depth=2, k=2, reach_depth=True).parents
    (-1, 0, 0, 1)
    """
    import heapq

    def p(depth: int, rank: int) -> float:
        row = accept[min(depth, len(accept)) - 1]
        return row[rank] if rank < len(row) else 0.0

    heap: list[tuple[float, int, tuple[int, ...], float]] = []  # (-value, depth, rank path, parent's value)
    chosen: list[tuple[int, ...]] = []

    def take(path: tuple[int, ...], parent_value: float) -> None:
        chosen.append(path)
        depth, rank = len(path), path[-1]
        value = parent_value * p(depth, rank)
        if rank + 1 < k:
            heapq.heappush(heap, (-parent_value * p(depth, rank + 1), depth, path[:-1] + (rank + 1,), parent_value))
        if depth < max_depth and not (reach_depth and path == (0,) * depth):
            heapq.heappush(heap, (-value * p(depth + 1, 0), depth + 1, path + (0,), value))

    if reach_depth:
        value = 1.0
        for depth in range(1, min(max_depth, n_drafts) + 1):
            take((0,) * depth, value)
            value *= p(depth, 0)
    else:
        heapq.heappush(heap, (-p(1, 0), 1, (0,), 1.0))
    while heap and len(chosen) < n_drafts:
        _, _, path, parent_value = heapq.heappop(heap)
        take(path, parent_value)
    # Breadth-first numbering: by depth, then by parent's number, then by rank (= path order).
    chosen.sort(key=lambda path: (len(path), path))
    index = {(): 0}
    parents = [-1]
    for path in chosen:
        index[path] = len(parents)
        parents.append(index[path[:-1]])
    return Tree.from_parents(parents)


def additive_mask(allowed: torch.Tensor, past: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, n, past + m] additive mask: every row sees the first ``past`` entries, then those ``allowed`` [n, m]."""
    n, m = allowed.shape
    mask = torch.zeros(1, 1, n, past + m, dtype=dtype, device=allowed.device)
    mask[0, 0, :, past:].masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask


def graft(tree: Tree, tokens: list[int], chain: list[int]) -> tuple[Tree, list[int]]:
    """A draft tree with ``chain`` (tokens to follow the root) added as a path from the root, sharing the
    tree's nodes where they already draft its first tokens: (the new tree, its tokens), breadth-first.

    >>> t = Tree.from_parents((-1, 0, 0, 1))           # root 5 -> {7, 3}, 7 -> 9
    >>> new, toks = graft(t, [5, 7, 3, 9], [7, 8, 2])  # 7 is shared, 8 and 2 hang under it
    >>> new.parents, toks
    ((-1, 0, 0, 1, 1, 4), [5, 7, 3, 9, 8, 2])
    """
    parents, tokens = list(tree.parents), list(tokens)
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents[1:], start=1):
        children.setdefault(p, []).append(i)
    node, i = 0, 0
    while i < len(chain):
        shared = next((c for c in children.get(node, []) if tokens[c] == chain[i]), None)
        if shared is None:
            break
        node, i = shared, i + 1
    for t in chain[i:]:
        parents.append(node)
        tokens.append(t)
        node = len(parents) - 1
    new, order = Tree.breadth_first(parents)
    return new, [tokens[j] for j in order]
