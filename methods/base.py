"""What a decoding method is: a proposer of draft trees, plus the registry that names them.

A proposer never sees the model. The shared loop (``methods.decode``) asks it for
a draft tree, the shared verifier (``methods.verify``) checks the tree in one
forward pass, and the proposer learns from the result.

Adding a method touches its own module only: a ``Proposer`` subclass with its ``Params``
declaration (``methods.params``), decorated with ``@register``, in a module of ``methods/proposers/`` (found
there by ``registry``; a method that lives elsewhere is registered when its module is imported). The runner
names no method: what a method must do before the first question (TR's ``tree=auto``
calibration) goes in its ``prepare`` hook, and what it leaves beside the answers (the chosen
tree) in its ``artefacts`` hook.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from methods.common import HarnessError
from methods.params import parse
from methods.tree import Tree


@dataclass
class Draft:
    """A tree of guesses rooted at the newest committed token."""

    tokens: torch.Tensor  # [n] long, tokens[0] is the root (the last committed token)
    tree: Tree  # topology of the n nodes, same device as tokens
    acceptable: torch.Tensor | None = None  # [n] bool; False: forwarded for its logits, never accepted
    depth: int | None = None  # depth of the deepest acceptable node (None: the tree's depth), for the answer file
    info: dict | None = None  # what the proposer records about this step in the answer file (a hybrid: which
    #                           drafter drafted it), JSON-able: ``step_info`` there, one entry per step
    q: torch.Tensor | None = None  # [n, vocab]: row i the distribution node i's children were sampled from (without
    #                                replacement), for the rejection rule at temperature > 0 (methods.sampling)
    keys: list[int] | None = None  # [n] the proposer's score class of each node (a rank, a match length), which a
    #                                per-step budget learns acceptance odds by (methods.budget); None: by depth alone
    whole: bool = False  # True: its update reads every node's logits (Lookahead's window): a budget keeps all or none
    kept: list[int] | None = None  # set by a budget that cut the draft: the proposed node index of each node left

    @property
    def acceptable_depth(self) -> int:
        return self.tree.max_depth if self.depth is None else self.depth


@dataclass
class Verification:
    """What one forward of a draft tree established."""

    path: list[int]  # accepted node indices, root first (always starts with 0)
    new_tokens: list[int]  # tokens committed by this step: drafts on the path, then the bonus token
    logits: torch.Tensor  # [n, vocab] target logits at every node of the draft
    argmax: torch.Tensor  # [n] long, the target's next token at every node: its argmax, or at temperature > 0
    #                       its draw for that position (methods.sampling), which acceptance compares drafts with
    topk: torch.Tensor | None = None  # [n, proposer.topk] long, top tokens per node, for proposers that ask
    hidden: torch.Tensor | None = None  # [len(path), hidden] target's last hidden states on the path, if asked
    past_answer: bool = False  # a forward past the answer (``Proposer.ending``): count it in no statistic
    learn: bool = True  # False: the proposer's reference does not learn from this forward (``Proposer.ending``)


@dataclass(frozen=True)
class Ending:
    """Where a method's reference code ends a request, when that is later than where ours does (``Proposer.ending``).

    Ours ends a request once it has ``max_new_tokens`` tokens or a stop token. The references of Token
    Recycling and SAM-Decoding keep a forward's bonus token pending, as the root of the next draft, and test
    the end on what a forward committed: its root and accepted drafts. So they forward once or twice past our
    end. Those forwards change no answer token, but what the proposer learns from them outlives the request
    (Token Recycling's matrix under a hot start), and with it the next request's drafts. With an ``Ending``
    the loop (``methods.decode``) goes on forwarding past the answer until the reference would stop:

    * ``past``: it stops after a forward once ``max_new_tokens + past`` tokens exist, counted as forwarded
      (the tokens a step has past the budget, which the answer drops, included);
    * ``stops_on_bonus``: a stop token as a forward's bonus stops it, that forward learned from; otherwise
      the stop token roots one more forward, whose committed tokens then hold it;
    * ``learns_last``: whether the forward that stops it on its committed tokens (a stop token among them,
      or the count) is learned from (``Proposer.update``); a reference that leaves its loop before its
      update does not learn from it (``Verification.learn``: the proposer keeps its statistics of the answer).

    ``learns_on_bonus``: whether a forward whose bonus stops the reference is learned from (``stops_on_bonus``);
    ``max_forwards``: its loop makes at most ``max_new_tokens`` forwards after the prefill, the last learned from.

    ``Ending(past=0, learns_last=True, stops_on_bonus=True)`` is our own rule.
    """

    past: int
    learns_last: bool
    stops_on_bonus: bool
    learns_on_bonus: bool = True
    max_forwards: bool = False

    def ends(self, committed: list[int], bonus: int, produced: int, max_new_tokens: int,
             stop_ids: set[int], forwards: int = 0) -> tuple[bool, bool]:
        """(whether the reference stops after this forward, whether it learns from it), for a forward that
        committed ``committed`` (its root, where generated, and its accepted drafts; the prefill: none) and
        drafted ``bonus`` next, ``produced`` tokens then existing, the request's ``forwards``-th after its prefill."""
        if any(t in stop_ids for t in committed) or produced >= max_new_tokens + self.past:
            return True, self.learns_last
        if self.stops_on_bonus and bonus in stop_ids:
            return True, self.learns_on_bonus
        return self.max_forwards and forwards >= max_new_tokens, True


@dataclass
class Preparation:
    """What a proposer may use before the first question (``Proposer.prepare``), before anything is timed."""

    engine: object  # the run's engine (methods.engine): its device, its dtype, its cost per step
    model_name: str  # the model config's name, for cache keys
    stop_ids: set[int]  # the tokens that end a turn
    prompts: Callable[[int], list[list[int]]]  # the first n of the project's own prompts (never the benchmark's),
    #                                             as token ids in this model's chat template
    cache: Path  # the project's cache (HARNESS_CACHE): a method keeps what it measures once in a subfolder
    batch_size: int = 1  # rows verified per forward (runtime.batch_size): what a step's cost is measured for

    def describe(self) -> str:
        """The model, device, threads and engine, for an artefact's description."""
        import torch

        return (f"{self.model_name} on {self.engine.device} ({torch.get_num_threads()} threads), engine "
                f"{self.engine.name}")


class Proposer:
    """Interface every method implements.

    * ``Params``: the declaration of its parameters (a dataclass of ``methods.params.param``
      fields); ``build(params, vocab_size=, device=[, target=])`` makes the proposer from a
      checked instance of it.
    * ``prepare(preparation)`` once, before the first question and before any timing: work
      that needs the engine (a calibration); ``artefacts()`` after it: files to save beside
      the answers.

    * ``reset(prompt_ids, turn, prompt_logits, prompt_hidden)`` after the prefill of
      every request (``turn`` counts from 0 within a question); methods that keep state
      across requests (Token Recycling's hot start) decide here what to keep.
      ``prompt_ids`` are the tokens the prefill forwarded: the prompt, or the prompt but
      its last token for a proposer that sets ``drafts_first`` (``methods.decode``).
      ``prompt_logits`` ([prompt_len, vocab]) is given only to methods that set
      ``wants_prompt_logits``: the other prefills compute the last position only.
      ``prompt_hidden`` ([prompt_len, hidden], the target's last hidden states, what its
      lm_head reads) only to methods that set ``wants_hidden``, which also get the
      accepted path's hidden states in every ``Verification``; a ``wants_hidden`` that is a
      tuple of layer indices asks for the inputs of those decoder layers instead, side by
      side (EAGLE-3's features).
    * ``propose(context)``: ``context`` is the committed sequence, prompt included,
      whose last element is the root. Returns a ``Draft``.
    * ``update(draft, result)``: learn from the verification of that draft.
    * ``ending``: None, or where the method's reference code ends a request (``Ending``): the loop then
      forwards past the answer as that code does, for what the proposer learns from those forwards. Its
      ``update`` then sees ``result.past_answer`` (count this forward in no statistic) and ``result.learn``
      (False: learn nothing from it, as the reference does not); the answer and its counts are unchanged.
    """

    name: ClassVar[str]
    Params: ClassVar[type]
    wants_prompt_logits: ClassVar[bool] = False
    wants_hidden: bool | tuple[int, ...] = False
    needs_target: ClassVar[bool] = False  # build() gets the target model (EAGLE shares its embeddings, lm_head)
    drafts_first: bool = False  # the prefill leaves out the prompt's last token, which roots the first draft
    drafts: ClassVar[bool] = True  # False: never drafts (vanilla), for the step-counting conventions of metrics
    samples_like_vanilla: bool = True  # False: at temperature > 0 its tokens have the target's distribution but are
    #                                    not vanilla sampling's draws (EAGLE-1's verify=specinfer)
    wants_sampler: bool = False  # True: the loop sets ``sampler`` (the turn's methods.sampling.Sampler, or None
    #                              when greedy) before ``reset``, for a proposer that samples its drafts
    topk: int = 0  # > 0: the verifier hands back the top-k tokens of every node (one pass gives the argmax too)
    min_layers: ClassVar[int] = 1  # the fewest decoder layers a target may have (EAGLE-3 reads layers 2, L/2, L-3)
    ending: Ending | None = None  # where the reference ends a request, when later than ours (``Ending``)
    # True: its per-request state is rebuilt from the committed context alone (``propose`` catches up on it), so a
    # request cut off part-way can go on in another process from exactly where it was (``methods.decode.Progress``;
    # a resumed batched run of a method whose slots share state, Token Recycling's hot matrix, needs it). False: a
    # resumed run decodes such a request again from its start, with the slot's state as it was then.
    resumes_mid_request: ClassVar[bool] = False
    # True: its drafts depend on the committed tokens alone (no logits, no hidden states), so that its acceptance over
    # recorded answers can be simulated without the target (``python -m evaluation.simulate``)
    token_only: ClassVar[bool] = False
    # What its drafts learn from earlier requests, for the run's record: "none", "question" (the earlier turns of the
    # same question: Token Recycling's cold start) or "run" (every earlier request of the run: its hot start,
    # SuffixDecoding's global tree, SpS's draft length)
    memory: str = "none"

    @classmethod
    def example(cls, folder: Path, prompts: list[list[int]]) -> dict:
        """Parameters that run this method on a small random target (of at least ``min_layers`` layers) where its
        defaults cannot: a random head, a drafter made of the target's first layer, a datastore made from
        ``prompts`` (the token ids to be decoded) in ``folder``. What every check that covers all registered
        methods uses (the lossless and sampling tests on small models, the GPU check). Default: the defaults."""
        return {}

    @classmethod
    def check(cls, params) -> None:
        """Refuse, from the checked ``params`` alone, what ``build`` would refuse only after the target has loaded
        (a head the model config does not name, a missing corpus file): nothing by default."""

    @classmethod
    def build(cls, params, *, vocab_size: int, device: torch.device) -> "Proposer":
        raise NotImplementedError

    def prepare(self, preparation: Preparation) -> None:
        """Before the first question: nothing by default."""

    def artefacts(self) -> dict[str, object]:
        """Files to write beside the answers once prepared: {file name: JSON-able object}."""
        return {}

    def reset(self, prompt_ids: torch.Tensor, turn: int, prompt_logits: torch.Tensor | None,
              prompt_hidden: torch.Tensor | None = None) -> None:
        pass

    def propose(self, context: torch.Tensor) -> Draft:
        raise NotImplementedError

    def update(self, draft: Draft, result: Verification) -> None:
        pass

    def finish(self, answer: list[int]) -> None:
        """The slot's request ended with ``answer`` (its new tokens, the stop token included): nothing by default; a
        proposer that remembers answers across requests (SuffixDecoding's global tree) takes those it has not seen."""

    def after_warmup(self) -> None:
        """The run's warm-up passes (``warmup``) are over: nothing by default (Token Recycling's matrix keeps what
        they taught it, as its paper's runs do); a proposer whose memory must hold only the timed answers forgets
        theirs here."""

    def skipped(self, draft: Draft, result: Verification) -> None:
        """A step that a per-step budget (``methods.budget``) took plain without asking for a draft (``propose`` and
        ``update`` were not called; ``draft`` is the root alone): nothing by default, for a proposer that catches up
        on the committed context in its next ``propose``; one that follows the target's features step by step takes
        the step's here, and Token Recycling the root's row."""

    def fork(self) -> "Proposer":
        """A proposer for another slot of a batch (``methods.decode.decode_batch``): it shares what is read-only or
        meant to be shared by the batch (weights, a corpus, Token Recycling's hot-start matrix, statistics) and has
        its own per-request state. The default, a shallow copy, serves a proposer whose per-request state is
        all set anew in ``reset``; one that keeps a scratch cache or per-request state in place says so here."""
        return copy.copy(self)

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
PROPOSERS = "methods.proposers"  # the package whose every module is a method's (or a helper of one)


def register(cls):
    """Class decorator: make a Proposer known by its ``name`` (to ``build_proposer``, to Hydra as ``method=NAME``,
    and to every check that covers all methods: the lossless and sampling tests, the GPU check)."""
    _REGISTRY[cls.name] = cls
    return cls


@functools.cache
def _import_proposers() -> None:
    """Import every module of ``methods/proposers/`` (once per process): each registers its methods."""
    import importlib
    import pkgutil

    package = importlib.import_module(PROPOSERS)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{PROPOSERS}.{module.name}")


def registry() -> dict[str, type]:
    """Every registered method by name: each module of ``methods/proposers/`` is imported (a new method's module
    needs no list to join), and a method registered from elsewhere is included once its module is imported."""
    _import_proposers()
    return dict(sorted(_REGISTRY.items()))


def known_methods() -> list[str]:
    return list(registry())


def check_method(name: str, params: dict):
    """Method ``name``'s parameters (plain Python values) checked against its ``Params``, the defaults filling what
    is absent, and by its ``check``: what can be refused before any model loads. Returns the checked ``Params``."""
    methods = registry()
    if name not in methods:
        raise HarnessError(f"unknown method '{name}'; known: {', '.join(methods)}")
    checked = parse(methods[name].Params, params, f"method '{name}'")
    methods[name].check(checked)
    return checked


def check_artefacts(name: str, params: dict) -> None:
    """The hub ids method ``name``'s parameters name for what the model config provides (a head, a drafter:
    ``methods.params.artefact``), each to be had: in the hub's cache when there is no network. Said before the
    target's weights load (after the settings alone, ``check_method``, and the target's own checkpoint)."""
    from methods import hub
    from methods.params import artefact_key

    checked = check_method(name, params)
    for f in dataclasses.fields(checked):
        value = getattr(checked, f.name)
        if not artefact_key(f) or not isinstance(value, str) or ":" in value or value == "random":
            continue
        try:
            where = hub.locate(value, f"method.{f.name}")
        except HarnessError:
            continue  # a missing folder: the method's own check or build says so in its words
        if isinstance(where, str) and hub.offline() and not hub.in_cache(where):
            raise hub.not_cached(where, f"method.{f.name}")


def build_proposer(name: str, params: dict, *, vocab_size: int, device: torch.device, target=None) -> Proposer:
    """Instantiate method ``name`` with its parameters (``check_method``).

    ``target`` (the target model) goes only to methods that set ``needs_target``.
    """
    checked = check_method(name, params)
    cls = registry()[name]
    if cls.needs_target:
        if target is None:
            raise HarnessError(f"method '{name}' drafts with the target model's own layers; build it with target=")
        return cls.build(checked, vocab_size=vocab_size, device=device, target=target)
    return cls.build(checked, vocab_size=vocab_size, device=device)
