"""Checkpoints built inside the tests, in the layouts real ones come in: a tiny random model of a shipped
config's architecture with a SentencePiece tokenizer (Vicuna's and Llama-2's kind: ``tokenizer.model`` only),
an EAGLE head in SafeAILab/EAGLE's layout, and the Hugging Face hub cache's folder layout to put them in."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from evaluation.shapes import random_model


@lru_cache(maxsize=1)
def _sentencepiece_model() -> bytes:
    """A 512-piece BPE SentencePiece model trained on Spec-Bench's question texts (a second or two)."""
    import io

    import sentencepiece as spm

    from evaluation.data import load_bench

    text = [t for q in load_bench(None) for t in q.turns]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=out, vocab_size=512, model_type="bpe",
                                   byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    return out.getvalue()


def sentencepiece_tokenizer(folder: Path) -> None:
    """``tokenizer.model`` and a ``LlamaTokenizer`` config, as lmsys/vicuna-7b-v1.3 ships them (no tokenizer.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(_sentencepiece_model())
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "model_max_length": 2048}))


def tiny_model(name: str, seed: int = 0, **overrides) -> LlamaForCausalLM:
    """A random model of the architecture of shipped config ``name`` (``evaluation.shapes.tiny``)."""
    return random_model(name, small=True, seed=seed, **overrides)


def save_model(folder: Path, name: str, **overrides) -> LlamaForCausalLM:
    model = tiny_model(name, **overrides)
    model.save_pretrained(folder)
    sentencepiece_tokenizer(folder)
    return model


def save_eagle_head(folder: Path, target_config, fmt: str = "bin", bias: bool | None = None, drop=(),
                    reshape=None, extra=None, config_extra=None) -> dict:
    """A head in SafeAILab/EAGLE's published layout: config.json plus pytorch_model.bin or model.safetensors.
    ``bias``: None writes no "bias" key (EAGLE reads true), False writes ``"bias": false`` and no ``fc.bias``."""
    from safetensors.torch import save_file

    from methods.eagle import expected_shapes, head_config

    folder.mkdir(parents=True, exist_ok=True)
    cfg = head_config(target_config)
    state = {k: torch.randn(s) * 0.02 for k, s in expected_shapes(cfg, bias is not False).items() if k not in drop}
    state["embed_tokens.weight"] = torch.zeros(cfg.vocab_size, cfg.hidden_size)  # published heads carry it
    if reshape:
        state[reshape] = torch.zeros(3, 3)
    state.update(extra or {})
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
              "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_attention_heads,
              "num_key_value_heads": cfg.num_key_value_heads, "num_hidden_layers": 1,
              "rms_norm_eps": cfg.rms_norm_eps, **({} if bias is None else {"bias": bias}), **(config_extra or {})}
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        save_file(state, str(folder / "model.safetensors"))
    return state


def save_medusa_heads(folder, config, heads: int = 5, layers: int = 1, drop=(), reshape=None, own=True) -> dict:
    """Heads as FasterDecoding publishes them and Spec-Bench's model/medusa/medusa_model.py (fd2c1cd) reads
    them: config.json (medusa_num_heads, medusa_num_layers, base_model_name_or_path) and medusa_lm_head.pt, the
    state dict of ``nn.ModuleList([nn.Sequential(*[ResBlock] * layers, nn.Linear(h, vocab, bias=False))])``,
    a ResBlock holding ``linear`` (h x h, with a bias)."""
    h, v = config.hidden_size, config.vocab_size
    state = {}
    for i in range(heads):
        for j in range(layers):
            state[f"{i}.{j}.linear.weight"] = torch.randn(h, h) * 0.05
            state[f"{i}.{j}.linear.bias"] = torch.randn(h) * 0.05
        if own:
            state[f"{i}.{layers}.weight"] = torch.randn(v, h)
    for k in drop:
        del state[k]
    if reshape:
        state[reshape] = torch.zeros(3, 3)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers,
                                                    "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
    torch.save(state, folder / "medusa_lm_head.pt")
    return state


def hub_snapshot(cache: Path, repo: str, commit: str = "0" * 40) -> Path:
    """The folder the hub cache at ``cache`` keeps ``repo``'s files in (huggingface_hub's layout:
    ``models--owner--name/snapshots/<commit>/`` and ``refs/main``); write the files into it."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    return snapshot
