"""Speculative sampling (SpS; Leviathan et al., arXiv 2211.17192; Chen et al., arXiv 2302.01318): a small draft
model with its own KV cache drafts a chain of tokens one forward at a time; the target verifies it in one.

The drafter (``method.drafter``):

* a folder or hub id of a causal LM with the target's vocabulary (``methods.hub``'s rule). Spec-Bench's SpS
  row uses ``double7/vicuna-68m`` for its Vicuna targets (``eval.sh``, hemingkx/Spec-Bench fd2c1cd), the
  Vicuna configs' default;
* ``self:L``: the target's own first ``L`` decoder layers with its final norm and lm_head, sharing the target's
  weights (training-free self-speculation, as in Draft & Verify, arXiv 2309.08168, which skips layers instead):
  the embedded model has no smaller sibling. ``self:N`` with all N layers is the target itself, whose every
  draft the target accepts (tests/test_sps.py).

The draft length follows Spec-Bench's SpS, transformers' assisted generation (``model/sps/decoding.py`` there,
on transformers 4.37.1's ``AssistedCandidateGenerator``): ``draft_tokens=5`` to start, and the ``heuristic``
schedule, +2 after a step that accepted every draft and -1 (to at least 1) after any other, kept across requests
(``num_assistant_tokens_schedule="heuristic"``; here at most ``MAX_DRAFT``). ``schedule=constant`` keeps it.

``topk > 1`` makes a tree at no extra drafter cost: beside every chain token its next ``topk - 1`` candidates
from the same drafter forward, as leaves (one of them is accepted where the chain token was not, one token more).

The drafter's cache keeps the committed tokens it has seen plus the accepted drafts it forwarded (the drafts'
entries are right wherever the target accepted them); each proposal first feeds what it has not seen.
At temperature > 0 the drafter drafts each token with the same position-keyed noise as the target's draw
(``methods.sampling``: the Gumbel-max of its own logits), so a drafter close to the target drafts the target's
sampled tokens, and the tokens stay vanilla sampling's.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import torch
from torch import nn

from methods import hub
from methods.base import Draft, Preparation, Proposer, Verification, register
from methods.common import HarnessError
from methods.engine import HFEngine, StaticEngine
from methods.engine.ops import can_pack
from methods.params import artefact, param
from methods.tree import Tree

SCHEDULES = ("heuristic", "constant")
MAX_DRAFT = 128  # the heuristic schedule's ceiling (transformers sets none; a drafter this good is the target)
SELF = re.compile(r"self:(\d+)")
ZERO = torch.zeros(1, dtype=torch.long)


def first_layers(target, n: int):
    """The target's first ``n`` decoder layers, its final norm and its lm_head as a model of their own: the
    same modules (no weight is copied) under a config of ``n`` layers."""
    inner = getattr(target, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise HarnessError(f"method.drafter=self:{n} needs a decoder-only model with model.layers (Llama, "
                           f"Mistral, Qwen); this one is {type(target).__name__}: give a drafter checkpoint")
    if not 1 <= n <= len(layers):
        raise HarnessError(f"method.drafter=self:{n}: the target has {len(layers)} layers; give self:1 to "
                           f"self:{len(layers)}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = n
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:n]
    with torch.device("meta"):
        shell = type(target)(config)
    for name, module in inner.named_children():  # embeddings, norm, rotary tables: the target's own
        setattr(shell.model, name, nn.ModuleList(layers[:n]) if name == "layers" else module)
    shell.lm_head = target.lm_head
    left = [k for k, t in [*shell.named_parameters(), *shell.named_buffers()] if t.is_meta]
    if left:
        raise HarnessError(f"method.drafter=self:{n}: {type(target).__name__} has parts outside model.* and "
                           f"lm_head ({', '.join(left[:3])}): give a drafter checkpoint")
    return shell.eval()


def load_drafter(ref: str, target):
    """The drafter ``ref`` names (module docstring), on the target's device and in its dtype."""
    match = SELF.fullmatch(ref)
    if match:
        return first_layers(target, int(match.group(1)))
    from transformers import AutoModelForCausalLM

    where = hub.folder(ref, "method.drafter", ["*.json", "*.safetensors", "*.bin"], "config.json and weights")
    if not (where / "config.json").is_file():
        raise HarnessError(f"method.drafter={ref}: {where} has no config.json; give a causal LM's folder or hub "
                          f"id, or self:L (the target's first L layers)")
    dtype = next(target.parameters()).dtype
    drafter = AutoModelForCausalLM.from_pretrained(where, dtype=dtype).to(target.device).eval()
    if drafter.config.vocab_size != target.config.vocab_size:
        raise HarnessError(f"method.drafter={ref} has a vocabulary of {drafter.config.vocab_size} tokens and the "
                          f"target {target.config.vocab_size}: a drafter must share the target's tokenizer")
    return drafter


def drafter_engine(model, pack: bool | None = None):
    """The lean engine for a Llama-architecture drafter (oneDNN-packed where it can be, or as ``pack`` says),
    the reference engine for any other."""
    if model.config.model_type != "llama":
        return HFEngine(model)
    dtype = next(model.parameters()).dtype
    return StaticEngine(model, pack=can_pack(model.device, dtype) if pack is None else pack)


