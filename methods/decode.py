"""The one decode loop every method runs.

Token counting, the same for every method: the prefill forward yields the first
new token and counts as a step of accept length 1; every later step commits its
accepted drafts plus the bonus token. Generation ends after the first stop token
(which is kept in ``token_ids`` and counted) or when ``max_new_tokens`` are
reached; tokens past either end are dropped from the step that produced them.
So ``sum(accept_lengths) == len(token_ids)`` and ``len(accept_lengths)`` is the
number of target forwards, for every method (a proposer's ``ending`` adds forwards past the
answer, counted apart: below). Beside each step's accept length the loop keeps
its draft's size (nodes, the root included: the prefill step's is 0), the depth of its deepest
acceptable draft (``draft_depths``: per-depth acceptance, ``evaluation.metrics``) and what the
proposer said of it (``Draft.info``, a hybrid's drafter).

A proposer that sets ``drafts_first`` (Token Recycling and Lookahead, whose reference
code prefills the prompt but its last token) gets a prefill of the prompt without its last
token, which yields no token and is no step; the first step is then an ordinary
proposal rooted at the prompt's last token (``Generation.prefill_step`` is False).

A proposer with an ``ending`` (``methods.base.Ending``: Token Recycling's and SAM-Decoding's reference
code, ``method.reference=true``) is forwarded past the answer, after ``decode_time`` is taken, until its
reference would stop, and learns from those forwards as the reference does (the last one too, or not:
``Verification.learn``, which may also withhold the answer's last forward).
Their tokens are no part of the answer, and no accept length, step or draft statistic counts them: they
are recorded apart, as ``Generation.extra_forwards`` (the tokens each produced) and ``extra_time``, which
``wall_time`` leaves out. The reference's own timing includes them; ours times the answer, which is
complete before them, and keeps their cost beside it for whoever wants to add it back.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from methods.base import Proposer
from methods.engine import Engine, HFEngine
from methods.engine.ops import sync
from methods.verify import verify


DRAFT_ROOM = 256  # cache slots past the budget for a step's drafts (an engine grows its cache for more)
ZERO = torch.zeros(1, dtype=torch.long)


@dataclass
class Generation:
    token_ids: list[int]  # new tokens, the stop token included when one was produced
    accept_lengths: list[int]  # tokens committed by each target forward, prefill first
    prefill_time: float  # seconds
    decode_time: float  # seconds, after the prefill
    stop: str  # "eos" or "length"
    prefill_step: bool = True  # accept_lengths[0] is the prefill's one token (False: drafts_first)
    draft_nodes: list[int] | None = None  # per step, as accept_lengths: nodes forwarded (the prefill step: 0)
    draft_depths: list[int] | None = None  # per step: depth of the deepest acceptable draft (plain step: 0)
    step_info: list[dict | None] | None = None  # per step: the proposer's Draft.info (None where it gave none)
    extra_forwards: list[int] | None = None  # per forward past the answer (Proposer.ending): the tokens it produced
    extra_time: float = 0.0  # seconds of the forwards past the answer, after decode_time

    @property
    def wall_time(self) -> float:
        return self.prefill_time + self.decode_time


class PhaseTimer:
    """Seconds spent per phase of the loop (forward, propose, accept, update, commit), for profiling.

    It synchronises the device at every phase boundary, which slows a GPU loop:
    use it in benchmarks, never in timed runs.
    """

    def __init__(self, device: torch.device):
        self.device, self.seconds = device, defaultdict(float)

    @contextmanager
    def __call__(self, phase: str):
        sync(self.device)
        t = time.perf_counter()
        yield
        sync(self.device)
        self.seconds[phase] += time.perf_counter() - t


@torch.inference_mode()
def generate(target, proposer: Proposer, prompt_ids: list[int], *, max_new_tokens: int, stop_ids: set[int],
             turn: int = 0, timer=nullcontext, sampler=None) -> Generation:
    """Decoding of ``prompt_ids`` with ``proposer``'s drafts, token for token what vanilla decoding gives:
    greedy, or with ``sampler`` (a ``methods.sampling.Sampler`` of the request's question and turn) its
    position-keyed draws.

    ``target`` is an ``Engine`` (``methods.engine``), or a Hugging Face model, run by the reference
    engine ``hf``. ``timer(phase)`` is a context manager around each phase; profiling passes a ``PhaseTimer``.
    """
    engine = target if isinstance(target, Engine) else HFEngine(target)
    if sampler is not None and sampler.settings.greedy:  # temperature 0 is greedy decoding itself
        sampler = None
    device = engine.device
    n_prompt = len(prompt_ids)
    ids = torch.empty(n_prompt + max_new_tokens, dtype=torch.long, device=device)
    ids[:n_prompt] = torch.tensor(prompt_ids)
    engine.start(n_prompt + max_new_tokens + DRAFT_ROOM)
    new: list[int] = []
    tail: list[int] = []  # forwarded tokens past the answer: the last step's beyond its end, then the extra forwards'
    accept_lengths: list[int] = []
    nodes: list[int] = []
    depths: list[int] = []
    info: list[dict | None] = []
    ending = proposer.ending
    produced = 0  # tokens forwarded so far, tail included (the reference's count, for ``ending``)

    def commit(tokens: list[int]) -> bool:
        """Append a step's tokens, cut at the first stop token or the budget; True when generation ends."""
        kept = tokens[: max_new_tokens - len(new)]
        stop = next((i for i, t in enumerate(kept) if t in stop_ids), None)
        if stop is not None:
            kept = kept[: stop + 1]
        ids[n_prompt + len(new): n_prompt + len(new) + len(kept)] = torch.tensor(kept)
        new.extend(kept)
        tail.extend(tokens[len(kept):])
        accept_lengths.append(len(kept))
        return stop is not None or len(new) >= max_new_tokens

    def forward(context: torch.Tensor, past_answer: bool):
        """Propose from ``context``, verify in one forward, let the proposer learn; (draft, result, whether the
        proposer's reference stops after it)."""
        nonlocal produced
        with timer("propose"):
            draft = proposer.propose(context)
        result = verify(engine, draft, timer, proposer.topk, hidden, sampler, len(new) + len(tail))
        stops = ending is None  # no ending: ours is the only end
        if ending is not None:  # the root counts where it was generated (a prompt's last token ends nothing)
            committed = (tail or new)[-1:] + result.new_tokens[:-1]
            produced += len(result.new_tokens)
            stops, result.learn = ending.ends(committed, result.new_tokens[-1], produced, max_new_tokens, stop_ids)
            result.past_answer = past_answer
        with timer("update"):
            proposer.update(draft, result)
        return draft, result, stops

    sync(device)
    t0 = time.perf_counter()
    # 1. Prefill: the prompt goes into the cache; its last position's argmax is the first new token.
    #    (drafts_first: the prompt but its last token, which roots the first draft.)
    full, hidden = proposer.wants_prompt_logits, proposer.wants_hidden
    first_step = proposer.drafts_first and n_prompt > 1
    prefill = n_prompt - 1 if first_step else n_prompt
    logits, states = engine.forward(ids[:prefill], last_only=not full, hidden=hidden)
    if proposer.wants_sampler:
        proposer.sampler = sampler
    proposer.reset(ids[:prefill], turn, logits if full else None, states)
    stopped = ending is None  # whether the proposer's reference has stopped
    if not first_step:
        nodes.append(0), depths.append(0), info.append(None)
        first = logits[-1].argmax() if sampler is None else sampler.draw(logits[-1:], ZERO.to(device), 0, 0)[0]
        first = int(first)
        if ending is not None:  # the prefill commits the prompt, so only its bonus can stop the reference
            produced = 1
            stopped = ending.ends([], first, produced, max_new_tokens, stop_ids)[0]
    done = False if first_step else commit([first])
    sync(device)
    t1 = time.perf_counter()
    while not done:
        # 2. Propose a draft tree rooted at the newest token (not yet in the cache), 3. verify it in one forward
        #    (the cache keeps the accepted path only), 4. let the proposer learn from every node's logits.
        draft, result, stopped = forward(ids[: n_prompt + len(new)], False)
        # 5. Commit accepted drafts and the bonus token.
        done = commit(result.new_tokens)
        nodes.append(draft.tree.size), depths.append(draft.acceptable_depth), info.append(draft.info)
    sync(device)
    t2 = time.perf_counter()
    extra: list[int] = []
    while not stopped:  # past the answer, as the proposer's reference goes on (``ending``)
        context = torch.cat([ids[: n_prompt + len(new)], torch.tensor(tail, dtype=torch.long, device=device)])
        _, result, stopped = forward(context, True)
        tail.extend(result.new_tokens)
        extra.append(len(result.new_tokens))
    sync(device)
    t3 = time.perf_counter()
    return Generation(new, accept_lengths, t1 - t0, t2 - t1, "eos" if new[-1] in stop_ids else "length",
                      prefill_step=not first_step, draft_nodes=nodes, draft_depths=depths,
                      step_info=info if any(i is not None for i in info) else None,
                      extra_forwards=extra if ending is not None else None, extra_time=t3 - t2)
