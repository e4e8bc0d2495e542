"""Medusa-1 (Cai et al., arXiv 2401.10774): heads on the target's last hidden state draft a sparse tree.

At the newest accepted node (the one whose next token is the root, committed by the last step) the target's
last hidden state ``f`` (after the final norm: what its lm_head reads) is known. Medusa head ``k`` (k = 0, 1, ...)
reads ``f`` and predicts the token ``k + 1`` places after the root: ``lm_head_k(ResBlocks_k(f))``, a ResBlock
being ``x + SiLU(W x + b)``. The draft is a static tree (``method.tree``; Spec-Bench's Medusa row runs
``mc_sim_7b_63``, ``data/trees/medusa.json``, 63 drafts, depth 4, the default, cut to the heads' depth when
they are fewer) whose node of depth ``d`` and rank ``r`` is
the ``r``-th of head ``d - 1``'s top-``topk`` tokens (Medusa's TOPK = 10), whatever its parent: one small
forward per step, no draft model. Verification is the shared greedy one (lossless); Medusa-2's typical
acceptance is not lossless and is not offered.

The heads' weights (``method.head``): a folder or hub id in the layout FasterDecoding publishes and
Spec-Bench's ``model/medusa/medusa_model.py`` (fd2c1cd) reads: ``config.json`` with ``medusa_num_heads`` and
``medusa_num_layers``, and ``medusa_lm_head.pt``, the state dict of a list of heads, head ``i`` a sequence of
``medusa_num_layers`` ResBlocks (``{i}.{j}.linear.weight`` / ``.bias``) and its own lm_head ``{i}.{L}.weight``.
A checkpoint without the lm_head keys shares the target's (Medusa's loader starts every head's lm_head as a
copy of the target's, and loads non-strictly): our trained heads (``python -m scripts.train_medusa``) are
so, ResBlocks only. ``random``: lossless, only slow.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from methods.base import Draft, Preparation, Proposer, Verification, register
from methods.common import HarnessError
from methods.heads import head_or_random, match_engine, require_head, target_lm_head
from methods.heads.medusa import TOPK, MedusaHeads, load_heads, random_heads
from methods.params import artefact, param
from methods.tree import heads_tree


@register
class Medusa(Proposer):
    name = "medusa"
    wants_hidden = True
    needs_target = True
    head_kind = {"what": "Medusa heads", "layout": "Medusa", "trainer": "scripts.train_medusa"}  # how to get them

    @dataclass
    class Params:
        head: str | None = param(None, "a folder or hub id in Medusa's layout, or random (lossless, slow); in a "
                                 "run, the model config's artefacts.medusa_head", config=artefact("medusa_head"))
        tree: str | None = param(None, "a template in data/trees/ or a .json path; default: mc_sim_7b_63 "
                                 "(data/trees/medusa.json, 63 drafts, depth 4) to the heads' depth")
        topk: int = param(TOPK, "candidates per head (Medusa's TOPK)", low=1, high=64)
        seed: int = param(0, "for head=random")

    def __init__(self, heads: MedusaHeads, target, tree: str | None, topk: int, head_name: str, device):
        dtype = next(target.parameters()).dtype
        self.heads = heads.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.lm_head = target_lm_head(target, device)
        self.tree, self.tree_name = heads_tree(tree, len(heads.heads), "Medusa")
        self.tree, self.width, self.head_name = self.tree.to(device), topk, head_name
        if int(self.tree.rank.max()) >= topk:
            raise HarnessError(f"tree '{self.tree_name}' uses ranks up to {int(self.tree.rank.max())}, which needs "
                              f"method.topk > {int(self.tree.rank.max())} (got {topk})")
        self.rows, self.cols = self.tree.depth[1:] - 1, self.tree.rank[1:]  # each draft's head and rank
        self.feature: torch.Tensor | None = None

    @classmethod
    def check(cls, params: Params) -> None:
        require_head(cls.name, params.head, **cls.head_kind)

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device, target) -> "Medusa":
        heads = head_or_random(cls.name, params.head, **cls.head_kind, load=lambda h: load_heads(h, target.config),
                               random=lambda: random_heads(target.config, params.tree, params.seed))
        return cls(heads, target, params.tree, params.topk, params.head, device)

    @classmethod
    def example(cls, folder, prompts) -> dict:
        return {"head": "random"}

    def prepare(self, preparation: Preparation) -> None:
        match_engine(self.lm_head, preparation)

    def reset(self, prompt_ids, turn, prompt_logits, prompt_hidden=None) -> None:
        self.feature = prompt_hidden[-1]

    def update(self, draft: Draft, result: Verification) -> None:
        self.feature = result.hidden[-1]  # the last accepted node's: the new root is its next token

    def skipped(self, draft: Draft, result: Verification) -> None:
        self.update(draft, result)

    def propose(self, context: torch.Tensor) -> Draft:
        top = self.heads(self.feature, self.lm_head, self.tree.max_depth).topk(self.width, dim=-1).indices
        return Draft(torch.cat([context[-1:], top[self.rows, self.cols]]), self.tree, keys=self.tree.ranks)

    def step_sizes(self) -> list[int]:
        return [self.tree.size]

    def summary(self) -> dict:
        return {"head": self.head_name, "heads": len(self.heads.heads), "own_lm_heads": self.heads.own_lm_head,
                "head_parameters": sum(p.numel() for p in self.heads.parameters()), "tree": self.tree_name,
                "tree_nodes": self.tree.size, "topk": self.width}
