"""Medusa-1 (Cai et al., arXiv 2401.10774): heads on the target's last hidden state draft a sparse tree.

At the newest accepted node (the one whose next token is the root, committed by the last step) the target's
last hidden state ``f`` (after the final norm: what its lm_head reads) is known. Medusa head ``k`` (k = 0, 1, ...)
reads ``f`` and predicts the token ``k + 1`` places after the root: ``lm_head_k(ResBlocks_k(f))``, a ResBlock
being ``x + SiLU(W x + b)``. The draft is a static tree (``method.tree``; Spec-Bench's Medusa row runs
``mc_sim_7b_63``, ``data/trees/medusa.json``, 63 drafts, depth 4, the default, cut to the heads' depth when
they are fewer) whose node of depth ``d`` and rank ``r`` is
the ``r``-th of head ``d - 1``'s top-``topk`` tokens (Medusa's TOPK = 10), whatever its parent: one small
forward per step, no draft model. Verification is the shared greedy one (lossless); Medusa-2's typical
acceptance is not lossless and is not offered.

The heads' weights (``method.head``): a folder or hub id in the layout FasterDecoding publishes and
Spec-Bench's ``model/medusa/medusa_model.py`` (fd2c1cd) reads: ``config.json`` with ``medusa_num_heads`` and
``medusa_num_layers``, and ``medusa_lm_head.pt``, the state dict of a list of heads, head ``i`` a sequence of
``medusa_num_layers`` ResBlocks (``{i}.{j}.linear.weight`` / ``.bias``) and its own lm_head ``{i}.{L}.weight``.
A checkpoint without the lm_head keys shares the target's (Medusa's loader starts every head's lm_head as a
copy of the target's, and loads non-strictly): our trained heads (``python -m scripts.train_medusa``) are
so, ResBlocks only. ``random``: lossless, only slow.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from methods import hub
from methods.base import Draft, Preparation, Proposer, Verification, register
from methods.common import HarnessError, folder_replaced, write_json_atomic
from methods.ops import Linear, can_pack
from methods.params import param
from methods.tree import HEADS_TREE, heads_tree, load_template

CONFIG_FILE, WEIGHTS_FILE = "config.json", "medusa_lm_head.pt"
TOPK = 10  # Medusa's top-k per head for the sparse tree (its utils.py TOPK)


class ResBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)

    def forward(self, x):
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``heads`` heads of ``layers`` ResBlocks each; with ``vocab`` their own lm_heads, else none (the target's is
    applied by the caller). ``heads.state_dict()`` has exactly the published keys."""

    def __init__(self, hidden: int, heads: int, layers: int, vocab: int | None = None):
        super().__init__()
        self.layers, self.own_lm_head = layers, vocab is not None
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden) for _ in range(layers)],
                          *([nn.Linear(hidden, vocab, bias=False)] if vocab is not None else []))
            for _ in range(heads))

    def forward(self, f: torch.Tensor, lm_head, n: int | None = None) -> torch.Tensor:
        """Logits [n, ..., vocab] of the first ``n`` heads (all by default) at features ``f`` [..., hidden]."""
        heads = self.heads[: n or len(self.heads)]
        if self.own_lm_head:
            return torch.stack([h(f) for h in heads])
        return lm_head(torch.stack([h(f) for h in heads]))


def expected_shapes(hidden: int, heads: int, layers: int, vocab: int | None) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for i in range(heads):
        for j in range(layers):
            shapes[f"{i}.{j}.linear.weight"], shapes[f"{i}.{j}.linear.bias"] = (hidden, hidden), (hidden,)
        if vocab is not None:
            shapes[f"{i}.{layers}.weight"] = (vocab, hidden)
    return shapes


def load_heads(head: str, target_config) -> MedusaHeads:
    """Medusa heads in the published layout, checked against the target; a mismatch names the key and shapes."""
    folder, raw = hub.head_files(head, "Medusa", [CONFIG_FILE, WEIGHTS_FILE])
    n, layers = raw.get("medusa_num_heads"), raw.get("medusa_num_layers", 1)
    if not isinstance(n, int) or n < 1 or not isinstance(layers, int) or layers < 0:
        raise HarnessError(f"Medusa head {folder}: {CONFIG_FILE} needs medusa_num_heads (>= 1) and "
                          f"medusa_num_layers, got {n!r} and {layers!r}")
    state = torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    h, vocab = target_config.hidden_size, target_config.vocab_size
    own = f"0.{layers}.weight" in state
    want = expected_shapes(h, n, layers, vocab if own else None)
    missing, unknown = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or unknown:
        raise HarnessError(f"Medusa head {folder} (medusa_num_heads={n}, medusa_num_layers={layers}) "
                          + (f"lacks {', '.join(missing[:5])}" if missing else
                             f"has keys Medusa's layout does not: {', '.join(unknown[:5])}"))
    for key, shape in want.items():
        if tuple(state[key].shape) != shape:
            raise HarnessError(f"Medusa head {folder}: {key} has shape {tuple(state[key].shape)}, but the target "
                              f"(hidden size {h}, vocabulary {vocab}) needs {shape}")
    heads = MedusaHeads(h, n, layers, vocab if own else None)
    heads.heads.load_state_dict(state)
    return heads