def chain_tree(length: int, k: int) -> Tree:
    """A chain of ``length`` drafts with ``k - 1`` leaves beside each, breadth-first: depth d's block holds the
    chain's node (node ``1 + (d - 1) k``) and then its alternatives, all children of the chain's node above.

    >>> chain_tree(2, 2).parents   # root -> {1, 2}, 1 -> {3, 4}
    (-1, 0, 0, 1, 1)
    """
    return Tree.from_parents([-1] + [0 if d == 0 else 1 + (d - 1) * k for d in range(length) for _ in range(k)])


@register
class SpS(Proposer):
    name = "sps"
    needs_target = True
    wants_sampler = True

    @dataclass
    class Params:
        drafter: str | None = param(None, "a causal LM with the target's vocabulary (folder or hub id), or self:L, "
                                    "the target's first L layers; in a run, the model config's artefacts.sps_drafter",
                                    config=artefact("sps_drafter"))
        draft_tokens: int = param(5, "chain length to start with (transformers' num_assistant_tokens)", low=1,
                                  high=MAX_DRAFT)
        schedule: str = param("heuristic", "heuristic: +2 after a fully accepted chain, -1 after any other (kept "
                              "across requests), as transformers' assisted generation | constant", choices=SCHEDULES)
        topk: int = param(1, "1: a chain; k: beside every chain token the drafter's next k-1 tokens, as leaves",
                          low=1, high=64)

    @classmethod
    def example(cls, folder, prompts) -> dict:
        return {"drafter": "self:1"}

    def __init__(self, drafter, name: str, draft_tokens: int, schedule: str, topk: int):
        self.drafter, self.drafter_name = drafter, name
        self.engine = drafter_engine(drafter)
        self.start_tokens, self.gamma, self.schedule, self.k = draft_tokens, draft_tokens, schedule, topk
        self.sampler, self.n_prompt, self.forwarded = None, 0, 0
        self.memory = "run" if schedule == "heuristic" else "none"  # the chain length goes on across requests

    @classmethod
    def check(cls, params: Params) -> None:
        if not params.drafter:
            raise HarnessError("method 'sps' needs a drafter and the model config names none: give "
                              "method.drafter=PATH (a causal LM with the target's tokenizer, or a hub id) or "
                              "method.drafter=self:L (the target's first L layers)")

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device, target) -> "SpS":
        return cls(load_drafter(params.drafter, target), params.drafter, params.draft_tokens, params.schedule,
                   params.topk)

    def prepare(self, preparation: Preparation) -> None:
        """Pack the drafter's weights as the target's engine packs its own (engine.pack=auto measured plain
        weights faster on this machine, or engine.pack=false, or engine.compile: plain)."""
        if getattr(preparation.engine, "pack", None) is False and isinstance(self.engine, StaticEngine):
            self.engine = drafter_engine(self.drafter, pack=False)

    def fork(self) -> "SpS":
        """Its own drafter cache (the weights shared), and its own chain length under the heuristic schedule."""
        other = super().fork()
        other.engine = drafter_engine(self.drafter, pack=getattr(self.engine, "pack", None))
        return other

    def reset(self, prompt_ids, turn, prompt_logits, prompt_hidden=None) -> None:
        self.engine.start(len(prompt_ids) + 2 * MAX_DRAFT)
        self.n_prompt = len(prompt_ids)

    def propose(self, context: torch.Tensor) -> Draft:
        past = len(context)
        logits, _ = self.engine.forward(context[self.engine.length:], last_only=True)  # the unseen, root included
        position = past - self.n_prompt  # new-token index of the root's next token (the sampler's key)
        tops = []  # per depth, breadth-first: the chain's token, then its k - 1 alternatives
        for d in range(self.gamma):
            scores = logits if self.sampler is None else self.sampler.scores(logits, ZERO.to(logits.device),
                                                                             position + d, 0)
            tops.append(scores.topk(self.k, dim=-1).indices[0])
            if d + 1 < self.gamma:
                logits, _ = self.engine.forward(tops[-1][:1], last_only=True)
        self.forwarded = self.gamma - 1
        tree = chain_tree(self.gamma, self.k).to(context.device)
        return Draft(torch.cat([context[-1:], *tops]), tree, keys=tree.ranks)

    def update(self, draft: Draft, result: Verification) -> None:
        # The path runs down the chain (nodes 1, 1 + k, 1 + 2k, ...), and may end at an alternative.
        path = result.path if draft.kept is None else [draft.kept[i] for i in result.path]  # as drafted
        on_chain = sum(1 for node in path[1:] if (node - 1) % self.k == 0)
        self.engine.commit(self.engine.length - self.forwarded, list(range(min(on_chain, self.forwarded))))
        if self.schedule == "heuristic":
            self.gamma = min(MAX_DRAFT, self.gamma + 2) if on_chain == self.gamma else max(1, self.gamma - 1)

    def step_sizes(self) -> list[int]:
        lengths = range(1, MAX_DRAFT + 1) if self.schedule == "heuristic" else [self.gamma]
        return [1 + g * self.k for g in lengths]

    def state_dict(self) -> dict:
        return {"draft_tokens": self.gamma}

    def load_state_dict(self, state: dict) -> None:
        self.gamma = int(state.get("draft_tokens", self.gamma))

    def summary(self) -> dict:
        return {"drafter": self.drafter_name, "drafter_layers": self.drafter.config.num_hidden_layers,
                "drafter_parameters": sum(p.numel() for p in self.drafter.parameters()),
                "draft_tokens": self.start_tokens, "schedule": self.schedule, "draft_tokens_now": self.gamma,
                "topk": self.k, "engine": self.engine.name}
