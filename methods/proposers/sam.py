"""SAM-Decoding (Hu et al., arXiv 2411.10666, ACL 2025): drafts found by suffix automata, alone or with a tree drafter.

Every step looks for the longest suffix of the committed sequence (its newest token, the root,
included) that occurred before, in two suffix automata (``methods.automata``), three with ``memory=run``
(the run's earlier answers: below):

* the **dynamic** one over the request's prompt and output so far, all but the root (rebuilt for
  every request; a second turn's prompt holds the first turn);
* the **static** one over a corpus (``method.corpus``, by default the model config's
  ``sam_corpus``), whose match length counts ``static_bias`` less.

When the better match scores at least ``threshold`` (a tie goes to the dynamic automaton), what
followed its first occurrence is the draft:

* from the dynamic automaton, a chain of up to ``max_draft`` tokens and, with ``alpha``, of at most
  ``alpha`` times the match score; in the hybrids the match first moves to a shorter one whose first
  occurrence is followed by enough tokens, when the longest one's is not (SAM-Decoding's ``to_anc``;
  ``Retrieval``'s ``walk``);
* from the static automaton, in ``sam`` a tree of the corpus's most frequent continuations, best
  first (as many nodes as the chain would have, at most 8 per depth:
  ``FrozenAutomaton.frequent_tree``); in the hybrids a chain, as from the dynamic one.

Otherwise the step is the tree drafter's:

* ``sam``: none, a plain step;
* ``sam_tr``: Token Recycling (``methods.proposers.tr``) on SAM-Decoding's own tree (``samd-tr``:
  60 drafts, depth 5); its matrix learns from every verified node, whichever drafter drafted it, and
  from the prompt's prefill logits (``start=hot_prompt``);
* ``sam_eagle2``: EAGLE-2 (``methods.proposers.eagle``), whose head is fed every accepted token.

This follows SAM-Decoding's code (hyx1999/SAM-Decoding, commit 18c41f055b424fa3fa0bac41a8953d34cea1ed77).
The hybrids: ``DraftModel.lookup`` in ``samd/draft.py`` (the choice), ``DynSAM`` and ``StaticSAM`` in
``samd/sam/`` (``transfer_state``, ``to_anc``, ``gen_draft``), the prefill's update in
``samd/samd_model.py``, TR's tree ``samd/config/token_recycle.json`` and the defaults of
``samd/samd_config.py`` and ``scripts/inference_samd.sh`` (``n_predicts=40`` tokens with the root,
so 39 drafts; threshold 5; bias 5; no ``alpha``). ``sam`` alone: the reference's SAM-only variant,
``samd_sam_only/draft.py`` ``DraftModel.lookup`` (a draft at every step from the better match, however
short), ``samd_sam_only/sam/dyn_sam.py`` ``gen_draft`` (``min(max_predicts, 1 + int(alpha * length))``
tokens with the root, from the longest match: no walk) and ``samd_sam_only/sam/static_sam.py``
``StaticSAM.gen_draft`` (the tree), with the defaults of ``samd_sam_only/samd_config.py`` and
``scripts/inference_samd_sam_only.sh`` (``max_predicts=60``: 59 drafts; ``alpha=4``; bias 0; ``K=8``).

``reference=true`` is that code step for step, checked on the embedded model against the reference
code itself (accept lengths equal at every step of 12 Spec-Bench first turns, for ``sam`` with and
without a corpus and for ``sam_tr``). Where the default differs, the tokens are the same and only the
work differs, each measured on those 12 turns where it matters:

* the hybrids' walk needs ``max_draft`` tokens after the match for a chain of ``max_draft``; the
  reference's ``to_anc`` wants ``n_predicts``, one more (``samd/sam/dyn_sam.py`` line 102: MAT of
  ``sam_tr`` 2.308 ours, 2.304 the reference's rule);
* a continuation shorter than the chain is drafted as it is, and a match with nothing after it
  falls back to the tree drafter; the hybrids' reference pads the chain to ``n_predicts`` with
  token 0 (``samd/sam/dyn_sam.py`` lines 110-112, ``static_sam.py`` lines 122-124), so that it
  verifies a chain of padding there, as ``reference=true`` does;
* ``sam``'s defaults are the reference's (reference=true changes nothing for it): its walk-free
  chains (MAT 1.574 without a corpus, 1.570 with the hybrids' walk) and static tree (1.919 with
  the embedded model's corpus, 1.780 for a chain from the first occurrence);
* the corpus (``scripts.make_sam_corpus``) keeps its sequences apart; the reference's tools join
  them with EOS and add every vocabulary token as a one-token sequence (``--layout reference``,
  which ``reference=true`` needs to be step for step the reference's: ``sam`` MAT 1.910 with it,
  1.919 apart).

One thing is not the reference's even so: where a static tree's path ends before the tree's
deepest level, the reference pads it with token 0 and, should the model predict token 0 there,
accepts it with the logits of the tree's last node (``samd_sam_only/utils.py`` lines 95-96,
``samd_sam_only/samd_model.py`` lines 144-154), which is no longer greedy decoding; here the path ends.

New here: ``merge=true`` (hybrids) verifies the chain and the tree drafter's tree together, the
chain grafted onto the tree where they share a prefix (``methods.tree.graft``), so that no step has
to choose; ``max_draft=auto`` caps the chain, by match score, where the tokens it is expected to
get accepted stop paying for its rows on this device (``methods.calibrate.chain_budget``; ``sam``'s
static tree takes the same cap). ``memory=run`` adds a third automaton, over the run's earlier answers
(``Memory``: each answer joining it once it ends), matched as the
dynamic one is; ``memory_tree=true`` drafts the chains of both the request's text and the memory, grafted
into one tree. Every step's drafter and best match score go to the answer file (``step_info``).
"""
from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import torch

