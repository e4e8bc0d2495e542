"""Every method from Python, and from transformers' own ``generate``: a thin door to what the harness runs (the
registry, the engines, the one decode loop); nothing here decodes on its own.

    from evaluation.api import Decoder, load, speculative

    decoder = load("smollm2-135m", "tr", tree="auto")      # a configured model by name (conf/model/), or
    decoder = Decoder(model, tokenizer, "pld")              # any transformers causal LM already loaded
    decoder = Decoder(model, tokenizer, "eagle2", batch_size=8, budget="auto")  # drafts cut per step to what pays
    result = decoder.generate("Why is the sky blue?", max_new_tokens=64)
    result.text, result.tokens, result.accept_lengths, result.seconds, result.mat
    results = decoder.generate(["First prompt", [1, 2, 3]], temperature=0.7, seed=1)   # a batch: text or token ids

    out = model.generate(input_ids, attention_mask=mask, max_new_tokens=64, do_sample=False,
                         custom_generate=speculative("tr", tree="auto"))              # transformers' own door

A method is named as in the registry with its parameters as keyword arguments (``Params``: the same names, checks
and errors as ``method.KEY=VALUE`` in a config). Greedy decoding gives exactly ``model.generate(do_sample=False)``'s
tokens; sampling (``temperature`` > 0) draws every position from noise keyed by (seed, prompt index, position), so
that every method samples exactly what vanilla samples (``methods.sampling``); it is not transformers' sampler.
``custom_generate/generate.py`` at the project's root is the same callable in the folder form that
``model.generate(custom_generate=PATH, trust_remote_code=True, method="tr")`` loads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from methods.base import Preparation, build_proposer, check_method
from methods.budget import Budget, check_settings
from methods.calibrate import prepare_budget
from methods.common import CACHE, HarnessError
from methods.decode import Generation, Request, decode_all
from methods.engine import build_engine
from methods.sampling import Sampler, Sampling


@dataclass
class Result:
    """One prompt's answer: its new tokens (a stop token included), their text, the tokens each target forward
    committed (the prefill's first), and the seconds it took."""

    tokens: list[int]
    text: str | None
    accept_lengths: list[int]
    seconds: float
    stop: str  # "eos" or "length"
    step_times: list[float] = field(default_factory=list)  # per step: seconds from the start to its commit

    @property
    def mat(self) -> float:
        """Mean accepted tokens per target forward (``evaluation.records.metrics``' MAT for one answer)."""
        return sum(self.accept_lengths) / len(self.accept_lengths)


class Decoder:
    """A method of the registry around a loaded causal LM: ``generate`` decodes prompts with it.

    ``engine``: ``static`` (the lean forward of the Llama, Qwen and Gemma 3 architectures) or ``hf`` (the model's
    own forward, any architecture); ``engine_params``: its parameters (``python -m methods`` lists them).
    ``batch_size``: the slots decoded at once (continuous batching; a method that sizes its drafts for the device,
    ``tree=auto`` say, measures at this size). ``prompt``: text -> token ids (default: the tokenizer's chat template
    with one user turn, or the plain text where it has none). ``name``: the model's name in the cache of what a
    method measures once (``tree=auto``'s calibration). ``budget`` and ``spec_off_above``: the per-step draft budget,
    as ``runtime.budget`` and ``runtime.spec_off_above`` (``methods.budget``; ``auto`` measures the engine's cost grid
    once per machine kind, at the first decode)."""

    def __init__(self, model, tokenizer=None, method: str = "vanilla", *, engine: str = "static",
                 engine_params: dict | None = None, batch_size: int = 1, prompt=None, name: str | None = None,
                 budget: str = "off", spec_off_above: int | None = None, **params):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise HarnessError(f"batch_size must be an integer of at least 1, got {batch_size!r}")
        check_settings(budget, spec_off_above)
        check_method(method, params)  # a bad name or parameter: the configs' own one line, before anything is built
        self.model, self.tokenizer, self.method, self.params = model, tokenizer, method, params
        self.device = next(model.parameters()).device
        self.engine_params = {"name": engine, **(engine_params or {})}
        self.engine = build_engine(model, self.engine_params)
        self._prompt = prompt
        self.name = name or model_name(model)
        self.stop_ids = stop_ids(model.generation_config.eos_token_id, tokenizer)
        self.batch_size = batch_size
        self.budget_settings = budget, spec_off_above
        self._proposers: list = []
        self._budget: Budget | None = None

    def using(self, method: str, **params) -> "Decoder":
        """Another method on the same model, tokenizer, prompt format and engine settings."""
        engine = dict(self.engine_params)
        budget, above = self.budget_settings
        return Decoder(self.model, self.tokenizer, method, engine=engine.pop("name"), engine_params=engine,
                       batch_size=self.batch_size, prompt=self._prompt, name=self.name, budget=budget,
                       spec_off_above=above, **params)

    def encode(self, prompt: str | list[int]) -> list[int]:
        """A prompt's token ids: token ids as they are; text through ``prompt``, the chat template or plain."""
        if isinstance(prompt, str):
            if self._prompt is not None:
                return list(self._prompt(prompt))
            if self.tokenizer is None:
                raise HarnessError("a text prompt needs the model's tokenizer: Decoder(model, tokenizer, ...), or "
                                   "pass token ids")
            if getattr(self.tokenizer, "chat_template", None):
                ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                         add_generation_prompt=True, tokenize=True)
                return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
            return self.tokenizer(prompt).input_ids
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise HarnessError(f"a prompt is a text or a non-empty list of token ids, got {type(prompt).__name__}")

    def _own_prompts(self, n: int) -> list[list[int]]:
        """The project's own prompts (never a benchmark's) in this model's template: what ``tree=auto`` decodes to
        measure its acceptance."""
        from evaluation.running.own_prompts import calibration_prompts

        if self._prompt is None and self.tokenizer is None:
            raise HarnessError(f"method '{self.method}' with these parameters measures its acceptance on the "
                               f"project's own prompts, which need the model's tokenizer: Decoder(model, tokenizer, "
                               f"...), or a fixed setting in place of auto")
        return [self.encode(text) for text in calibration_prompts(n)]

    def proposers(self, n: int) -> list:
        """``n`` slots' proposers: the first built and prepared once (before any timing), the others forked; with
        them the decoder's budget (``budget``)."""
        if not self._proposers:
            first = build_proposer(self.method, self.params, vocab_size=self.model.config.vocab_size,
                                   device=self.device, target=self.model)
            first.prepare(Preparation(engine=self.engine, model_name=self.name, stop_ids=self.stop_ids,
                                      prompts=self._own_prompts, cache=CACHE, batch_size=self.batch_size))
            self._budget = prepare_budget(self.engine, first, *self.budget_settings, self.batch_size, self.name, CACHE)
            self._proposers = [first]
        while len(self._proposers) < n:
            self._proposers.append(self._proposers[0].fork())
        return self._proposers[:n]

    def decode(self, prompts: list[list[int]], max_new_tokens: int, sampling: Sampling | None = None,
               stop: set[int] | None = None, slots: int | None = None) -> list[Generation]:
        """Each prompt (token ids) decoded in ``slots`` slots (default ``batch_size``): the loop's Generations, in
        order. Prompt i samples with the draws of (seed, i, turn 0)."""
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise HarnessError(f"max_new_tokens must be an integer of at least 1, got {max_new_tokens!r}")
        greedy = sampling is None or sampling.greedy
        requests = [Request(p, max_new_tokens, 0, None if greedy else Sampler(sampling, i, 0))
                    for i, p in enumerate(prompts)]
        self.engine.use_threads()
        proposers = self.proposers(min(slots or self.batch_size, len(prompts)))
        return decode_all(self.engine, proposers, requests, stop_ids=self.stop_ids if stop is None else stop,
                          budget=self._budget)

    def generate(self, prompts, max_new_tokens: int = 256, *, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0) -> Result | list[Result]:
        """Decode one prompt (text, or token ids) or a list of them: a ``Result``, or one per prompt."""
        one = isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                           and all(isinstance(t, int) for t in prompts))
        batch = [prompts] if one else list(prompts)
        if not batch:
            raise HarnessError("no prompts to decode: give a text, token ids, or a list of them")
        sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        gens = self.decode([self.encode(p) for p in batch], max_new_tokens, sampling)
        results = [Result(g.token_ids, self.tokenizer.decode(g.token_ids, skip_special_tokens=True)
                          if self.tokenizer is not None else None, g.accept_lengths, g.wall_time, g.stop,
                          list(g.step_times or [])) for g in gens]
        return results[0] if one else results

    __call__ = generate


