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

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from methods import hub, kv
from methods.base import Draft, Preparation, Proposer, Verification, register
from methods.common import HarnessError, folder_replaced, write_json_atomic
from methods.eagle import head_config
from methods.medusa import fit, head_batch, top1
from methods.ops import Linear, can_pack, fp32_rotary
from methods.params import param
from methods.tree import HEADS_TREE, additive_mask, heads_tree, load_template

CONFIG_FILE, WEIGHTS_FILE = "config.json", "hydra_lm_head.pt"
ARCHS = ("mlp", "prefix-mlp")
# Keys of a published state dict that are not the heads': the target's embedding (the head module holds a
# reference to it), the prefix model's unused embedding, rotary buffers of older transformers.
IGNORED = ("input_embed_fn.weight", "prefix_embeding_layer.embed_tokens.weight", "rotary_emb.inv_freq")


class ResBlock(nn.Module):
    """``res(x) + SiLU(W x + b)``: ``res`` the identity, or a linear when the input is wider than the output."""

    def __init__(self, hidden: int, inputs: int | None = None):
        super().__init__()
        inputs = inputs or hidden
        self.linear = nn.Linear(inputs, hidden)
        self.res_connection = nn.Linear(inputs, hidden) if inputs != hidden else None

    def forward(self, x):
        return (x if self.res_connection is None else self.res_connection(x)) + F.silu(self.linear(x))


