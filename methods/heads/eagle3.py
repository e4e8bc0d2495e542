"""EAGLE-3's draft head and its checkpoint layout (SafeAILab/EAGLE's EAGLE-3 heads), the draft vocabulary and
its training. The method: ``methods.proposers.eagle3``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from methods import hub
from methods.common import HarnessError, folder_replaced, write_json_atomic
from methods.heads.eagle import (
    BIN_FILE,
    CONFIG_FILE,
    ROPE_KEYS,
    SAFETENSORS_FILE,
    SHAPE_KEYS,
    head_config,
    head_rope,
    read_weights,
)
from methods.heads.eagle_train import head_pass
from methods.heads.fit import fit

IGNORED = ("embed_tokens.weight", "t2d", "rotary_emb.inv_freq")  # the target's embedding; the reverse map; buffers


def feature_layers(n_layers: int) -> tuple[int, int, int]:
    """The target layers whose inputs EAGLE-3 reads: 2, L // 2 and L - 3, in layer order.

    >>> feature_layers(32), feature_layers(40)
    ((2, 16, 29), (2, 20, 37))
    """
    if n_layers < 8:
        raise HarnessError(f"EAGLE-3 reads the target's layers 2, L // 2 and L - 3, which needs at least 8 layers; "
                          f"this target has {n_layers}")
    return 2, n_layers // 2, n_layers - 3


class Eagle3Head(nn.Module):
    def __init__(self, config, draft_vocab: int):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.midlayer = LlamaDecoderLayer(config, layer_idx=0)
        at = self.midlayer.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):  # the attention reads [embedding, hidden] side by side
            old = getattr(at, name)
            setattr(at, name, nn.Linear(2 * h, old.out_features, bias=False))
        self.midlayer.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor,
                mask: torch.Tensor, cache) -> torch.Tensor:
        """[1, n, h] embeddings and [1, n, 3h] target features (committed pairs) or [1, n, h] outputs (drafts)
        -> [1, n, h] outputs; appends n entries to ``cache``."""
        layer = self.midlayer
        x = self.fc(features) if features.shape[-1] != embeds.shape[-1] else features
        qkv_in = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(x)], dim=-1)
        attn, _ = layer.self_attn(qkv_in, position_embeddings=self.rotary(x, position_ids), attention_mask=mask,
                                  past_key_values=cache)
        x = x + attn
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def tokens(self) -> torch.Tensor:
        """The target token of every draft-vocabulary entry: ``i + d2t[i]``."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def logits(self, out: torch.Tensor, vocab: int) -> torch.Tensor:
        """Logits over the target's ``vocab`` tokens: the draft vocabulary's at their tokens, -inf elsewhere."""
        draft = self.lm_head(self.norm(out))
        if draft.shape[-1] == vocab:
            return draft
        full = draft.new_full((*draft.shape[:-1], vocab), float("-inf"))
        full[..., self.tokens()] = draft
        return full


def expected_shapes(config, draft_vocab: int, vocab: int) -> dict[str, tuple[int, ...]]:
    h, heads, kv_heads, i = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, \
        config.intermediate_size
    d = h // heads  # EAGLE-3's attention: head_dim = hidden_size // num_attention_heads
    a = "midlayer.self_attn."
    return {"fc.weight": (h, 3 * h), f"{a}q_proj.weight": (heads * d, 2 * h),
            f"{a}k_proj.weight": (kv_heads * d, 2 * h), f"{a}v_proj.weight": (kv_heads * d, 2 * h),
            f"{a}o_proj.weight": (h, heads * d),
            "midlayer.mlp.gate_proj.weight": (i, h), "midlayer.mlp.up_proj.weight": (i, h),
            "midlayer.mlp.down_proj.weight": (h, i), "midlayer.input_layernorm.weight": (h,),
            "midlayer.hidden_norm.weight": (h,), "midlayer.post_attention_layernorm.weight": (h,),
            "norm.weight": (h,), "lm_head.weight": (draft_vocab, h), **({"d2t": (draft_vocab,)} if draft_vocab < vocab
                                                                        else {})}


