"""``method.tree=auto``: the draft tree that maximises expected tokens per second on this engine and device.

Two measurements, one model:

* **acceptance** ``p[d][r]``: how often a draft of rank r at depth d is correct given
  that its parent is. Measured in a calibration pass: Token Recycling with the ``probe``
  tree (8 ranks at every depth to 8) decodes prompts of our own
  (``evaluation.running.own_prompts``: none is a Spec-Bench question), so the questions being
  measured never inform the tree that measures them; the first prompt only warms the
  matrix. Acceptance depends on the model and K, not on the device: the table is cached
  under ``data/cache/autotree/``.
* **cost** ``c(N)``: the latency of one verification of N tokens through the run's own
  engine on this device (``measure_cost``), taken when the run starts, at 256 cached
  tokens: each size's fastest of 5 repeats, fitted non-decreasing in N (noise must make
  neither a larger tree look cheaper nor one slow sample penalise every larger size).
  Under load (``runtime.batch_size=B``) it is the cost of one forward verifying B rows of N
  tokens each: every row gains E(n) tokens from it, and vanilla B tokens from ``c(1)``, so
  the same choice applies, and as B grows and a forward's cost rises with N sooner, the
  tree shrinks towards the plain step.

For every number of drafts n, ``methods.tree.grow_tree`` gives the tree of n drafts with
the largest expected accepted length ``E(n) = 1 + sum over nodes of the product of p along
its path`` (a plain step: n = 0, E = 1). The choice is ``argmax_n E(n) / c(n + 1)``; when
no tree beats the plain step, the plain step it is. With Token Recycling, E(n) flatters
small trees: a step refreshes the matrix rows of its own nodes only, so a small tree drafts
from a staler matrix than the probe that measured p (on the embedded model, 5 drafts:
E = 1.78, reached 1.53). So the calibration also decodes with each candidate tree and
``choose_tree(..., measured=)`` scores candidates by the MAT they reached. The tree never
changes output tokens, only how many a step commits.
"""
from __future__ import annotations

import statistics
import time
from bisect import bisect_left

import torch

from methods.base import Draft
from methods.budget import monotone
from methods.engine.ops import sync
from methods.tree import Tree, grow_tree
from methods.verify import Check, verify_rows

SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 81)  # tokens per forward whose cost is measured
CONTEXT = 256  # cached tokens when measuring cost
MAX_DEPTH = 8  # the probe tree's depth
PSEUDO_TRIES = 20  # shrinkage of sparse (deep) estimates towards the rank's rate over all depths


def star(n: int) -> Tree:
    """A root and n - 1 children: n tokens through tree attention (n = 1: a plain step)."""
    return Tree.from_parents([-1] + [0] * (n - 1))


@torch.inference_mode()
def measure_cost(engine, sizes=SIZES, contexts=(CONTEXT,), repeats: int = 5, rows: int = 1) -> list[dict]:
    """Latency of verifying N tokens after C cached ones through ``engine`` (in each of ``rows`` rows at once, one
    forward: a batch): ``ms`` the median of the repeats, ``ms_min`` the fastest.

    Each point runs the shared verifier on a star tree of N nodes (a root and N - 1
    children) in every row, then drops the drafts from the cache; one untimed run first.
    """
    out = []
    gen = torch.Generator().manual_seed(0)
    vocab, device = engine.model.config.vocab_size, engine.device
    for c in contexts:
        engine.start(c + max(sizes), rows=rows)
        for row in range(rows):
            engine.forward(torch.randint(vocab, (c,), generator=gen).to(device), row=row, last_only=True)
        for n in sizes:
            checks = [Check(Draft(torch.randint(vocab, (n,), generator=gen).to(device), star(n).to(device)), row)
                      for row in range(rows)]
            times = []
            for i in range(repeats + 1):
                sync(device)
                t = time.perf_counter()
                verify_rows(engine, checks)
                sync(device)
                if i:
                    times.append(time.perf_counter() - t)
                for row in range(rows):
                    engine.commit(c, [], row=row)
            out.append({"context": c, "tokens": n, "rows": rows, "ms": 1000 * statistics.median(times),
                        "ms_min": 1000 * min(times)})
    for r in out:
        plain = next(x["ms"] for x in out if x["context"] == r["context"] and x["tokens"] == min(sizes))
        r["vs_plain"] = r["ms"] / plain
    return out


def cost_curve(rows: list[dict]) -> dict[int, float]:
    """ms per forward for every N from 1 to the largest measured, from each size's fastest repeat (a
    shared machine's spikes only ever add time), fitted non-decreasing in N (``monotone``), linear between
    measured sizes."""
    fitted = monotone({r["tokens"]: r.get("ms_min", r["ms"]) for r in rows})
    curve = {}
    for (n0, c0), (n1, c1) in zip(fitted, fitted[1:] + fitted[-1:]):
        for n in range(n0, max(n1, n0 + 1)):
            curve[n] = c0 + (c1 - c0) * (n - n0) / (n1 - n0) if n1 > n0 else c0
    return curve


def acceptance_table(parents: list[int], node_accepts: list[int], k: int) -> list[list[float]]:
    """p[d-1][r] = accepted(nodes of depth d, rank r) / accepted(their parents), from a run's node statistics.

    Deep nodes are tried rarely, so each estimate is shrunk towards the same rank's
    rate pooled over all depths, as if ``PSEUDO_TRIES`` more tries had that rate.
    """
    tree = Tree.from_parents(parents)
    depth, rank = tree.depth.tolist(), tree.rank.tolist()
    hits = [[0] * k for _ in range(tree.max_depth)]
    tries = [[0] * k for _ in range(tree.max_depth)]
    for i in range(1, tree.size):
        if rank[i] < k:
            hits[depth[i] - 1][rank[i]] += node_accepts[i]
            tries[depth[i] - 1][rank[i]] += node_accepts[parents[i]]
    pooled = [sum(h[r] for h in hits) / max(1, sum(t[r] for t in tries)) for r in range(k)]
    return [[(h + PSEUDO_TRIES * pooled[r]) / (t + PSEUDO_TRIES) for r, (h, t) in enumerate(zip(hr, tr))]
            for hr, tr in zip(hits, tries)]


