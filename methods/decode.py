"""The one decode loop every method runs, at every batch size.

``decode_batch`` decodes requests in B slots at once (``runtime.batch_size``; continuous batching: a finished slot
takes the next request); ``generate`` is it with one slot. Each slot's request follows the steps below on its own,
except that one forward verifies every busy slot's draft (``methods.verify.verify_rows``); its counts are a lone
request's, and each step also records the rows its forward verified and the token positions it computed
(``Generation.batch_rows``, ``forward_slots``: batched runs only), each turn its first token's time and its clock.

Token counting, the same for every method: the prefill forward yields the first
new token and counts as a step of accept length 1; every later step commits its
accepted drafts plus the bonus token. Generation ends after the first stop token
(which is kept in ``token_ids`` and counted) or when ``max_new_tokens`` are
reached; tokens past either end are dropped from the step that produced them.
So ``sum(accept_lengths) == len(token_ids)`` and ``len(accept_lengths)`` is the
number of target forwards, for every method (a proposer's ``ending`` adds forwards past the
answer, counted apart: below). Beside each step's accept length the loop keeps
its draft's size (nodes, the root included: the prefill step's is 0), the depth of its deepest
acceptable draft (``draft_depths``: per-depth acceptance, ``evaluation.records.metrics``) and what the
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
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

from methods.base import Draft, Proposer
from methods.engine import Engine, HFEngine
from methods.engine.ops import sync
from methods.tree import Tree
from methods.verify import Check, Chunk, step_rows

DRAFT_ROOM = 256  # cache slots past the budget for a step's drafts (an engine grows its cache for more)
ZERO = torch.zeros(1, dtype=torch.long)
PLAIN = Tree.chain(1)  # a plain step's tree: the root alone


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
    first_token_time: float | None = None  # seconds from the start (the prefill's) to the first new token
    clock: tuple[float, float] | None = None  # time.perf_counter() at the start and at the answer's end
    batch_rows: list[int] | None = None  # per step, batched runs only: the rows its forward verified (prefill: 0)
    forward_slots: list[int] | None = None  # per step, batched runs only: the drafts' token positions that forward
    #   computed, padding included (hf: rows x the widest row's nodes; static, ragged: their sum; prefill: 0)
    step_times: list[float] | None = None  # per step: seconds from the start (the prefill's) to its tokens' commit
    offered_nodes: list[int] | None = None  # per step, where a budget cut drafts (methods.budget): nodes drafted
    expected_lengths: list[float | None] | None = None  # per step, budget=auto: the tokens it was expected to commit

    @property
    def wall_time(self) -> float:
        return self.prefill_time + self.decode_time


class PhaseTimer:
    """Seconds spent per phase of the loop (forward, propose, accept, update, commit), for profiling.

    It synchronises the device at every phase boundary, which slows a GPU loop:
    use it in benchmarks, never in timed runs.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.calls: dict[str, list[float]] = defaultdict(list)  # every call's seconds, per phase, in order

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds per phase, all its calls together."""
        return defaultdict(float, {phase: sum(calls) for phase, calls in self.calls.items()})

    @contextmanager
    def __call__(self, phase: str):
        sync(self.device)
        t = time.perf_counter()
        yield
        sync(self.device)
        self.calls[phase].append(time.perf_counter() - t)


@dataclass
class Request:
    """One turn to decode: what ``generate`` takes, as a batch's slot takes it (``decode_batch``)."""

    prompt_ids: list[int]
    max_new_tokens: int
    turn: int = 0  # counts from 0 within a question (Proposer.reset)
    sampler: object = None  # a methods.sampling.Sampler of the request's question and turn, or None: greedy
    tag: object = None  # the caller's, handed back with the Generation
    resume: "Progress | None" = None  # a request decoded part-way in an earlier process: go on from there
    force: tuple[int, list[int]] | None = None  # (after, tokens): the answer's tokens from index ``after`` on are
    #   ``tokens``, one a step: each such step's root is the next of them in place of the target's own token, and it
    #   commits only its bonus (SpecTTS-Bench's forced end of thinking); no step before accepts past ``after``