def load_head(head: str, target_config) -> Eagle3Head:
    """An EAGLE-3 head in the published layout, checked against the target; a mismatch names key and shapes."""
    folder = hub.folder(head, "method.head", [CONFIG_FILE, "*.bin", "*.safetensors"],
                        f"{CONFIG_FILE} and {BIN_FILE} or {SAFETENSORS_FILE}")
    if not (folder / CONFIG_FILE).is_file():
        raise HarnessError(f"EAGLE-3 head {folder} has no {CONFIG_FILE}")
    raw = json.loads((folder / CONFIG_FILE).read_text())
    h, vocab = target_config.hidden_size, target_config.vocab_size
    if raw.get("hidden_size") != h or raw.get("vocab_size", vocab) != vocab:
        raise HarnessError(f"EAGLE-3 head {folder} is for hidden size {raw.get('hidden_size')} and vocabulary "
                          f"{raw.get('vocab_size')}, the target has {h} and {vocab}: give the head trained for it")
    if raw.get("target_hidden_size", h) != h:
        raise HarnessError(f"EAGLE-3 head {folder} has target_hidden_size {raw['target_hidden_size']} beside hidden "
                          f"size {h}: heads narrower than their target are not offered")
    draft_vocab = raw.get("draft_vocab_size", vocab)
    if not isinstance(draft_vocab, int) or not 1 <= draft_vocab <= vocab:
        raise HarnessError(f"EAGLE-3 head {folder}: draft_vocab_size {draft_vocab!r} must be in 1..{vocab}")
    config = head_config(target_config, **{k: raw[k] for k in SHAPE_KEYS if k in raw}, **head_rope(raw))
    config.head_dim = h // config.num_attention_heads
    state = read_weights(folder, "EAGLE-3", IGNORED)
    want = expected_shapes(config, draft_vocab, vocab)
    missing, unknown = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or unknown:
        raise HarnessError(f"EAGLE-3 head {folder} " + (f"lacks {', '.join(missing[:5])}: not a checkpoint in "
                                                       f"EAGLE-3's layout" if missing else
                                                       f"has keys EAGLE-3's layout does not: {', '.join(unknown[:5])}"))
    for key, shape in want.items():
        if tuple(state[key].shape) != shape:
            raise HarnessError(f"EAGLE-3 head {folder}: {key} has shape {tuple(state[key].shape)}, but the target "
                              f"(hidden size {h}, draft vocabulary {draft_vocab}) needs {shape}")
    if "d2t" in state:
        ids = torch.arange(draft_vocab) + state["d2t"]
        if int(ids.min()) < 0 or int(ids.max()) >= vocab or len(ids.unique()) != draft_vocab:
            raise HarnessError(f"EAGLE-3 head {folder}: d2t does not map the draft vocabulary to distinct tokens of "
                              f"the target's {vocab}")
    model = Eagle3Head(config, draft_vocab)
    model.load_state_dict(state, strict=False)  # the rotary buffer, and d2t for a full draft vocabulary
    return model


def new_head(target_config, tokens: torch.Tensor | None = None, intermediate_size: int | None = None) -> Eagle3Head:
    """An untrained head for the target (PyTorch's default initialisation, as EAGLE-3's trainer starts), its
    draft vocabulary ``tokens`` (increasing target ids; None: the whole vocabulary), its MLP as wide as the
    target's unless ``intermediate_size`` says otherwise (config.json's key: the loader reads any width)."""
    config = head_config(target_config, **({"intermediate_size": intermediate_size} if intermediate_size else {}))
    config.head_dim = config.hidden_size // config.num_attention_heads
    head = Eagle3Head(config, len(tokens) if tokens is not None else target_config.vocab_size)
    if tokens is not None:
        head.d2t.copy_(tokens - torch.arange(len(tokens)))
    return head


def random_head(target_config, seed: int = 0) -> Eagle3Head:
    torch.manual_seed(seed)
    head = new_head(target_config)
    head.apply(lambda m: nn.init.normal_(m.weight, std=0.02) if isinstance(m, nn.Linear) else None)
    return head


def draft_vocabulary(records: list[dict], size: int) -> torch.Tensor:
    """The ``size`` tokens most frequent in the records' responses, in increasing order: the draft vocabulary
    EAGLE-3's trainer picks (``eagle/traineagle3/cnets.py``, ``Model.scandata``: the most common tokens under the
    loss mask, sorted)."""
    counts = torch.bincount(torch.cat([d["ids"][d["start"]:] for d in records]))
    return counts.topk(min(size, int((counts > 0).sum()))).indices.sort().values