class HydraHead(nn.Module):
    """Head ``i``: a ResBlock from ``(i + 2) * hidden`` inputs, one shared ResBlock applied ``layers - 1`` times,
    its own lm_head when ``vocab`` is given."""

    def __init__(self, hidden: int, i: int, layers: int, vocab: int | None):
        super().__init__()
        self.first = ResBlock(hidden, (i + 2) * hidden)
        self.more = ResBlock(hidden) if layers > 1 else None
        self.repeat = layers - 1
        self.lm_head = nn.Linear(hidden, vocab) if vocab is not None else None

    def forward(self, x: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
        x = self.first(F.dropout(x, dropout, self.training))
        for _ in range(self.repeat):
            x = self.more(F.dropout(x, dropout, self.training))
        return x


class Prefix(nn.Module):
    """Hydra++'s prefix: one Llama decoder layer (input norm included) and a final norm over the target's features."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, layer_idx=0)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, features: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, cache=None):
        """[1, n, h] features -> [1, n, h]; with ``cache``, appends n entries to it."""
        x = self.layers[0](features, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
                           use_cache=cache is not None, position_embeddings=self.rotary(features, position_ids))
        return self.norm(x)


class HydraHeads(nn.Module):
    def __init__(self, target_config, heads: int, layers: int, arch: str = "mlp", own_lm_heads: bool = False):
        super().__init__()
        if arch not in ARCHS:
            raise HarnessError(f"Hydra head architecture '{arch}' is not one this harness runs: {', '.join(ARCHS)}")
        h = target_config.hidden_size
        self.arch, self.layers, self.own_lm_heads = arch, layers, own_lm_heads
        self.heads = nn.ModuleList(HydraHead(h, i, layers, target_config.vocab_size if own_lm_heads else None)
                                   for i in range(heads))
        self.prefix = Prefix(head_config(target_config)) if arch == "prefix-mlp" else None

    def logits(self, i: int, x: torch.Tensor, lm_head, dropout: float = 0.0) -> torch.Tensor:
        """Head ``i``'s next-token logits at inputs ``x`` [..., (i + 2) * hidden]."""
        head = self.heads[i]
        y = F.dropout(head(x, dropout), dropout, self.training)
        return head.lm_head(y) if head.lm_head is not None else lm_head(y)


def layout(heads: HydraHeads) -> dict[str, str]:
    """The published state-dict key of every tensor of ``heads``: {published key: our key}.

    The head module's ``hydra_mlp.{i}`` is a Sequential of head ``i``'s ResBlocks (``mlp``), or of Dropout,
    ResBlock pairs (``prefix-mlp``: the ResBlocks at odd indices); its ResBlocks after the first are one module
    repeated, so their keys hold the same tensor. ``hydra_lm_head.{i}`` is a Linear (``mlp``) or a Dropout,
    Linear pair (``prefix-mlp``: index 1). The prefix is ``prefix_embeding_layer``, a one-layer LlamaModel."""
    prefix = heads.arch == "prefix-mlp"
    keys = {}
    for i, head in enumerate(heads.heads):
        for j in range(heads.layers):
            block, ours = f"hydra_mlp.{i}.{2 * j + 1 if prefix else j}", f"heads.{i}.{'first' if j == 0 else 'more'}"
            for name in ("linear.weight", "linear.bias", *(("res_connection.weight", "res_connection.bias")
                                                          if j == 0 else ())):
                keys[f"{block}.{name}"] = f"{ours}.{name}"
        if head.lm_head is not None:
            for name in ("weight", "bias"):
                keys[f"hydra_lm_head.{i}.{'1.' if prefix else ''}{name}"] = f"heads.{i}.lm_head.{name}"
    if prefix:
        for name, _ in heads.prefix.named_parameters():
            keys[f"prefix_embeding_layer.{name}"] = f"prefix.{name}"
    return keys


def load_heads(head: str, target_config) -> HydraHeads:
    """Hydra heads in the published layout, checked against the target; a mismatch names the key and shapes."""
    folder, raw = hub.head_files(head, "Hydra", [CONFIG_FILE, WEIGHTS_FILE])
    # HydraConfig's defaults (Spec-Bench model/hydra/hydra_model.py) for keys a config.json leaves out
    n, layers, arch = raw.get("hydra_num_heads", 4), raw.get("hydra_num_layers", 1), raw.get("hydra_head_arch", "mlp")
    if not isinstance(n, int) or n < 1 or not isinstance(layers, int) or layers < 1:
        raise HarnessError(f"Hydra head {folder}: {CONFIG_FILE} needs hydra_num_heads >= 1 and hydra_num_layers "
                          f">= 1, got {n!r} and {layers!r}")
    if arch not in ARCHS:
        raise HarnessError(f"Hydra head {folder}: hydra_head_arch '{arch}' is not one this harness runs "
                          f"({', '.join(ARCHS)}; Hydra's cross-attn and eagle-attn heads are not offered)")
    if not raw.get("grounded_heads", False):
        raise HarnessError(f"Hydra head {folder}: grounded_heads is false, so its heads do not read the draft "
                          f"tokens: those are Medusa heads, not Hydra's (give grounded heads, or use method=medusa)")
    if raw.get("hidden_state_offset", 0) != 0:
        raise HarnessError(f"Hydra head {folder}: hidden_state_offset {raw['hidden_state_offset']} reads an inner "
                          f"layer of the target; this harness feeds the last one (hidden_state_offset 0)")
    state = torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    state = {k: v for k, v in state.items() if not k.endswith(IGNORED)}
    own = any(k.startswith("hydra_lm_head.") for k in state)
    heads = HydraHeads(target_config, n, layers, arch, own_lm_heads=own)
    keys, ours = layout(heads), heads.state_dict()
    missing, unknown = sorted(set(keys) - set(state)), sorted(set(state) - set(keys))
    if missing or unknown:
        raise HarnessError(f"Hydra head {folder} (hydra_head_arch={arch}, hydra_num_heads={n}, hydra_num_layers="
                          f"{layers}) " + (f"lacks {', '.join(missing[:5])}" if missing else
                                           f"has keys Hydra's layout does not: {', '.join(unknown[:5])}"))
    loaded: dict[str, torch.Tensor] = {}
    for key, our in keys.items():
        if tuple(state[key].shape) != tuple(ours[our].shape):
            raise HarnessError(f"Hydra head {folder}: {key} has shape {tuple(state[key].shape)}, but the target "
                              f"(hidden size {target_config.hidden_size}, vocabulary {target_config.vocab_size}) "
                              f"needs {tuple(ours[our].shape)}")
        if our in loaded and not torch.equal(loaded[our], state[key]):
            raise HarnessError(f"Hydra head {folder}: {key} differs from the first repeated block's; Hydra's heads "
                              f"apply one ResBlock after the first, so these keys must hold one tensor")
        loaded[our] = state[key]
    heads.load_state_dict(loaded, strict=False)  # the prefix's rotary buffer is not in a checkpoint
    return heads


def save_heads(heads: HydraHeads, folder: str | Path, extra_json: dict[str, object] | None = None,
               base: str = "") -> Path:
    """Write ``heads`` in the layout load_heads reads (fp16, as Hydra's are published), the folder whole beside
    its place and renamed into it."""
    folder = Path(folder).absolute()
    ours = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in heads.state_dict().items()}
    state = {key: ours[our] for key, our in layout(heads).items()}  # a repeated block's keys: one tensor, stored once
    config = {"hydra_num_heads": len(heads.heads), "hydra_num_layers": heads.layers, "hydra_head_arch": heads.arch,
              "grounded_heads": True, "hidden_state_offset": 0, "base_model_name_or_path": base}
    with folder_replaced(folder) as tmp:
        torch.save(state, tmp / WEIGHTS_FILE)
        write_json_atomic(tmp / CONFIG_FILE, config)
        for name, obj in (extra_json or {}).items():
            write_json_atomic(tmp / name, obj)
    return folder


