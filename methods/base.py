"""What a decoding method is: a proposer of draft trees, plus the registry that names them.

A proposer never sees the model. The shared loop (``methods.decode``) asks it for
a draft tree, the shared verifier (``methods.verify``) checks the tree in one
forward pass, and the proposer learns from the result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from methods.tree import Tree


@dataclass
class Draft:
    """A tree of guesses rooted at the newest committed token."""

    tokens: torch.Tensor  # [n] long, tokens[0] is the root (the last committed token)
    tree: Tree  # topology of the n nodes, same device as tokens
    acceptable: torch.Tensor | None = None  # [n] bool; False: forwarded for its logits, never accepted


@dataclass
class Verification:
    """What one forward of a draft tree established."""

    path: list[int]  # accepted node indices, root first (always starts with 0)
    new_tokens: list[int]  # tokens committed by this step: drafts on the path, then the bonus token
    logits: torch.Tensor  # [n, vocab] target logits at every node of the draft
    argmax: torch.Tensor  # [n] long, the target's greedy next token at every node
    topk: torch.Tensor | None = None  # [n, proposer.topk] long, top tokens per node, for proposers that ask


class Proposer:
    """Interface every method implements.

    * ``reset(prompt_ids, turn, prompt_logits)`` after the prefill of every request
      (``turn`` counts from 0 within a question); methods that keep state across
      requests (Token Recycling's hot start) decide here what to keep.
      ``prompt_logits`` ([prompt_len, vocab]) is given only to methods that set
      ``wants_prompt_logits``: the other prefills compute the last position only.
    * ``propose(context)``: ``context`` is the committed sequence, prompt included,
      whose last element is the root. Returns a ``Draft``.
    * ``update(draft, result)``: learn from the verification of that draft.
    """

    name: ClassVar[str]
    wants_prompt_logits: ClassVar[bool] = False
    topk: int = 0  # > 0: the verifier hands back the top-k tokens of every node (one pass gives the argmax too)

    def reset(self, prompt_ids: torch.Tensor, turn: int, prompt_logits: torch.Tensor | None) -> None:
        pass

    def propose(self, context: torch.Tensor) -> Draft:
        raise NotImplementedError

    def update(self, draft: Draft, result: Verification) -> None:
        pass

    def state_dict(self) -> dict:
        """State that outlives a request (saved with a run so that a resumed run continues it)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def summary(self) -> dict:
        """Facts about the method's state for the run summary (e.g. memory in bytes)."""
        return {}


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the fix."""


_REGISTRY: dict[str, type] = {}


def register(cls):
    _REGISTRY[cls.name] = cls
    return cls


def known_methods() -> list[str]:
    import methods  # noqa: F401  (importing the package registers every method)

    return sorted(_REGISTRY)


def build_proposer(name: str, params: dict, *, vocab_size: int, device: torch.device) -> Proposer:
    """Instantiate method ``name`` with its parameters (plain Python values, validated by the method)."""
    known = known_methods()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown method '{name}'; known: {', '.join(known)}")
    return _REGISTRY[name].build(params, vocab_size=vocab_size, device=device)