@dataclass
class StepLog:
    """What the loop records of each step of one request, the prefill's first (where it yields a token): the
    ``Generation``'s per-step lists, appended together (``add``) so that they stay aligned."""

    accept_lengths: list[int] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)  # the draft's size, the root included (prefill: 0)
    depths: list[int] = field(default_factory=list)  # the deepest acceptable draft's depth (plain step: 0)
    info: list[dict | None] = field(default_factory=list)  # the proposer's Draft.info
    rows: list[int] = field(default_factory=list)  # the rows its forward verified (a batch; prefill: 0)
    slots: list[int] = field(default_factory=list)  # the token positions its forward computed, padding included
    times: list[float] = field(default_factory=list)  # seconds from the request's start to its tokens' commit
    offered: list[int] = field(default_factory=list)  # the draft's size before a budget's cut (prefill: 0)
    expected: list[float | None] = field(default_factory=list)  # budget=auto: the tokens it was expected to commit

    def add(self, accepted: int, time: float, nodes: int = 0, depth: int = 0, info: dict | None = None,
            rows: int = 0, slots: int = 0, offered: int | None = None, expected: float | None = None) -> None:
        for lst, value in ((self.accept_lengths, accepted), (self.times, time), (self.nodes, nodes),
                           (self.depths, depth), (self.info, info), (self.rows, rows), (self.slots, slots),
                           (self.offered, nodes if offered is None else offered), (self.expected, expected)):
            lst.append(value)


@dataclass
class Progress:
    """How far a request got (``_Row.progress``), in plain values, so that another process can go on from exactly
    there (``Request.resume``): its cache is rebuilt by a prefill of what it had committed, its proposer's
    per-request state from that context, and the proposer state the slot had then (``state``) is loaded again after
    ``reset``, which has had its effects on it already. For proposers that say they can
    (``Proposer.resumes_mid_request``)."""

    new: list[int]  # the tokens committed so far (the last one the next step's root)
    log: dict  # the StepLog's lists
    prefill_step: bool
    first_token: float | None
    tail: list[int]
    extra: list[int]
    produced: int
    answered: bool
    stopped: bool
    state: dict | None = None