from methods.automata import SEPARATOR, FrozenAutomaton, SuffixAutomaton, corpus_automaton
from methods.base import Draft, Ending, Preparation, Proposer, Verification, register
from methods.calibrate import chain_budget
from methods.common import CACHE, ROOT, HarnessError
from methods.params import AUTO, artefact, param
from methods.proposers.eagle import Eagle2
from methods.proposers.tr import FIRST_STEPS, STARTS, TokenRecycling
from methods.tree import Tree, graft

DYNAMIC, STATIC, MEMORY = "sam", "sam_static", "sam_memory"  # a retrieved step's drafter: the automaton it came from
TREE_WIDTH = 8  # the static tree's most nodes per depth and children per node (samd_sam_only/samd_config.py K)


@dataclass(frozen=True)
class Match:
    source: str  # DYNAMIC, STATIC or MEMORY
    length: int  # tokens matched, the root included
    score: int  # length, less static_bias for the static automaton
    state: int  # the state of that automaton holding the match


class Memory:
    """The run's earlier answers in one growing automaton (``memory=run``), each followed by ``SEPARATOR``, which the
    slots of a batch share; ``version`` counts the answers in it, so that a slot knows when to find its match anew."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.automaton, self.version = SuffixAutomaton(), 0

    def add(self, answer: list[int]) -> None:
        self.automaton.extend([*answer, SEPARATOR])
        self.version += 1

    def continuation(self, state: int, n: int) -> list[int]:
        """Up to ``n`` tokens after the first occurrence of ``state``'s strings, within its answer."""
        out = self.automaton.continuation(state, n)
        return out[: out.index(SEPARATOR)] if SEPARATOR in out else out


