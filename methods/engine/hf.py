"""``engine=hf``: the unmodified Hugging Face model over a growing ``DynamicCache`` (the reference).

A batch of ``rows`` sequences shares one ``DynamicCache`` of batch size ``rows``, whose length is the longest row's:
row r's committed entries are its first ``length_of(r)`` slots, the rest of its slots are masked. A step appends
every row's tokens (padded to the widest, a row not stepping all padding) after the longest row, and ``commit``
moves a row's accepted entries down to its own length (``kv.commit_row``). A prefill runs the row alone, on a cache
of its own, and is then placed in its row (``kv.place_row``).

A model with sliding-window layers (Gemma 3) keeps every position in every layer (``kv.new_cache``), and a step
that passes its own mask (a tree, a batch) passes one per layer type, each narrowed to its window
(``arch.hf_mask``), as the model's forward builds them when given none.
"""
from __future__ import annotations

import torch

from methods.engine import arch, kv
from methods.engine.core import Engine


class HFEngine(Engine):
    """The stock Hugging Face forward over a ``DynamicCache`` (the reference)."""

    name = "hf"
    gqa = "expanded"  # transformers expands grouped K/V heads itself when a mask is passed (its use_gqa_in_sdpa)

    def __init__(self, model, *, threads: int | str | None = None):
        super().__init__(model)
        self.cache, self.rows, self.lengths = None, 1, [0]
        self._step = 0  # a batched step's first slot (where every row's new entries were appended)
        self.windows = arch.layer_windows(model)  # layer type -> sliding window: the masks a step passes
        self.set_threads(threads)

    def start(self, capacity: int, rows: int = 1) -> None:
        self.cache, self.rows, self.lengths = kv.new_cache(self.model), rows, [0] * rows

    def open(self, row: int, capacity: int) -> None:
        if self.rows == 1:
            self.cache = kv.new_cache(self.model)
        self.lengths[row] = 0  # its old entries stay, masked, until overwritten

    def length_of(self, row: int) -> int:
        return kv.length(self.cache) if self.rows == 1 else self.lengths[row]

    def _run(self, tokens, cache, past, tree, last_only, hidden):
        kwargs = {}
        if tree is not None and not tree.is_chain:
            n, dev = tree.ancestors.shape[0], self.device
            positions = tree.depth + past
            allowed = torch.cat([torch.ones(n, past, dtype=torch.bool, device=dev), tree.ancestors], 1)
            keys = torch.cat([torch.arange(past, device=dev), positions])  # the slots' positions
            mask = arch.hf_mask(self.windows, allowed[None], positions[None], keys[None], self.dtype)
            kwargs = dict(position_ids=positions.view(1, -1), attention_mask=mask)
        out = self.model(input_ids=tokens.view(1, -1), past_key_values=cache, use_cache=True,
                         logits_to_keep=1 if last_only else 0, output_hidden_states=bool(hidden), **kwargs)
        if isinstance(hidden, tuple):
            return out.logits[0], torch.cat([out.hidden_states[i][0] for i in hidden], dim=-1)
        return out.logits[0], (out.hidden_states[-1][0] if hidden else None)

    def forward(self, tokens, tree=None, *, row=0, last_only=False, hidden=False):
        if self.rows == 1:
            return self._run(tokens, self.cache, kv.length(self.cache), tree, last_only, hidden)
        if self.lengths[row]:
            return self.forward_rows([row], [tokens], [tree], hidden=hidden)[0]
        own = kv.new_cache(self.model)  # a prefill in a batch: the row alone, then placed in the shared cache
        out = self._run(tokens, own, 0, tree, last_only, hidden)
        kv.place_row(self.cache, row, self.rows, own)
        self.lengths[row] = tokens.shape[0]
        return out

    def forward_rows(self, rows, tokens, trees, *, hidden=False, keep=None):
        if self.rows == 1 or (len(rows) == 1 and not self.lengths[rows[0]]):  # one row, or a prefill (alone)
            return super().forward_rows(rows, tokens, trees, hidden=hidden, keep=keep)
        kv.truncate(self.cache, max(self.lengths))  # what the last step appended past every row's accepted entries
        past = self._step = kv.length(self.cache)
        width = max(t.shape[0] for t in tokens)
        step = dict(zip(rows, zip(tokens, trees)))
        dev = self.device
        ids = torch.zeros(self.rows, width, dtype=torch.long, device=dev)
        positions = torch.zeros(self.rows, width, dtype=torch.long, device=dev)
        allowed = torch.zeros(self.rows, width, past + width, dtype=torch.bool, device=dev)
        own = torch.arange(width, device=dev)
        allowed[:, own, past + own] = True  # every node sees itself (a padding node nothing else)
        for r in range(self.rows):
            length = self.lengths[r]
            positions[r] = length
            if r not in step:
                continue
            t, tree = step[r]
            n = t.shape[0]
            ids[r, :n] = t
            allowed[r, :n, :length] = True
            if tree is None or tree.is_chain:
                positions[r, :n] = torch.arange(length, length + n, device=dev)
                allowed[r, :n, past:past + n] = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
            else:
                positions[r, :n] = tree.depth + length
                allowed[r, :n, past:past + n] = tree.ancestors
        keys = torch.cat([torch.arange(past, device=dev).expand(self.rows, past), positions], 1)
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, position_ids=positions,
                         attention_mask=arch.hf_mask(self.windows, allowed, positions, keys, self.dtype),
                         output_hidden_states=bool(hidden))
        if isinstance(hidden, tuple):
            states = torch.cat([out.hidden_states[i] for i in hidden], dim=-1)
        else:
            states = out.hidden_states[-1] if hidden else None
        self.last_slots = self.rows * width
        counts = [t.shape[0] for t in tokens]
        kept = [n if k is None else min(k, n) for n, k in zip(counts, keep or [None] * len(rows))]
        return [(out.logits[r, n - k:n], states[r, :n] if hidden else None) for r, n, k in zip(rows, counts, kept)]

    def commit(self, start: int, path: list[int], row: int = 0) -> None:
        if self.rows == 1:
            kv.commit(self.cache, start, path)
        else:  # the step's entries were appended after the longest row: moved down to the row's own length
            kv.commit_row(self.cache, row, self._step, start, path)
            self.lengths[row] = start + len(path)
