"""How the target model is run: one sequence, its KV cache, and three operations.

Every method's forwards go through an engine (``methods.decode`` and the verifier
``methods.verify`` call nothing else):

* ``start(capacity)``: a new, empty sequence;
* ``forward(tokens, tree=None, ...)``: run ``tokens`` after the committed prefix
  (a causal chain, or a draft tree with tree attention) and write their KV entries;
* ``commit(start, path)``: keep, of the entries written from ``start`` on, only the
  accepted nodes ``path``.

Two engines (``engine=`` in the Hydra config; their parameters: ``ENGINE_PARAMS`` below; ``engine=vllm`` is vLLM's
whole loop instead, run by ``evaluation.running.vllm``, its parameters ``VllmParams``):

``hf`` (eager, the reference): the unmodified Hugging Face model with a growing
    ``DynamicCache``; works for every architecture transformers loads.
``static``: a lean forward of the Llama, Qwen2, Qwen3 and Gemma 3 architectures (Vicuna,
    Llama-2/3/3.1, SmolLM2, Qwen2.5, Qwen3, Gemma 3; ``arch`` holds what each adds to Llama's layer) written
    for decoding: a preallocated KV cache written by position (``kv.StaticKV``),
    rejected drafts left in place and masked (never copied away), the tree mask
    built on the device from the tree's ancestor matrix (a one-token step, or a prompt from slot 0, needs no mask
    and reads only its own span: ``StaticEngine._unmasked``; on a CPU in float32 a batch's one-token rows attend
    in one call of the engine's own kernel, ``native``, ``engine.decode_attention``), q/k/v and gate/up as one
    linear each (the model's weights views of them: ``ops.Linear.fused``), rotary tables computed
    once, and on the CPU the weights pre-packed once for oneDNN where that is faster
    on the machine at hand: ``engine.pack=auto`` times both at start, once per machine
    kind (``choose_pack``; packing won 1.8-2.4x for the MLP weights on an AVX-512
    EPYC, 1.1-1.5x on an AVX2 EPYC, and lost 1.2x in float32 on an AMX Xeon).

    ``engine.compile`` says how a verification step runs (the prefill, whose size is the prompt's, and the
    batched steps of several rows stay eager); every run summary names it (``step``):

    * ``auto`` (the default): ``graphs`` on CUDA, eager on a CPU (where eager measured faster than
      torch.compile: results/MEASUREMENTS.md);
    * ``false``: eager, one kernel launch per operation, as Spec-Bench's own scripts run (on a GPU, a 7B model's
      step then costs what its launches cost, about the same for 1 and 128 tokens);
    * ``graphs`` (CUDA only): the eager step recorded as a CUDA graph per step size and span bucket and replayed
      (``graphs``: what is recorded, when, and why it is exact), as serving engines (vLLM, SGLang) capture theirs;
    * ``true``: the decoder layers of every step as a ``torch.compile`` graph, one per step size, static in
      that size and dynamic only in the attention span and the cache capacity. The weights are the graph's
      inputs, not packed for oneDNN (inductor's freezing would pack them but cannot cache its artefacts); the
      compiled code is cached on disk (``data/cache/inductor``), so only the first run pays for the code
      generation. ``engine.compile_mode`` is passed on (``reduce-overhead`` adds CUDA graphs on a GPU).

    With ``graphs`` or ``true``, ``prepare(sizes)`` readies every step size a proposer declares
    (``Proposer.step_sizes``) before anything is timed; more than four sizes are padded up to powers of two
    (``graph_sizes``; a padding node sees only itself and is never committed).

    On CUDA, grouped K/V heads meet attention folded: each group's queries become its K/V head's query rows
    (with a mask no fused kernel takes ``enable_gqa``: ``sdpa_backend``; ``summary()`` records the kernel).

Both run on the CPU with ``engine.threads`` threads: ``auto`` takes ``OMP_NUM_THREADS`` where it is
set (a launcher running jobs side by side sets it), else times a few forwards with each candidate
count at the start and keeps the fastest (``choose_threads``).

Both compute the same function; tokens can differ only where two logits tie to
within rounding (``evaluation.equal`` shows where).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from methods.common import HarnessError
from methods.engine.core import Engine, sdpa_backend
from methods.engine.hf import HFEngine
from methods.engine.static import COMPILE_MODES, INDUCTOR_CACHE, StaticEngine
from methods.engine.tuning import choose_pack, choose_threads, time_variants
from methods.params import AUTO, param, parse

__all__ = ["ENGINE_PARAMS", "Engine", "HFEngine", "StaticEngine", "VllmParams", "build_engine", "choose_pack",
           "choose_threads", "sdpa_backend", "time_variants"]


def _threads():
    return param(AUTO, "CPU threads: auto takes OMP_NUM_THREADS where it is set, else the count that times fastest "
                 "at the start (once per process, in the run summary)", low=1, auto=True)


@dataclass
class HFParams:
    threads: int | str = _threads()


@dataclass
class StaticParams:
    pack: str | bool = param("auto", "auto: on the CPU, pack the weights for oneDNN if that times faster on this "
                             "machine kind (measured once, cached in data/cache/engine/, in the run summary)",
                             choices=("auto", True, False))
    compile: str | bool = param(AUTO, "how a verification step runs: auto (CUDA graphs on CUDA, eager on a CPU), "
                                "false (eager), graphs (CUDA graphs of the eager step; CUDA only), true "
                                "(torch.compile, cached in data/cache/inductor); named in the run summary",
                                choices=(AUTO, False, "graphs", True))
    compile_mode: str = param("default", "torch.compile's mode; reduce-overhead adds CUDA graphs on a GPU",
                              choices=COMPILE_MODES)
    threads: int | str = _threads()
    decode_attention: str = param(AUTO, "a one-token step's attention: auto (the engine's own kernel, "
                                  "methods/engine/native.py, on a CPU in float32 where it builds; else torch's), "
                                  "native (it, or a one-line error), sdpa (torch's); named in the run summary",
                                  choices=(AUTO, "native", "sdpa"))


@dataclass
class VllmParams:
    """engine=vllm: vLLM decodes the whole turn (evaluation.running.vllm runs it; it is no ``Engine`` of ours)."""

    drafter: str = param(AUTO, "whose drafts: auto (vLLM's own for pld and suffix, else ours), vllm (its ngram or "
                         "suffix), ours (our proposer through vLLM's custom_class)", choices=(AUTO, "vllm", "ours"))
    eager: bool = param(True, "enforce_eager: no torch.compile (on a 2-core CPU it started in about 30 s against "
                        "80-115 s compiled, with the same tokens)", choices=(True, False))
    prefix_caching: bool = param(False, "vLLM's prefix cache across requests (off: every prompt is prefilled whole, "
                                 "as our engines do, so that the two engines' steps compare)", choices=(True, False))
    kv_cache_gib: int = param(2, "VLLM_CPU_KVCACHE_SPACE: GiB for vLLM's KV cache on the CPU (its default takes "
                              "most of the RAM and fails)", low=1, high=1024)
    reserved_cpus: int = param(0, "VLLM_CPU_NUM_OF_RESERVED_CPU: cores kept for vLLM's scheduler process (0: its "
                               "worker computes on every core, as our engines do; vLLM's default keeps one)",
                               low=0, high=1024)
    tensor_parallel: int = param(1, "tensor_parallel_size: GPUs one model is split over (a model larger than one GPU)",
                                 low=1, high=64)
    python: str = param(AUTO, "the Python that has vLLM: auto (this one where it imports vllm, else "
                        ".venv-vllm/bin/python, which make vllm installs)")


# engine=NAME: the declarations (methods.params)
ENGINE_PARAMS = {"hf": HFParams, "static": StaticParams, "vllm": VllmParams}


def build_engine(model, params: dict) -> Engine:
    """The engine ``params['name']`` for ``model``, its other parameters checked against its declaration."""
    params = dict(params)
    name = params.pop("name", None)
    if name not in ENGINE_PARAMS:
        raise HarnessError(f"unknown engine '{name}'; known: {', '.join(ENGINE_PARAMS)}")
    if name == "vllm":
        raise HarnessError("engine=vllm runs vLLM's own loop, not ours: evaluation.running.vllm.make_runner builds it "
                           "(python -m evaluation.run and scripts.bench_methods take engine=vllm)")
    p = parse(ENGINE_PARAMS[name], params, f"engine '{name}'", prefix="engine")
    if name == "hf":
        return HFEngine(model, threads=p.threads)
    cuda = model.device.type == "cuda"
    compile = ("graphs" if cuda else False) if p.compile == AUTO else p.compile
    if compile == "graphs" and not cuda:
        raise HarnessError(f"engine.compile=graphs records CUDA graphs, and this model is on the {model.device.type}; "
                           f"set engine.compile=auto (eager on a CPU) or run on a CUDA device")
    if compile is True:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(INDUCTOR_CACHE)  # torch sets its /tmp default on import
    return StaticEngine(model, pack=None if p.pack == AUTO else p.pack, compile=compile, mode=p.compile_mode,
                        threads=p.threads, attention=p.decode_attention)
