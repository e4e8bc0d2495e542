"""SuffixDecoding (Oliaro et al., arXiv 2411.04975, NeurIPS 2025): drafts from suffix trees over the request and
over the run's earlier answers.

Every step matches the end of the committed sequence (its newest token, the root, included) in two suffix trees
(``methods.suffix_tree``) and drafts the better-scoring continuation of the two:

* the request's own tree, over its prompt and what it has generated so far (built anew for every request; a second
  turn's prompt holds the first turn);
* the **global** tree, over the answers of earlier requests of the run (``max_cached_requests`` of them, the
  oldest leaving first; 0: none) and the running answers, token by token as they are committed: the memory
  across requests that makes the method shine where requests repeat each other.

A draft follows every match length from 1 to ``max_depth`` - 1 tokens: a match of m tokens allows ``min(max_spec_tokens,
floor(m * max_spec_factor + max_spec_offset))`` tokens, each as likely as the share of the match's occurrences it
continues (the product along its path), none under ``min_token_prob``; a draft scores the sum of its tokens'
probabilities. ``tree=false`` drafts a chain of the most frequent continuation (what vLLM verifies);
``tree=true`` a tree of the most probable continuations, best first (what the paper and SGLang verify).

This is arctic-inference's SuffixDecoding (snowflakedb/ArcticInference at 9d46438, the 0.3.0 release:
``arctic_inference/suffix_decoding/cache.py`` and ``csrc/suffix_decoding/suffix_tree.cc``) as vLLM's
``method="suffix"`` drives it (``vllm/v1/spec_decode/suffix_decoding.py``: a request starts with its prompt once
its first token exists, every step adds the tokens committed since, then speculates from the last
``max_depth`` tokens), with vLLM's defaults (``suffix_decoding_max_tree_depth`` 24,
``suffix_decoding_max_cached_requests`` 10000, ``suffix_decoding_max_spec_factor`` 1.0,
``suffix_decoding_min_token_prob`` 0.1, ``num_speculative_tokens`` the tree depth when not given). Its drafts
are the library's, token for token (``tests/test_suffix.py``), from our own trees (``backend=python``) or the
library's (``backend=arctic``, after ``make arctic``).

Where the run's memory differs from a server's: the requests are the run's turns, in the run's order; an answer
joins the global tree token by token, its last step's tokens when it ends (``Proposer.finish``); the warm-up's answers
leave it before the timed questions unless ``warmup_memory=true``; a resumed run rebuilds it by replaying every
change (``SuffixCache.replay``), so that it drafts what the unbroken run drafts.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from methods.base import Draft, Preparation, Proposer, register
from methods.calibrate import chain_budget
from methods.params import AUTO, param
from methods.suffix_tree import NativeTree, SuffixCache, SuffixTree, have_native, native
from methods.tree import Tree

BACKENDS = ("auto", "python", "arctic")
REQUEST, MEMORY = "request", "memory"  # a step's drafter: the request's own tree, or the global one


def key(prob: float) -> int:
    """A drafted node's key for a per-step budget (``Draft.keys``): its probability's tenth, 1 to 10."""
    return 1 + min(9, int(prob * 10))


@register
class SuffixDecoding(Proposer):
    name = "suffix"
    token_only = True
    resumes_mid_request = True  # its cache is replayed, its request's tree rebuilt from the context

    @dataclass
    class Params:  # vLLM's defaults (vllm/config/speculative.py, suffix_decoding_*), arctic-inference's names
        tree: bool = param(False, "false: a chain of the most frequent continuation (vLLM); true: a tree of the most "
                           "probable ones (the paper, SGLang)")
        max_depth: int = param(24, "the trees hold substrings of up to this many tokens: a match and its draft "
                               "together (max_tree_depth)", low=2, high=4096)
        max_cached_requests: int = param(10000, "the global tree's answers, the oldest leaving first; 0: no global "
                                         "tree (no memory across requests); -1: no bound", low=-1)
        max_spec_tokens: int | str | None = param(None, "most tokens a draft holds (vLLM's num_speculative_tokens); "
                                                  "null: max_depth; auto: capped by match length where they stop "
                                                  "paying on this device", low=1, high=4096, auto=True)
        max_spec_factor: float = param(1.0, "a match of m tokens drafts at most m x this + max_spec_offset", low=0)
        max_spec_offset: float = param(0.0, "see max_spec_factor")
        min_token_prob: float = param(0.1, "no drafted token less likely than this (its share of the match's "
                                      "occurrences along its path)", low=0, high=1)
        warmup_memory: bool = param(False, "true: the warm-up's answers stay in the global tree for the timed ones")
        backend: str = param("auto", "whose suffix trees: python (ours), arctic (arctic-inference's C++, make "
                             "arctic), auto (arctic where installed); the same drafts either way", choices=BACKENDS)

    def __init__(self, params: Params, device: torch.device):
        self.tree, self.max_depth, self.params = params.tree, params.max_depth, params
        self.factor, self.offset, self.floor = params.max_spec_factor, params.max_spec_offset, params.min_token_prob
        self.backend = params.backend if params.backend != "auto" else "arctic" if have_native() else "python"
        if self.backend == "arctic":
            native()  # installed, or a one-line error now
        self.cache = SuffixCache(params.max_depth, params.max_cached_requests,
                                 NativeTree if self.backend == "arctic" else SuffixTree)
        self.auto = params.max_spec_tokens == AUTO
        # the longest draft: the tree depth where not given (vLLM's num_speculative_tokens), auto's probe's too
        self.most = params.max_depth if params.max_spec_tokens in (None, AUTO) else params.max_spec_tokens
        self.memory = "none" if params.max_cached_requests == 0 else "run"
        self.device = device
        self.stats = {"steps": Counter(), "accepted": Counter()}  # per drafter, shared by the slots
        self.last = None  # the last speculation as the library returns it (scripts.suffix_parity compares it)
        self.budget: dict | None = None  # max_spec_tokens=auto: the caps by match length (methods.calibrate)
        self.threshold = 1  # the shortest match that drafts, where auto's caps start
        self.log: list | None = None  # auto's calibration: (match, drafted, accepted[, the accepted nodes' places])
        self._order: list[int] = []  # the last draft's nodes' places in the speculation (its best-first order)
        self.owner = True  # the batch's first slot: its state_dict holds the cache's log
        self._new_request()

    def _new_request(self) -> None:
        self.request: int | None = None  # the cache's id of this slot's request, once started
        self.prompt_len = self.fed = 0  # tokens of the prompt, and of the answer the cache has
        self.replayed = False  # its cache was replayed mid-request: its own tree lacks the prompt until rebuilt

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device) -> "SuffixDecoding":
        return cls(params, device)

    def fork(self) -> "SuffixDecoding":
        other = super().fork()  # the cache (its global tree) and the statistics are the batch's
        other._new_request()
        other.owner = False  # the first slot's saved state holds the shared cache
        return other

    def reset(self, prompt_ids, turn, prompt_logits, prompt_hidden=None) -> None:
        self._new_request()
        self.prompt_len = len(prompt_ids)

    def _catch_up(self, context: torch.Tensor) -> None:
        """Start the request in the cache (its prompt) if it has not started, then add the answer's tokens it has
        not seen."""
        if self.request is None:
            self.request = self.cache.new_request()
            self.cache.start(self.request, context[: self.prompt_len].tolist())
        elif self.replayed:
            self.cache.rebuild(self.request, context[: self.prompt_len + self.fed].tolist())
            self.replayed = False
        new = context[self.prompt_len + self.fed:].tolist()
        if new:
            self.cache.add(self.request, new)
            self.fed += len(new)

    def propose(self, context: torch.Tensor) -> Draft:
        self._catch_up(context)
        root = context[-1:]
        d, remembered = self.cache.speculate(self.request, context[-self.max_depth:].tolist(), self.most,
                                             self.factor, self.offset, self.floor, self.tree)
        self.last = d
        n = self.cap(d.match_len)
        if not d.token_ids[:n]:
            return Draft(root, Tree.chain(1).to(root.device), info={"drafter": "plain", "match": d.match_len})
        tree, order = Tree.breadth_first([-1] + [p + 1 for p in d.parents[:n]])
        self._order = order
        tokens, probs = [int(root)] + d.token_ids, [1.0] + d.probs
        return Draft(torch.tensor([tokens[i] for i in order], device=root.device), tree.to(root.device),
                     info={"drafter": MEMORY if remembered else REQUEST, "match": d.match_len},
                     keys=[0] + [key(probs[i]) for i in order[1:]])

    def cap(self, match: int) -> int:
        """Most tokens a draft from a match of ``match`` tokens keeps: its first in best-first order (auto: the
        calibrated cap of its range of match lengths)."""
        if self.budget is None:
            return self.most
        return next(c for lo, c in reversed(self.budget["caps"]) if match >= lo or lo == self.threshold)

    def prepare(self, preparation: Preparation) -> None:
        if self.auto and self.budget is None:
            self.budget = chain_budget(self, preparation)

    def chain_settings(self) -> tuple[str, dict]:
        """What auto's calibration depends on: its cache file's name part, the settings it records."""
        p = self.params
        part = (f"suffix-{'tree' if p.tree else 'chain'}-d{p.max_depth}-c{p.max_cached_requests}"
                f"-f{p.max_spec_factor:g}-o{p.max_spec_offset:g}-p{p.min_token_prob:g}")
        return part, {"max_draft": self.most, "tree": p.tree, "max_depth": p.max_depth,
                     "max_cached_requests": p.max_cached_requests, "max_spec_factor": p.max_spec_factor,
                     "max_spec_offset": p.max_spec_offset, "min_token_prob": p.min_token_prob}

    def probe(self) -> "SuffixDecoding":
        """This method's settings with the longest drafts and a cache of its own, logging every drafting step
        (auto's calibration)."""
        probe = SuffixDecoding(dataclasses.replace(self.params, max_spec_tokens=None, backend=self.backend),
                               self.device)
        probe.log = []
        return probe

    def artefacts(self) -> dict[str, object]:
        return {"draft_budget.json": self.budget} if self.budget is not None else {}

    def update(self, draft: Draft, result) -> None:
        who = draft.info["drafter"]
        self.stats["steps"][who] += 1
        self.stats["accepted"][who] += len(result.path) - 1
        if self.log is not None and who in (REQUEST, MEMORY):  # the accepted nodes' places where not a chain's
            places, accepted = sorted(self._order[i] - 1 for i in result.path[1:]), len(result.path) - 1
            step = (draft.info["match"], draft.tree.size - 1, accepted)
            self.log.append(step if places == list(range(accepted)) else (*step, places))

    def finish(self, answer: list[int]) -> None:
        """The answer's last tokens join the trees, and the request's own tree goes (its answer stays in the
        global one)."""
        if self.request is None:  # it ended at its prefill, before any step
            self.request = self.cache.new_request()
            self.cache.start(self.request, [])
        if answer[self.fed:]:
            self.cache.add(self.request, answer[self.fed:])
        self.cache.stop(self.request)
        self._new_request()

    def after_warmup(self) -> None:
        if not self.params.warmup_memory:
            self.cache.clear()

    def step_sizes(self) -> list[int]:
        return list(range(1, self.most + 2))

    def state_dict(self) -> dict:
        """This slot's request and, the first slot's, the cache's log (it replays into the same cache)."""
        out = {"suffix_request": -1 if self.request is None else self.request, "suffix_fed": self.fed}
        if self.owner:
            out["suffix_log"] = torch.from_numpy(np.array(self.cache.log, dtype=np.int64))
        return out

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        if "suffix_log" in state:
            log = state["suffix_log"].tolist()
            if self.cache.log.tolist() != log:  # (a resumed row loads what its run's restore loaded already)
                self.cache.replay(log)
        self.request = None if state["suffix_request"] < 0 else int(state["suffix_request"])
        self.fed = int(state["suffix_fed"])
        self.replayed = self.request is not None

    def summary(self) -> dict:
        p = self.params
        return {"tree": p.tree, "max_depth": p.max_depth, "max_cached_requests": p.max_cached_requests,
                "max_spec_tokens": AUTO if self.auto else self.most, "max_spec_factor": p.max_spec_factor,
                "max_spec_offset": p.max_spec_offset, "min_token_prob": p.min_token_prob,
                "warmup_memory": p.warmup_memory, "backend": self.backend, "memory": self.memory,
                "memory_answers": len(self.cache.cached),
                "steps_by_drafter": dict(self.stats["steps"]),
                "accepted_drafts_by_drafter": dict(self.stats["accepted"]),
                **({"budget": self.budget} if self.budget else {})}

