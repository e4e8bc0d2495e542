"""Fixtures the test files share (their helpers: tests/helpers.py).

Tiers: tests marked ``slow`` (``pytest.mark.slow``: the embedded model through the command lines, many questions
decoded, training, compilation) are left out by ``make test-fast`` (``pytest -m "not slow"``); ``make test`` runs
every test.
"""
import os
from pathlib import Path

import pytest
import torch

from evaluation.running.config import ModelSpec
from evaluation.running.models import load_model
from methods.common import HarnessError, exit_on_error
from tests.helpers import shipped_spec, tiny_llama

# engine.threads=auto keeps OMP_NUM_THREADS where it is set: the suite (and the command lines it starts) runs with
# the thread count it started with instead of timing one per model shape; tests/test_machine.py times it.
os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))


# --- fixtures -------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def tiny_models():
    """``tiny_models(layers)``: a randomly initialised Llama of ``layers`` layers (``tests.helpers.tiny_llama``'s
    generic one, seeded), its logits spread so that greedy argmaxes are not decided by rounding; one per depth per
    session. The engine's fast test subject; a method that reads deep layers (EAGLE-3) gets a deeper one."""
    built = {}

    def make(layers: int = 2):
        if layers not in built:
            model = tiny_llama(seed=0, num_hidden_layers=layers, max_position_embeddings=512, bos_token_id=1,
                               eos_token_id=None, pad_token_id=0).eval()
            model.generation_config.eos_token_id = None  # tests choose their own stop tokens
            with torch.no_grad():
                model.lm_head.weight.mul_(20)
            built[layers] = model
        return built[layers]

    return make


@pytest.fixture(scope="session")
def tiny_model(tiny_models):
    """The 2-layer tiny model (``tiny_models``)."""
    return tiny_models(2)


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M in fp32 on the CPU, loaded once per session: (model, tokenizer, spec). Shared by
    every test that only reads it; a test that changes a model (casts it, trains it) loads its own."""
    spec = shipped_spec("smollm2-135m", device="cpu", dtype="float32")
    model, tok, _ = load_model(spec)
    return model, tok, spec


def _reuse_embedded(request, monkeypatch) -> None:
    """Runners built in this process (``evaluation.running.runner.Runner``, ``run``) take the session's embedded model
    (``embedded``, loaded when first asked for) instead of loading it again, for every spec that resolves to it:
    the embedded checkpoint in float32 on the CPU. Any other spec loads as before."""
    import evaluation.running.runner
    from evaluation.running.models import resolve_device, resolve_dtype

    cpu, base, real = torch.device("cpu"), shipped_spec("smollm2-135m"), evaluation.running.runner.load_model

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

    monkeypatch.setattr(evaluation.running.runner, "load_model", load)


@pytest.fixture
def reuse_embedded(request, monkeypatch):
    """``_reuse_embedded`` for one test."""
    _reuse_embedded(request, monkeypatch)


@pytest.fixture(scope="module")
def reuse_embedded_in_module(request):
    """``_reuse_embedded`` for a module's fixtures (runs made once and read by several tests)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _reuse_embedded(request, monkeypatch)
        yield


@pytest.fixture
def run_error(tmp_path, capsys, reuse_embedded):
    """``evaluation.run`` in this process, as its entry point runs it (``run(compose_config(overrides), out)``
    under ``exit_on_error``), expected to fail as the command line would: exit 2, one line ``error: ...`` on
    stderr, no traceback, and nothing left in ``tmp_path/run``. The run folder is ``tmp_path/run``, or what a
    ``hydra.run.dir=DIR`` override or ``out`` names; ``base``: overrides put before ``overrides`` (by default
    those of the command lines these tests ran before: no warm-up, no progress bar). Returns what it printed
    (``.err``, ``.out``)."""
    from evaluation.running.config import compose_config
    from evaluation.running.runner import run

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
