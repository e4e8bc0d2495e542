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

import json
import shutil
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from methods import hub, kv
from methods.base import Draft, Preparation, Proposer, Verification, register
from methods.common import HarnessError, folder_replaced, write_json_atomic
from methods.ops import Linear, can_pack, fp32_rotary
from methods.params import param
from methods.tree import Tree, additive_mask, load_template


VERIFY_RULES = ("coupled", "specinfer")  # EAGLE-1 at temperature > 0 (methods.sampling)

# The checkpoint layout, defined here once: load_head reads it, save_head writes it (scripts.train_eagle's heads,
# data/eagle/), as SafeAILab/EAGLE publishes its heads and eagle/model/ea_model.py reads them.
CONFIG_FILE = "config.json"
SAFETENSORS_FILE, BIN_FILE = "model.safetensors", "pytorch_model.bin"  # load_head takes the first one present
# config.json keys that shape the head beyond the target's config (read into head_config, with ROPE_KEYS below);
# hidden_size and vocab_size are written too, to refuse a head made for another target.
SHAPE_KEYS = ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
              "max_position_embeddings")
# fc has a bias unless config.json says "bias": false, the key and default EAGLE's ea_model.py reads (its Llama-3
# heads have none); save_head writes the key only for a head without one, so a head with a bias reads as before.
BIAS_KEY = "bias"
# Keys of a published checkpoint that the head does not use: the target's embeddings (shared) and old rotary buffers.
IGNORED = ("embed_tokens.weight", "rotary_emb.inv_freq")


class EagleHead(nn.Module):
    """``fc([token embedding, feature])`` then one Llama decoder layer without its input norm."""

    def __init__(self, config: LlamaConfig, bias: bool = True):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=bias)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, layer_idx=0)])
        self.layers[0].input_layernorm = nn.Identity()
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor,
                mask: torch.Tensor, cache) -> torch.Tensor:
        """[1, n, h] embeddings and features -> [1, n, h] predicted next features; appends n entries to ``cache``."""
        x = self.fc(torch.cat([embeds, features], dim=-1))
        return self.layers[0](x, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
                              use_cache=True, position_embeddings=self.rotary(x, position_ids))


ROPE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling")


def head_config(target_config, **overrides) -> LlamaConfig:
    """The head's config: the target's attention and MLP shapes, one layer; ``overrides`` from the head's own
    config.json. Its rotary settings, when it has any, replace the target's (EAGLE's heads carry their own)."""
    c = target_config.to_dict()
    if any(k in overrides for k in ROPE_KEYS):
        for k in ROPE_KEYS:
            c.pop(k, None)
    c.update(num_hidden_layers=1, **overrides)
    config = LlamaConfig(**{k: v for k, v in c.items() if k not in ("architectures", "model_type")})
    config._attn_implementation = "sdpa"
    return config


def expected_shapes(config: LlamaConfig, bias: bool = True) -> dict[str, tuple[int, ...]]:
    h, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or h // heads
    i = config.intermediate_size
    return {
        "fc.weight": (h, 2 * h), **({"fc.bias": (h,)} if bias else {}),
        "layers.0.self_attn.q_proj.weight": (heads * d, h), "layers.0.self_attn.k_proj.weight": (kv_heads * d, h),
        "layers.0.self_attn.v_proj.weight": (kv_heads * d, h), "layers.0.self_attn.o_proj.weight": (h, heads * d),
        "layers.0.mlp.gate_proj.weight": (i, h), "layers.0.mlp.up_proj.weight": (i, h),
        "layers.0.mlp.down_proj.weight": (h, i), "layers.0.post_attention_layernorm.weight": (h,),
    }


