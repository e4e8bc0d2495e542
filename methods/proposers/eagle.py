"""EAGLE (arXiv 2401.15077) and EAGLE-2 (arXiv 2406.16858): a one-layer draft head on the target's features.

The head reads, at its position ``j``, the target's last hidden state ``f_j`` (after the
final norm: what the target's lm_head reads) and the embedding of the next token
``x_{j+1}``; it predicts ``f_{j+1}``, and the target's own lm_head turns the prediction
into next-token logits. With ``L`` committed tokens (``x_{L-1}`` the root, not yet
forwarded by the target)::

    head position   0           1           ...  L-2
    input           (f_0, x_1)  (f_1, x_2)  ...  (f_{L-2}, x_{L-1})
    output          f~_1        f~_2        ...  f~_{L-1}  -> lm_head -> depth-1 drafts

A draft node at depth ``d`` is fed (its parent's predicted feature, its own token) at
head position ``L-2+d`` and sees the head's cache and its own draft ancestors: tree
attention, as in the verifier. The head's cache keeps committed pairs only; the draft
entries are dropped after each proposal (``kv.truncate``).

* ``eagle``: a static tree (``data/trees/eagle.json``: 25 drafts, depth 5, ranks of
  the head's top-k); each level is one head forward of the nodes that have children.
* ``eagle2``: a dynamic tree: the root's ``topk`` best tokens are the first candidates;
  then ``depth`` times the ``topk`` candidates of the newest depth with the highest
  cumulative log-probability are expanded (``topk`` children each), so drafts reach depth
  ``depth + 1`` (EAGLE-2's code counts its depth so); the best ``total_tokens - 1`` of all
  candidates by cumulative log-probability form the draft.

The head's weights come from ``method.head``: a folder or hub id (``methods.hub``) in the
published layout of SafeAILab/EAGLE (``config.json`` with ``pytorch_model.bin`` or
``model.safetensors``, keys ``fc.*`` and ``layers.0.*``; ``fc`` has a bias unless the config
says ``"bias": false``, as ``eagle/model/ea_model.py`` reads it: EAGLE's Llama-3 heads have
none), or ``random`` (still lossless, only slow). The head runs in the target's dtype, its
rotary frequencies in fp32 (``fp32_rotary``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from methods.base import Draft, Preparation, Proposer, Verification, register
from methods.common import HarnessError
from methods.engine import kv
from methods.engine.ops import fp32_rotary
from methods.heads import head_or_random, match_engine, require_head, target_lm_head
from methods.heads.eagle import EagleHead, load_head, random_head
from methods.params import artefact, param
from methods.tree import Tree, additive_mask, load_template

VERIFY_RULES = ("coupled", "specinfer")  # EAGLE-1 at temperature > 0 (methods.sampling)


class _Eagle(Proposer):
    """What both EAGLEs share: the head, its cache of committed pairs, and feeding it pairs."""

    wants_hidden = True
    needs_target = True
    uses_target_lm_head = True
    head_kind = {"what": "a draft head", "layout": "EAGLE", "trainer": "scripts.train_eagle"}  # how to get one

    @dataclass
    class Params:
        head: str | None = param(None, "a folder or hub id in EAGLE's layout, or random (lossless, slow); in a "
                                 "run, the model config's artefacts.eagle_head", config=artefact("eagle_head"))
        topk: int = param(10, "candidates the head ranks per node (EAGLE's top-k)", low=1, high=64)
        seed: int = param(0, "for head=random")

    def __init__(self, head: EagleHead, target, width: int, head_name: str, device: torch.device):
        self.device = device
        self.head = fp32_rotary(head.to(device=device, dtype=next(target.parameters()).dtype)).eval()
        self.head.requires_grad_(False)
        self.embed = target.get_input_embeddings()  # shared with the target, as in EAGLE
        # the target's lm_head turns predicted features into logits (oneDNN-packed on a CPU); EAGLE-3 has its own
        self.lm_head = target_lm_head(target, device) if self.uses_target_lm_head else None
        self.width, self.head_name = width, head_name  # width: candidates per node (EAGLE's top-k)
        self.cache = None
        self.pending: torch.Tensor | None = None  # [m, h] target features not yet fed to the head

    @classmethod
    def check(cls, params: Params) -> None:
        require_head(cls.name, params.head, **cls.head_kind)

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device, target) -> "_Eagle":
        head_name, width = params.head, params.topk
        shared = {f.name for f in fields(_Eagle.Params)}
        extra = {f.name: getattr(params, f.name) for f in fields(params) if f.name not in shared}
        head = head_or_random(cls.name, head_name, **cls.head_kind, load=lambda h: load_head(h, target.config),
                              random=lambda: random_head(target.config, params.seed))
        return cls(head, target, width, head_name, device, **extra)

    @classmethod
    def example(cls, folder, prompts) -> dict:
        return {"head": "random"}

    def prepare(self, preparation: Preparation) -> None:
        match_engine(self.lm_head, preparation)

    def _logits(self, features: torch.Tensor) -> torch.Tensor:
        """Next-token logits over the target's vocabulary at the head's predicted features."""
        return self.lm_head(features)

    def reset(self, prompt_ids, turn, prompt_logits, prompt_hidden=None) -> None:
        self.cache = kv.new_cache(self.head)
        self.pending = prompt_hidden

    def update(self, draft: Draft, result: Verification) -> None:
        self.pending = torch.cat([self.pending, result.hidden])

    def skipped(self, draft: Draft, result: Verification) -> None:
        self.update(draft, result)

    def _head(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, free: int,
              allowed: torch.Tensor) -> torch.Tensor:
        """Feed n (token [n], feature [n, h]) pairs at ``positions`` [n]; returns their predicted features [n, h].

        Each pair sees the head's first ``free`` cache entries, and of the entries after them plus the n
        new ones those marked in ``allowed`` [n, cached - free + n] (its draft ancestors and itself).
        """
        mask = additive_mask(allowed, free, features.dtype)
        out = self.head(self.embed(tokens)[None], features[None], positions.view(1, -1), mask, self.cache)
        return out[0]

    def _catch_up(self, context: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Feed the committed pairs the head has not seen: (the root's predicted feature [h], head length)."""
        start, n = kv.length(self.cache), len(self.pending)
        assert start + n == len(context) - 1, "the head's pairs and the committed tokens are out of step"
        chain = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        positions = torch.arange(start, start + n, device=self.device)
        out = self._head(context[start + 1:], self.pending, positions, start, chain)
        self.pending = self.pending[:0]
        return out[-1], start + n

    def summary(self) -> dict:
        return {"head": self.head_name, "head_parameters": sum(p.numel() for p in self.head.parameters()),
                "topk": self.width}