class Retrieval:
    """The automata of one run: the dynamic one per request, the static one (optional) fixed, and the run's memory
    (optional, ``Memory``) of earlier answers.

    ``walk``: before a dynamic chain of ``n`` tokens, the match moves along suffix links to shorter ones while its
    first occurrence is followed by fewer than ``n + walk`` tokens (SAM-Decoding's ``to_anc``,
    ``samd/sam/dyn_sam.py`` lines 99-105, whose ``n_predicts`` counts the root: ``walk=1`` there); None: never
    (its SAM-only method, ``samd_sam_only/sam/dyn_sam.py``, whose ``gen_draft``, lines 116-121, drafts from the
    longest match).
    Worked example, the text ``2 5 6 7 8 1 2 4 3 9 1`` and the root 2: the longest match "1 2" first ends with 4
    tokens after it, its suffix "2" with 10. A chain of 4 is [4 3 9 1] without a walk or with ``walk=0``, and
    [5 6 7 8] with ``walk=1`` (4 < 4 + 1); a chain of 5 is [4 3 9 1] without a walk, [5 6 7 8 1] with one."""

    def __init__(self, corpus: FrozenAutomaton | None, static_bias: int, walk: int | None = 0,
                 memory: Memory | None = None):
        self.corpus, self.static_bias, self.walk, self.memory = corpus, static_bias, walk, memory
        self.reset()

    def reset(self) -> None:
        self.dynamic = SuffixAutomaton()
        self.cursor = self.static_cursor = (0, 0)  # (state, length) of the longest earlier match of the text's end
        self.memory_cursor, self.memory_version = (0, 0), -1  # the same in the memory, as of its version

    def sync(self, context: torch.Tensor) -> None:
        """Feed the automata the committed tokens they have not seen, all but the root; where the memory took an
        answer since, its match is found anew over the whole context."""
        fed, end = len(self.dynamic), len(context) - 1
        memory = self.memory
        if memory is not None and memory.version != self.memory_version:
            self.memory_cursor = memory.automaton.walk(context[:fed].tolist())
            self.memory_version = memory.version
        if end <= fed:
            return
        dynamic, corpus = self.dynamic, self.corpus
        for t in context[fed:end].tolist():
            self.cursor = dynamic.advance(*self.cursor, t)  # matched in the text before t joins it
            dynamic.extend((t,))
            self.cursor = dynamic.settle(*self.cursor)
            if corpus is not None:
                self.static_cursor = corpus.advance(*self.static_cursor, t)
            if memory is not None:
                self.memory_cursor = memory.automaton.advance(*self.memory_cursor, t)

    def best(self, root: int) -> Match | None:
        """The best of the automata's longest matches ending at ``root`` (None: none matches); on a tie the request's
        own text, then the memory."""
        state, length = self.dynamic.advance(*self.cursor, root)
        best = Match(DYNAMIC, length, length, state) if length else None
        remembered = self.remembered(root)
        if remembered is not None and (best is None or remembered.score > best.score):
            best = remembered
        if self.corpus is not None:
            state, length = self.corpus.advance(*self.static_cursor, root)
            if length and (best is None or length - self.static_bias > best.score):
                best = Match(STATIC, length, length - self.static_bias, state)
        return best

    def remembered(self, root: int) -> Match | None:
        """The memory's longest match ending at ``root``, or None."""
        if self.memory is None:
            return None
        state, length = self.memory.automaton.advance(*self.memory_cursor, root)
        return Match(MEMORY, length, length, state) if length else None

    def chain(self, match: Match, n: int) -> list[int]:
        """Up to ``n`` tokens that followed ``match``'s first occurrence (the dynamic one's after the ``walk``)."""
        if match.source == STATIC:
            return self.corpus.continuation(match.state, n)
        if match.source == MEMORY:
            return self.memory.continuation(match.state, n)
        d, state = self.dynamic, match.state
        if self.walk is not None:
            while d.link[state] > 0 and len(d) - d.end[state] < n + self.walk:
                state = d.link[state]
        return d.continuation(state, n)


def corpus_path(ref: str) -> Path:
    """``method.corpus``: a file as given, or relative to the project root."""
    path = Path(ref).expanduser()
    for candidate in (path,) if path.is_absolute() else (path, ROOT / path):
        if candidate.is_file():
            return candidate
    raise HarnessError(f"method.corpus={ref}: no such file; make it with python -m scripts.make_sam_corpus "
                       f"--model MODEL [--texts FILE.jsonl] --out {ref}, or set method.corpus=null to draft from the "
                       f"request alone")