def load_head(head: str, target_config) -> EagleHead:
    """Read a head in the published layout and check it against the target; a mismatch names key and shapes."""
    folder = hub.folder(head, "method.head", [CONFIG_FILE, "*.bin", "*.safetensors"],
                        f"{CONFIG_FILE} and {BIN_FILE} or {SAFETENSORS_FILE}")
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise HarnessError(f"EAGLE head {folder} has no {CONFIG_FILE}")
    raw = json.loads(config_file.read_text())
    if raw.get("hidden_size") != target_config.hidden_size or raw.get("vocab_size", target_config.vocab_size) \
            != target_config.vocab_size:
        raise HarnessError(f"EAGLE head {folder} is for hidden size {raw.get('hidden_size')} and vocabulary "
                          f"{raw.get('vocab_size')}, the target has {target_config.hidden_size} and "
                          f"{target_config.vocab_size}: give the head trained for this model")
    config = head_config(target_config, **{k: raw[k] for k in (*SHAPE_KEYS, *ROPE_KEYS) if k in raw})
    bias = raw.get(BIAS_KEY, True)
    state = read_weights(folder, "EAGLE", IGNORED)
    want = expected_shapes(config, bias)
    missing = sorted(set(want) - set(state))
    if missing:
        raise HarnessError(f"EAGLE head {folder} lacks {', '.join(missing)}: not a checkpoint in EAGLE's layout")
    unknown = sorted(set(state) - set(want))
    if unknown:
        raise HarnessError(f"EAGLE head {folder} has keys this head does not know: {', '.join(unknown[:5])}")
    for key, shape in want.items():
        if tuple(state[key].shape) != shape:
            raise HarnessError(f"EAGLE head {folder}: {key} has shape {tuple(state[key].shape)}, but the target "
                              f"(hidden size {target_config.hidden_size}) needs {shape}")
    model = EagleHead(config, bias)
    model.load_state_dict(state, strict=False)  # the rotary buffer is not in a checkpoint
    return model


