"""Fixtures and helpers the test files share.

Tiers: tests marked ``slow`` (``pytest.mark.slow``: the embedded model through the command lines, many questions
decoded, training, compilation) are left out by ``make test-fast`` (``pytest -m "not slow"``); ``make test`` runs
every test.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM

from evaluation.models import ModelSpec, load_model
from methods.common import ROOT, HarnessError, exit_on_error

# engine.threads=auto keeps OMP_NUM_THREADS where it is set: the suite (and the command lines it starts) runs with
# the thread count it started with instead of timing one per model shape; tests/test_machine.py times it.
os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))


# --- helpers --------------------------------------------------------------------------------------------

def cli(*args, check: bool = True, env: dict | None = None, timeout: int = 900, **kw) -> subprocess.CompletedProcess:
    """``python -m ARGS`` in the project root, in a process of its own, its output captured. ``check``: a non-zero
    exit fails the test; ``env``: variables set for it on top of this process's environment."""
    p = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env=None if env is None else {**os.environ, **env}, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def llama(vocab_size: int = 96, hidden_size: int = 64, intermediate_size: int = 128, num_hidden_layers: int = 2,
          num_attention_heads: int = 4, num_key_value_heads: int = 2, **config) -> LlamaForCausalLM:
    """A randomly initialised Llama of a small config (no download); ``config``: more LlamaConfig fields."""
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                                        intermediate_size=intermediate_size, num_hidden_layers=num_hidden_layers,
                                        num_attention_heads=num_attention_heads,
                                        num_key_value_heads=num_key_value_heads, **config))


def generate_greedy(model, prompt: list[int], max_new_tokens: int, **kw) -> list[int]:
    """``model.generate``'s greedy continuation of ``prompt`` (new tokens only): what every method must emit."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, **kw)
    return out[0, len(prompt):].tolist()


def shipped_spec(name: str, **overrides) -> ModelSpec:
    """The ModelSpec of the shipped model config ``conf/model/NAME.yaml``, with ``overrides``."""
    raw = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml"))
    return ModelSpec(**{**raw, **overrides})


# --- fixtures -------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def tiny_model():
    """A randomly initialised 2-layer Llama: the engine's fast test subject (no download)."""
    torch.manual_seed(0)
    model = llama(max_position_embeddings=512, bos_token_id=1, eos_token_id=None, pad_token_id=0).eval()
    model.generation_config.eos_token_id = None  # tests choose their own stop tokens
    # Spread the logits so that greedy argmaxes are not decided by rounding.
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    return model


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M in fp32 on the CPU, loaded once per session: (model, tokenizer, spec). Shared by
    every test that only reads it; a test that changes a model (casts it, trains it) loads its own."""
    spec = shipped_spec("smollm2-135m", device="cpu", dtype="float32")
    model, tok, _ = load_model(spec)
    return model, tok, spec


@pytest.fixture
def reuse_embedded(request, monkeypatch):
    """Runners built in this process (``evaluation.run.Runner``, ``run``) take the session's embedded model
    (``embedded``, loaded when first asked for) instead of loading it again, for every spec that resolves to it:
    the embedded checkpoint in float32 on the CPU. Any other spec loads as before."""
    import evaluation.run
    from evaluation.models import resolve_device, resolve_dtype

    cpu, base, real = torch.device("cpu"), shipped_spec("smollm2-135m"), evaluation.run.load_model

    def load(s: ModelSpec):
        try:
            same = (s.checkpoint == base.checkpoint and s.attn_implementation == base.attn_implementation
                    and resolve_device(s.device) == cpu and resolve_dtype(s.dtype, cpu) == torch.float32)
        except HarnessError:  # a device or dtype that cannot be: the loader says so
            same = False
        if not same:
            return real(s)
        model, tok, _ = request.getfixturevalue("embedded")
        return model, tok, cpu

    monkeypatch.setattr(evaluation.run, "load_model", load)


@pytest.fixture
def run_error(tmp_path, capsys, reuse_embedded):
    """``evaluation.run`` in this process, as its entry point runs it (``run(compose_config(overrides), out)``
    under ``exit_on_error``), expected to fail as the command line would: exit 2, one line ``error: ...`` on
    stderr, no traceback, and nothing left in ``tmp_path/run``. The run folder is ``tmp_path/run``, or what a
    ``hydra.run.dir=DIR`` override or ``out`` names; ``base``: overrides put before ``overrides`` (by default
    those of the command lines these tests ran before: no warm-up, no progress bar). Returns what it printed
    (``.err``, ``.out``)."""
    from evaluation.run import compose_config, run

    def fail(*overrides: str, out: Path | None = None, base=("warmup=0", "runtime.progress=false")):
        default = tmp_path / "run"
        folder = next((Path(o.split("=", 1)[1]) for o in overrides if o.startswith("hydra.run.dir=")), out or default)
        cfg_overrides = [*base, *(o for o in overrides if not o.startswith("hydra.run.dir="))]
        entry = exit_on_error(lambda: run(compose_config(cfg_overrides), folder))
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            entry()
        said = capsys.readouterr()
        assert e.value.code == 2, said
        assert said.err.strip().splitlines()[-1].startswith("error: "), said.err
        assert "Traceback" not in said.err + said.out
        assert not default.exists() or not any(default.iterdir()), "a failed run left files behind"
        return said

    return fail


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