class _Retrieving(Proposer):
    """SAM's chain when its match scores at least ``threshold``, else ``Drafter``'s step (None: a plain step)."""

    Drafter: ClassVar[type | None] = None
    STATIC_TREE: ClassVar[bool] = False  # the static automaton drafts a chain (samd/sam/static_sam.py, lines 119-125)
    WALK: ClassVar[int | None] = 0  # Retrieval's walk: ours, a chain of n needs n tokens after its match
    REFERENCE_WALK: ClassVar[int | None] = 1  # reference=true: samd's to_anc, n + 1 with the root
    REFERENCE_PADS: ClassVar[bool] = True  # reference=true: a chain is padded to max_draft with token 0 (samd)

    @classmethod
    def example(cls, folder, prompts) -> dict:
        return cls.Drafter.example(folder, prompts) if cls.Drafter is not None else {}

    @dataclass
    class Params:  # the hybrids' defaults (samd/samd_config.py, scripts/inference_samd.sh)
        max_draft: int | str = param(39, "most tokens a retrieved chain drafts (the reference's n_predicts less the "
                                     "root), or auto (capped by match score where they stop paying on this "
                                     "device)", low=1, high=1024, auto=True)
        threshold: int = param(5, "a match of at least this score drafts a chain (SAM-Decoding's len_threshold)",
                               low=1, high=1024)
        static_bias: int = param(5, "the static automaton's match length counts this much less (len_bias)",
                                 low=0, high=1024)
        alpha: float = param(0.0, "a chain drafts at most alpha x the match score (the SAM-only variant's rule); "
                             "0: no such limit", low=0)
        corpus: str | None = param(None, "the static automaton's corpus file (scripts.make_sam_corpus), or null; "
                                   "in a run, the model config's artefacts.sam_corpus", config=artefact("sam_corpus"))
        reference: bool = param(False, "true: step for step SAM-Decoding's code (samd_sam_only for sam, whose "
                                "defaults are already its; samd for the hybrids): the walk to an earlier match needs "
                                "max_draft + 1 tokens after it (not max_draft), chains are padded to max_draft with "
                                "token 0, and sam_tr ends a request as samd's loop does; exact with a corpus in the "
                                "reference's layout (scripts.make_sam_corpus --layout reference)")
        memory: str = param("none", "run: a third automaton over the run's earlier answers (the warm-up's left out), "
                            "matched beside the request's own (SuffixDecoding's memory, not SAM-Decoding's); none",
                            choices=("none", "run"))
        memory_tree: bool = param(False, "memory=run: where both the request's text and the memory match, draft both "
                                  "chains as one tree")

    def __init__(self, params, drafter: Proposer | None, corpus: FrozenAutomaton | None, about: dict | None,
                 device: torch.device):
        self.max_draft, self.threshold, self.alpha = params.max_draft, params.threshold, params.alpha
        self.longest = type(params)().max_draft  # the declared default: the chain of the reference, auto's probe
        self.static_bias, self.corpus_file, self.corpus_about = params.static_bias, params.corpus, about
        self.merge, self.reference = getattr(params, "merge", False), params.reference
        self.pads = params.reference and self.REFERENCE_PADS
        self.static_tree = self.STATIC_TREE
        self.drafter, self.device = drafter, device
        self.retrieval = Retrieval(corpus, params.static_bias,
                                   walk=self.REFERENCE_WALK if params.reference else self.WALK,
                                   memory=Memory() if params.memory == "run" else None)
        self.memory_tree = params.memory_tree and params.memory == "run"
        self.budget: dict | None = None  # max_draft=auto: the caps by match score (methods.calibrate)
        self.log: list[tuple[int, int, int]] | None = None  # calibration: (score, drafted, accepted) per chain
        self.steps, self.accepted = Counter(), Counter()  # per drafter, for the summary
        if drafter is not None:  # the verifier and the loop serve the tree drafter as they would alone
            self.topk, self.drafts_first = drafter.topk, drafter.drafts_first
            self.wants_prompt_logits, self.wants_hidden = drafter.wants_prompt_logits, drafter.wants_hidden

    @classmethod
    def _drafter_params(cls, params):
        """The tree drafter's own parameters, from the hybrid's."""
        return cls.Drafter.Params(**{f.name: getattr(params, f.name) for f in fields(cls.Drafter.Params)})

    @classmethod
    def check(cls, params) -> None:
        if cls.Drafter is not None:
            cls.Drafter.check(cls._drafter_params(params))
        if params.reference and (params.max_draft == AUTO or getattr(params, "merge", False)
                                 or params.memory != "none"):
            raise HarnessError("method.reference=true drafts as SAM-Decoding's code does, which has neither "
                               "max_draft=auto, merge=true nor a memory: give max_draft a number, leave merge false "
                               "and memory none")
        if params.corpus:
            corpus_path(params.corpus)

    @classmethod
    def build(cls, params, *, vocab_size: int, device: torch.device, target=None) -> "_Retrieving":
        drafter = None
        if cls.Drafter is not None:
            extra = {"target": target} if cls.Drafter.needs_target else {}
            drafter = cls.Drafter.build(cls._drafter_params(params), vocab_size=vocab_size, device=device, **extra)
        corpus, about = corpus_automaton(corpus_path(params.corpus), CACHE / "sam") if params.corpus else (None, None)
        return cls(params, drafter, corpus, about, device)

    @property
    def corpus_digest(self) -> str | None:
        return self.corpus_about.get("sha256") if self.corpus_about else None

    def probe(self) -> "SamDecoding":
        """``sam`` with this run's automata and settings and the reference's chain length, logging its chains
        (max_draft=auto's calibration)."""
        memory = "run" if self.retrieval.memory is not None else "none"
        params = SamDecoding.Params(max_draft=self.longest, threshold=self.threshold, static_bias=self.static_bias,
                                    alpha=self.alpha, corpus=self.corpus_file, memory=memory)
        probe = SamDecoding(params, None, self.retrieval.corpus, self.corpus_about, self.device)
        probe.static_tree = False  # the caps are a chain's: the corpus's matches draft chains here too
        probe.retrieval.walk = self.retrieval.walk
        probe.log = []
        return probe

    def chain_settings(self) -> tuple[str, dict]:
        """What max_draft=auto's calibration depends on: its cache file's name part, and the settings it records."""
        walk = self.retrieval.walk
        corpus = self.corpus_digest or "none"
        memory = self.retrieval.memory is not None
        key = (f"sam-{corpus}-t{self.threshold}-b{self.static_bias}-a{self.alpha:g}-n{self.longest}-"
               f"w{'none' if walk is None else walk}{'-mrun' if memory else ''}")
        return key, {"max_draft": self.longest, "threshold": self.threshold, "static_bias": self.static_bias,
                     "alpha": self.alpha, "walk": walk, "corpus": self.corpus_file, "corpus_sha256": corpus,
                     **({"memory": "run"} if memory else {})}

    def prepare(self, preparation: Preparation) -> None:
        if self.drafter is not None:
            self.drafter.prepare(preparation)
        if self.max_draft == AUTO and self.budget is None:
            self.budget = chain_budget(self, preparation, other=self._other_step())

    def _other_step(self) -> tuple[float, int] | None:
        """(tokens, nodes) of a step without a chain, where known (TR's tree=auto), for the chain's budget."""
        auto = getattr(self.drafter, "auto", None)
        return (auto["mat"], self.drafter.tree.size) if auto else None

    def artefacts(self) -> dict[str, object]:
        out = dict(self.drafter.artefacts()) if self.drafter is not None else {}
        if self.budget is not None:
            out["chain_budget.json"] = self.budget
        return out

    def cap(self, score: int) -> int:
        """Most tokens a chain of a match of this score drafts."""
        if self.max_draft != AUTO:
            cap = self.max_draft
        else:
            cap = next(c for lo, c in reversed(self.budget["caps"]) if score >= lo)
        return min(cap, int(self.alpha * score)) if self.alpha else cap

    @property
    def token_only(self) -> bool:
        """Its chains copy the tokens; a tree drafter learns from the target."""
        return self.drafter is None

    @property
    def memory(self) -> str:
        """run with the memory automaton, else its tree drafter's (Token Recycling's matrix)."""
        if self.retrieval.memory is not None:
            return "run"
        return self.drafter.memory if self.drafter is not None else "none"

    @property
    def resumes_mid_request(self) -> bool:
        """Its automata catch up on the context (``Retrieval.sync``); its tree drafter says for itself."""
        return self.drafter is None or self.drafter.resumes_mid_request

    def fork(self) -> "_Retrieving":
        """Its own dynamic automaton (the corpus's shared) and its own tree drafter's state."""
        other = super().fork()
        other.retrieval = copy.copy(self.retrieval)
        if self.drafter is not None:
            other.drafter = self.drafter.fork()
        return other

    def reset(self, prompt_ids: torch.Tensor, turn: int, prompt_logits: torch.Tensor | None,
              prompt_hidden: torch.Tensor | None = None) -> None:
        self.retrieval.reset()
        if self.drafter is not None:
            self.drafter.reset(prompt_ids, turn, prompt_logits, prompt_hidden)

    def propose(self, context: torch.Tensor) -> Draft:
        self.retrieval.sync(context)
        root = context[-1:]
        match = self.retrieval.best(int(root))
        score = match.score if match else 0
        drafts = match is not None and score >= self.threshold
        if drafts and match.source == STATIC and self.static_tree:  # sam: a tree of the corpus's continuations
            nodes = self.retrieval.corpus.frequent_tree(match.state, self.cap(score) + 1, TREE_WIDTH)
            tree, order = Tree.breadth_first([-1] + [parent for parent, _ in nodes])
            tokens = [int(root)] + [token for _, token in nodes]
            return Draft(torch.tensor([tokens[i] for i in order], device=root.device), tree.to(root.device),
                         info={"drafter": STATIC if nodes else "plain", "match": score},
                         keys=[0] + [self.key(score)] * (len(tokens) - 1))
        chain = self.retrieval.chain(match, self.cap(score)) if drafts else []
        if drafts and self.pads:
            chain += [0] * (self.cap(score) - len(chain))
        if chain and self.memory_tree and match.source in (DYNAMIC, MEMORY):
            other = self._other_chain(match, int(root))
            if other:  # the two chains as one tree, the better one first
                tree, tokens = graft(Tree.chain(len(chain) + 1), [int(root), *chain], other)
                return Draft(torch.tensor(tokens, device=root.device), tree.to(root.device),
                             info={"drafter": f"{DYNAMIC}+{MEMORY}", "match": score},
                             keys=[0] + [self.key(score)] * (len(tokens) - 1))
        if chain and not self.merge:
            tokens = torch.cat([root, torch.tensor(chain, device=root.device)])
            return Draft(tokens, Tree.chain(len(tokens)).to(root.device), info={"drafter": match.source,
                                                                                 "match": score, **self._reach(match)},
                         keys=[0] + [self.key(score)] * len(chain))
        if self.drafter is None:
            return Draft(root, Tree.chain(1).to(root.device), info={"drafter": "plain", "match": score})
        draft = self.drafter.propose(context)
        if chain:  # merge: the chain grafted onto the tree
            tree, tokens = graft(draft.tree, draft.tokens.tolist(), chain)
            return Draft(torch.tensor(tokens, device=root.device), tree.to(root.device),
                         info={"drafter": f"{self.drafter.name}+{match.source}", "match": score})
        draft.info = {"drafter": self.drafter.name, "match": score}
        return draft

    def _other_chain(self, match: Match, root: int) -> list[int]:
        """memory_tree: the chain of the other of the request's text and the memory, where it matches well enough."""
        r = self.retrieval
        if match.source == MEMORY:
            state, length = r.dynamic.advance(*r.cursor, root)
            other = Match(DYNAMIC, length, length, state)
        else:
            other = r.remembered(root)
        if other is None or other.score < self.threshold:
            return []
        return r.chain(other, self.cap(other.score))

    @staticmethod
    def key(score: int) -> int:
        """A retrieved node's key for a per-step budget (``Draft.keys``): its match score, from 32 on (apart from a
        tree drafter's ranks)."""
        return 32 + min(score, 31)

    def _reach(self, match: Match) -> dict:
        """How far back a chain of the request's own text was copied from (the tokens after its match's first
        occurrence), for the reports' share of drafts from long-range memory; a corpus's chain says its drafter."""
        d = self.retrieval.dynamic
        return {"reach": len(d) - d.end[match.state]} if match.source == DYNAMIC else {}

    def update(self, draft: Draft, result: Verification) -> None:
        if self.drafter is not None:  # TR writes every node's row, EAGLE-2 is fed the accepted tokens
            self.drafter.update(draft, result)
        who = draft.info["drafter"]
        self.steps[who] += 1
        self.accepted[who] += len(result.path) - 1
        if self.log is not None and who in (DYNAMIC, STATIC, MEMORY):
            self.log.append((draft.info["match"], draft.tree.size - 1, len(result.path) - 1))

    def skipped(self, draft: Draft, result: Verification) -> None:
        if self.drafter is not None:
            self.drafter.skipped(draft, result)

    def finish(self, answer: list[int]) -> None:
        if self.retrieval.memory is not None:
            self.retrieval.memory.add(answer)
        if self.drafter is not None:
            self.drafter.finish(answer)

    def after_warmup(self) -> None:
        if self.retrieval.memory is not None:
            self.retrieval.memory.clear()
        if self.drafter is not None:
            self.drafter.after_warmup()

    def step_sizes(self) -> list[int]:
        most = self.longest if self.max_draft == AUTO else self.max_draft
        sizes = set(range(1, most + 2))
        tree_sizes = self.drafter.step_sizes() if self.drafter is not None else []
        if tree_sizes is None:
            return None
        sizes |= set(tree_sizes)
        if self.merge:
            sizes |= {t + n for t in tree_sizes for n in range(1, most + 1)}
        return sorted(sizes)

    def state_dict(self) -> dict:
        out = self.drafter.state_dict() if self.drafter is not None else {}
        if self.retrieval.memory is not None:  # the remembered answers, which rebuild the same automaton
            out["sam_memory"] = torch.tensor(self.retrieval.memory.automaton.tokens, dtype=torch.int64)
        return out

    def load_state_dict(self, state: dict) -> None:
        memory = self.retrieval.memory
        if memory is not None and "sam_memory" in state:
            text = state["sam_memory"].tolist()
            if memory.automaton.tokens != text:  # the slots share it: the first slot's load rebuilds it
                memory.clear()
                memory.automaton.extend(text)
                memory.version = text.count(SEPARATOR)
            self.retrieval.memory_version = -1
        if self.drafter is not None:
            self.drafter.load_state_dict({k: v for k, v in state.items() if k != "sam_memory"})

    def summary(self) -> dict:
        corpus = self.retrieval.corpus
        memory = self.retrieval.memory
        out = {"max_draft": self.max_draft, "threshold": self.threshold, "static_bias": self.static_bias,
               "alpha": self.alpha, "reference": self.reference,
               **({"memory_answers": memory.version, "memory_tokens": len(memory.automaton) - memory.version,
                   "memory_tree": self.memory_tree} if memory is not None else {}),
               "corpus": self.corpus_file, **({"merge": self.merge} if self.drafter is not None else {}),
               **({"corpus_tokens": len(corpus), "corpus_states": corpus.states, "corpus_about": self.corpus_about}
                  if corpus is not None else {}),
               "steps_by_drafter": dict(self.steps), "accepted_drafts_by_drafter": dict(self.accepted),
               **({"budget": self.budget} if self.budget else {})}
        if self.drafter is not None:
            out["drafter"] = {"method": self.drafter.name, **self.drafter.summary()}
        return out


