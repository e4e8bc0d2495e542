"""Medusa-1's heads (ResBlocks on the target's last hidden state), their checkpoint layout (FasterDecoding's) and
their training. The method: ``methods.proposers.medusa``.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from methods import hub
from methods.common import HarnessError, folder_replaced, write_json_atomic
from methods.heads.fit import fit, head_batch, top1
from methods.tree import HEADS_TREE, load_template

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


def train(heads: MedusaHeads, lm_head: nn.Module, train_set: list[dict], val: list[dict], *, minutes: float,
          lr: float = 1e-3, positions: int = 64, seed: int = 0, max_steps: int | None = None, log=print) -> dict:
    """Self-distillation of ResBlock-only heads (the target's lm_head frozen and shared): head ``k`` at response
    position ``t`` learns the target's greedy token at ``t + k + 2`` (``greedy[t + k + 1]`` of the records of
    ``methods.heads.eagle_train.features``), cross-entropy, AdamW; ``positions`` random positions per sequence and
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


def validate(heads: MedusaHeads, lm_head, val: list[dict]) -> list[float]:
    """Top-1 accuracy of every head against the target's greedy tokens over the held-out records' responses."""
    return top1(lambda d, t: heads(d["feats"][t].float(), lm_head), len(heads.heads), val)


def random_heads(target_config, tree: str | None = None, seed: int = 0) -> MedusaHeads:
    """ResBlock heads (one block each) drawn at random, as many as the depth of ``tree`` (default: Medusa's)."""
    torch.manual_seed(seed)
    heads = MedusaHeads(target_config.hidden_size, load_template(tree or HEADS_TREE).max_depth, 1)
    for block in heads.modules():
        if isinstance(block, nn.Linear):
            nn.init.normal_(block.weight, std=0.02)
    return heads
