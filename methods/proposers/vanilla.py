"""Greedy decoding: the root-only tree, through the same verifier as every other method."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from methods.base import Draft, Proposer, register
from methods.tree import Tree


@register
class Vanilla(Proposer):
    name = "vanilla"
    resumes_mid_request = True
    drafts = False

    @dataclass
    class Params:
        """No parameters."""

    def __init__(self, device: torch.device):
        self.tree = Tree.chain(1).to(device)

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device) -> "Vanilla":
        return cls(device)

    def propose(self, context: torch.Tensor) -> Draft:
        return Draft(context[-1:], self.tree)

    def step_sizes(self) -> list[int]:
        return [1]