def save_heads(heads: MedusaHeads, folder: str | Path, extra_json: dict[str, object] | None = None,
               base: str = "") -> Path:
    """Write ``heads`` in the layout load_heads reads (fp16 weights, as Medusa's are published), the folder
    whole beside its place and renamed into it."""
    folder = Path(folder).absolute()
    state = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in heads.heads.state_dict().items()}
    with folder_replaced(folder) as tmp:
        torch.save(state, tmp / WEIGHTS_FILE)
        write_json_atomic(tmp / CONFIG_FILE, {"medusa_num_heads": len(heads.heads), "medusa_num_layers":
                                              heads.layers, "base_model_name_or_path": base})
        for name, obj in (extra_json or {}).items():
            write_json_atomic(tmp / name, obj)
    return folder


@register
class Medusa(Proposer):
    name = "medusa"
    wants_hidden = True
    needs_target = True

    @dataclass
    class Params:
        head: str | None = param(None, "a folder or hub id in Medusa's layout, or random (lossless, slow); in a "
                                 "run, the model config's medusa_head", config="${model.medusa_head}")
        tree: str | None = param(None, "a template in data/trees/ or a .json path; default: mc_sim_7b_63 "
                                 "(data/trees/medusa.json, 63 drafts, depth 4) to the heads' depth")
        topk: int = param(TOPK, "candidates per head (Medusa's TOPK)", low=1, high=64)
        seed: int = param(0, "for head=random")

    def __init__(self, heads: MedusaHeads, target, tree: str | None, topk: int, head_name: str, device):
        dtype = next(target.parameters()).dtype
        self.heads = heads.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.lm_head = Linear(target.get_output_embeddings(), can_pack(device, dtype))
        self.tree, self.tree_name = heads_tree(tree, len(heads.heads), "Medusa")
        self.tree, self.width, self.head_name = self.tree.to(device), topk, head_name
        if int(self.tree.rank.max()) >= topk:
            raise HarnessError(f"tree '{self.tree_name}' uses ranks up to {int(self.tree.rank.max())}, which needs "
                              f"method.topk > {int(self.tree.rank.max())} (got {topk})")
        self.rows, self.cols = self.tree.depth[1:] - 1, self.tree.rank[1:]  # each draft's head and rank
        self.feature: torch.Tensor | None = None

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device, target) -> "Medusa":
        if not params.head:
            raise HarnessError("method 'medusa' needs Medusa heads and the model config names none: give "
                              "method.head=PATH (a folder in Medusa's layout, or a hub id), train them with python "
                              "-m scripts.train_medusa, or method.head=random (lossless, slow)")
        if params.head == "random":
            torch.manual_seed(params.seed)
            heads = MedusaHeads(target.config.hidden_size, load_template(params.tree or HEADS_TREE).max_depth, 1)
            for block in heads.modules():
                if isinstance(block, nn.Linear):
                    nn.init.normal_(block.weight, std=0.02)
        else:
            heads = load_heads(params.head, target.config)
        return cls(heads, target, params.tree, params.topk, params.head, device)

    def prepare(self, preparation: Preparation) -> None:
        """The lm_head as the target's engine runs its own (packed only where engine.pack chose it)."""
        if getattr(preparation.engine, "pack", None) is False:
            self.lm_head.unpack()

    def reset(self, prompt_ids, turn, prompt_logits, prompt_hidden=None) -> None:
        self.feature = prompt_hidden[-1]

    def update(self, draft: Draft, result: Verification) -> None:
        self.feature = result.hidden[-1]  # the last accepted node's: the new root is its next token

    def propose(self, context: torch.Tensor) -> Draft:
        top = self.heads(self.feature, self.lm_head, self.tree.max_depth).topk(self.width, dim=-1).indices
        return Draft(torch.cat([context[-1:], top[self.rows, self.cols]]), self.tree)

    def step_sizes(self) -> list[int]:
        return [self.tree.size]

    def summary(self) -> dict:
        return {"head": self.head_name, "heads": len(self.heads.heads), "own_lm_heads": self.heads.own_lm_head,
                "head_parameters": sum(p.numel() for p in self.heads.parameters()), "tree": self.tree_name,
                "tree_nodes": self.tree.size, "topk": self.width}