def model_name(model) -> str:
    """A loaded model's name for the cache keys: a local folder's name (``data/cache/models/smollm2-135m``:
    ``smollm2-135m``, whose shipped calibrations then apply), a hub id with ``--`` for ``/``, else its class."""
    where = str(getattr(model.config, "_name_or_path", "") or "")
    if not where:
        return type(model).__name__
    return Path(where).name if Path(where).is_dir() else where.replace("/", "--")


def stop_ids(eos, tokenizer=None) -> set[int]:
    """The tokens that end an answer: the generation config's eos id(s) and the tokenizer's."""
    ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def load(model: str = "smollm2-135m", method: str = "vanilla", *, overrides: list[str] = (),
         batch_size: int | None = None, budget: str | None = None, spec_off_above: int | None = None,
         **params) -> Decoder:
    """A configured model (``conf/model/NAME.yaml``: the embedded ones offline, the others from the hub) with
    method ``method``: its checkpoint, its device and dtype, its prompt format (the fastchat template the harness
    runs it with) and the heads and corpora its config names for the methods (``artefacts``), as
    ``python -m evaluation.run model=NAME method=METHOD`` would. ``overrides``: more settings in Hydra's syntax
    (``model.dtype=bfloat16``, ``engine=hf``); ``batch_size``, ``budget``, ``spec_off_above``: ``runtime.*``'s, as
    ``Decoder``'s (None: the config's); ``params``: the method's parameters."""
    from omegaconf import OmegaConf

    from evaluation.running.config import batch_size as configured_batch
    from evaluation.running.config import compose_config, method_params, model_spec
    from evaluation.running.models import load_model
    from evaluation.running.prompts import check_template, prompt_ids

    runtime = {"batch_size": batch_size, "budget": budget, "spec_off_above": spec_off_above}
    cfg = compose_config([f"model={model}", f"method={method}", *overrides,
                          *(f"runtime.{k}={v}" for k, v in runtime.items() if v is not None)])
    name, defaults = method_params(cfg)
    check_method(name, {**defaults, **params})  # before the weights load
    spec = model_spec(cfg)
    target, tok, _ = load_model(spec)
    check_template(spec, tok)
    engine = OmegaConf.to_container(cfg.engine, resolve=True)
    return Decoder(target, tok, name, engine=engine.pop("name"), engine_params=engine, batch_size=configured_batch(cfg),
                   prompt=lambda text: prompt_ids(spec, tok, [text], []), name=spec.name,
                   budget=cfg.runtime.budget, spec_off_above=cfg.runtime.spec_off_above, **{**defaults, **params})


