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
from transformers.cache_utils import DynamicLayer


def new_cache(model) -> DynamicCache:
    """A cache of full layers for every layer, sliding-window ones included (whose window the attention mask
    applies): slots stay positions, so ``commit`` and ``truncate`` cut it where they mean to (transformers' own
    sliding-window layers drop entries as they go)."""
    cache = DynamicCache(config=model.config)  # one layer object per decoder layer from the start (place_row)
    cache.layers = [DynamicLayer() if getattr(layer, "is_sliding", False) else layer for layer in cache.layers]
    return cache


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


def place_row(cache: DynamicCache, row: int, rows: int, part: DynamicCache) -> None:
    """Put the entries of ``part`` (one sequence's cache) at slots 0.. of ``row`` in ``cache``, a cache of ``rows``
    sequences (a batch, ``methods.engine.hf``), whose length grows (zeros in the other rows) where it is shorter.
    The row's slots past them keep what they held (its length says where its entries end)."""
    n = length(part)
    for layer, src in zip(cache.layers, part.layers):
        if not layer.is_initialized or layer.keys.numel() == 0:
            layer.lazy_initialization(src.keys, src.values)
            shape = (rows, *src.keys.shape[1:2], 0, src.keys.shape[-1])
            layer.keys, layer.values = src.keys.new_zeros(shape), src.values.new_zeros(shape)
        grow = n - layer.keys.shape[2]
        if grow > 0:
            layer.keys = torch.nn.functional.pad(layer.keys, (0, 0, 0, grow))
            layer.values = torch.nn.functional.pad(layer.values, (0, 0, 0, grow))
        layer.keys[row, :, :n] = src.keys[0]
        layer.values[row, :, :n] = src.values[0]


def commit_row(cache: DynamicCache, row: int, step: int, start: int, keep: list[int]) -> None:
    """Keep, of the entries a batched step appended from slot ``step`` on, ``row``'s nodes ``keep``, moved to its
    slots ``start, start+1, ...`` (its committed length: ``start <= step``). The cache's length is left as it is;
    ``truncate`` to the longest row's length drops what is past every row."""
    src = torch.tensor(keep, device=cache.layers[0].keys.device) + step
    for layer in cache.layers:
        layer.keys[row, :, start:start + len(keep)] = layer.keys[row].index_select(1, src)
        layer.values[row, :, start:start + len(keep)] = layer.values[row].index_select(1, src)


class StaticKV:
    """A preallocated cache for ``rows`` sequences (a batch's slots): ``keys/values[rows, layers, kv_heads, capacity,
    head_dim]``, so that one row's cache, ``keys[row]``, is one contiguous block laid out as a single sequence's.

    Entries are written by slot; ``lengths[row]`` counts those in use. A draft's rejected
    entries dropped by ``commit`` stay where they are, past the length: the next
    forward overwrites the slots it uses and masks every slot past its own tokens,
    so dropping a rejected draft costs nothing, and committing an accepted path
    moves only its own entries (none for a chain).
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype, device, rows: int = 1):
        self.keys = torch.zeros(rows, layers, kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.lengths = [0] * rows
        self._views()

    def _views(self) -> None:
        self.row_keys, self.row_values = list(self.keys), list(self.values)  # per row, made once per allocation

    def row(self, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row ``r``'s keys and values [layers, kv_heads, capacity, head_dim] (views, the same objects until the
        cache grows)."""
        return self.row_keys[r], self.row_values[r]

    @property
    def rows(self) -> int:
        return self.keys.shape[0]

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    @property
    def length(self) -> int:
        """Row 0's length (a cache of one sequence)."""
        return self.lengths[0]

    def reserve(self, n: int) -> None:
        """Make room for ``n`` slots per row (at least doubling, keeping the entries)."""
        if n > self.capacity:
            grow = max(n, 2 * self.capacity) - self.capacity
            pad = (0, 0, 0, grow)
            self.keys = torch.nn.functional.pad(self.keys, pad)
            self.values = torch.nn.functional.pad(self.values, pad)
            self._views()

    @staticmethod
    def write(keys: torch.Tensor, values: torch.Tensor, layer: int, slots: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, span: int):
        """Write ``k, v`` [kv_heads, n, head_dim] at ``slots`` of one row's ``keys, values`` ([layers, kv_heads,
        capacity, head_dim]: ``StaticKV.keys[row]``, passed in so that a compiled step takes them as inputs); return
        the layer's first ``span`` slots (views). The engine appends: after its last layer it sets the row's length
        past the new slots."""
        keys, values = keys[layer], values[layer]
        keys.index_copy_(1, slots, k)
        values.index_copy_(1, slots, v)
        return keys[:, :span], values[:, :span]

    @staticmethod
    def places(rows: list[int], starts: list[int], counts: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
        """Where ``write_tokens`` puts a packed forward's tokens: row ``rows[i]``'s ``counts[i]`` tokens at its slots
        ``starts[i]...``, as (row, slot) index tensors [T]."""
        return (torch.tensor(rows, device=device).repeat_interleave(torch.tensor(counts, device=device)),
                torch.cat([torch.arange(s, s + n, device=device) for s, n in zip(starts, counts)]))

    def write_tokens(self, layer: int, places: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor,
                     v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a packed forward's ``k, v`` [kv_heads, T, head_dim] at its ``places`` in ``layer``; return
        that layer's keys and values of every row [rows, kv_heads, capacity, head_dim] (views). The engine sets
        the rows' lengths after its last layer."""
        keys, values = self.keys[:, layer], self.values[:, layer]
        rows, slots = places
        keys[rows, :, slots] = k.transpose(0, 1)
        values[rows, :, slots] = v.transpose(0, 1)
        return keys, values

    def commit(self, start: int, keep: list[int], row: int = 0) -> None:
        """Keep, of ``row``'s entries written from ``start`` on, the nodes ``keep`` (see ``commit`` above)."""
        m = len(keep)
        if keep != list(range(m)):
            keys, values = self.keys[row], self.values[row]
            src = torch.tensor(keep, device=self.keys.device) + start
            dst = torch.arange(start, start + m, device=self.keys.device)
            keys.index_copy_(2, dst, keys.index_select(2, src))
            values.index_copy_(2, dst, values.index_select(2, src))
        self.lengths[row] = start + m