@register
class Eagle(_Eagle):
    """EAGLE-1: a static draft tree whose node of rank r takes the r-th most likely token after its parent."""

    name = "eagle"

    @dataclass
    class Params(_Eagle.Params):
        tree: str = param("eagle", "a template in data/trees/ or a .json path (eagle: EAGLE-1's tree, 25 drafts, "
                          "depth 5, ranks of the head's top-k)")
        verify: str = param("coupled", "at temperature > 0: coupled (the head's top-k, every token vanilla "
                            "sampling's draw: methods.sampling) | specinfer (children sampled from the head's "
                            "distribution, recursive rejection sampling with it: the target's distribution, not "
                            "vanilla's tokens)", choices=VERIFY_RULES)

    def __init__(self, head, target, width, head_name, device, tree: str, verify: str = "coupled"):
        super().__init__(head, target, width, head_name, device)
        self.tree, self.tree_name = load_template(str(tree)).to(device), str(tree)
        self.verify = verify
        self.wants_sampler = verify == "specinfer"
        self.samples_like_vanilla = not self.wants_sampler
        self.sampler, self.n_prompt = None, 0
        if int(self.tree.rank.max()) >= width:
            raise HarnessError(f"tree '{tree}' uses ranks up to {int(self.tree.rank.max())}, which needs "
                              f"method.topk > {int(self.tree.rank.max())} (got {width})")
        parents, depth = self.tree.parents, self.tree.depth.tolist()
        with_children = set(parents[1:])
        # Per depth d >= 1: the nodes to forward (those with children), all forwarded nodes so far (the
        # head cache's draft entries, in order), and for the nodes of depth d + 1 their parent's row.
        self.first = torch.tensor([i for i, x in enumerate(depth) if x == 1], device=device)
        self.levels, done = [], []
        for d in range(1, self.tree.max_depth):
            fwd = [i for i, x in enumerate(depth) if x == d and i in with_children]
            kids = [i for i, x in enumerate(depth) if x == d + 1]
            done = done + fwd
            self.levels.append((d, torch.tensor(fwd, device=device), self.tree.ancestors[fwd][:, done],
                                torch.tensor(kids, device=device),
                                torch.tensor([fwd.index(parents[i]) for i in kids], device=device)))

    def reset(self, prompt_ids, turn, prompt_logits, prompt_hidden=None) -> None:
        super().reset(prompt_ids, turn, prompt_logits, prompt_hidden)
        self.n_prompt = len(prompt_ids)

    def propose(self, context: torch.Tensor) -> Draft:
        tree, rank = self.tree, self.tree.rank
        root, past = self._catch_up(context)
        sampled = self.sampler is not None and not self.sampler.settings.greedy
        gen = self.sampler.generator(len(context) - self.n_prompt, 1, self.device) if sampled else None
        self._q = None  # [n, vocab] with gen: the distributions the children were sampled from
        tokens = torch.empty(tree.size, dtype=torch.long, device=self.device)
        tokens[0] = context[-1]
        tokens[self.first] = self._children(self._logits(root)[None], gen, [0])[0, rank[self.first]]
        features = root.expand(tree.size, -1).clone()  # [n, h] predicted feature after each node
        for d, fwd, allowed, kids, parent_row in self.levels:
            parent_features = features[tree.parent_index[fwd]]
            out = self._head(tokens[fwd], parent_features, torch.full_like(fwd, past - 1 + d), past, allowed)
            features[fwd] = out
            top = self._children(self._logits(out), gen, fwd)  # [len(fwd), width]
            tokens[kids] = top[parent_row, rank[kids]]
        kv.truncate(self.cache, past)
        return Draft(tokens, tree, q=self._q, keys=tree.ranks)

    def _children(self, logits: torch.Tensor, gen, rows) -> torch.Tensor:
        """[m, width] candidate children of m nodes in the order they are tried: the head's top tokens, or with
        ``gen`` (verify=specinfer at temperature > 0) a sample without replacement from the head's processed
        distribution (Gumbel top-k), whose rows go to the step's ``_q`` at ``rows``."""
        if gen is None:
            return logits.topk(self.width).indices
        from methods.sampling import gumbel, process

        probs = process(logits, self.sampler.settings)  # [m, vocab]
        if self._q is None:
            self._q = torch.zeros(self.tree.size, probs.shape[-1], device=probs.device)
        self._q[rows] = probs
        u = torch.rand(probs.shape, generator=gen, device=probs.device).clamp_(min=1e-20)
        return (probs.log() + gumbel(u)).topk(self.width).indices

    def step_sizes(self) -> list[int]:
        return [self.tree.size]

    def summary(self) -> dict:
        return {**super().summary(), "tree": self.tree_name, "verify": self.verify, "tree_nodes": self.tree.size,
                "tree_depth": self.tree.max_depth}


