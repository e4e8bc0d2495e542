"""The architectures behind the shipped model configs (``conf/model/``), from their published ``config.json``.

``SHAPES[name]`` holds the config arguments of the checkpoint a model config names (``model_type`` says which
transformers config: Llama unless given), so that a randomly initialised model of the same shape can be timed
where the weights are not (``scripts/profile_cost.py --shape``, ``scripts/gpu_check.py``), and ``tiny(name)`` a
small model that keeps what decides whether our code handles the architecture (the architecture itself,
vocabulary size, grouped-query attention, head size, rotary base and scaling, sliding windows, tied or untied
embeddings) for the tests. Imports only transformers (no Hydra): the GPU check uses it.
"""
from __future__ import annotations

SHAPES: dict[str, dict] = {
    # lmsys/vicuna-{7b,13b,33b}-v1.3 config.json (LLaMA-1 shapes)
    "vicuna-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-6,
                      rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    "vicuna-13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                       num_key_value_heads=40, vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-6,
                       rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    "vicuna-33b": dict(hidden_size=6656, intermediate_size=17920, num_hidden_layers=60, num_attention_heads=52,
                       num_key_value_heads=52, vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-6,
                       rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    # meta-llama/Llama-2-7b-chat-hf config.json
    "llama-2-7b-chat": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                            num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096,
                            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1,
                            eos_token_id=2),
    # meta-llama/Meta-Llama-3-8B-Instruct config.json: grouped-query attention (8 K/V heads), a 128K vocabulary
    "llama-3-8b-instruct": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
                                tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128009),
    # HuggingFaceTB/SmolLM2-135M-Instruct (the embedded model): tied embeddings, 3 K/V heads for 9, head size 64
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
                         rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
}

# Llama 3.1's rotary scaling (meta-llama/Llama-3.1-8B-Instruct config.json; DeepSeek-R1-Distill-Llama-8B keeps it)
LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

SHAPES.update({
    # meta-llama/Llama-3.1-8B-Instruct config.json: Llama-3's shape, 128K positions by rotary scaling
    "llama-3.1-8b-instruct": {**SHAPES["llama-3-8b-instruct"], "max_position_embeddings": 131072,
                              "rope_scaling": LLAMA31_ROPE},
    # deepseek-ai/DeepSeek-R1-Distill-Llama-8B config.json: Llama-3.1-8B's, its end token 128001
    "deepseek-r1-distill-llama-8b": {**SHAPES["llama-3-8b-instruct"], "max_position_embeddings": 131072,
                                     "rope_scaling": LLAMA31_ROPE, "eos_token_id": 128001},
    # Qwen/Qwen3-8B config.json: q/k RMSNorm per head, head size 128 given on its own, a 152K vocabulary
    "qwen3-8b": dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                     max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
                     bos_token_id=151643, eos_token_id=151645),
    # Qwen/Qwen2.5-7B-Instruct config.json: biases on q, k and v; 28 heads on 4 K/V heads
    "qwen2.5-7b-instruct": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645),
    # google/gemma-3-270m config.json (the second embedded model): q/k norms, four norms per layer, five
    # sliding-window layers (512 positions, rotary base 10000) to one global (1e6), head size 256 on 640 hidden
    "gemma3-270m": dict(model_type="gemma3_text", hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                        rope_local_base_freq=10000.0, sliding_window=512, query_pre_attn_scalar=256,
                        tie_word_embeddings=True, bos_token_id=2, eos_token_id=1),
})


def tiny(name: str, layers: int = 2, **overrides) -> dict:
    """Config arguments of a small model that keeps ``name``'s architecture, vocabulary, head size, ratio of query
    to K/V heads, rotary settings and embedding tying: 2 layers, the fewest heads that keep the ratio, and a hidden
    size of 32 per head (the heads keep their size: ``head_dim`` is given explicitly, as Qwen3 or Gemma do)."""
    shape = SHAPES[name]
    group = shape["num_attention_heads"] // shape["num_key_value_heads"]
    heads = group if group > 1 else 2
    return {**shape, "hidden_size": 32 * heads, "intermediate_size": 64 * heads, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": heads // group,
            "head_dim": shape.get("head_dim") or shape["hidden_size"] // shape["num_attention_heads"], **overrides}


def random_model(name: str, *, small: bool = False, dtype=None, device="cpu", seed: int = 0, **overrides):
    """A randomly initialised model of shape ``name`` (``small``: its ``tiny`` version, the lm_head widened so that
    greedy argmaxes are not decided by rounding), built directly on ``device`` in ``dtype`` (a 7B model in fp16 on
    a GPU takes seconds and its own size in memory, no host copy)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    args = tiny(name, **overrides) if small else {**SHAPES[name], **overrides}
    config = AutoConfig.for_model(args.pop("model_type", "llama"), **args)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype or torch.float32)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config).eval()
    finally:
        torch.set_default_dtype(default)
    if small:
        with torch.no_grad():
            model.lm_head.weight.normal_(0, 1.0)  # tied: the embeddings are the head, as wide
    model.generation_config.eos_token_id = None  # callers choose their own stop tokens
    return model
