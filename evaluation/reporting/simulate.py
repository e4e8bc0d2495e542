"""Acceptance simulated over recorded answers, for the drafters whose drafts depend on the tokens alone
(``Proposer.token_only``: PLD, SAM-Decoding's automata without a tree drafter, REST): where no reasoning model runs
here, a run's answers (a GPU run's traces of Qwen3 or an R1 distill, say) say what those drafters would accept on
them.

Each answer is taken as the target's greedy output: from its prompt (rebuilt as the run built it: its model's
format, its paradigm's turns), the drafter proposes at every step; the accepted path is the one the trace follows
(a node is correct when its parent is and its token is the trace's next: ``methods.verify.accept``'s rule with the
trace as the target's argmax), and the step commits it and the trace's next token, cut at the answer's end. So on
greedy answers of the target itself the simulated accept lengths are the decoded ones, step for step
(tests/test_simulate.py holds it on the embedded model); on sampled answers they are what greedy verification of
those tokens would accept. Reported as "simulated". The prefill yields the first token as a step of its own, as
these drafters decode (none drafts first).
"""
from __future__ import annotations

import torch

from evaluation.records.metrics import OVERALL, task_table
from methods.base import Draft, Proposer, Verification


def accepted(draft: Draft, trace: list[int], at: int) -> list[int]:
    """The draft's nodes the trace follows (root first), ``trace[at]`` being the root's next token: the deepest
    node whose path matches the trace, the first in breadth-first order among the deepest."""
    tokens, parents, depth = draft.tokens.tolist(), draft.tree.parents, draft.tree.depth.tolist()
    acceptable = draft.acceptable.tolist() if draft.acceptable is not None else [True] * len(tokens)
    on = [True] + [False] * (len(tokens) - 1)
    for i in range(1, len(tokens)):
        k = at + depth[i] - 1
        on[i] = on[parents[i]] and acceptable[i] and k < len(trace) and tokens[i] == trace[k]
    best = max(range(len(tokens)), key=lambda i: (on[i] and depth[i], -i) if on[i] else (-1, 0))
    return draft.tree.path_to(best)


def simulate_turn(proposer: Proposer, prompt: list[int], trace: list[int], turn: int
                  ) -> tuple[list[int], list[int]]:
    """(accept lengths, draft sizes) ``proposer`` would have had decoding ``trace`` after ``prompt``, the prefill's
    first token a step of its own (size 0)."""
    proposer.reset(torch.tensor(prompt), turn, None)
    new, accepts, sizes = trace[:1], [1], [0]
    while len(new) < len(trace):
        draft = proposer.propose(torch.tensor(prompt + new))
        path = accepted(draft, trace, len(new))
        commit = trace[len(new): len(new) + len(path)]
        proposer.update(draft, Verification(path, commit, None, None))
        accepts.append(len(commit))
        sizes.append(draft.tree.size)
        new += commit
    return accepts, sizes


def simulate(records: list[dict], prompts: dict[tuple[int, int], list[int]], make) -> list[dict]:
    """``records`` with every turn's accept lengths simulated (``simulate_turn``) by the proposer ``make()`` builds
    (one per question, as a run's state would carry over: the proposers here keep none), ``prompts``: (question,
    turn) -> the turn's prompt ids. The records keep their tokens and times; their steps are the simulation's."""
    out = []
    for r in records:
        c = r["choices"][0]
        proposer, accepts, sizes, steps = make(), [], [], []
        for t, ids in enumerate(c["token_ids"]):
            a, n = simulate_turn(proposer, prompts[r["question_id"], t], ids, t)
            accepts, sizes = accepts + a, sizes + n
            steps.append(len(a))
        out.append({**r, "choices": [{**c, "accept_lengths": accepts, "decoding_steps": steps, "draft_nodes": sizes,
                                      "step_info": None, "step_times": None, "spec_bench_steps": steps}]})
    return out


def simulated_mat(records: list[dict]) -> dict[str, float]:
    """MAT per task and overall (the same tokens over the simulated steps)."""
    t = task_table(records, ci=False)
    return {task: float(t.loc[task, "mat"]) for task in t.index if task != OVERALL} | {
        OVERALL: float(t.loc[OVERALL, "mat"])}