def read_weights(folder: Path, kind: str, ignored: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The state dict of a head folder in SafeAILab's layouts (``model.safetensors``, else ``pytorch_model.bin``),
    without the keys that end in one of ``ignored``; neither file: refused naming the ``kind`` of head."""
    if (folder / SAFETENSORS_FILE).is_file():
        from safetensors.torch import load_file

        state = load_file(folder / SAFETENSORS_FILE)
    elif (folder / BIN_FILE).is_file():
        state = torch.load(folder / BIN_FILE, map_location="cpu", weights_only=True)
    else:
        raise HarnessError(f"{kind} head {folder} has neither {SAFETENSORS_FILE} nor {BIN_FILE}")
    return {k: v for k, v in state.items() if not k.endswith(ignored)}


def save_head(head: EagleHead, folder: str | Path, dtype: torch.dtype = torch.float16,
              extra_json: dict[str, object] | None = None) -> Path:
    """Write ``head`` in the layout load_head reads: config.json (hidden size and vocabulary, SHAPE_KEYS, the
    rotary settings, the bias flag) and model.safetensors holding exactly expected_shapes' keys in ``dtype``
    (fp16 by default, as EAGLE publishes its heads: half the bytes, and the head runs in the target's dtype
    anyway). ``extra_json`` adds JSON files beside them, by name (a training log).

    The folder is written whole beside its place and renamed into it, so a reader (or a killed training run)
    finds the old head or the new one, never a config of one and the weights of another. Other files an
    existing folder holds are carried over, as writing file by file kept them."""
    from safetensors.torch import save_file

    folder = Path(folder).absolute()
    if folder.exists() and not folder.is_dir():
        raise HarnessError(f"cannot save the EAGLE head to {folder}: it is a file; give a folder")
    c, bias = head.config, head.fc.bias is not None
    state = head.state_dict()
    weights = {k: state[k].detach().to(device="cpu", dtype=dtype).contiguous() for k in expected_shapes(c, bias)}
    shapes = {**{k: getattr(c, k) for k in SHAPE_KEYS},
              "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads}
    config = {"architectures": ["EagleHead"], "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
              "num_hidden_layers": 1, **shapes, ROPE_KEYS[0]: c.rope_parameters,
              **({} if bias else {BIAS_KEY: False}), "torch_dtype": str(dtype).removeprefix("torch.")}
    written = {CONFIG_FILE, SAFETENSORS_FILE, *(extra_json or {})}
    with folder_replaced(folder) as tmp:
        if folder.is_dir():
            for entry in folder.iterdir():
                if entry.name not in written:
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.copytree(entry, tmp / entry.name, symlinks=True)
                    else:
                        shutil.copy2(entry, tmp / entry.name, follow_symlinks=False)
        save_file(weights, str(tmp / SAFETENSORS_FILE))
        write_json_atomic(tmp / CONFIG_FILE, config)
        for name, obj in (extra_json or {}).items():
            write_json_atomic(tmp / name, obj)
    return folder


def random_head(target_config, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(head_config(target_config))
    head.apply(lambda m: nn.init.normal_(m.weight, std=0.02) if isinstance(m, nn.Linear) else None)
    return head


class _Eagle(Proposer):
    """What both EAGLEs share: the head, its cache of committed pairs, and feeding it pairs."""

    wants_hidden = True
    needs_target = True
    uses_target_lm_head = True

    @dataclass
    class Params:
        head: str | None = param(None, "a folder or hub id in EAGLE's layout, or random (lossless, slow); in a "
                                 "run, the model config's head", config="${model.eagle_head}")
        topk: int = param(10, "candidates the head ranks per node (EAGLE's top-k)", low=1, high=64)
        seed: int = param(0, "for head=random")

    def __init__(self, head: EagleHead, target, width: int, head_name: str, device: torch.device):
        self.device = device
        self.head = fp32_rotary(head.to(device=device, dtype=next(target.parameters()).dtype)).eval()
        self.head.requires_grad_(False)
        self.embed = target.get_input_embeddings()  # shared with the target, as in EAGLE
        dtype = next(target.parameters()).dtype
        # the target's lm_head turns predicted features into logits (oneDNN-packed on a CPU); EAGLE-3 has its own
        self.lm_head = Linear(target.get_output_embeddings(), can_pack(device, dtype)) if self.uses_target_lm_head \
            else None
        self.width, self.head_name = width, head_name  # width: candidates per node (EAGLE's top-k)
        self.cache = None
        self.pending: torch.Tensor | None = None  # [m, h] target features not yet fed to the head

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device, target) -> "_Eagle":
        head_name, width = params.head, params.topk
        shared = {f.name for f in fields(_Eagle.Params)}
        extra = {f.name: getattr(params, f.name) for f in fields(params) if f.name not in shared}
        if not head_name:
            raise HarnessError(f"method '{cls.name}' needs a draft head and the model config names none: give "
                              f"method.head=PATH (a folder in EAGLE's layout, or a hub id), train one with "
                              f"python -m scripts.train_eagle, or method.head=random (lossless, slow)")
        head = random_head(target.config, params.seed) if head_name == "random" else load_head(head_name, target.config)
        return cls(head, target, width, head_name, device, **extra)

    def prepare(self, preparation: Preparation) -> None:
        """Run the lm_head as the static engine runs its own: where engine.pack=auto measured plain weights
        faster on this machine (or engine.pack=false, or engine.compile), the drafts' lm_head is not packed either."""
        if getattr(preparation.engine, "pack", None) is False and self.lm_head is not None:
            self.lm_head.unpack()

    def _logits(self, features: torch.Tensor) -> torch.Tensor:
        """Next-token logits over the target's vocabulary at the head's predicted features."""
        return self.lm_head(features)

    def reset(self, prompt_ids, turn, prompt_logits, prompt_hidden=None) -> None:
        self.cache = kv.new_cache(self.head)
        self.pending = prompt_hidden

    def update(self, draft: Draft, result: Verification) -> None:
        self.pending = torch.cat([self.pending, result.hidden])

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
        return Draft(tokens, tree, q=self._q)

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
        return Draft(tokens, tree.to(self.device))

    def step_sizes(self) -> list[int]:
        candidates = self.width + self.depth * self.width * self.width
        return [1 + min(self.total - 1, candidates)]

    def summary(self) -> dict:
        return {**super().summary(), "depth": self.depth, "total_tokens": self.total}
