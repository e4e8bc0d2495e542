"""A per-step draft budget (``runtime.budget``, ``runtime.spec_off_above``): how much of each step's drafts the forward
verifies.

* ``budget=off`` (the default): every draft goes into the forward whole, as each method's reference verifies it.
* ``budget=auto``: before each forward, the drafts of all busy rows are cut to the nodes that maximise the expected
  tokens committed per second of that forward, ``(rows + sum of the kept nodes' odds) / cost(rows, tokens)``. This is
  SmartSpec's goodput (Liu et al. 2024, arXiv 2406.14066: a batch's proposal length chosen per step from the expected
  accepted tokens and the step's measured time), taken down to single nodes as EAGLE-2 ranks its draft tree's
  nodes by their odds (Li et al. 2024, arXiv 2406.16858). A row may keep nothing (a plain step), a row may keep
  everything; when nothing pays, the step is vanilla's.
* ``spec_off_above=B``: plain steps while more than B rows are busy, the switch serving engines ship today (vLLM's
  ``speculative_disable_by_batch_size``, ArcticInference's ``disable_by_batch_size``), for comparison.

Cutting a draft never changes a token: the verifier accepts the longest path the target agrees with among the nodes
it is given, and every token it commits is the target's own. The cut is prefix-closed (a node is kept with its
parent), keeps a row's siblings in their order where the draft was sampled (``Draft.q``: the rejection rule tries a
node's children in the order drawn), and keeps a draft that asks for it whole or not at all (``Draft.whole``:
Lookahead's window, whose every node's logits its update reads). The proposer then learns from the draft it was
verified with (``Draft.kept`` maps its nodes to those it proposed).

The odds: a node's chance of being accepted given that its parent is, learned online over the run from what the
verifier accepted, per depth and the proposer's score of the node (``Draft.keys``: TR's rank in the matrix row, the
heads' ranks, EAGLE-2's head probability, PLD's and SAM's match length; none: depth only), shrunk towards the
depth's rate and that towards a prior of ``PRIOR`` for the first steps, older evidence weighing less (``Odds``). A
node's odds of being on the accepted path are the product along its path, and the expected tokens a step commits
are one (the bonus) plus their sum: greedy acceptance takes at most one child of each node, so the accepted nodes
are one path.

The cost: milliseconds of one verification forward of R rows of N tokens each through the run's engine, measured on
a grid of R (powers of two up to the batch size) and N, fitted non-decreasing in N, cached per model, engine and
machine kind (``methods.calibrate.budget_cost``); between grid points it is interpolated, R linearly and N on each
row count's curve (``Cost``). A ragged engine (``Engine.ragged``: static) computes the rows' sizes unpadded, so a
forward of rows of n_i tokens costs as R rows of their mean; a padded one (hf) computes every row of the engine at
the widest row's size.

The drafting is done before the cut, so what it costs is not in the choice; it decides whether the proposers are
asked for the next drafts (``Pause``, one for the run's slots): drafting whose drafts have not paid for it rests, and
each proposer hears of the steps it sat out (``Proposer.skipped``). Odds are learned only from what is verified, so a
draft cut to nothing teaches nothing: after a rest one row's draft is a probe, its best node verified whatever its
odds.
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from methods.base import Draft, Verification
from methods.common import HarnessError
from methods.tree import Tree

PRIOR = 0.5  # a node's odds given its parent's acceptance before anything is learned
TAIL_WEIGHT = 2.0  # pseudo-tries of the prior in the rate of the depths from d on
DEPTH_WEIGHT = 8.0  # pseudo-tries of that rate in depth d's
KEY_WEIGHT = 8.0  # pseudo-tries of the depth's rate in a (depth, key) rate
MAX_DEPTH = 32  # deeper nodes share the statistics of this depth
MAX_KEY = 63  # larger keys share the statistics of this one
DECAY = 0.99  # per step, the weight of what the odds learned before (about the last 100 steps count)
POLICIES = ("off", "auto")
FREE = 0.005  # drafting that takes less than this share of a token's time is never paused (Pause)


class Odds:
    """A draft node's probability of acceptance given its parent's, per (depth, key), learned from verifications.

    ``p(d, k) = (hits[d, k] + KEY_WEIGHT * q(d)) / (tries[d, k] + KEY_WEIGHT)``, with the depth's rate
    ``q(d) = (hits[d] + DEPTH_WEIGHT * t(d)) / (tries[d] + DEPTH_WEIGHT)`` and that of the depths from d on
    ``t(d) = (hits[>= d] + TAIL_WEIGHT * PRIOR) / (tries[>= d] + TAIL_WEIGHT)``: a try is a node whose parent was
    accepted, a hit one that was accepted itself. Deep nodes are tried rarely, and a chain that got that far tends to
    go on (a copied passage: PLD's and SAM's depth-4 nodes are accepted about 0.9 of the time against 0.3 at depth 1),
    so a deep node's few tries lean on the deeper nodes' together rather than on the prior. Every step (``forget``)
    weighs what was learned before by ``DECAY`` less: a drafter's accuracy drifts (Token Recycling's matrix fills, a
    passage to copy comes and goes), and odds learned low drift back towards the prior while nothing is verified, so
    that the drafts are tried again.

    >>> odds = Odds()
    >>> odds.p(1, 0)
    0.5
    >>> odds.learn((-1, 0, 0, 1), [0, 1, 1, 2], [0, 0, 1, 0], [True] * 4, [0, 1, 3])
    >>> round(odds.p(1, 0), 4), round(odds.p(1, 1), 4), round(odds.p(2, 0), 4)
    (0.6267, 0.5156, 0.7366)
    >>> for _ in range(1000):
    ...     odds.forget()
    >>> round(odds.p(1, 0), 4)
    0.5
    """

    def __init__(self):
        self.hits: dict[tuple[int, int], float] = defaultdict(float)
        self.tries: dict[tuple[int, int], float] = defaultdict(float)
        self.depth_hits: dict[int, float] = defaultdict(float)
        self.depth_tries: dict[int, float] = defaultdict(float)
        self.tail_hits: dict[int, float] = defaultdict(float)  # of the depths from d on
        self.tail_tries: dict[int, float] = defaultdict(float)
        self.unit = 1.0  # what a try learned now counts, in the counts' units (1 / the weight of a count)
        self.known: dict[tuple[int, int], float] = {}  # p's answers since the last forget or learn

    def p(self, depth: int, key: int) -> float:
        d, k = min(depth, MAX_DEPTH), min(max(key, 0), MAX_KEY)
        if (d, k) not in self.known:
            w = 1 / self.unit
            t = (w * self.tail_hits[d] + TAIL_WEIGHT * PRIOR) / (w * self.tail_tries[d] + TAIL_WEIGHT)
            q = (w * self.depth_hits[d] + DEPTH_WEIGHT * t) / (w * self.depth_tries[d] + DEPTH_WEIGHT)
            self.known[d, k] = (w * self.hits[d, k] + KEY_WEIGHT * q) / (w * self.tries[d, k] + KEY_WEIGHT)
        return self.known[d, k]

    def forget(self) -> None:
        """A step has passed: what was learned counts ``DECAY`` times less (new tries count more, the same)."""
        self.known.clear()
        self.unit /= DECAY
        if self.unit > 1e9:  # bring the counts back to units of one try
            for table in (self.hits, self.tries, self.depth_hits, self.depth_tries, self.tail_hits, self.tail_tries):
                for key in table:
                    table[key] /= self.unit
            self.unit = 1.0

    @staticmethod
    def tried(parents, depths: list[int], keys: list[int], acceptable: list[bool], path: list[int]):
        """One verification's tries, as (depth, key, hit): the nodes of a draft (``parents``, ``depths``, ``keys``,
        ``acceptable``) whose parent is on its accepted ``path`` (node indices, root first)."""
        on = set(path)
        for i in range(1, len(parents)):
            if parents[i] in on and acceptable[i]:
                yield depths[i], keys[i], i in on

    def learn(self, parents, depths: list[int], keys: list[int], acceptable: list[bool], path: list[int]) -> None:
        """One verification (``tried``'s arguments)."""
        unit = self.unit
        self.known.clear()
        for depth, key, accepted in self.tried(parents, depths, keys, acceptable, path):
            d, k = min(depth, MAX_DEPTH), min(max(key, 0), MAX_KEY)
            hit = unit * accepted
            self.tries[d, k] += unit
            self.hits[d, k] += hit
            self.depth_tries[d] += unit
            self.depth_hits[d] += hit
            for shallower in range(1, d + 1):
                self.tail_tries[shallower] += unit
                self.tail_hits[shallower] += hit

    def state_dict(self) -> dict:
        return {"hits": [[d, k, v / self.unit] for (d, k), v in self.hits.items()],
                "tries": [[d, k, v / self.unit] for (d, k), v in self.tries.items()]}

    def load_state_dict(self, state: dict) -> None:
        self.__init__()
        for name in ("hits", "tries"):
            for d, k, v in state.get(name, []):
                getattr(self, name)[int(d), int(k)] = v
                getattr(self, f"depth_{name}")[int(d)] += v
                for shallower in range(1, int(d) + 1):
                    getattr(self, f"tail_{name}")[shallower] += v


class Cost:
    """Milliseconds of a forward of ``rows`` rows computing ``slots`` token positions (their sizes' sum; a padded
    engine: rows x the widest), from a grid measured per row count (``table``: rows -> {tokens per row: ms}).

    >>> cost = Cost({1: {1: 10.0, 2: 12.0, 4: 20.0}, 4: {1: 30.0, 2: 40.0, 4: 80.0}})
    >>> cost(1, 3), cost(4, 8), round(cost(2, 2), 3), round(cost(1, 8), 3)
    (16.0, 40.0, 16.667, 36.0)
    """

    def __init__(self, table: dict[int, dict[int, float]]):
        self.table = {int(r): {int(n): float(ms) for n, ms in points.items()} for r, points in table.items()}
        self.curves = {r: np.array(monotone(points), dtype=float).T for r, points in self.table.items()}
        self.row_counts = sorted(self.curves)
        self.known: dict[tuple[int, int], float] = {}  # answers for whole numbers: a step asks the same ones again

    def __call__(self, rows: int, slots):
        """The cost of ``slots`` token positions (a number, or an array of them: the costs of as many forwards)."""
        if isinstance(slots, int):
            if (rows, slots) not in self.known:
                self.known[rows, slots] = float(self(rows, np.array([slots]))[0])
            return self.known[rows, slots]
        per = np.asarray(slots, dtype=float) / rows
        counts = self.row_counts
        lo = max([r for r in counts if r <= rows], default=counts[0])
        hi = min([r for r in counts if r >= rows], default=counts[-1])
        a, b = _at(self.curves[lo], per), _at(self.curves[hi], per)
        if hi == lo:
            ms = a * rows / lo if rows > hi else a  # past the grid: as many forwards' worth more
        else:
            ms = a + (b - a) * (rows - lo) / (hi - lo)
        return float(ms) if ms.ndim == 0 else ms


def monotone(points: dict[int, float]) -> list[tuple[int, float]]:
    """(n, ms) sorted by n, made non-decreasing in n: adjacent sizes that violate the order are pooled into their
    mean (a cost measured lower at a larger size is noise).

    >>> monotone({1: 2.0, 2: 1.0, 4: 3.0})
    [(1, 1.5), (2, 1.5), (4, 3.0)]
    """
    blocks: list[list] = []  # [sum, count, [sizes]], pooled left to right
    for n, ms in sorted(points.items()):
        blocks.append([ms, 1, [n]])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            last = blocks.pop()
            blocks[-1][0] += last[0]
            blocks[-1][1] += last[1]
            blocks[-1][2] += last[2]
    return [(n, b[0] / b[1]) for b in blocks for n in b[2]]


def _at(curve: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The curve (its sizes and costs) at ``n`` tokens per row: linear between its points, and past its ends along
    its last segment."""
    ns, ms = curve
    if len(ns) == 1:
        return np.full_like(n, ms[0])
    past = ms[-1] + (ms[-1] - ms[-2]) * (n - ns[-1]) / (ns[-1] - ns[-2])
    return np.where(n > ns[-1], past, np.interp(n, ns, ms))


@dataclass
class Offer:
    """One row's draft as the choice sees it, host-side."""

    parents: tuple[int, ...]
    depths: list[int]
    keys: list[int]
    acceptable: list[bool]
    ordered: bool = False  # sampled children (Draft.q): a node only with its earlier siblings
    whole: bool = False  # all of it or none of it (Draft.whole)

    @staticmethod
    def of(draft: Draft) -> "Offer":
        tree = draft.tree
        n = tree.size
        return Offer(tree.parents, [len(p) - 1 for p in tree.paths], list(draft.keys) if draft.keys else [0] * n,
                     draft.acceptable.tolist() if draft.acceptable is not None else [True] * n,
                     draft.q is not None, draft.whole)

    def values(self, odds: Odds) -> list[float]:
        """Each node's odds of being on the accepted path (the root: 1; an unacceptable node: 0)."""
        v = [1.0] * len(self.parents)
        last_child: dict[int, int] = {}
        for i in range(1, len(self.parents)):
            parent = self.parents[i]
            v[i] = v[parent] * odds.p(self.depths[i], self.keys[i]) if self.acceptable[i] else 0.0
            if self.ordered and parent in last_child:
                v[i] = min(v[i], v[last_child[parent]])
            last_child[parent] = i
        return v


def choose(offers: list[Offer], odds: Odds, cost: Callable[[int, int], float], ragged: bool = True,
           engine_rows: int | None = None) -> tuple[list[tuple[list[int], float]], float]:
    """Per row, the nodes to verify (root first, ascending) and the tokens the step is then expected to commit, for
    the forward that maximises expected tokens per millisecond (module docstring); and that rate.

    Items are the rows' nodes (a ``whole`` draft: one item of all its nodes), ranked by their expected tokens per
    token forwarded; the forward takes the best prefix of that ranking (the empty one: every row a plain step).
    A node never ranks above its parent (its odds are at most its parent's; ties go to the earlier node), so every
    prefix is prefix-closed. ``cost(rows, slots)``: the milliseconds of a forward of ``slots`` token positions
    (``Cost``). ``ragged``: a forward costs its rows' total size; else ``engine_rows`` rows (all the
    engine's) at the widest row's size.

    >>> flat = lambda rows, slots: 10.0                      # a free forward (a GPU's flat curve): keep everything
    >>> steep = lambda rows, slots: 10.0 * slots             # every token costs a plain step: keep nothing
    >>> chain = Offer((-1, 0, 1), [0, 1, 2], [0, 0, 0], [True] * 3)
    >>> [kept for kept, _ in choose([chain], Odds(), flat)[0]], [kept for kept, _ in choose([chain], Odds(), steep)[0]]
    ([[0, 1, 2]], [[0]])
    """
    rows = len(offers)
    values = [o.values(odds) for o in offers]
    items = []  # (tokens gained per token forwarded, row, first node, nodes, gain)
    for r, (o, v) in enumerate(zip(offers, values)):
        if o.whole:
            if len(v) > 1:
                gain = sum(v[1:])
                items.append((gain / (len(v) - 1), r, 1, list(range(1, len(v))), gain))
        else:
            items.extend((v[i], r, i, [i], v[i]) for i in range(1, len(v)) if v[i] > 0)
    items.sort(key=lambda it: (-it[0], it[1], it[2]))
    # the forward's rate after each prefix of the ranking, the empty one first; the first best: the fewest nodes
    forward_rows = rows if ragged else engine_rows or rows
    gained, slots, sizes, widest = 0.0, rows, [1] * rows, 1
    best_m, best = 0, rows / cost(forward_rows, rows if ragged else forward_rows)
    for m, (_, r, _, nodes, gain) in enumerate(items, 1):
        gained += gain
        if ragged:
            slots += len(nodes)
        else:
            sizes[r] += len(nodes)
            widest = max(widest, sizes[r])
            slots = forward_rows * widest
        rate = (rows + gained) / cost(forward_rows, slots)
        if rate > best:
            best_m, best = m, rate
    kept = [[0] for _ in range(rows)]
    for _, r, _, nodes, _ in items[:best_m]:
        kept[r].extend(nodes)
    return [(sorted(k), 1.0 + sum(v[i] for i in k[1:])) for k, v in zip(kept, values)], best


def best_node(offer: Offer, odds: Odds) -> tuple[list[int], float]:
    """``choose``'s answer for one row that verifies its best node (with its ancestors; a whole draft: all of it),
    whatever it costs: a probe (``Pause``). Nothing to verify (no node of any odds): the root alone."""
    v = offer.values(odds)
    best = max(range(1, len(v)), key=lambda i: (v[i], -i), default=None)
    if best is None or v[best] <= 0:
        return [0], 1.0
    if offer.whole:
        kept = list(range(len(v)))
    else:
        kept, node = [best], best
        while offer.parents[node] != -1:
            node = offer.parents[node]
            kept.append(node)
    kept.sort()
    return kept, 1.0 + sum(v[i] for i in kept[1:])


def cut(draft: Draft, kept: list[int]) -> Draft:
    """``draft`` with its nodes ``kept`` only (ascending, root first, each with its parent): the tree, tokens,
    acceptable mask, keys and sampled distributions of those, and ``kept`` recorded (``Draft.kept``)."""
    if len(kept) == draft.tree.size:
        return draft
    index = {old: new for new, old in enumerate(kept)}
    parents = draft.tree.parents
    tree = Tree.from_parents([-1] + [index[parents[i]] for i in kept[1:]]).to(draft.tokens.device)
    at = torch.tensor(kept, device=draft.tokens.device)
    acceptable = draft.acceptable[at] if draft.acceptable is not None else None
    if acceptable is not None:
        deepest = [d for d, ok in zip(tree.depth.tolist(), acceptable.tolist()) if ok]
        depth = max(deepest, default=0)
    else:
        depth = None if draft.depth is None else min(draft.depth, tree.max_depth)
    return replace(draft, tokens=draft.tokens[at], tree=tree, acceptable=acceptable, depth=depth,
                   q=draft.q[at] if draft.q is not None else None,
                   keys=[draft.keys[i] for i in kept] if draft.keys else None, kept=kept)


@dataclass
class Plan:
    """What the budget did to one row's draft this step, for the answer file."""

    offered: int  # nodes the proposer drafted (the root included; 1: it was not asked to draft)
    expected: float | None  # tokens the step was expected to commit (budget=auto), else None
    drafted: bool = True  # False: the proposer was not asked (``Proposer.skipped``)


class Pause:
    """When the busy rows' proposers are asked to draft (``budget=auto``), and which row's draft is a probe.

    A step's drafts pay when the tokens expected of what was kept (over the rows that drafted) are worth more than
    the drafting's time at the forward's rate. After two steps whose drafts do not, drafting rests ``wait`` steps
    (plain steps), then one row's draft is a probe: its best node is verified whatever the odds say, so that odds
    learned low are tried again (what a drafter proposes changes: Token Recycling's matrix fills, a copied passage
    comes round). ``wait`` doubles (up to ``MAX_WAIT``) while the drafts do not pay and is back to 1 when one does.
    Drafting that is free (under ``FREE`` tokens' worth a row: PLD's lookup, TR's gather) goes on while resting, which
    then only spaces the probes.

    One pause serves all the slots of a run, for the whole run (``Budget.pause``): what drafting costs is the method's
    and the machine's, and the odds a probe teaches are the run's (``Odds``), so one row's probe, the rows taking
    turns, tells for all; a pause per slot would have every slot of a large batch learn the same on its own, paying a
    draft each time.

    >>> p, steps = Pause(), []
    >>> for _ in range(6):  # three rows whose drafts never pay: asked, asked, rest 1, a probe (row 0), rest 2
    ...     asked, probe = p.ask(3)
    ...     steps.append((sum(asked), probe))
    ...     p.paid([0.0] * sum(asked), [0.1] * sum(asked))
    >>> steps
    [(3, None), (3, None), (0, None), (1, 0), (0, None), (0, None)]
    """

    MAX_WAIT = 256

    def __init__(self):
        self.left, self.wait, self.unpaid = 0, 1, 0
        self.free = False  # the last drafting took under FREE tokens' worth a row
        self.due = False  # the next draft is a probe
        self.turn = 0  # probes taken so far: the next one is row turn % rows

    def ask(self, rows: int) -> tuple[list[bool], int | None]:
        """Whether each of ``rows`` busy rows' proposers is asked for this step's draft, and the row whose draft is a
        probe (None: none is)."""
        if self.left:
            self.left -= 1
            self.due = self.due or not self.left
            return [self.free] * rows, None
        if not self.due:
            return [True] * rows, None
        self.due, row = False, self.turn % rows
        self.turn += 1
        return ([True] * rows if self.free else [r == row for r in range(rows)]), row

    def paid(self, gains: list[float], worths: list[float]) -> None:
        """What the rows that drafted this step expect of what was kept (tokens beyond the bonus), and what their
        drafting was worth (tokens at the forward's rate)."""
        if not worths:
            return
        self.free = max(worths) < FREE
        if sum(gains) > sum(worths):
            self.wait, self.unpaid = 1, 0
            return
        self.unpaid += 1
        if self.unpaid >= 2:
            self.left = self.wait
            self.wait = min(2 * self.wait, self.MAX_WAIT)


class Budget:
    """A run's draft budget (module docstring): ``plan`` cuts the step's drafts, ``learn`` takes each verification."""

    def __init__(self, policy: str = "off", off_above: int | None = None, cost: Cost | None = None,
                 ragged: bool = True):
        if policy not in POLICIES:
            raise HarnessError(f"runtime.budget={policy} is not a budget; use one of {', '.join(POLICIES)}")
        if policy == "auto" and cost is None:
            raise HarnessError("runtime.budget=auto needs the engine's cost (methods.calibrate.budget_cost)")
        self.policy, self.off_above, self.cost, self.ragged = policy, off_above, cost, ragged
        self.odds = Odds()
        self.pause = Pause()  # the slots', for the whole run
        self.seconds = 0.0  # spent choosing, for the run summary

    @property
    def active(self) -> bool:
        return self.policy == "auto" or self.off_above is not None

    def drafting(self, rows: int) -> tuple[list[bool], int | None]:
        """Whether each of ``rows`` busy rows' proposers is asked for a draft this step, and the row whose draft is a
        probe (``Pause.ask``)."""
        if self.off_above is not None and rows > self.off_above:
            return [False] * rows, None
        return self.pause.ask(rows) if self.policy == "auto" else ([True] * rows, None)

    def plan(self, drafts: list[Draft], drafted: list[bool], seconds: list[float], probe: int | None,
             engine_rows: int) -> tuple[list[Draft], list[Plan]]:
        """The drafts to verify in this forward (``drafted``: which rows' proposers drafted theirs, in ``seconds``;
        ``probe``: the row whose draft verifies its best node whatever it costs), and what was done to each; the
        ``Pause`` told whether the drafts paid."""
        t = time.perf_counter()
        offered = [d.tree.size for d in drafts]
        if self.policy != "auto":
            return drafts, [Plan(n, None, asked) for n, asked in zip(offered, drafted)]
        self.odds.forget()
        offers = [Offer.of(d) for d in drafts]
        chosen, rate = choose(offers, self.odds, self.cost, self.ragged, engine_rows)
        asked = [r for r, a in enumerate(drafted) if a]
        # the tokens the drafts are expected to bring as chosen (a probe's forced node not counted), against the
        # drafting's time in tokens at the forward's rate
        self.pause.paid([chosen[r][1] - 1 for r in asked], [1000 * seconds[r] * rate for r in asked])
        if probe is not None and chosen[probe][0] == [0]:
            chosen[probe] = best_node(offers[probe], self.odds)
        cuts = [cut(d, kept) for d, (kept, _) in zip(drafts, chosen)]
        self.seconds += time.perf_counter() - t
        return cuts, [Plan(n, e, asked) for n, (_, e), asked in zip(offered, chosen, drafted)]

    def learn(self, draft: Draft, result: Verification) -> None:
        if self.policy != "auto" or draft.tree.size == 1 or result.past_answer:
            return
        t = time.perf_counter()
        o = Offer.of(draft)
        self.odds.learn(o.parents, o.depths, o.keys, o.acceptable, result.path)
        self.seconds += time.perf_counter() - t

    def summary(self) -> dict:  # seconds_choosing: choosing, cutting and learning, the budget's own time
        out = {"policy": self.policy, "spec_off_above": self.off_above, "seconds_choosing": round(self.seconds, 3)}
        if self.cost is not None:
            out["cost_ms"] = {str(r): {str(n): round(ms, 3) for n, ms in p.items()} for r, p in self.cost.table.items()}
        return out


def check_settings(policy: str, off_above) -> None:
    """Refuse, before anything loads, a budget that is not one."""
    if policy not in POLICIES:
        raise HarnessError(f"runtime.budget={policy} is not a budget; use one of {', '.join(POLICIES)}")
    if off_above is not None and (isinstance(off_above, bool) or not isinstance(off_above, int) or off_above < 0):
        raise HarnessError(f"runtime.spec_off_above={off_above} must be a number of rows (0 or more) or null")