def expected_length(p: list[list[float]], tree: Tree) -> float:
    """Expected tokens a step commits with ``tree``: the bonus token plus each draft's chance of acceptance."""
    depth, rank = tree.depth.tolist(), tree.rank.tolist()
    value = [1.0] * tree.size
    for i in range(1, tree.size):
        row = p[min(depth[i], len(p)) - 1]
        value[i] = value[tree.parents[i]] * (row[rank[i]] if rank[i] < len(row) else 0.0)
    return sum(value)


def choose_tree(p: list[list[float]], cost: dict[int, float], k: int, max_depth: int = MAX_DEPTH,
                measured: dict[int, float] | None = None) -> dict:
    """The tree maximising expected tokens per millisecond; every candidate size scored (``mat``: the
    accepted length a score used).

    Without ``measured``, every draft count n below the curve's end is a candidate, scored by the model's
    ``E(n)``. With ``measured`` (draft count -> MAT that grown tree reached in calibration), those counts
    are the candidates, scored by their measured MAT: a tree also decides how many rows of Token
    Recycling's matrix each step refreshes, which the independence model cannot see.
    """
    sizes = [0] + sorted(n for n in measured if 0 < n < max(cost)) if measured else range(0, max(cost))
    scores = []
    for n in sizes:
        tree = grow_tree(p, n, max_depth, k) if n else Tree.from_parents((-1,))
        e = expected_length(p, tree)
        mat = (measured or {}).get(n, 1.0) if measured else e
        scores.append({"drafts": n, "expected_length": e, "mat": mat, "ms": cost[n + 1],
                       "tokens_per_ms": mat / cost[n + 1], "tree": tree})
    best = max(scores, key=lambda s: (s["tokens_per_ms"], -s["drafts"]))
    plain = scores[0]
    return {"tree": best["tree"], "drafts": best["drafts"], "expected_length": best["expected_length"],
            "mat": best["mat"], "mat_source": "calibration decode" if measured else "model",
            "expected_speedup": best["tokens_per_ms"] / plain["tokens_per_ms"],
            "scores": [{k_: v for k_, v in s.items() if k_ != "tree"} for s in scores]}


CHAIN_BUCKETS = (0, 2, 5, 10, 20)  # a chain's cap is chosen per match score: threshold + these start the ranges


def choose_chain_caps(chains: list[tuple], others: int, cost: dict[int, float], threshold: int,
                      most: int, other: tuple[float, int] | None = None) -> dict:
    """Caps on a retrieved chain's length, one per range of match scores, that maximise expected tokens per
    millisecond over a calibration's steps.

    ``chains`` are the calibration's chain steps, drafted with up to ``most`` tokens: (match score, tokens
    drafted, tokens accepted). Capped at ``n``, such a step would have had ``min(accepted, n)`` accepted for
    ``min(drafted, n)`` drafted: a chain's prefix is accepted as far as the chain is, so the counterfactual is
    exact. A tree drafted best first (SuffixDecoding's) gives a fourth item, the accepted nodes' places in that
    order: cut to its first ``n`` nodes it keeps those placed before ``n``. ``others`` steps had no chain; each yields ``other[0]`` tokens for a forward of ``other[1]`` tokens
    (default: a plain step, 1 and 1). The ratio of sums is maximised by Dinkelbach's iteration: at rate
    ``lam``, each range takes the cap that maximises its tokens - lam * ms, then lam becomes the new rate; it
    rises until no cap changes. A range without calibration steps takes its neighbour's cap.
    """
    tokens_each, nodes = other or (1.0, 1)
    starts = [threshold + b for b in CHAIN_BUCKETS]
    ranges = [[c for c in chains if lo <= c[0] < hi] for lo, hi in zip(starts, starts[1:] + [float("inf")])]

    def kept(step, n):
        return min(step[2], n) if len(step) == 3 else bisect_left(step[3], n)

    def value(steps, n, lam):
        return sum(1 + kept(c, n) - lam * cost[1 + min(c[1], n)] for c in steps)

    def rate(caps):
        tokens = others * tokens_each + sum(1 + kept(c, n) for steps, n in zip(ranges, caps) for c in steps)
        ms = others * cost[nodes] + sum(cost[1 + min(c[1], n)] for steps, n in zip(ranges, caps) for c in steps)
        return tokens / ms if ms else 0.0

    caps = [most] * len(ranges)
    fixed = lam = rate(caps)
    for _ in range(50):
        new = [max(range(1, most + 1), key=lambda n: (value(steps, n, lam), -n)) if steps else most
               for steps in ranges]
        if new == caps:
            break
        caps, lam = new, rate(new)
    have = [i for i, steps in enumerate(ranges) if steps]
    for i, steps in enumerate(ranges):  # an empty range: the cap of the nearest range with steps
        if not steps and have:
            caps[i] = caps[min(have, key=lambda j: (abs(j - i), -j))]
    return {"caps": [[lo, n] for lo, n in zip(starts, caps)],
            "steps": [len(steps) for steps in ranges], "chain_steps": len(chains), "other_steps": others,
            "other_step": {"tokens": tokens_each, "nodes": nodes},
            "expected_speedup_vs_uncapped": rate(caps) / fixed if fixed else 1.0,
            "expected_tokens_per_ms": rate(caps)}
