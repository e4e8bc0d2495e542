"""What each new token of a static-engine step sees, and where it sits: attention masks and positions.

A step forwards ``n`` new tokens after ``past`` committed cache entries: a chain (a prompt, a vanilla step) sees
the committed prefix and the tokens before it; a draft tree's node i sits at ``past + depth[i]`` and sees the
prefix and its own ancestors (``Tree.ancestors``); a padding node of a compiled step's fixed size (``size > n``)
sees only itself and is never committed. Attention reads the first ``span`` cache slots, so a mask is
[size, span]; a sliding-window layer narrows it by position (``arch.window_mask``). Worked example, past 3, the
tree (-1, 0, 0) (a root and two children), span 8::

    slot:      0 1 2 | 3 4 5 | 6 7      positions of the new nodes: 3 4 4
    node 0:    1 1 1 | 1 0 0 | 0 0
    node 1:    1 1 1 | 1 1 0 | 0 0
    node 2:    1 1 1 | 1 0 1 | 0 0

``step_mask`` and ``positions`` build them eagerly from Python numbers; ``graph_masks`` builds the same from
tensors only (the committed length a 0-d tensor, the tree's depths and ancestors padded to the size), what a
CUDA graph records once and replays for any length and tree.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from methods.engine import arch
from methods.tree import Tree


def step_mask(past: int, n: int, tree: Tree | None, span: int, size: int, device) -> torch.Tensor:
    """[size, span] bool: what each of ``n`` new tokens after ``past`` committed ones sees (the committed prefix,
    then its ancestors among the n, or the causal triangle); a padding node (``size > n``) sees only itself."""
    rel = torch.arange(span, device=device) - past
    if tree is None or tree.is_chain:
        mask = rel[None, :] <= torch.arange(n, device=device)[:, None]
    else:
        mask = (rel < 0) | ((rel < n) & tree.ancestors[:, rel.clamp(0, n - 1)])
    if size > n:
        pad = torch.arange(n, size, device=device)
        mask = torch.cat([mask, rel[None, :] == pad[:, None]])
    return mask


def positions(past: int, n: int, tree: Tree | None, size: int, device) -> torch.Tensor:
    """[size] positions of ``n`` new tokens after ``past`` (a tree's nodes at ``past + depth``); padding: ``past``."""
    if tree is None or tree.is_chain:
        out = torch.arange(past, past + n, device=device)
    else:
        out = tree.depth + past
    if size > n:
        out = torch.cat([out, torch.full((size - n,), past, device=device)])
    return out


def windowed(mask: torch.Tensor, past: int, at: torch.Tensor, windows: tuple) -> dict:
    """``mask`` and, for each sliding window of the model's layers, its narrowing: window -> [size, span]. The
    keys' positions: a committed slot's is its index, a new token's its own (``at``)."""
    if windows == (None,):
        return {None: mask}
    keys = torch.arange(mask.shape[1], device=mask.device)
    keys[past:past + at.shape[0]] = at
    return {w: arch.window_mask(mask, at, keys, w) for w in windows}


def graph_masks(past: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor, span: int,
                windows: tuple) -> tuple[torch.Tensor, dict]:
    """(positions [size], window -> mask [size, span]) of a step of static shapes, from tensors only: ``past`` 0-d,
    ``depth`` [size] and ``ancestors`` [size, size] of the tree padded to the size (a padding node at depth 0 seeing
    only itself). The same masks as ``step_mask`` and ``windowed`` (tests/test_static_engine.py decodes with both)."""
    size, dev = depth.shape[0], depth.device
    at = depth + past
    rel = torch.arange(span, device=dev) - past  # a slot's place among the new entries (< 0: committed)
    new = (rel >= 0) & (rel < size)
    where = rel.clamp(0, size - 1)
    mask = (rel < 0) | (new & ancestors[:, where])
    if windows == (None,):
        return at, {None: mask}
    keys = torch.where(new, at[where], torch.arange(span, device=dev))  # each slot's position
    return at, {w: arch.window_mask(mask, at, keys, w) for w in windows}


def groups(rows: list[int], counts: list[int], spans: list[int], masks: list[dict | None]) -> list[tuple]:
    """A packed forward's rows in runs that attend in one call: consecutive rows of as many tokens each, at
    consecutive cache rows. Each run as (first cache row, rows g, tokens each n, first packed token, span, window
    -> mask [g, 1, n, span]): the run's longest span, each row's mask padded with keys it does not see. A row
    whose mask is None needs none (``StaticEngine._unmasked``): a run of its own, over its own ``span`` exactly,
    its mask None."""
    runs, start = [], 0
    for i in range(1, len(rows) + 1):
        if (i == len(rows) or counts[i] != counts[start] or rows[i] != rows[i - 1] + 1 or masks[i] is None
                or masks[start] is None):
            runs.append(range(start, i))
            start = i
    out, first = [], 0
    for run in runs:
        span = max(spans[j] for j in run)
        mask = None if masks[run[0]] is None else {
            w: torch.stack([F.pad(masks[j][w], (0, span - spans[j])) for j in run])[:, None] for w in masks[run[0]]}
        out.append((rows[run[0]], len(run), counts[run[0]], first, span, mask))
        first += len(run) * counts[run[0]]
    return out