@register
class Eagle2(_Eagle):
    """EAGLE-2: ``depth`` times expand the ``topk`` best candidates of the newest depth, keep the best
    ``total_tokens - 1`` overall."""

    name = "eagle2"

    @dataclass
    class Params(_Eagle.Params):
        depth: int = param(5, "expansions after the root's top-k: drafts reach depth + 1 (EAGLE-2's count)",
                           low=1, high=1024)
        total_tokens: int = param(60, "draft tree size, root included", low=2, high=1024)

    @classmethod
    def example(cls, folder, prompts) -> dict:
        return {"head": "random", "total_tokens": 16}

    def __init__(self, head, target, width, head_name, device, depth: int, total_tokens: int):
        super().__init__(head, target, width, head_name, device)
        self.depth, self.total = depth, total_tokens

    def propose(self, context: torch.Tensor) -> Draft:
        root, past = self._catch_up(context)
        # Candidates, host-side: token, parent (candidate index; 0 = root), cumulative log-probability, depth.
        tok, par, score, dep = [int(context[-1])], [-1], [0.0], [0]
        logp, top = torch.log_softmax(self._logits(root).float(), dim=-1).topk(self.width)
        front = list(range(1, self.width + 1))
        tok += top.tolist(); par += [0] * self.width; score += logp.tolist(); dep += [1] * self.width
        front_features = root.expand(self.width, -1)
        column: dict[int, int] = {}  # candidate -> its entry in the head cache after ``past``
        for d in range(1, self.depth + 1):  # expand depth d's front: candidates of depth d + 1
            n_cached = len(column)
            allowed = torch.zeros(len(front), n_cached + len(front), dtype=torch.bool)
            for i, c in enumerate(front):
                a = par[c]
                while a > 0:
                    allowed[i, column[a]] = True
                    a = par[a]
                allowed[i, n_cached + i] = True
                column[c] = n_cached + i
            positions = torch.full((len(front),), past - 1 + d, device=self.device)
            out = self._head(torch.tensor([tok[c] for c in front], device=self.device), front_features, positions,
                             past, allowed.to(self.device))
            logp, top = torch.log_softmax(self._logits(out).float(), dim=-1).topk(self.width)  # [f, width]
            cum = torch.tensor([score[c] for c in front], device=self.device)[:, None] + logp
            base = len(tok)
            tok += top.flatten().tolist()
            par += [c for c in front for _ in range(self.width)]
            score += cum.flatten().tolist()
            dep += [d + 1] * cum.numel()
            best = cum.flatten().topk(min(self.width, cum.numel())).indices
            front_features = out[best // self.width]
            front = [base + b for b in best.tolist()]
        kv.truncate(self.cache, past)
        # The best candidates by cumulative log-probability; a child never scores above its parent and ties go
        # to the shallower node, so every prefix of this order holds each node's parent.
        best = sorted(range(1, len(tok)), key=lambda c: (-score[c], dep[c], c))[: self.total - 1]
        keep = sorted(best, key=lambda c: (dep[c], c))
        index = {0: 0, **{c: i + 1 for i, c in enumerate(keep)}}
        tree, order = Tree.breadth_first([-1] + [index[par[c]] for c in keep])
        chosen = [0] + keep
        tokens = torch.tensor([tok[chosen[i]] for i in order], device=self.device)
        # a node's key for a per-step budget: its head probability given its parent, in tenths
        keys = [0] + [min(9, int(10 * math.exp(score[chosen[i]] - score[par[chosen[i]]]))) for i in order[1:]]
        return Draft(tokens, tree.to(self.device), keys=keys)

    def step_sizes(self) -> list[int]:
        candidates = self.width + self.depth * self.width * self.width
        return [1 + min(self.total - 1, candidates)]

    def summary(self) -> dict:
        return {**super().summary(), "depth": self.depth, "total_tokens": self.total}
