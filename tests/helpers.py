"""Helpers the test files share (the fixtures are in conftest.py): a command line in its own process or a run in
this one, the one builder of small random models, greedy decoding by ``generate``, requests decoded in a batch, a
shipped model config."""
import os
import subprocess
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM

from evaluation.running.config import ModelSpec
from methods.common import ROOT
from methods.decode import Request, decode_all
from methods.sampling import Sampler, Sampling


def cli(*args, check: bool = True, env: dict | None = None, timeout: int = 900, **kw) -> subprocess.CompletedProcess:
    """``python -m ARGS`` in the project root, in a process of its own, its output captured. ``check``: a non-zero
    exit fails the test; ``env``: variables set for it on top of this process's environment."""
    p = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env=None if env is None else {**os.environ, **env}, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def run_here(out, *overrides: str):
    """``python -m evaluation.run hydra.run.dir=OUT OVERRIDES`` in this process, as its entry point runs it (with the
    ``reuse_embedded`` fixtures: no second process, no second load of the embedded model). Returns ``out``."""
    from evaluation.running.config import compose_config
    from evaluation.running.runner import run
    from methods.common import exit_on_error

    exit_on_error(lambda: run(compose_config(list(overrides)), Path(out)))()
    return out


def tiny_llama(shape: str | None = None, *, seed: int | None = None, **config) -> LlamaForCausalLM:
    """A randomly initialised small Llama, built here and nowhere else in the tests (no download).

    ``shape``: a shipped model's architecture at a small size (``scripts.shapes.tiny``: its vocabulary, head
    size, K/V grouping, rotary settings; the lm_head widened against rounding ties), seeded (``seed`` or 0). None:
    a generic one (vocabulary 96, hidden 64, 2 layers, 4 heads on 2 K/V heads) seeded only when ``seed`` is
    given. ``config``: more ``LlamaConfig`` fields, or overrides of the shape's."""
    if shape is not None:
        from scripts.shapes import random_model

        return random_model(shape, small=True, seed=seed or 0, **config)
    if seed is not None:
        torch.manual_seed(seed)
    defaults = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2)
    return LlamaForCausalLM(LlamaConfig(**{**defaults, **config}))


def generate_greedy(model, prompt: list[int], max_new_tokens: int, **kw) -> list[int]:
    """``model.generate``'s greedy continuation of ``prompt`` (new tokens only): what every method must emit."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, **kw)
    return out[0, len(prompt):].tolist()


def batched(engine, proposer, batch: int, prompts: list[list[int]], max_new: int, turns: list[int] | None = None,
            sampling: Sampling | None = None, chunk: int = 0) -> list:
    """Every prompt decoded in ``batch`` slots, a freed slot taking the next prompt (``turns``: each prompt's turn;
    prompts prefilled in chunks of ``chunk`` tokens riding along the steps, where the engine is ragged): the
    Generations in the prompts' order."""
    turns = turns or [0] * len(prompts)
    proposers = [proposer] + [proposer.fork() for _ in range(batch - 1)]
    requests = [Request(p, max_new, t, Sampler(sampling, i, t) if sampling else None)
                for i, (p, t) in enumerate(zip(prompts, turns))]
    return decode_all(engine, proposers, requests, stop_ids=set(), prefill_chunk=chunk)


def shipped_spec(name: str, **overrides) -> ModelSpec:
    """The ModelSpec of the shipped model config ``conf/model/NAME.yaml``, with ``overrides``."""
    raw = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml"))
    return ModelSpec(**{**raw, **overrides})
