"""What a decoding method is: a proposer of draft trees, plus the registry that names them.

A proposer never sees the model. The shared loop (``methods.decode``) asks it for
a draft tree, the shared verifier (``methods.verify``) checks the tree in one
forward pass, and the proposer learns from the result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from methods.common import HarnessError
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
    hidden: torch.Tensor | None = None  # [len(path), hidden] target's last hidden states on the path, if asked


class Proposer:
    """Interface every method implements.

    * ``reset(prompt_ids, turn, prompt_logits, prompt_hidden)`` after the prefill of
      every request (``turn`` counts from 0 within a question); methods that keep state
      across requests (Token Recycling's hot start) decide here what to keep.
      ``prompt_ids`` are the tokens the prefill forwarded: the prompt, or the prompt but
      its last token for a proposer that sets ``drafts_first`` (``methods.decode``).
      ``prompt_logits`` ([prompt_len, vocab]) is given only to methods that set
      ``wants_prompt_logits``: the other prefills compute the last position only.
      ``prompt_hidden`` ([prompt_len, hidden], the target's last hidden states, what its
      lm_head reads) only to methods that set ``wants_hidden``, which also get the
      accepted path's hidden states in every ``Verification``.
    * ``propose(context)``: ``context`` is the committed sequence, prompt included,
      whose last element is the root. Returns a ``Draft``.
    * ``update(draft, result)``: learn from the verification of that draft.
    """

    name: ClassVar[str]
    wants_prompt_logits: ClassVar[bool] = False
    wants_hidden: ClassVar[bool] = False
    needs_target: ClassVar[bool] = False  # build() gets the target model (EAGLE shares its embeddings, lm_head)
    drafts_first: bool = False  # the prefill leaves out the prompt's last token, which roots the first draft
    drafts: ClassVar[bool] = True  # False: never drafts (vanilla), for the step-counting conventions of metrics
    topk: int = 0  # > 0: the verifier hands back the top-k tokens of every node (one pass gives the argmax too)

    def reset(self, prompt_ids: torch.Tensor, turn: int, prompt_logits: torch.Tensor | None,
              prompt_hidden: torch.Tensor | None = None) -> None:
        pass

    def propose(self, context: torch.Tensor) -> Draft:
        raise NotImplementedError

    def update(self, draft: Draft, result: Verification) -> None:
        pass

    def step_sizes(self) -> list[int] | None:
        """Every size (tree nodes, root included) this proposer's drafts can have, so that a compiled engine
        compiles them all before anything is timed; None: not known in advance."""
        return None

    def state_dict(self) -> dict:
        """State that outlives a request (saved with a run so that a resumed run continues it)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def summary(self) -> dict:
        """Facts about the method's state for the run summary (e.g. memory in bytes)."""
        return {}


_REGISTRY: dict[str, type] = {}


def register(cls):
    _REGISTRY[cls.name] = cls
    return cls


def known_methods() -> list[str]:
    import methods  # noqa: F401  (importing the package registers every method)

    return sorted(_REGISTRY)


def build_proposer(name: str, params: dict, *, vocab_size: int, device: torch.device, target=None) -> Proposer:
    """Instantiate method ``name`` with its parameters (plain Python values, validated by the method).

    ``target`` (the target model) goes only to methods that set ``needs_target``.
    """
    known = known_methods()
    if name not in _REGISTRY:
        raise HarnessError(f"unknown method '{name}'; known: {', '.join(known)}")
    cls = _REGISTRY[name]
    if cls.needs_target:
        if target is None:
            raise HarnessError(f"method '{name}' drafts with the target model's own layers; build it with target=")
        return cls.build(params, vocab_size=vocab_size, device=device, target=target)
    return cls.build(params, vocab_size=vocab_size, device=device)