def train(heads: MedusaHeads, lm_head: nn.Module, train_set: list[dict], val: list[dict], *, minutes: float,
          lr: float = 1e-3, positions: int = 64, seed: int = 0, max_steps: int | None = None, log=print) -> dict:
    """Self-distillation of ResBlock-only heads (the target's lm_head frozen and shared): head ``k`` at response
    position ``t`` learns the target's greedy token at ``t + k + 2`` (``greedy[t + k + 1]`` of the records of
    ``methods.eagle_train.features``), cross-entropy, AdamW; ``positions`` random positions per sequence and
    step (``fit``). Returns the log: steps, minutes, the held-out top-1 accuracy of every head."""
    n = len(heads.heads)

    def loss(d: dict, gen) -> torch.Tensor | None:
        t, y = head_batch(d, n, positions, gen)
        if t is None:
            return None
        logits = heads(d["feats"][t].float(), lm_head)  # [n, positions, vocab]
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1)

    return {**fit(heads, loss, train_set, minutes=minutes, lr=lr, seed=seed, max_steps=max_steps, log=log),
            "top1_per_head": validate(heads, lm_head, val)}


def fit(module: nn.Module, loss, train_set: list[dict], *, minutes: float, lr: float, seed: int = 0,
        max_steps: int | None = None, log=print) -> dict:
    """The training loop of draft heads (Medusa's, Hydra's, EAGLE-3's): AdamW on ``module``'s trainable
    parameters, one step per record (``loss(record, generator)``, None to skip it), records in a fresh random
    order every epoch, until ``minutes`` run out or ``max_steps`` are done; ``module`` left in eval mode.
    Returns steps and minutes."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=lr)
    t0, steps = time.time(), 0
    module.train()

    def done() -> bool:
        return time.time() - t0 >= 60 * minutes or (max_steps is not None and steps >= max_steps)

    while not done():
        for d in (train_set[i] for i in torch.randperm(len(train_set), generator=gen).tolist()):
            value = loss(d, gen)
            if value is None:
                continue
            opt.zero_grad()
            value.backward()
            opt.step()
            steps += 1
            if steps % 200 == 0:
                log(f"step {steps}: loss {value.item():.3f}, {(time.time() - t0) / 60:.1f} min")
            if done():
                break
    module.eval()
    return {"steps": steps, "minutes": round((time.time() - t0) / 60, 2)}


def head_batch(d: dict, n: int, positions: int, gen) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Random response positions ``t`` of record ``d`` [p] and the label of each of ``n`` heads there [n, p]:
    head ``k``'s is ``greedy[t + k + 1]``, the target's token ``k + 2`` places after ``t`` (-1: past the end)."""
    length = len(d["ids"])
    first, last = max(d["start"] - 1, 0), length - 2  # t + 1 is a response token; head 0's label needs t + 1
    if last < first:
        return None, None
    t = torch.randint(first, last + 1, (min(positions, last - first + 1),), generator=gen)
    idx = t[None, :] + torch.arange(1, n + 1)[:, None]  # greedy[t + k + 1]
    y = torch.where(idx < length, d["greedy"][idx.clamp(max=length - 1)], -1)
    return t, y


def validate(heads: MedusaHeads, lm_head, val: list[dict]) -> list[float]:
    """Top-1 accuracy of every head against the target's greedy tokens over the held-out records' responses."""
    return top1(lambda d, t: heads(d["feats"][t].float(), lm_head), len(heads.heads), val)


@torch.no_grad()
def top1(predict, n: int, val: list[dict]) -> list[float]:
    """Top-1 accuracy of ``n`` heads, head ``k`` against ``greedy[t + k + 1]`` at every response position ``t``
    of the held-out records; ``predict(record, t)`` gives the logits [n, len(t), vocab]."""
    hits, total = torch.zeros(n), torch.zeros(n)
    for d in val:
        length, first = len(d["ids"]), max(d["start"] - 1, 0)
        t = torch.arange(first, length - 1)
        if not len(t):
            continue
        idx = t[None, :] + torch.arange(1, n + 1)[:, None]
        ok = idx < length
        pred = predict(d, t).argmax(-1)
        hits += ((pred == d["greedy"][idx.clamp(max=length - 1)]) & ok).sum(1)
        total += ok.sum(1)
    return [round(float(h / max(c, 1)), 4) for h, c in zip(hits, total)]
