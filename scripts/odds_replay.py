"""How well a per-step budget's odds (``methods.budget.Odds``) predict what the verifier accepts.

    python -m scripts.odds_replay "method=sam method.max_draft=auto" [--set model=...] [--questions 30]
        [--tokens 128]

Decodes the first turn of ``--questions`` Spec-Bench questions (spread over the file) at batch size 1 with
``runtime.budget=auto`` and a flat cost, so that every node of every draft is verified and what is scored was not
chosen by the odds themselves; then replays the run's verifications through the odds as ``methods.budget`` learns
them, and through the same odds with a depth's rate pulled towards the prior alone (``TAIL_WEIGHT`` infinite: the
estimator before the rate of the deeper nodes was added). Each step, every node whose parent was accepted is
predicted before the step teaches the odds: the log loss per node, and by depth the mean prediction against the
share accepted (the calibration).
"""
from __future__ import annotations

import argparse
import math
from collections import defaultdict

from evaluation.api import load
from evaluation.records.bench import load_bench
from methods import budget
from methods.common import HarnessError, exit_on_error


class Recorder(budget.Odds):
    """Odds that keep every verification they learn, step by step."""

    def __init__(self):
        super().__init__()
        self.steps: list[list[tuple]] = []

    def forget(self) -> None:
        self.steps.append([])
        super().forget()

    def learn(self, parents, depths, keys, acceptable, path) -> None:
        self.steps[-1].append((parents, depths, keys, acceptable, path))
        super().learn(parents, depths, keys, acceptable, path)


def replay(steps: list[list[tuple]]) -> tuple[float, dict[int, tuple[float, float, int]]]:
    """(log loss per node, {depth (5: 5 and deeper): (mean prediction, share accepted, nodes)}) of ``budget.Odds``
    as its module's constants now are."""
    odds, loss, n = budget.Odds(), 0.0, 0
    by_depth = defaultdict(lambda: [0.0, 0, 0])
    for step in steps:
        odds.forget()
        for verification in step:
            for depth, key, hit in budget.Odds.tried(*verification):
                p = min(max(odds.p(depth, key), 1e-6), 1 - 1e-6)
                loss -= math.log(p if hit else 1 - p)
                n += 1
                row = by_depth[min(depth, 5)]
                row[0], row[1], row[2] = row[0] + p, row[1] + hit, row[2] + 1
        for learned in step:
            odds.learn(*learned)
    return loss / max(n, 1), {d: (s / c, h / c, c) for d, (s, h, c) in sorted(by_depth.items())}


@exit_on_error
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("method", help='the method as overrides, e.g. "method=sam method.max_draft=auto"')
    ap.add_argument("--set", nargs="*", default=[], help="more overrides (model=...)")
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args(argv)
    overrides = args.method.split() + list(args.set)
    method = next((o.split("=", 1)[1] for o in overrides if o.startswith("method=")), None)
    if method is None:
        raise HarnessError(f"no method in {args.method!r}: give it as method=NAME, e.g. \"method=sam "
                           f"method.max_draft=auto\"")
    model = next((o.split("=", 1)[1] for o in overrides if o.startswith("model=")), "smollm2-135m")
    rest = [o for o in overrides if not o.startswith(("method=", "model="))]
    decoder = load(model, method, overrides=rest, budget="auto")
    decoder.proposers(1)  # built and prepared, the budget with them
    recorder = Recorder()
    decoder._budget.odds = recorder
    decoder._budget.cost = budget.Cost({1: {1: 1e6, 4096: 1e6}})  # flat and slow: every node verified, no pause
    questions = load_bench(None)
    questions = questions[::max(1, len(questions) // args.questions)][:args.questions]
    gens = decoder.decode([decoder.encode(q.turns[0]) for q in questions], args.tokens)
    steps = sum(len(g.accept_lengths) for g in gens)
    print(f"{args.method}: {len(questions)} questions, {steps} steps, MAT "
          f"{sum(map(len, (g.token_ids for g in gens))) / steps:.2f}")
    for name, tail in (("now (towards the deeper nodes' rate)", budget.TAIL_WEIGHT), ("towards the prior alone", 1e18)):
        budget.TAIL_WEIGHT = tail
        loss, by_depth = replay(recorder.steps)
        print(f"{name:38s} log loss {loss:.4f}; by depth, predicted/accepted (nodes): "
              + " ".join(f"d{d}{'+' if d == 5 else ''} {p:.2f}/{a:.2f} ({c})" for d, (p, a, c) in by_depth.items()))


if __name__ == "__main__":
    main()
