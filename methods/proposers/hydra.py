"""Hydra (Ankner et al., arXiv 2402.05109): Medusa's draft heads made sequentially dependent.

Medusa's head ``k`` sees only the target's last hidden state; Hydra's head ``k`` also reads the embeddings of
the draft tokens on the path so far. With ``p`` the feature of the newest committed position (the one whose
next token is the root) and ``e(x)`` the target's input embedding, the node of depth ``d`` and rank ``r`` under
the path ``root, t_1, ..., t_{d-1}`` is the ``r``-th most likely token of::

    head_{d-1}(cat(p, e(root), e(t_1), ..., e(t_{d-1})))     # (d + 1) x hidden inputs

a head being a ResBlock that reduces its input to the hidden size (``res_connection(x) + SiLU(W x + b)``, both
linears), then ``hydra_num_layers - 1`` applications of one shared ResBlock ``x + SiLU(W x + b)``, then its own
lm_head (with a bias). So one tree level is one small forward of the nodes that have children: ``depth``
forwards per step, no draft model.

Two head architectures (``hydra_head_arch``), as zankner/Hydra and Spec-Bench's ``model/hydra`` (fd2c1cd)
define them:

* ``mlp``: ``p`` is the target's last hidden state (after its final norm: what its lm_head reads).
* ``prefix-mlp`` (Hydra++): ``p`` is the output of a one-layer Llama model (the target's layer shape, its own
  final norm) run causally over the target's last hidden states of every committed position, with its own KV
  cache of committed positions only.

The heads' weights (``method.head``): a folder or hub id in the layout zankner/Hydra publishes
(``ankner/hydra-vicuna-{7b,13b,33b}-v1.3``) and Spec-Bench's ``model/hydra/hydra_model.py`` reads:
``config.json`` (``hydra_num_heads``, ``hydra_num_layers``, ``hydra_head_arch``, ``grounded_heads``,
``hidden_state_offset``) and ``hydra_lm_head.pt``, the state dict of the head module: see ``layout``. Heads
without their lm_head keys share the target's (no bias): our trained heads (``python -m scripts.train_hydra``)
are so. Ungrounded heads (``grounded_heads: false``) are Medusa heads, and a ``hidden_state_offset`` other than
0 reads an inner layer: both are refused. The tree (``method.tree``) is Spec-Bench's Hydra default,
``mc_sim_7b_63`` (its ``hydra_choices.py`` holds the same list as Medusa's: ``data/trees/medusa.json``), cut to
the heads' depth when they are fewer than its 4 (``methods.tree.heads_tree``).
Verification is the shared greedy one (lossless); Hydra's typical acceptance at T > 0 is not offered.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from methods.base import Draft, Preparation, Proposer, Verification, register
from methods.engine import kv
from methods.engine.ops import fp32_rotary
from methods.heads import head_or_random, match_engine, require_head, target_lm_head
from methods.heads.hydra import ARCHS, HydraHeads, load_heads, random_heads
from methods.params import artefact, param
from methods.tree import HEADS_TREE, additive_mask, heads_tree, load_template


@register
class Hydra(Proposer):
    name = "hydra"
    wants_hidden = True
    needs_target = True
    head_kind = {"what": "Hydra heads", "layout": "Hydra", "trainer": "scripts.train_hydra"}  # how to get them

    @dataclass
    class Params:
        head: str | None = param(None, "a folder or hub id in Hydra's layout, or random (lossless, slow); in a "
                                 "run, the model config's artefacts.hydra_head", config=artefact("hydra_head"))
        tree: str | None = param(None, "a template in data/trees/ or a .json path; default: mc_sim_7b_63 "
                                 "(data/trees/medusa.json, Hydra's default: 63 drafts, depth 4) to the heads' depth")
        arch: str = param("mlp", "for head=random: the head architecture", choices=ARCHS)
        seed: int = param(0, "for head=random")

    def __init__(self, heads: HydraHeads, target, tree: str | None, head_name: str, device):
        dtype = next(target.parameters()).dtype
        self.heads = fp32_rotary(heads.to(device=device, dtype=dtype)).eval().requires_grad_(False)
        self.embed = target.get_input_embeddings()
        self.lm_head = target_lm_head(target, device)
        self.tree, self.tree_name = heads_tree(tree, len(heads.heads), "Hydra")
        self.tree, self.head_name, self.device = self.tree.to(device), head_name, device
        self.width = int(self.tree.rank.max()) + 1  # a parent's children are its head's top tokens, in rank order
        # Per depth d = 1..max: the nodes of depth d - 1 that have children (head d - 1 reads them), the nodes of
        # depth d with each one's parent row among those, and for the next level, each forwarded node's parent row.
        parents, depth = self.tree.parents, self.tree.depth.tolist()
        with_children = set(parents[1:])
        fwd = [[i for i, x in enumerate(depth) if x == d and i in with_children] for d in range(self.tree.max_depth)]
        t = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
        self.levels = []
        for d in range(1, self.tree.max_depth + 1):
            kids = [i for i, x in enumerate(depth) if x == d]
            grow = fwd[d] if d < self.tree.max_depth else []
            self.levels.append((t(kids), t([fwd[d - 1].index(parents[i]) for i in kids]), t(grow),
                                t([fwd[d - 1].index(parents[i]) for i in grow])))
        self.cache, self.pending = None, None  # the prefix's cache of committed positions; features not fed yet

    @classmethod
    def check(cls, params: Params) -> None:
        require_head(cls.name, params.head, **cls.head_kind)

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device, target) -> "Hydra":
        depth = load_template(params.tree or HEADS_TREE).max_depth
        heads = head_or_random(cls.name, params.head, **cls.head_kind, load=lambda h: load_heads(h, target.config),
                               random=lambda: random_heads(target.config, depth, params.arch, params.seed))
        return cls(heads, target, params.tree, params.head, device)

    @classmethod
    def example(cls, folder, prompts) -> dict:
        return {"head": "random", "arch": "prefix-mlp"}  # the prefix layer: the more of Hydra's code

    def prepare(self, preparation: Preparation) -> None:
        match_engine(self.lm_head, preparation)

    def reset(self, prompt_ids, turn, prompt_logits, prompt_hidden=None) -> None:
        self.cache = kv.new_cache(self.heads.prefix) if self.heads.prefix is not None else None
        self.pending = prompt_hidden

    def update(self, draft: Draft, result: Verification) -> None:
        self.pending = torch.cat([self.pending, result.hidden])

    def skipped(self, draft: Draft, result: Verification) -> None:
        self.update(draft, result)

    def _feature(self, context: torch.Tensor) -> torch.Tensor:
        """``p`` [h]: the target's feature at the newest committed position, or (prefix-mlp) the prefix's output
        there, after feeding it the committed features it has not seen."""
        if self.cache is None:
            p, self.pending = self.pending[-1], self.pending[-1:]
            return p
        start, n = kv.length(self.cache), len(self.pending)
        assert start + n == len(context) - 1, "the prefix's cache and the committed tokens are out of step"
        mask = additive_mask(torch.ones(n, n, dtype=torch.bool, device=self.device).tril(), start, self.pending.dtype)
        positions = torch.arange(start, start + n, device=self.device).view(1, -1)
        out = self.heads.prefix(self.pending[None], positions, mask, self.cache)
        self.pending = self.pending[:0]
        return out[0, -1]

    def propose(self, context: torch.Tensor) -> Draft:
        tokens = torch.empty(self.tree.size, dtype=torch.long, device=self.device)
        tokens[0] = context[-1]
        x = torch.cat([self._feature(context), self.embed(context[-1])])[None]  # [1, 2h]: the root's path
        for d, (kids, parent_row, grow, grow_row) in enumerate(self.levels):
            top = self.heads.logits(d, x, self.lm_head).topk(self.width, dim=-1).indices  # [len(x), width]
            tokens[kids] = top[parent_row, self.tree.rank[kids]]
            if len(grow):
                x = torch.cat([x[grow_row], self.embed(tokens[grow])], dim=-1)
        return Draft(tokens, self.tree, keys=self.tree.ranks)

    def step_sizes(self) -> list[int]:
        return [self.tree.size]

    def summary(self) -> dict:
        return {"head": self.head_name, "arch": self.heads.arch, "heads": len(self.heads.heads),
                "layers": self.heads.layers, "own_lm_heads": self.heads.own_lm_heads,
                "head_parameters": sum(p.numel() for p in self.heads.parameters()), "tree": self.tree_name,
                "tree_nodes": self.tree.size}