# What custom_generate honours of what generate prepares: the logits warpers of do_sample's settings (read from the
# generation config into our sampler), the length and eos criteria (max_new_tokens, eos ids) and the model kwargs of
# a plain decoder-only call. Anything else is refused by name.
WARPERS = {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"}
CRITERIA = {"MaxLengthCriteria", "EosTokenCriteria"}
MODEL_KWARGS = {"attention_mask", "position_ids", "use_cache", "logits_to_keep", "past_key_values",
                "cache_position", "output_attentions", "output_hidden_states", "return_dict"}


@dataclass
class SpeculativeOutput(GenerateDecoderOnlyOutput):
    """What ``generate`` returns with ``return_dict_in_generate=True``, and per row the tokens each target forward
    committed (``accept_lengths``) and the seconds it took."""

    accept_lengths: list[list[int]] | None = None
    seconds: list[float] | None = None


class CustomGenerate:
    """``model.generate(..., custom_generate=speculative(METHOD, **params))``: transformers prepares the inputs and
    the generation config, then hands the loop to this callable, which decodes every row with the method (one
    ``Decoder`` per model, built at the first call) and returns what ``generate`` returns."""

    def __init__(self, method: str = "vanilla", *, engine: str = "static", engine_params: dict | None = None,
                 tokenizer=None, budget: str = "off", spec_off_above: int | None = None, **params):
        check_settings(budget, spec_off_above)
        check_method(method, params)
        self.method, self.engine, self.engine_params, self.params = method, engine, engine_params, params
        self.budget = {"budget": budget, "spec_off_above": spec_off_above}
        self.tokenizer = tokenizer  # only for a method that measures itself on the project's prompts (tree=auto)
        self._decoders: dict[int, Decoder] = {}

    def decoder(self, model, rows: int = 1) -> Decoder:
        if id(model) not in self._decoders:
            self._decoders[id(model)] = Decoder(model, self.tokenizer, self.method, engine=self.engine,
                                                engine_params=self.engine_params, batch_size=rows, **self.budget,
                                                **self.params)
        return self._decoders[id(model)]

    def __call__(self, model, input_ids: torch.LongTensor, logits_processor=None, stopping_criteria=None,
                 generation_config=None, seed: int = 0, **model_kwargs):
        cfg = generation_config
        refuse(cfg, logits_processor, stopping_criteria, model_kwargs)
        mask = model_kwargs.get("attention_mask")
        prompts = unpadded(input_ids, mask)
        max_new = cfg.max_length - input_ids.shape[1]
        sampling = Sampling(temperature=cfg.temperature, top_k=cfg.top_k or 0, top_p=cfg.top_p or 1.0, seed=seed) \
            if cfg.do_sample else None
        decoder = self.decoder(model, len(prompts))
        gens = decoder.decode(prompts, max_new, sampling, stop=stop_ids(cfg.eos_token_id), slots=len(prompts))
        pad = getattr(cfg, "_pad_token_tensor", None)  # generate's choice: the pad id, else the first eos id
        pad = int(pad.flatten()[0]) if pad is not None else cfg.pad_token_id if cfg.pad_token_id is not None else 0
        width = max(len(g.token_ids) for g in gens)
        new = torch.full((len(gens), width), pad, dtype=input_ids.dtype, device=input_ids.device)
        for r, g in enumerate(gens):
            new[r, :len(g.token_ids)] = torch.tensor(g.token_ids, dtype=input_ids.dtype)
        sequences = torch.cat([input_ids, new], dim=1)
        if not cfg.return_dict_in_generate:
            return sequences
        return SpeculativeOutput(sequences=sequences, accept_lengths=[g.accept_lengths for g in gens],
                                 seconds=[g.wall_time for g in gens])


def speculative(method: str = "vanilla", *, engine: str = "static", engine_params: dict | None = None,
                tokenizer=None, budget: str = "off", spec_off_above: int | None = None, **params) -> CustomGenerate:
    """The ``custom_generate`` callable of ``method`` with ``params`` (checked here, before any decoding);
    ``tokenizer`` where the method sizes its drafts on the project's own prompts (``tree=auto``, ``max_draft=auto``);
    ``budget``, ``spec_off_above``: the per-step draft budget (``Decoder``)."""
    return CustomGenerate(method, engine=engine, engine_params=engine_params, tokenizer=tokenizer, budget=budget,
                          spec_off_above=spec_off_above, **params)


def refuse(cfg, processors, criteria, model_kwargs: dict) -> None:
    """One line for what custom_generate cannot honour, raised before any decoding. (A ``streamer`` or
    ``synced_gpus`` never reaches a custom_generate callable: transformers keeps them back.)"""
    fix = "drop it, or call generate without custom_generate"
    if cfg.num_beams > 1:
        raise HarnessError(f"num_beams={cfg.num_beams}: beam search is not what speculative decoding reproduces; "
                           f"custom_generate decodes greedy or sampled, set num_beams=1")
    for flag in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
        if getattr(cfg, flag, False) or model_kwargs.get(flag):
            raise HarnessError(f"{flag}=True: custom_generate returns the sequences and each row's accept lengths, "
                               f"not per-step tensors; {fix}")
    for p in processors or []:
        if type(p).__name__ not in WARPERS:
            raise HarnessError(f"custom_generate cannot honour the logits processor {type(p).__name__} (from the "
                               f"generation config or logits_processor); it samples with temperature, top_k and "
                               f"top_p only: {fix}")
    for c in criteria or []:
        if type(c).__name__ not in CRITERIA:
            raise HarnessError(f"custom_generate cannot honour the stopping criterion {type(c).__name__}; it stops "
                               f"at max_new_tokens and the eos ids: {fix}")
    extra = sorted(k for k, v in model_kwargs.items() if k not in MODEL_KWARGS and v is not None)
    if extra:
        raise HarnessError(f"custom_generate decodes token ids only; it cannot take {', '.join(extra)}: {fix}")
    cache = model_kwargs.get("past_key_values")
    if cache is not None and cache.get_seq_length() > 0:
        raise HarnessError(f"custom_generate starts from the prompt: a past_key_values holding "
                           f"{cache.get_seq_length()} tokens cannot be continued; {fix}")


def unpadded(input_ids: torch.Tensor, mask: torch.Tensor | None) -> list[list[int]]:
    """Each row's prompt without its left padding (``mask`` None: no padding)."""
    if mask is None:
        return input_ids.tolist()
    out = []
    for r, (ids, m) in enumerate(zip(input_ids.tolist(), mask.tolist())):
        first = m.index(1) if 1 in m else len(m)
        if first == len(m) or 0 in m[first:]:
            raise HarnessError(f"row {r} of the batch is {'empty' if first == len(m) else 'padded on the right'}: "
                               f"decoder-only generation needs left padding (tokenizer.padding_side='left')")
        out.append(ids[first:])
    return out
