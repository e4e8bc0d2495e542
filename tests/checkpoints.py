"""Checkpoints built inside the tests, in the layouts real ones come in: a tiny random model of a shipped
config's architecture with a SentencePiece tokenizer (Vicuna's and Llama-2's kind: ``tokenizer.model`` only),
an EAGLE head in SafeAILab/EAGLE's layout, Medusa and Hydra heads in theirs, and the Hugging Face hub cache's
folder layout to put them in."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.helpers import tiny_llama


@lru_cache(maxsize=1)
def _sentencepiece_model() -> bytes:
    """A 512-piece BPE SentencePiece model trained on Spec-Bench's question texts (a second or two)."""
    import io

    import sentencepiece as spm

    from evaluation.records.bench import load_bench

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


def save_model(folder: Path, name: str, **overrides) -> LlamaForCausalLM:
    model = tiny_llama(name, **overrides)
    model.save_pretrained(folder)
    sentencepiece_tokenizer(folder)
    return model


def save_eagle_head(folder: Path, target_config, fmt: str = "bin", bias: bool | None = None, drop=(),
                    reshape=None, extra=None, config_extra=None) -> dict:
    """A head in SafeAILab/EAGLE's published layout: config.json plus pytorch_model.bin or model.safetensors.
    ``bias``: None writes no "bias" key (EAGLE reads true), False writes ``"bias": false`` and no ``fc.bias``."""
    from safetensors.torch import save_file

    from methods.heads.eagle import expected_shapes, head_config

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


def save_hydra_heads(folder, config, arch: str = "mlp", heads: int = 4, layers: int = 2, own: bool = True,
                     grounded: bool = True, drop=(), reshape=None, differ=None, **extra) -> dict:
    """Heads as zankner/Hydra publishes them (ankner/hydra-vicuna-7b-v1.3) and Spec-Bench's model/hydra (fd2c1cd)
    reads them: config.json (HydraConfig: hydra_num_heads, hydra_num_layers, hydra_head_arch, grounded_heads,
    hidden_state_offset) and hydra_lm_head.pt, ``hydra_head.state_dict()`` as hydra/train/train.py saves it.
    Per hydra_heads/mlp_head.py and prefix_mlp_head.py, head i is ``hydra_mlp.{i}``, a Sequential of
    ResBlock(h, i + 1) (``linear`` and ``res_connection``, (i + 2) h -> h, with biases) then one ResBlock(h)
    repeated layers - 1 times (``linear`` only): at indices 0, 1, ... (mlp) or 1, 3, ... after Dropouts
    (prefix-mlp); ``hydra_lm_head.{i}`` a Linear(h, vocab) with a bias (mlp) or Dropout, Linear (prefix-mlp,
    ``.1.``); prefix-mlp's ``prefix_embeding_layer`` a one-layer LlamaModel of the base config; the target's
    embedding held as ``input_embed_fn``. Returns the state (float32), with ``prefix_model``, the LlamaModel."""
    from transformers import LlamaModel

    h, v = config.hidden_size, config.vocab_size
    prefix = arch == "prefix-mlp"
    state = {"input_embed_fn.weight": torch.randn(v, h)}
    for i in range(heads):
        shared = {"weight": torch.randn(h, h) * 0.05, "bias": torch.randn(h) * 0.05}
        for j in range(layers):
            block = f"hydra_mlp.{i}.{2 * j + 1 if prefix else j}"
            if j == 0:
                for part in ("linear", "res_connection"):
                    state[f"{block}.{part}.weight"] = torch.randn(h, (i + 2) * h) * 0.05
                    state[f"{block}.{part}.bias"] = torch.randn(h) * 0.05
            else:
                state[f"{block}.linear.weight"], state[f"{block}.linear.bias"] = shared["weight"], shared["bias"]
        if own:
            lm = f"hydra_lm_head.{i}.{'1.' if prefix else ''}"
            state[f"{lm}weight"], state[f"{lm}bias"] = torch.randn(v, h), torch.randn(v)
    prefix_model = None
    if prefix:
        c = LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 1})
        torch.manual_seed(1)
        prefix_model = LlamaModel(c).eval()
        with torch.no_grad():
            for p in prefix_model.parameters():
                p.add_(torch.randn_like(p) * 0.05)  # norms away from one
        state.update({f"prefix_embeding_layer.{k}": t.clone() for k, t in prefix_model.state_dict().items()})
    for k in drop:
        del state[k]
    if reshape:
        state[reshape] = torch.zeros(3, 3)
    if differ:
        state[differ] = state[differ] + 1
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "hydra_num_heads": heads, "hydra_num_layers": layers, "hydra_head_arch": arch, "grounded_heads": grounded,
        "hidden_state_offset": 0, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3", **extra}))
    torch.save(state, folder / "hydra_lm_head.pt")
    return {**state, "prefix_model": prefix_model}


def save_eagle3_head(folder, config, draft_vocab: int | None = None, drop=(), reshape=None, **extra) -> dict:
    """An EAGLE-3 head as SafeAILab publishes them (yuhuili/EAGLE3-Vicuna1.3-13B) and eagle/model/cnets.py's
    ``Model`` holds it: ``fc`` (3h -> h, no bias), ``midlayer`` (LlamaDecoderLayeremb: q/k/v_proj from 2h,
    o_proj, the MLP, input_layernorm, hidden_norm, post_attention_layernorm), ``norm``, ``lm_head`` (h ->
    draft_vocab_size), the buffers ``d2t`` (draft index i -> token i + d2t[i]) and ``t2d`` when the draft
    vocabulary is smaller, and the base model's ``embed_tokens``; config.json the target's shapes, one layer,
    ``draft_vocab_size``; pytorch_model.bin. Returns the state (float32)."""
    h, v, i = config.hidden_size, config.vocab_size, config.intermediate_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    d, dv = h // heads, draft_vocab or v
    r = lambda *shape: torch.randn(*shape) * 0.1  # noqa: E731
    a = "midlayer.self_attn."
    state = {"fc.weight": r(h, 3 * h), f"{a}q_proj.weight": r(heads * d, 2 * h),
             f"{a}k_proj.weight": r(kv_heads * d, 2 * h), f"{a}v_proj.weight": r(kv_heads * d, 2 * h),
             f"{a}o_proj.weight": r(h, heads * d),
             "midlayer.mlp.gate_proj.weight": r(i, h), "midlayer.mlp.up_proj.weight": r(i, h),
             "midlayer.mlp.down_proj.weight": r(h, i), "midlayer.input_layernorm.weight": 1 + r(h),
             "midlayer.hidden_norm.weight": 1 + r(h), "midlayer.post_attention_layernorm.weight": 1 + r(h),
             "norm.weight": 1 + r(h), "lm_head.weight": torch.randn(dv, h), "embed_tokens.weight": r(v, h)}
    if dv < v:  # the draft vocabulary: dv distinct target tokens, in increasing order
        tokens = torch.randperm(v, generator=torch.Generator().manual_seed(0))[:dv].sort().values
        state["d2t"] = tokens - torch.arange(dv)
        state["t2d"] = torch.zeros(v, dtype=torch.bool).index_fill_(0, tokens, True)
    for k in drop:
        del state[k]
    if reshape:
        state[reshape] = torch.zeros(3, 3)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": h, "intermediate_size": i, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "num_hidden_layers": 1, "rms_norm_eps": config.rms_norm_eps,
        "vocab_size": v, "draft_vocab_size": dv, **extra}))
    torch.save(state, folder / "pytorch_model.bin")
    return state
