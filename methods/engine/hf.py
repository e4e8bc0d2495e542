"""``engine=hf``: the unmodified Hugging Face model over a growing ``DynamicCache`` (the reference)."""
from __future__ import annotations

import torch

from methods.engine import kv
from methods.engine.core import Engine
from methods.tree import tree_mask


class HFEngine(Engine):
    """The stock Hugging Face forward over a ``DynamicCache`` (the reference)."""

    name = "hf"
    expand_kv = True  # transformers expands grouped K/V heads itself when a mask is passed (its use_gqa_in_sdpa)

    def __init__(self, model, *, threads: int | str | None = None):
        super().__init__(model)
        self.cache = None
        self.set_threads(threads)

    def start(self, capacity: int) -> None:
        self.cache = kv.new_cache(self.model)

    @property
    def length(self) -> int:
        return kv.length(self.cache)

    def forward(self, tokens, tree=None, *, last_only=False, hidden=False):
        kwargs = {}
        if tree is not None and not tree.is_chain:
            kwargs = dict(position_ids=(tree.depth + self.length).view(1, -1),
                          attention_mask=tree_mask(tree, self.length, self.dtype))
        out = self.model(input_ids=tokens.view(1, -1), past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1 if last_only else 0, output_hidden_states=bool(hidden), **kwargs)
        if isinstance(hidden, tuple):
            return out.logits[0], torch.cat([out.hidden_states[i][0] for i in hidden], dim=-1)
        return out.logits[0], (out.hidden_states[-1][0] if hidden else None)

    def commit(self, start: int, path: list[int]) -> None:
        kv.commit(self.cache, start, path)