class _Row:
    """One request in a batch's slot: its tokens and counts, and the steps of ``generate``'s loop."""

    def __init__(self, slot: int, request: Request, proposer: Proposer, engine: Engine, stop_ids: set[int], timer):
        self.slot, self.request, self.proposer, self.engine = slot, request, proposer, engine
        self.stop_ids, self.timer, self.max_new = stop_ids, timer, request.max_new_tokens
        sampler = request.sampler
        self.sampler = None if sampler is not None and sampler.settings.greedy else sampler  # temperature 0: greedy
        self.n_prompt = len(request.prompt_ids)
        self.ids = torch.empty(self.n_prompt + self.max_new, dtype=torch.long, device=engine.device)
        self.ids[:self.n_prompt] = torch.tensor(request.prompt_ids)
        self.new: list[int] = []
        self.log = StepLog()
        self.tail: list[int] = []  # forwarded tokens past the answer: the last step's beyond its end, then the extras'
        self.extra: list[int] = []
        self.ending = proposer.ending
        self.produced = 0  # tokens forwarded so far, tail included (the reference's count, for ``ending``)
        self.answered = False  # the answer is complete
        self.stopped = self.ending is None  # whether the proposer's reference has stopped
        self.first_token = None  # seconds from the start to the first new token
        self.forced = list(request.force[1]) if request.force else []  # the forced tokens still to feed
        self.resumed = request.resume
        if self.resumed is not None:
            r = self.resumed
            self.new, self.log = list(r.new), StepLog(**{k: list(v) for k, v in r.log.items()})
            self.tail, self.extra, self.produced = list(r.tail), list(r.extra), r.produced
            self.answered, self.stopped, self.first_token = r.answered, r.stopped, r.first_token
            self.ids[self.n_prompt:self.n_prompt + len(self.new)] = torch.tensor(self.new, dtype=torch.long)
        self.t0 = self.t1 = self.t2 = 0.0  # perf_counter at the start, the end of the prefill, the answer's end
        self.first_step = False  # drafts_first: the prompt's last token is the first step's root (no prefill step)
        self.todo = self.filled = 0  # prompt tokens to prefill, and in the cache so far
        self.parts: list[tuple] = []  # the prompt chunks' (logits, states), where the proposer wants them all
        self.draft_seconds = 0.0  # the last proposal's time

    @property
    def finished(self) -> bool:
        return self.answered and self.stopped

    def commit(self, tokens: list[int], **step) -> None:
        """Append a step's tokens, cut at the first stop token or the budget, and log the step (``StepLog.add``'s
        ``step``); ``answered`` when generation ends there."""
        new = self.new
        kept = tokens[: self.max_new - len(new)]
        stop = next((i for i, t in enumerate(kept) if t in self.stop_ids), None)
        if stop is not None:
            kept = kept[: stop + 1]
        self.ids[self.n_prompt + len(new): self.n_prompt + len(new) + len(kept)] = torch.tensor(kept)
        new.extend(kept)
        self.tail.extend(tokens[len(kept):])
        now = time.perf_counter() - self.t0
        self.log.add(len(kept), now, **step)
        if self.first_token is None and new:
            self.first_token = now
        self.answered = stop is not None or len(new) >= self.max_new

    def open(self) -> None:
        """The row's cache is emptied, its clock started; the prompt is then prefilled, whole (``prefill``) or in
        chunks that ride along a batch's steps (``chunk``, ``fed``)."""
        engine = self.engine
        engine.open(self.slot, self.n_prompt + self.max_new + DRAFT_ROOM)
        sync(engine.device)
        self.t0 = time.perf_counter()
        self.first_step = self.proposer.drafts_first and self.n_prompt > 1
        self.todo = self.n_prompt - 1 if self.first_step else self.n_prompt  # drafts_first: all but its last token
        self.reset_on = self.todo  # the prompt the proposer's reset sees
        if self.resumed is not None:  # what it had committed, the newest token (the next root) left out
            self.first_step = not self.resumed.prefill_step
            self.todo = self.n_prompt + len(self.new) - 1 if self.new else self.todo

    @property
    def filling(self) -> bool:
        return self.filled < self.todo

    def chunk(self, size: int) -> Chunk:
        """The prompt's next ``size`` tokens (0: all that is left), and how many of their logits to keep."""
        start = self.filled
        end = self.todo if not size else min(self.todo, start + size)
        keep = end - start if self.proposer.wants_prompt_logits else int(end == self.todo)
        return Chunk(self.slot, self.ids[start:end], keep)

    def prefill(self) -> None:
        """The whole prompt in one forward of the row alone."""
        chunk = self.chunk(0)
        [(logits, states)] = self.engine.forward_rows([self.slot], [chunk.tokens], [None],
                                                      hidden=self.proposer.wants_hidden, keep=[chunk.keep])
        self.fed(chunk, logits, states)

    def fed(self, chunk: Chunk, logits, states) -> None:
        """A forward took ``chunk``: after the prompt's last, its last position's argmax is the first new token (none
        for drafts_first, whose first step drafts from the prompt's last token)."""
        self.filled += chunk.tokens.shape[0]
        proposer, hidden = self.proposer, self.proposer.wants_hidden
        if proposer.wants_prompt_logits or hidden:
            self.parts.append((logits, states))
        if self.filling:
            return
        if self.parts:
            logits = torch.cat([p[0] for p in self.parts])
            states = torch.cat([p[1] for p in self.parts]) if hidden else None
            self.parts = []
        n = self.reset_on
        if proposer.wants_sampler:
            proposer.sampler = self.sampler
        proposer.reset(self.ids[:n], self.request.turn, logits[:n] if proposer.wants_prompt_logits else None,
                       states[:n] if states is not None else None)
        if self.resumed is not None:
            if self.resumed.state is not None:  # the slot's proposer as it was, reset's effects included
                proposer.load_state_dict(self.resumed.state)
        elif not self.first_step:
            sampler, last = self.sampler, logits[-1:]
            first = int(last[0].argmax() if sampler is None else
                        sampler.draw(last, ZERO.to(self.engine.device), 0, 0)[0])
            if self.ending is not None:  # the prefill commits the prompt, so only its bonus can stop the reference
                self.produced = 1
                self.stopped = self.ending.ends([], first, self.produced, self.max_new, self.stop_ids)[0]
            self.commit([first])
        sync(self.engine.device)
        self.t1 = time.perf_counter()
        if self.answered:
            self.t2 = self.t1

    def propose(self, asked: bool = True) -> Check:
        """2. A draft tree rooted at the newest token (not yet in the cache); past the answer (``ending``), rooted at
        the tail's. Not ``asked`` (a per-step budget): the root alone, the proposer not called."""
        context = self.ids[: self.n_prompt + len(self.new)]
        if self.answered:
            context = torch.cat([context, torch.tensor(self.tail, dtype=torch.long, device=self.engine.device)])
        # A forced text (Request.force) replaces the tokens from index ``after`` on, one a step, whatever the method:
        # a step before it accepts no draft past that index, so that the token there ends a step and roots the next.
        pending = bool(self.forced) and not self.answered and len(self.forced) + len(self.new) <= self.max_new
        forcing = pending and len(self.new) > self.request.force[0]
        if forcing:  # the root is the next forced token in place of the target's (which is dropped)
            token = self.forced.pop(0)
            self.new[-1] = token
            self.ids[self.n_prompt + len(self.new) - 1] = token
        t = time.perf_counter()
        if not asked:
            draft = Draft(context[-1:], PLAIN.to(context.device), kept=[0])
        else:
            with self.timer("propose"):
                draft = self.proposer.propose(context)
        self.draft_seconds = time.perf_counter() - t
        if pending:  # the proposer drafts as ever; forcing: only the root is accepted (the step commits its bonus)
            reach = 0 if forcing else self.request.force[0] - len(self.new)
            if forcing or reach < draft.tree.max_depth:
                keep = draft.tree.depth <= reach
                draft.acceptable = keep if draft.acceptable is None else draft.acceptable & keep
                draft.q, draft.depth = None, min(draft.acceptable_depth, reach)
            if forcing:
                draft.info = {**(draft.info or {}), "forced": True}
        return Check(draft, self.slot, self.sampler, len(self.new) + len(self.tail))

    def settle(self, draft, result, rows: int, slots: int, plan=None) -> None:
        """4. Let the proposer learn from every node's logits, 5. commit the accepted drafts and the bonus token
        (past the answer: keep them apart). ``rows``, ``slots``: the forward's rows and token positions; ``plan``
        what a budget did to the draft (``methods.budget.Plan``)."""
        ending = self.ending
        if ending is not None:  # the root counts where it was generated (a prompt's last token ends nothing)
            committed = (self.tail or self.new)[-1:] + result.new_tokens[:-1]
            self.produced += len(result.new_tokens)
            forwards = len(self.log.accept_lengths) + len(self.extra) + (1 if self.first_step else 0)
            self.stopped, result.learn = ending.ends(committed, result.new_tokens[-1], self.produced, self.max_new,
                                                     self.stop_ids, forwards)
            result.past_answer = self.answered
        with self.timer("update"):
            if plan is None or plan.drafted:
                self.proposer.update(draft, result)
            else:
                self.proposer.skipped(draft, result)
        if self.answered:
            self.tail.extend(result.new_tokens)
            self.extra.append(len(result.new_tokens))
            return
        self.commit(result.new_tokens, nodes=draft.tree.size, depth=draft.acceptable_depth, info=draft.info, rows=rows,
                    slots=slots, offered=plan.offered if plan else None, expected=plan.expected if plan else None)
        if self.answered:
            sync(self.engine.device)
            self.t2 = time.perf_counter()

    def progress(self) -> Progress:
        """How far this request got, to go on from there in another process (``Request.resume``)."""
        return Progress(list(self.new), {k: list(v) for k, v in vars(self.log).items()}, not self.first_step,
                        self.first_token, list(self.tail), list(self.extra), self.produced, self.answered,
                        self.stopped)

    def generation(self) -> Generation:
        sync(self.engine.device)
        t3 = time.perf_counter()
        log, batched = self.log, any(r > 1 for r in self.log.rows)
        return Generation(self.new, log.accept_lengths, self.t1 - self.t0, self.t2 - self.t1,
                          "eos" if self.new[-1] in self.stop_ids else "length",
                          prefill_step=not self.first_step, draft_nodes=log.nodes, draft_depths=log.depths,
                          step_info=log.info if any(i is not None for i in log.info) else None,
                          extra_forwards=self.extra if self.ending is not None else None, extra_time=t3 - self.t2,
                          first_token_time=self.first_token, clock=(self.t0, self.t2), step_times=log.times,
                          batch_rows=log.rows if batched else None, forward_slots=log.slots if batched else None,
                          offered_nodes=log.offered if log.offered != log.nodes else None,
                          expected_lengths=log.expected if any(e is not None for e in log.expected) else None)


