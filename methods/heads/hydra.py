"""Hydra's sequentially dependent heads (mlp and Hydra++'s prefix-mlp), their checkpoint layout (zankner/Hydra's)
and their training. The method: ``methods.proposers.hydra``.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from methods import hub
from methods.common import HarnessError, folder_replaced, write_json_atomic
from methods.heads.eagle import head_config
from methods.heads.fit import fit, head_batch, top1
from methods.tree import additive_mask

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


LABELS = ("teacher", "greedy")


def train(heads: HydraHeads, embed: nn.Module, lm_head: nn.Module, train_set: list[dict], val: list[dict], *,
          minutes: float, lr: float = 1e-3, positions: int = 64, labels: str = "teacher", dropout: float = 0.0,
          seed: int = 0, max_steps: int | None = None, log=print) -> dict:
    """Self-distillation of Hydra heads on records of ``methods.heads.eagle_train.features`` (the target's own greedy
    answers): head ``k`` at response position ``t`` reads the path ``ids[t + 1 .. t + k + 1]`` (teacher forcing
    on the target's tokens, as drafting reads an accepted path) and learns the target's next-token distribution
    at ``t + k + 1`` (``labels=teacher``: Hydra++'s teacher loss) or its greedy token there (``greedy``);
    ``dropout`` before every ResBlock and lm_head (Hydra++: 0.2); the target's embedding and lm_head frozen;
    ``positions`` random positions per sequence and step (``methods.heads.fit.fit``). Returns the log: steps,
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
