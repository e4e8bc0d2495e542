import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from evaluation.models import ModelSpec, load_model
from methods.common import ROOT


@pytest.fixture(scope="session")
def tiny_model():
    """A randomly initialised 2-layer Llama: the engine's fast test subject (no download)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=None, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None  # tests choose their own stop tokens
    # Spread the logits so that greedy argmaxes are not decided by rounding.
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    return model


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M in fp32 on the CPU: (model, tokenizer, spec)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/model/smollm2-135m.yaml"))
    spec = ModelSpec(**{**raw, "device": "cpu", "dtype": "float32"})
    model, tok, _ = load_model(spec)
    return model, tok, spec


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face hub cache, offline: a hub id resolves only to what the test puts in it
    (``tests.checkpoints.hub_snapshot``); subprocesses inherit it through the environment."""
    from huggingface_hub import constants

    from methods import hub

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.offline.cache_clear()
    yield cache
    hub.offline.cache_clear()