def random_heads(target_config, heads: int, arch: str = "mlp", seed: int = 0) -> HydraHeads:
    torch.manual_seed(seed)
    out = HydraHeads(target_config, heads, 1, arch)
    for m in out.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
    return out


@register
class Hydra(Proposer):
    name = "hydra"
    wants_hidden = True
    needs_target = True

    @dataclass
    class Params:
        head: str | None = param(None, "a folder or hub id in Hydra's layout, or random (lossless, slow); in a "
                                 "run, the model config's hydra_head", config="${model.hydra_head}")
        tree: str | None = param(None, "a template in data/trees/ or a .json path; default: mc_sim_7b_63 "
                                 "(data/trees/medusa.json, Hydra's default: 63 drafts, depth 4) to the heads' depth")
        arch: str = param("mlp", "for head=random: the head architecture", choices=ARCHS)
        seed: int = param(0, "for head=random")

    def __init__(self, heads: HydraHeads, target, tree: str | None, head_name: str, device):
        dtype = next(target.parameters()).dtype
        self.heads = fp32_rotary(heads.to(device=device, dtype=dtype)).eval().requires_grad_(False)
        self.embed = target.get_input_embeddings()
        self.lm_head = Linear(target.get_output_embeddings(), can_pack(device, dtype))
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
    def build(cls, params: Params, *, vocab_size: int, device: torch.device, target) -> "Hydra":
        if not params.head:
            raise HarnessError("method 'hydra' needs Hydra heads and the model config names none: give "
                              "method.head=PATH (a folder in Hydra's layout, or a hub id), train them with python "
                              "-m scripts.train_hydra, or method.head=random (lossless, slow)")
        if params.head == "random":
            depth = load_template(params.tree or HEADS_TREE).max_depth
            heads = random_heads(target.config, depth, params.arch, params.seed)
        else:
            heads = load_heads(params.head, target.config)
        return cls(heads, target, params.tree, params.head, device)

    def prepare(self, preparation: Preparation) -> None:
        """The shared lm_head as the target's engine runs its own (packed only where engine.pack chose it)."""
        if getattr(preparation.engine, "pack", None) is False:
            self.lm_head.unpack()

    def reset(self, prompt_ids, turn, prompt_logits, prompt_hidden=None) -> None:
        self.cache = kv.new_cache(self.heads.prefix) if self.heads.prefix is not None else None
        self.pending = prompt_hidden

    def update(self, draft: Draft, result: Verification) -> None:
        self.pending = torch.cat([self.pending, result.hidden])

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
        return Draft(tokens, self.tree)

    def step_sizes(self) -> list[int]:
        return [self.tree.size]

    def summary(self) -> dict:
        return {"head": self.head_name, "arch": self.heads.arch, "heads": len(self.heads.heads),
                "layers": self.heads.layers, "own_lm_heads": self.heads.own_lm_heads,
                "head_parameters": sum(p.numel() for p in self.heads.parameters()), "tree": self.tree_name,
                "tree_nodes": self.tree.size}


