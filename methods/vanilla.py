"""Greedy decoding: the root-only tree, through the same verifier as every other method."""
from __future__ import annotations

import torch

from methods.base import Draft, Proposer, register
from methods.common import HarnessError
from methods.tree import Tree


@register
class Vanilla(Proposer):
    name = "vanilla"
    drafts = False

    def __init__(self, device: torch.device):
        self.tree = Tree.chain(1).to(device)

    @classmethod
    def build(cls, params: dict, *, vocab_size: int, device: torch.device) -> "Vanilla":
        if params:
            raise HarnessError(f"method 'vanilla' takes no parameters, got: {', '.join(params)}")
        return cls(device)

    def propose(self, context: torch.Tensor) -> Draft:
        return Draft(context[-1:], self.tree)

    def step_sizes(self) -> list[int]:
        return [1]