Feed = Callable[[int, "tuple[Request, Generation] | None"], "Request | None"]


@torch.inference_mode()
def decode_batch(engine: Engine, proposers: list[Proposer], feed: Feed, *, stop_ids: set[int],
                 timer=nullcontext, prefill_chunk: int = 0, rows: list | None = None, budget=None) -> None:
    """Decode requests in ``len(proposers)`` slots at once (continuous batching), token for token what vanilla
    decoding gives each of them alone.

    ``feed(slot, done)`` hands the slot its next request (None: nothing more for it): first with ``done`` None, then
    whenever the slot's request has finished, with ``done`` = (that request, its Generation), so that the caller
    keeps the result and may give the slot the same question's next turn. Slot i drafts with ``proposers[i]``
    (``Proposer.fork``). Every step, each busy slot proposes, in slot order; one forward verifies every slot's draft
    (``methods.verify.step_rows``: each row seeing its own prefix and tree); then each slot learns and commits, in
    slot order, so that state the proposers share (Token Recycling's hot matrix) is updated in an order that does not
    depend on timing.

    A new request's prompt is prefilled alone (one row's forward, before the next step), or with ``prefill_chunk``
    > 0 and an engine that runs rows unpadded (``Engine.ragged``), in chunks of that many tokens that ride along
    the batch's steps: each step's forward then also takes the next chunk of every slot still prefilling,
    after which (the prompt's last chunk) the slot joins the steps. The others' steps go on meanwhile, at a cost
    of a few tokens in a forward of many, where a prefill alone would stall them (Sarathi-Serve's chunked
    prefills, Agrawal et al., OSDI 2024). With one slot this is ``generate``'s loop exactly. ``rows`` (a list of
    one None per slot) is kept as each slot's request in flight, for a caller that saves how far they got
    (``_Row.progress``). ``budget`` (a ``methods.budget.Budget``: ``runtime.budget``, ``runtime.spec_off_above``)
    cuts each step's drafts before the forward and learns from what it verified; its cut changes no token.
    """
    rows = [None] * len(proposers) if rows is None else rows  # the caller's list, where it wants to see the rows
    chunk = prefill_chunk if len(proposers) > 1 and engine.ragged else 0

    def fill(slot: int, done) -> None:
        while (request := feed(slot, done)) is not None:
            row = _Row(slot, request, proposers[slot], engine, stop_ids, timer)
            row.open()
            if not chunk:
                row.prefill()
            if not row.finished:
                rows[slot] = row
                return
            row.proposer.finish(row.new)
            done = (request, row.generation())
        rows[slot] = None

    engine.start(0, rows=len(proposers))
    for slot in range(len(proposers)):
        fill(slot, None)
    while busy := [row for row in rows if row is not None]:
        filling = [row for row in busy if row.filling]
        stepping = [row for row in busy if not row.filling]
        plans = [None] * len(stepping)
        if budget is not None and budget.active and stepping:
            asked, probe = budget.drafting(len(stepping))
            checks = [row.propose(a) for row, a in zip(stepping, asked)]
            drafts, plans = budget.plan([c.draft for c in checks], asked, [row.draft_seconds for row in stepping],
                                        probe, len(proposers))
            for c, d in zip(checks, drafts):
                c.draft = d
        else:
            checks = [row.propose() for row in stepping]
        chunks = [row.chunk(chunk) for row in filling]
        first = busy[0].proposer  # one method: one top-k and hidden request for all
        results, fed = step_rows(engine, checks, chunks, timer, first.topk, first.wants_hidden)
        slots = engine.last_slots - sum(c.tokens.shape[0] for c in chunks)  # the drafts' positions, padding included
        for row, check, result, plan in zip(stepping, checks, results, plans):
            if plan is not None:
                budget.learn(check.draft, result)
            row.settle(check.draft, result, len(stepping), slots, plan)
        for row, c, (logits, states) in zip(filling, chunks, fed):
            row.fed(c, logits, states)
        for row in busy:
            if row.finished:
                row.proposer.finish(row.new)
                fill(row.slot, (row.request, row.generation()))


