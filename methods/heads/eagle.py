"""EAGLE's draft head (EAGLE-1 and EAGLE-2 share it) and its checkpoint layout: the module, reading and
writing SafeAILab/EAGLE's published layout, a random head. The method: ``methods.proposers.eagle``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from methods import hub
from methods.common import HarnessError, folder_replaced, write_json_atomic

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
EAGLE_ROPE = {"rope_theta": 10000.0}  # a head's config.json without rotary keys: EAGLE's own default (see head_rope)


def head_rope(raw: dict) -> dict:
    """The rotary settings of a published head's config.json ``raw``; where it names none, EAGLE's default base
    10000 unscaled, as its code builds the head then (``_init_rope`` in eagle/model/cnets.py and cnets1.py,
    SafeAILab/EAGLE cb7e084), not the target's (EAGLE-3's Llama-3.1 head lists none: its target has 500000 and
    Llama-3 scaling)."""
    return {k: raw[k] for k in ROPE_KEYS if k in raw} or dict(EAGLE_ROPE)


def head_config(target_config, **overrides) -> LlamaConfig:
    """The head's config: the target's attention and MLP shapes, one layer; ``overrides`` from the head's own
    config.json. Its rotary settings, when it has any, replace the target's (EAGLE's heads carry their own).
    A rotary table by layer type (Gemma 3's) gives its top-level settings where it has them (what a head saved
    with such a table was trained with), else its full-attention layers' entry."""
    c = target_config.to_dict()
    if any(k in overrides for k in ROPE_KEYS):
        for k in ROPE_KEYS:
            c.pop(k, None)
    for key in ("layer_types", "sliding_window"):  # the target's (Gemma 3's windows): the head's one layer is a
        c.pop(key, None)  # full-attention one, and a cache made from its config keeps every entry
    c.update(num_hidden_layers=1, **overrides)
    rope = c.get("rope_parameters")
    if isinstance(rope, dict) and any(isinstance(v, dict) for v in rope.values()):
        c["rope_parameters"] = {k: v for k, v in rope.items() if not isinstance(v, dict)} or \
            dict(rope["full_attention"])
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
    config = head_config(target_config, **{k: raw[k] for k in SHAPE_KEYS if k in raw}, **head_rope(raw))
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


def random_head(target_config, seed: int = 0, intermediate_size: int | None = None) -> EagleHead:
    """A new head of the target's shapes, its MLP ``intermediate_size`` wide where given (config.json records it)."""
    torch.manual_seed(seed)
    width = {"intermediate_size": intermediate_size} if intermediate_size else {}
    head = EagleHead(head_config(target_config, **width))
    head.apply(lambda m: nn.init.normal_(m.weight, std=0.02) if isinstance(m, nn.Linear) else None)
    return head