@register
class SamDecoding(_Retrieving):
    """SAM alone: a chain from the request, or a tree from the corpus, where a match is long enough, else a plain
    step."""

    name = "sam"
    token_only = True  # no tree drafter: its chains copy the tokens
    STATIC_TREE = True  # samd_sam_only/sam/static_sam.py StaticSAM.gen_draft (FrozenAutomaton.frequent_tree)
    WALK = REFERENCE_WALK = None  # samd_sam_only/sam/dyn_sam.py gen_draft: the longest match's first occurrence
    REFERENCE_PADS = False  # its chain is as long as the continuation (gen_draft, lines 116-121)

    @dataclass
    class Params(_Retrieving.Params):  # the SAM-only variant's (samd_sam_only/, scripts/inference_samd_sam_only.sh)
        max_draft: int | str = param(59, "most tokens a retrieved chain drafts (the SAM-only variant's max_predicts "
                                     "less the root), or auto (capped by match score where they stop paying on this "
                                     "device)", low=1, high=1024, auto=True)
        threshold: int = param(1, "a match of at least this score drafts a chain (the SAM-only variant drafts from "
                               "any match)", low=1, high=1024)
        static_bias: int = param(0, "the static automaton's match length counts this much less (its script's 0)",
                                 low=0, high=1024)
        alpha: float = param(4.0, "a chain drafts at most alpha x the match score (the SAM-only variant's rule); "
                             "0: no such limit", low=0)


