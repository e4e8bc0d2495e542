"""EAGLE-3 (Li et al., arXiv 2503.01840): the draft head reads low, middle and high target layers.

EAGLE-1/2's head predicts the target's last hidden state; EAGLE-3's predicts tokens directly, from a fusion
of three of the target's layers. At committed position ``j`` the target's feature is the inputs of its
decoder layers 2, L // 2 and L - 3 (L layers; transformers' ``hidden_states[i]``) side by side, ``g_j``
[3h], as SafeAILab/EAGLE's ``eagle/model/modeling_llama_kv.py`` collects them. The head::

    a_j   = fc(g_j)                          # 3h -> h; a draft node reads its parent's output o instead
    o_j   = a_j + Attn(cat(norm_e(e(x_{j+1})), norm_h(a_j)))     # q, k, v from 2h inputs; its own KV cache
    o_j   = o_j + MLP(norm_post(o_j))
    logits = lm_head(norm(o_j))              # over a draft vocabulary: draft index i is token i + d2t[i]

(``eagle/model/cnets.py``: ``Model``, ``LlamaDecoderLayeremb``). The draft tree is EAGLE-2's dynamic one
(``methods.proposers.eagle.Eagle2``, which this proposer is, with the head and the logits above); Spec-Bench's EAGLE-3
row (``evaluation/inference_eagle3.py``, fd2c1cd) runs total_token 60, depth 5, top_k 10, our defaults.

The head's weights (``method.head``): a folder or hub id in the layout SafeAILab publishes
(``yuhuili/EAGLE3-Vicuna1.3-13B``, ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``): ``config.json`` (the target's
shapes, one layer, ``draft_vocab_size``) and ``pytorch_model.bin`` or ``model.safetensors`` with ``fc.weight``,
``midlayer.*``, ``norm.weight``, ``lm_head.weight`` and, when the draft vocabulary is smaller than the
target's, ``d2t`` (and ``t2d``, unused here). The token embedding is the target's (EAGLE-3 loads it from the
base model). A head whose ``target_hidden_size`` differs from its own hidden size is refused.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from methods.base import register
from methods.heads import head_or_random
from methods.heads.eagle3 import feature_layers, load_head, random_head
from methods.params import artefact, param
from methods.proposers.eagle import Eagle2


@register
class Eagle3(Eagle2):
    """EAGLE-3: EAGLE-2's dynamic tree drafted by a head on three target layers with its own lm_head."""

    name = "eagle3"
    uses_target_lm_head = False
    min_layers = 8
    head_kind = {"what": "an EAGLE-3 head", "layout": "EAGLE-3", "trainer": "scripts.train_eagle3"}

    @dataclass
    class Params(Eagle2.Params):
        head: str | None = param(None, "a folder or hub id in EAGLE-3's layout, or random (lossless, slow); in a "
                                 "run, the model config's artefacts.eagle3_head", config=artefact("eagle3_head"))
        depth: int = param(5, "expansions after the root's top-k: drafts reach depth + 1 (Spec-Bench's EAGLE-3: 5)",
                           low=1, high=1024)

    def __init__(self, head, target, width, head_name, device, depth: int, total_tokens: int):
        super().__init__(head, target, width, head_name, device, depth, total_tokens)
        self.wants_hidden = feature_layers(target.config.num_hidden_layers)
        self.vocab = target.config.vocab_size

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device, target) -> "Eagle3":
        feature_layers(target.config.num_hidden_layers)
        head = head_or_random(cls.name, params.head, **cls.head_kind, load=lambda h: load_head(h, target.config),
                              random=lambda: random_head(target.config, params.seed))
        return cls(head, target, params.topk, params.head, device, params.depth, params.total_tokens)

    def _logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.head.logits(features, self.vocab)

    def summary(self) -> dict:
        return {**super().summary(), "feature_layers": list(self.wants_hidden),
                "draft_vocab": self.head.lm_head.out_features}
