"""Acceptance simulated over recorded answers, for the drafters whose drafts depend on the tokens alone
(``Proposer.token_only``: PLD, SAM-Decoding's automata without a tree drafter, REST, SuffixDecoding): where no
reasoning model runs here, a run's answers (a GPU run's traces of Qwen3 or an R1 distill, say), or a trace file of
another engine's (``python -m evaluation.simulate --traces``), say what those drafters would accept on them.

Each answer is taken as the target's greedy output: from its prompt, the drafter proposes at every step; the
accepted path is the one the trace follows (a node is correct when its parent is and its token is the trace's next:
``methods.verify.accept``'s rule with the trace as the target's argmax), and the step commits it and the trace's
next token, cut at the answer's end. One proposer goes through the answers in their order, as a run's does, so that
what it remembers across requests (SuffixDecoding's global tree) is what the run's would be. So on greedy answers of
the target itself the simulated accept lengths are the decoded ones, step for step (tests/test_reasoning.py holds
it on the embedded model, the global tree included); on sampled answers they are what greedy verification of those
tokens would accept. Reported as "simulated". The prefill yields the first token as a step of its own, as these
drafters decode (PIA, which drafts first, roots its first step at the prompt's last token, as it decodes).
"""
from __future__ import annotations

import time

import torch

from evaluation.records.bench import TASKS, task_of
from evaluation.records.metrics import OVERALL
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


def simulate_turn(proposer: Proposer, prompt: list[int], trace: list[int], turn: int, watch=None
                  ) -> tuple[list[int], list[int]]:
    """(accept lengths, draft sizes) ``proposer`` would have had decoding ``trace`` after ``prompt``, the prefill's
    first token a step of its own (size 0; a proposer that ``drafts_first`` drafts from the prompt's last token
    instead, as it decodes); then the request ends (``Proposer.finish``: a memory across requests takes
    the answer). ``watch(context, draft)`` sees every step's draft before it is judged."""
    accepts, sizes, _ = simulate_timed(proposer, prompt, trace, turn, watch)
    return accepts, sizes


def simulate_timed(proposer: Proposer, prompt: list[int], trace: list[int], turn: int, watch=None
                   ) -> tuple[list[int], list[int], float]:
    """``simulate_turn``'s, and the seconds the proposer took (its reset, proposals, updates and finish)."""
    clock = time.perf_counter
    first = proposer.drafts_first and len(prompt) > 1  # its first step roots at the prompt's last token
    t = clock()
    proposer.reset(torch.tensor(prompt[:-1] if first else prompt), turn, None)
    spent = clock() - t
    new, accepts, sizes = ([], [], []) if first or not trace else (trace[:1], [1], [0])
    while len(new) < len(trace):
        context = torch.tensor(prompt + new)
        t = clock()
        draft = proposer.propose(context)
        spent += clock() - t
        if watch is not None:
            watch(context, draft)
        path = accepted(draft, trace, len(new))
        commit = trace[len(new): len(new) + len(path)]
        t = clock()
        proposer.update(draft, Verification(path, commit, None, None))
        spent += clock() - t
        accepts.append(len(commit))
        sizes.append(draft.tree.size)
        new += commit
    t = clock()
    proposer.finish(list(trace))
    return accepts, sizes, spent + clock() - t


def remember(proposer: Proposer, prompt: list[int], answer: list[int]) -> None:
    """A request the proposer is told of, not decoded (a trace file's training part): its answer joins what the
    proposer remembers across requests, where it does (SuffixDecoding's global tree)."""
    proposer.reset(torch.tensor(prompt), 0, None)
    proposer.finish(list(answer))


def simulate(records: list[dict], prompts: dict[tuple[int, int], list[int]], make,
             train: list[tuple[list[int], list[int]]] = (), watch=None) -> list[dict]:
    """``records`` with every turn's accept lengths simulated (``simulate_turn``) by one proposer, ``make()``'s, over
    the records in their order, as one run's proposer goes from request to request (what it remembers across them
    included), after it was told of ``train``'s (prompt, answer) pairs; ``prompts``: (question, turn) -> the turn's
    prompt ids. The records keep their tokens and times; their steps are the simulation's."""
    proposer, out = make(), []
    for prompt, answer in train:
        remember(proposer, prompt, answer)
    for r in records:
        c = r["choices"][0]
        accepts, sizes, steps, spent = [], [], [], []
        for t, ids in enumerate(c["token_ids"]):
            a, n, seconds = simulate_timed(proposer, prompts[r["question_id"], t], ids, t, watch)
            accepts, sizes = accepts + a, sizes + n
            steps.append(len(a))
            spent.append(seconds)
        out.append({**r, "choices": [{**c, "accept_lengths": accepts, "decoding_steps": steps, "draft_nodes": sizes,
                                      "step_info": None, "step_times": None, "spec_bench_steps": steps,
                                      "proposer_seconds": spent}]})
    return out


def recorded_steps(acc_len: list[int], n: int) -> list[int]:
    """The accept lengths an engine had on an answer of ``n`` tokens, from its recorded ``acc_len[i]``: the accept
    length of a step rooted at output token i (the layout of arXiv 2601.11580's published traces, SpecDecode-Bench/
    simulator ``simulator.py``: the prefill yields token 0, a step from token i commits ``acc_len[i]`` tokens, the
    bonus included), cut at the answer's end; the prefill's step first, as ours.

    >>> recorded_steps([3, 1, 1, 2, 1, 1], 6)   # tokens 0 | 1 2 3 | 4 5 (from token 3: 2)
    [1, 3, 2]
    """
    steps, at = ([1] if n else []), 1
    while at < n:
        a = max(1, min(int(acc_len[at - 1]), n - at))
        steps.append(a)
        at += a
    return steps


def proposer_ms(records: list[dict]) -> float:
    """The simulated proposer's milliseconds per step (``simulate``'s records): what drafting costs without the
    target."""
    seconds = sum(sum(r["choices"][0]["proposer_seconds"]) for r in records)
    return 1000 * seconds / max(1, sum(len(r["choices"][0]["accept_lengths"]) for r in records))


def simulated_mat(records: list[dict]) -> dict[str, float]:
    """MAT per task (Spec-Bench's order first) and overall: the tokens over the simulated steps."""
    tokens, steps = {}, {}
    for r in records:
        c, task = r["choices"][0], task_of(r.get("category", ""))
        tokens[task] = tokens.get(task, 0) + sum(c["accept_lengths"])
        steps[task] = steps.get(task, 0) + len(c["accept_lengths"])
    order = [t for t in TASKS if t in tokens] + sorted(set(tokens) - set(TASKS))
    return {t: tokens[t] / steps[t] for t in order if steps[t]} | {
        OVERALL: sum(tokens.values()) / max(1, sum(steps.values()))}