@register
class SamTokenRecycling(_Retrieving):
    """SAM with Token Recycling. ``reference=true`` ends each request as SAM-Decoding's loop does (commit 18c41f0,
    ``samd/samd_model.py``, ``SamdModel.generate``, lines 253-272): a forward's bonus stays pending as the next
    root, and the loop stops after a forward whose root and accepted drafts hold a stop token (lines 257-263) or
    bring the tokens it counts, the pending bonus left out, to ``max_new_tokens`` (lines 265-272), having learned
    from that forward (``decode`` runs ``update_state``, lines 172-208, before). So it forwards once more when
    the answer ends with exactly ``max_new_tokens`` tokens or on a stop token as a bonus, and TR's matrix, which
    outlives the request, learns from that forward (``methods.base.Ending``)."""

    name = "sam_tr"
    Drafter = TokenRecycling
    REFERENCE_ENDING: ClassVar[Ending] = Ending(past=1, learns_last=True, stops_on_bonus=False)

    @dataclass
    class Params(_Retrieving.Params, TokenRecycling.Params):
        start: str = param("hot_prompt", "TR's start policy (methods.proposers.tr); hot_prompt: SAM-Decoding's, "
                           "which also learns from the prompt's prefill logits", choices=STARTS)
        first_step: str = param("prefill", "TR's first step (methods.proposers.tr); prefill: SAM-Decoding's, the "
                                "prefill yields the first token", choices=FIRST_STEPS)
        tree: str = param("samd-tr", "TR's tree (methods.proposers.tr); samd-tr: SAM-Decoding's (samd/config/"
                          "token_recycle.json: 60 drafts, depth 5); paper: TR's own (80, depth 6), auto, or a file")
        merge: bool = param(False, "true: verify the retrieved chain and TR's tree together in one tree")

    def __init__(self, params, *args):
        super().__init__(params, *args)
        self.ending = self.REFERENCE_ENDING if params.reference else None

    def update(self, draft: Draft, result: Verification) -> None:
        """Past the answer TR learns and the drafters' statistics count nothing."""
        if result.past_answer:
            self.drafter.update(draft, result)
        else:
            super().update(draft, result)


@register
class SamEagle2(_Retrieving):
    name = "sam_eagle2"
    Drafter = Eagle2
    needs_target = True

    @dataclass
    class Params(_Retrieving.Params, Eagle2.Params):
        merge: bool = param(False, "true: verify the retrieved chain and EAGLE-2's tree together in one tree")