def save_head(head: Eagle3Head, folder, extra_json: dict[str, object] | None = None, base: str = "") -> Path:
    """Write ``head`` in the layout load_head reads (fp16 ``model.safetensors``, ``d2t``/``t2d`` for a smaller
    draft vocabulary, as EAGLE-3's are published), the folder whole beside its place and renamed into it."""
    from safetensors.torch import save_file

    folder, c = Path(folder).absolute(), head.config
    draft_vocab = head.lm_head.out_features
    state = head.state_dict()
    weights = {k: state[k].detach().to("cpu", torch.float16 if state[k].is_floating_point() else state[k].dtype)
               .contiguous() for k in expected_shapes(c, draft_vocab, c.vocab_size)}
    if draft_vocab < c.vocab_size:
        weights["t2d"] = torch.zeros(c.vocab_size, dtype=torch.bool).index_fill_(0, head.tokens().cpu(), True)
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
              "draft_vocab_size": draft_vocab, "num_hidden_layers": 1, **{k: getattr(c, k) for k in SHAPE_KEYS},
              ROPE_KEYS[0]: c.rope_parameters, "torch_dtype": "float16", "base_model_name_or_path": base}
    with folder_replaced(folder) as tmp:
        save_file(weights, str(tmp / SAFETENSORS_FILE))
        write_json_atomic(tmp / CONFIG_FILE, config)
        for name, obj in (extra_json or {}).items():
            write_json_atomic(tmp / name, obj)
    return folder


def train(head: Eagle3Head, embed, lm_head, train_set: list[dict], val: list[dict], *, minutes: float,
          lr: float = 1e-3, unroll: int = 3, positions: int = 64, seed: int = 0, max_steps: int | None = None,
          log=print) -> dict:
    """EAGLE-3's training with training-time test, self-distilled, on records with ``taps``
    (``methods.heads.eagle_train.features(layers=feature_layers(L))``): depth 1 reads the target's features, depth
    s > 1 the head's own depth s - 1 outputs as drafting does (``methods.heads.eagle_train.head_pass``); the loss of
    depth s, weighted 0.8^(s-1), is the cross-entropy of the head's draft-vocabulary logits against the
    target's next-token distribution restricted to the draft vocabulary, at ``positions`` random response
    positions, those whose target token is outside it left out (``eagle/traineagle3``: cnets.py and
    main.py); the target's embedding and lm_head frozen (``methods.heads.fit.fit``). Returns the log: steps,
    minutes, the held-out top-1 accuracy of every depth."""
    tokens = head.tokens()
    inside = torch.zeros(head.config.vocab_size, dtype=torch.bool)
    inside[tokens] = True

    def loss(d: dict, gen) -> torch.Tensor | None:
        s, length = d["start"], len(d["ids"])
        if s < unroll or length - s < 1:
            return None
        total = 0.0
        for depth, out in enumerate(head_pass(head, embed, d, unroll=unroll, key="taps"), start=1):
            rows = out[s - depth:]  # row r predicts the token after position s + r
            r = torch.randint(len(rows), (min(positions, len(rows)),), generator=gen)
            with torch.no_grad():
                teacher = torch.softmax(lm_head(d["feats"][s + r].float())[:, tokens], dim=-1)
            logp = torch.log_softmax(head.lm_head(head.norm(rows[r])).float(), dim=-1)
            keep = inside[d["greedy"][s + r]]
            total = total + 0.8 ** (depth - 1) * (-(teacher * logp).sum(-1) * keep).sum() / max(int(keep.sum()), 1)
        return total

    result = fit(head, loss, train_set, minutes=minutes, lr=lr, seed=seed, max_steps=max_steps, log=log)
    return {**result, "top1_per_depth": validate(head, embed, val, unroll)}


@torch.no_grad()
def validate(head: Eagle3Head, embed, val: list[dict], unroll: int = 3) -> list[float]:
    """Top-1 accuracy of each depth of the training-time test (``head_pass``) against the target's greedy tokens
    over the held-out records' responses."""
    hits, total = torch.zeros(unroll), torch.zeros(unroll)
    for d in val:
        s = d["start"]
        if s < unroll:
            continue
        for depth, out in enumerate(head_pass(head, embed, d, unroll=unroll, key="taps"), start=1):
            pred = head.logits(out[s - depth:], head.config.vocab_size).argmax(-1)
            hits[depth - 1] += int((pred == d["greedy"][s:s + len(pred)]).sum())
            total[depth - 1] += len(pred)
    return [round(float(h / max(c, 1)), 4) for h, c in zip(hits, total)]