def generate(target, proposer: Proposer, prompt_ids: list[int], *, max_new_tokens: int, stop_ids: set[int],
             turn: int = 0, timer=nullcontext, sampler=None) -> Generation:
    """Decoding of ``prompt_ids`` with ``proposer``'s drafts, token for token what vanilla decoding gives:
    greedy, or with ``sampler`` (a ``methods.sampling.Sampler`` of the request's question and turn) its
    position-keyed draws: ``decode_batch`` with one slot.

    ``target`` is an ``Engine`` (``methods.engine``), or a Hugging Face model, run by the reference
    engine ``hf``. ``timer(phase)`` is a context manager around each phase; profiling passes a ``PhaseTimer``.
    """
    engine = target if isinstance(target, Engine) else HFEngine(target)
    return decode_all(engine, [proposer], [Request(prompt_ids, max_new_tokens, turn, sampler)], stop_ids=stop_ids,
                      timer=timer)[0]


def decode_all(engine: Engine, proposers: list[Proposer], requests: list[Request], *, stop_ids: set[int],
               timer=nullcontext, prefill_chunk: int = 0, budget=None) -> list[Generation]:
    """``requests`` decoded in ``len(proposers)`` slots (``decode_batch``, ``budget`` its), a freed slot taking the
    next request in order: their Generations, in the requests' order."""
    at = {id(r): i for i, r in enumerate(requests)}
    queue, out = list(requests), [None] * len(requests)

    def feed(slot, done):
        if done is not None:
            out[at[id(done[0])]] = done[1]
        return queue.pop(0) if queue else None

    decode_batch(engine, proposers, feed, stop_ids=stop_ids, timer=timer, prefill_chunk=prefill_chunk, budget=budget)
    return out
