"""The one module that touches KV-cache internals.

transformers changes its cache classes between releases; in 5.x a ``DynamicCache``
holds per-layer ``cache.layers[i].keys / .values`` of shape
``[batch, kv_heads, seq, head_dim]``. Everything else in the harness sees only
``new_cache``, ``length`` and ``commit``.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


def length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def truncate(cache: DynamicCache, n: int) -> None:
    """Drop every entry from slot ``n`` on (a draft model's scratch entries after a proposal)."""
    commit(cache, n, [])


def commit(cache: DynamicCache, start: int, keep: list[int]) -> None:
    """Keep, of the entries written from slot ``start`` on, only the nodes ``keep``.

    ``keep`` are tree-node indices relative to ``start`` in increasing order (an
    accepted root-to-node path). Their entries are moved to ``start, start+1, ...``
    and everything after is dropped, so the cache again holds exactly the
    committed tokens. Example, ``start=8`` and a 3-node tree whose path is [0, 2]::

        before: [0 1 2 3 4 5 6 7 | n0 n1 n2]   length 11
        after:  [0 1 2 3 4 5 6 7 | n0 n2]      length 10

    A path that is already a prefix (vanilla, a fully accepted chain) only
    truncates: no copy.
    """
    m = len(keep)
    contiguous = keep == list(range(m))
    if not contiguous:
        src = torch.tensor(keep, device=cache.layers[0].keys.device) + start
    for layer in cache.layers:
        if not contiguous:
            # The path is increasing, so the gather reads before it overwrites: copy through a temporary anyway.
            layer.keys[:, :, start:start + m] = layer.keys.index_select(2, src)
            layer.values[:, :, start:start + m] = layer.values.index_select(2, src)
        layer.keys = layer.keys[:, :, :start + m]
        layer.values = layer.values[:, :, :start + m]
