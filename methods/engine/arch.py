"""What a decoder does beyond Llama's, per architecture, in this one place: the static engine reads a ``Plan`` of
the model and a ``LayerPlan`` per layer, and its forward never asks which architecture it runs.

Claimed by ``engine=static`` (``STATIC``), each checked token for token against ``generate`` on a tiny random
model (tests/test_architectures.py):

* ``llama``: Vicuna, Llama-2/3/3.1 (rotary scaling is the rotary module's), SmolLM2, DeepSeek-R1-Distill-Llama;
* ``qwen2`` (Qwen2.5): biases on q/k/v, which the linears carry;
* ``qwen3``: an RMSNorm over each head's queries and keys before the rotary embedding (``q_norm``/``k_norm``),
  the head size independent of the hidden size;
* ``gemma3_text`` (Gemma 3): the same q/k norms; norms after attention and after the MLP as well as before
  them; the embeddings scaled by sqrt(hidden) (the embedding module does it); sliding-window layers (a query
  sees the last ``sliding_window`` positions) with their own rotary base beside global ones; a final logit
  soft-cap where the config sets one.

Read from the modules of transformers' implementation (``modeling_gemma3.py``, ``modeling_qwen3.py``), not
from the model type, so a module present is a module used. Anything else runs on ``engine=hf``.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from methods.common import HarnessError

STATIC = ("llama", "qwen2", "qwen3", "gemma3_text")
FULL = "full_attention"


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass
class LayerPlan:
    """One decoder layer's parts around attention and MLP (identity where the architecture has none)."""

    q_norm: Callable  # per head, on queries [.., n, head_dim] before the rotary embedding (Qwen3, Gemma 3)
    k_norm: Callable
    after_attention: Callable  # on the attention's output projection, before the residual (Gemma 3)
    before_mlp: Callable  # the MLP's input norm (Llama: post_attention_layernorm; Gemma 3: pre_feedforward_)
    after_mlp: Callable  # on the MLP's output, before the residual (Gemma 3)
    window: int | None  # sliding-window attention: keys at positions > query's - window; None: every earlier one
    rope: str  # the rotary table it reads (Gemma 3: one per layer type)


# transformers' RMSNorms that compute weight * (x * rsqrt(mean(x^2) + eps)) in float32, as torch's rms_norm does
# (one kernel call where the module makes eight; the same numbers: tests/test_static_engine.py)
PLAIN_RMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")


def norm(module) -> Callable:
    """``module`` (a norm of the model), as one ``rms_norm`` call where it is a plain float32 RMSNorm (``PLAIN_RMS``)
    of a float32 model, else the module itself."""
    if module is None or type(module).__name__ not in PLAIN_RMS or module.weight.dtype != torch.float32:
        return module
    shape, weight, eps = (module.weight.shape[0],), module.weight, module.variance_epsilon
    return lambda x: torch.nn.functional.rms_norm(x, shape, weight, eps)


def layer_plan(layer) -> LayerPlan:
    at = layer.self_attn
    gemma = hasattr(layer, "pre_feedforward_layernorm")  # the "sandwich": norms after attention and MLP too
    return LayerPlan(
        q_norm=norm(getattr(at, "q_norm", None)) or _same, k_norm=norm(getattr(at, "k_norm", None)) or _same,
        after_attention=layer.post_attention_layernorm if gemma else _same,
        before_mlp=layer.pre_feedforward_layernorm if gemma else norm(layer.post_attention_layernorm),
        after_mlp=layer.post_feedforward_layernorm if gemma else _same,
        window=getattr(at, "sliding_window", None), rope=getattr(at, "layer_type", None) or FULL)


@dataclass
class Plan:
    """The whole model's: its layers' plans, the rotary tables it needs and the final logit soft-cap."""

    layers: list[LayerPlan]
    ropes: tuple[str, ...]  # the rotary tables the layers read
    rope_per_type: bool  # the rotary module takes the layer type (Gemma 3)
    logit_cap: float | None

    @property
    def windows(self) -> tuple[int | None, ...]:
        """The distinct attention windows (None: full), each a mask per forward."""
        return tuple(sorted({p.window for p in self.layers}, key=lambda w: (w is not None, w or 0)))

    def rope_tables(self, rotary, dtype, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """cos, sin [n, head_dim] of ``positions`` for every table the layers read."""
        x = torch.empty(1, dtype=dtype, device=positions.device)
        out = {}
        for name in self.ropes:
            cos, sin = rotary(x, positions[None], name) if self.rope_per_type else rotary(x, positions[None])
            out[name] = (cos[0], sin[0])
        return out

    def logits(self, lm_head, h: torch.Tensor) -> torch.Tensor:
        logits = lm_head(h)
        if self.logit_cap is not None:  # Gemma's final soft-cap, as its CausalLM applies it
            logits = torch.tanh(logits / self.logit_cap) * self.logit_cap
        return logits


def plan(model) -> Plan:
    """The ``Plan`` of ``model``, or the one-line refusal that names ``engine=hf``."""
    cfg = model.config
    if cfg.model_type not in STATIC:
        raise HarnessError(f"engine=static runs the {', '.join(STATIC)} architectures; this model is "
                           f"'{cfg.model_type}'. Use engine=hf")
    if getattr(cfg, "attn_logit_softcapping", None) is not None:
        raise HarnessError(f"engine=static has no attention logit soft-cap (this {cfg.model_type} config sets "
                           f"attn_logit_softcapping={cfg.attn_logit_softcapping}). Use engine=hf")
    layers = [layer_plan(layer) for layer in model.model.layers]
    rotary = model.model.rotary_emb
    per_type = "layer_type" in inspect.signature(rotary.forward).parameters
    return Plan(layers, tuple(sorted({p.rope for p in layers})) if per_type else (FULL,), per_type,
                getattr(cfg, "final_logit_softcapping", None))


def window_mask(mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor,
                window: int | None) -> torch.Tensor:
    """``mask`` [.., n, span] narrowed to a sliding window: a query at position p keeps the keys at positions
    greater than p - window (transformers' ``sliding_window_overlay``); ``window`` None: ``mask`` itself."""
    if window is None:
        return mask
    return mask & (key_positions[..., None, :] > query_positions[..., :, None] - window)


def layer_windows(model) -> dict[str | None, int | None]:
    """A transformers model's layer types and each one's sliding window (None: full attention)."""
    layers = getattr(getattr(model, "model", None), "layers", [])
    return {getattr(layer.self_attn, "layer_type", None): getattr(layer.self_attn, "sliding_window", None)
            for layer in layers}


def hf_mask(types: dict[str | None, int | None], allowed: torch.Tensor, query_positions: torch.Tensor,
            key_positions: torch.Tensor, dtype: torch.dtype):
    """The ``attention_mask`` a transformers model of layer ``types`` (``layer_windows``) takes for ``allowed``
    [b, n, kv] (bool: what each query may see; positions [b, n] and [b, kv]): additive [b, 1, n, kv]; for a model
    with sliding-window layers, one such mask per layer type (the mapping its forward builds itself when given
    none), each narrowed to its window."""
    def additive(a: torch.Tensor) -> torch.Tensor:
        return torch.zeros(a.shape, dtype=dtype, device=a.device).masked_fill_(~a, torch.finfo(dtype).min)[:, None]

    if all(w is None for w in types.values()):
        return additive(allowed)
    return {t: additive(window_mask(allowed, query_positions, key_positions, w)) for t, w in types.items()}
