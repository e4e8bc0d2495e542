"""The one verifier: forward a draft tree through the engine, accept the longest path the target agrees with.

The engine (``methods.engine``) runs the tree with tree attention: node i at
position ``L + depth[i]``, seeing the committed prefix and its own ancestors.
Chains take the model's ordinary causal path. The target's next token at a node is
its argmax (greedy), or at temperature > 0 its position-keyed draw
(``methods.sampling``): one rule for both, and for every method.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from methods.base import Draft, Verification
from methods.sampling import rejection
from methods.tree import Tree


def greedy(logits: torch.Tensor, k: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(argmax [n], top-k indices [n, k] or None) of ``logits`` [n, vocab].

    With ``k`` the argmax is read off the top-k (one pass over the vocabulary instead
    of two) with ``torch.argmax``'s rule for ties, the lowest index among the maxima:
    among top-k entries equal to the maximum the lowest index is taken, and a row
    whose k entries all tie (more maxima than k) falls back to a full argmax.

    >>> greedy(torch.tensor([[1., 3., 3., 0.]]), k=2)[0].tolist()
    [1]
    """
    if not k:
        return logits.argmax(dim=-1), None
    values, top = logits.topk(k, dim=-1)
    is_max = values == values[:, :1]
    argmax = torch.where(is_max, top, logits.shape[-1]).amin(dim=-1)
    all_tied = is_max[:, -1]
    if logits.is_cuda:  # a full argmax is cheap there, a host synchronisation is not
        argmax = torch.where(all_tied, logits.argmax(dim=-1), argmax)
    elif bool(all_tied.any()):  # on the CPU the opposite
        argmax = logits.argmax(dim=-1)
    return argmax, top


def accept(tokens: torch.Tensor, argmax: torch.Tensor, tree: Tree,
           acceptable: torch.Tensor | None = None) -> torch.Tensor:
    """Index of the deepest node whose whole path the target agrees with (a 0-d tensor, no host sync).

    A draft is correct when it equals its parent's greedy next token (and is not
    marked unacceptable, like Lookahead's window); a node is accepted when every node
    on its path is correct. Among the deepest acceptable nodes the first in BFS order
    wins (the lowest ranks, for rank-ordered trees).

    >>> t = Tree.from_parents((-1, 0, 0, 1))        # 0 -> {1, 2}, 1 -> 3
    >>> int(accept(torch.tensor([5, 7, 6, 9]), torch.tensor([6, 9, 4, 2]), t))
    2
    """
    correct = tokens == argmax[tree.parent_index]
    if acceptable is not None:
        correct &= acceptable
    correct[0] = True
    ok = ~(tree.ancestors & ~correct).any(dim=1)
    return torch.where(ok, tree.depth, -1).argmax()


@dataclass
class Check:
    """One row's draft to verify in a batched forward (``verify_rows``)."""

    draft: Draft
    row: int = 0  # the engine's row (a batch's slot)
    sampler: object = None  # a methods.sampling.Sampler, or None: greedy
    position: int = 0  # the root's next token is new token number ``position`` of the row's turn


@torch.inference_mode()
def verify(engine, draft: Draft, timer=nullcontext, topk: int = 0, hidden: bool | tuple[int, ...] = False,
           sampler=None, position: int = 0) -> Verification:
    """Forward ``draft`` after the committed prefix, accept, and leave only the accepted path in the cache.

    ``engine`` is a ``methods.engine.Engine``; ``timer(phase)`` is a context manager that profiling code
    passes in (``methods.decode.PhaseTimer``); ``topk > 0`` also returns every node's top-k tokens
    (``Proposer.topk``); ``hidden`` the target's last hidden states on the accepted path, or the inputs of
    those layers (``Proposer.wants_hidden``). ``sampler`` (a ``methods.sampling.Sampler``; None: greedy) draws each
    node's next token, the root's being new token number ``position`` of the turn.
    """
    return verify_rows(engine, [Check(draft, 0, sampler, position)], timer, topk, hidden)[0]


@dataclass
class Chunk:
    """A part of one row's prompt that rides along a batched step's forward (``step_rows``), appended to its cache."""

    row: int
    tokens: torch.Tensor  # [n]
    keep: int  # the logits of its last ``keep`` tokens are wanted (0: none)


@torch.inference_mode()
def verify_rows(engine, checks: list[Check], timer=nullcontext, topk: int = 0,
                hidden: bool | tuple[int, ...] = False) -> list[Verification]:
    """``verify`` of several rows' drafts (a batch) in one forward (``Engine.forward_rows``), each row then accepted
    and committed on its own, in the order given."""
    return step_rows(engine, checks, [], timer, topk, hidden)[0]


@torch.inference_mode()
def step_rows(engine, checks: list[Check], chunks: list[Chunk], timer=nullcontext, topk: int = 0,
              hidden: bool | tuple[int, ...] = False) -> tuple[list[Verification], list[tuple]]:
    """``verify_rows``, with ``chunks`` of other rows' prompts in the same forward: the drafts' verifications, and
    each chunk's (logits of its kept tokens, states)."""
    pasts = [engine.length_of(c.row) for c in checks]
    with timer("forward"):
        outs = engine.forward_rows([c.row for c in checks] + [c.row for c in chunks],
                                   [c.draft.tokens for c in checks] + [c.tokens for c in chunks],
                                   [c.draft.tree for c in checks] + [None] * len(chunks), hidden=hidden,
                                   keep=[None] * len(checks) + [c.keep for c in chunks])
    return ([_settle(engine, c, past, logits, states, timer, topk, hidden)
             for c, past, (logits, states) in zip(checks, pasts, outs)], outs[len(checks):])


def _settle(engine, check: Check, past: int, logits, states, timer, topk, hidden) -> Verification:
    """Accept the longest path of one row's draft the target agrees with, and commit it."""
    draft, sampler, position = check.draft, check.sampler, check.position
    tree = draft.tree
    with timer("accept"):
        if sampler is not None and draft.q is not None:  # drafts sampled from the drafter's q: the rejection rule
            tokens = draft.tokens.tolist()
            path, bonus = rejection(tokens, tree.children(), logits, draft.q, sampler, position)
            argmax, top = greedy(logits, topk)
        else:
            if sampler is None:
                argmax, top = greedy(logits, topk)  # [n], [n, topk]
            else:  # the draws take the argmax's place; top-k for proposers that learn from it
                argmax = sampler.draw(logits, tree.depth, position, tree.max_depth)
                top = logits.topk(topk, dim=-1).indices if topk else None
            best = accept(draft.tokens, argmax, tree, draft.acceptable)
            # The step's only host synchronisation: winner, bonus token and the drafted tokens together.
            host = torch.cat([best.view(1), argmax[best].view(1), draft.tokens]).tolist()
            best, bonus, tokens = host[0], host[1], host[2:]
            path = tree.path_to(best)
    with timer("commit"):
        engine.commit(past, path, row=check.row)
    states = states[path] if hidden else None  # [len(path), hidden]
    return Verification(path, [tokens[i] for i in path[1:]] + [bonus], logits, argmax, top, states)
