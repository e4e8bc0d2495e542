"""The one module that touches KV-cache internals.

transformers changes its cache classes between releases; in 5.x a ``DynamicCache``
holds per-layer ``cache.layers[i].keys / .values`` of shape
``[batch, kv_heads, seq, head_dim]``. Everything else in the harness sees only
``new_cache``, ``length`` and ``commit``, and the static engine (``methods.engine``) sees
only ``StaticKV``.
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


class StaticKV:
    """A preallocated cache for one sequence: per layer ``keys/values[kv_heads, capacity, head_dim]``.

    Entries are written by slot; ``length`` counts those in use. A draft's rejected
    entries dropped by ``commit`` stay where they are, past ``length``: the next
    forward overwrites the slots it uses and masks every slot past its own tokens,
    so dropping a rejected draft costs nothing, and committing an accepted path
    moves only its own entries (none for a chain).
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype, device):
        self.keys = torch.zeros(layers, kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def reserve(self, n: int) -> None:
        """Make room for ``n`` slots (at least doubling, keeping the entries)."""
        if n > self.capacity:
            grow = max(n, 2 * self.capacity) - self.capacity
            pad = (0, 0, 0, grow)
            self.keys = torch.nn.functional.pad(self.keys, pad)
            self.values = torch.nn.functional.pad(self.values, pad)

    @staticmethod
    def write(keys: torch.Tensor, values: torch.Tensor, layer: int, slots: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, span: int):
        """Write ``k, v`` [kv_heads, n, head_dim] at ``slots`` of a cache's ``keys, values`` (a ``StaticKV``'s,
        passed in so that a compiled step takes them as inputs); return the layer's first ``span`` slots
        (views). The engine appends: after its last layer it sets ``length`` past the new slots."""
        keys, values = keys[layer], values[layer]
        keys.index_copy_(1, slots, k)
        values.index_copy_(1, slots, v)
        return keys[:, :span], values[:, :span]

    def commit(self, start: int, keep: list[int]) -> None:
        """Keep, of the entries written from ``start`` on, the nodes ``keep`` (see ``commit`` above)."""
        m = len(keep)
        if keep != list(range(m)):
            src = torch.tensor(keep, device=self.keys.device) + start
            dst = torch.arange(start, start + m, device=self.keys.device)
            self.keys.index_copy_(2, dst, self.keys.index_select(2, src))
            self.values.index_copy_(2, dst, self.values.index_select(2, src))
        self.length = start + m