LABELS = ("teacher", "greedy")


def train(heads: HydraHeads, embed: nn.Module, lm_head: nn.Module, train_set: list[dict], val: list[dict], *,
          minutes: float, lr: float = 1e-3, positions: int = 64, labels: str = "teacher", dropout: float = 0.0,
          seed: int = 0, max_steps: int | None = None, log=print) -> dict:
    """Self-distillation of Hydra heads on records of ``methods.eagle_train.features`` (the target's own greedy
    answers): head ``k`` at response position ``t`` reads the path ``ids[t + 1 .. t + k + 1]`` (teacher forcing
    on the target's tokens, as drafting reads an accepted path) and learns the target's next-token distribution
    at ``t + k + 1`` (``labels=teacher``: Hydra++'s teacher loss) or its greedy token there (``greedy``);
    ``dropout`` before every ResBlock and lm_head (Hydra++: 0.2); the target's embedding and lm_head frozen;
    ``positions`` random positions per sequence and step (``methods.medusa.fit``). Returns the log: steps,
    minutes, the held-out top-1 accuracy of every head."""
    if labels not in LABELS:
        raise HarnessError(f"labels must be one of {', '.join(LABELS)}, got '{labels}'")
    n = len(heads.heads)

    def loss(d: dict, gen) -> torch.Tensor | None:
        t, y = head_batch(d, n, positions, gen)
        if t is None:
            return None
        logits, ok = path_logits(heads, embed, lm_head, d, t, dropout), y >= 0  # [n, p, vocab], [n, p]
        if labels == "greedy":
            return F.cross_entropy(logits[ok], y[ok])
        idx = (t[None, :] + torch.arange(1, n + 1)[:, None]).clamp(max=len(d["ids"]) - 1)
        with torch.no_grad():
            teacher = torch.softmax(lm_head(d["feats"][idx[ok]].float()), dim=-1)
        return F.cross_entropy(logits[ok], teacher)

    result = fit(heads, loss, train_set, minutes=minutes, lr=lr, seed=seed, max_steps=max_steps, log=log)
    return {**result, "top1_per_head": validate(heads, embed, lm_head, val)}


def path_logits(heads: HydraHeads, embed, lm_head, d: dict, t: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
    """Every head's logits [n, len(t), vocab] at positions ``t`` of record ``d``, head ``k`` reading the record's
    tokens ``t + 1 .. t + k + 1`` as its path (clamped at the end: those rows have no label)."""
    feats = d["feats"].float()
    if heads.prefix is not None:
        n = len(feats)
        mask = additive_mask(torch.ones(n, n, dtype=torch.bool).tril(), 0, feats.dtype)
        feats = heads.prefix(feats[None], torch.arange(n).view(1, -1), mask)[0]
    with torch.no_grad():
        tokens = embed(d["ids"]).float()
    x, out = [feats[t]], []
    for k in range(len(heads.heads)):
        x.append(tokens[(t + k + 1).clamp(max=len(tokens) - 1)])
        out.append(heads.logits(k, torch.cat(x, dim=-1), lm_head, dropout))
    return torch.stack(out)


def validate(heads: HydraHeads, embed, lm_head, val: list[dict]) -> list[float]:
    """Top-1 accuracy of every head against the target's greedy tokens over the held-out records' responses."""
    return top1(lambda d, t: path_logits(heads, embed, lm_head, d, t), len(heads.heads), val)
