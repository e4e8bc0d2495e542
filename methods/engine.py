"""How the target model is run: one sequence, its KV cache, and three operations.

Every method's forwards go through an engine (``methods.decode`` and the verifier
``methods.verify`` call nothing else):

* ``start(capacity)``: a new, empty sequence;
* ``forward(tokens, tree=None, ...)``: run ``tokens`` after the committed prefix
  (a causal chain, or a draft tree with tree attention) and write their KV entries;
* ``commit(start, path)``: keep, of the entries written from ``start`` on, only the
  accepted nodes ``path``.

Two engines (``engine=`` in the Hydra config; their parameters: ``ENGINE_PARAMS`` below):

``hf`` (eager, the reference): the unmodified Hugging Face model with a growing
    ``DynamicCache``; works for every architecture transformers loads.
``static``: a lean forward of Llama-family models (Llama, Vicuna, SmolLM2) written
    for decoding: a preallocated KV cache written by position (``kv.StaticKV``),
    rejected drafts left in place and masked (never copied away), the tree mask
    built on the device from the tree's ancestor matrix, rotary tables computed
    once, and on the CPU the weights pre-packed once for oneDNN where that is faster
    on the machine at hand: ``engine.pack=auto`` times both at start, once per machine
    kind (``choose_pack``; packing won 1.8-2.4x for the MLP weights on an AVX-512
    EPYC, 1.1-1.5x on an AVX2 EPYC, and lost 1.2x in float32 on an AMX Xeon).

    ``engine.compile=true``: the decoder layers of every verification step run as a
    ``torch.compile`` graph, one per step size (the number of tree nodes), static in
    that size and dynamic only in the attention span and the cache capacity; the
    prefill (its size is the prompt's) stays eager. The weights are the graph's
    inputs, not packed for oneDNN (inductor's freezing would pack them but cannot cache
    its artefacts); the compiled code is cached on disk (``data/cache/inductor``), so
    only the first run pays for the code generation. ``prepare(sizes)`` compiles every
    step size a proposer declares (``Proposer.step_sizes``) before anything is timed;
    more than four sizes are padded up to powers of two (``graph_sizes``; a padding node
    sees only itself and is never committed). ``engine.compile_mode`` is passed on
    (``reduce-overhead`` adds CUDA graphs on a GPU).

    On CUDA, grouped K/V heads are expanded before attention: with a mask no fused
    kernel takes ``enable_gqa`` (``sdpa_backend``; ``summary()`` records the kernel).

Both run on the CPU with ``engine.threads`` threads: ``auto`` takes ``OMP_NUM_THREADS`` where it is
set (a launcher running jobs side by side sets it), else times a few forwards with each candidate
count at the start and keeps the fastest (``choose_threads``).

Both compute the same function; tokens can differ only where two logits tie to
within rounding (``evaluation.equal`` shows where).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F

from methods import kv
from methods.common import CACHE, HarnessError, write_json_atomic
from methods.machine import usable_cores
from methods.ops import Linear, can_pack, fp32_rotary, rotate_half, sync
from methods.params import AUTO, param, parse
from methods.tree import Tree, tree_mask

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
INDUCTOR_CACHE = CACHE / "inductor"


class Engine:
    """Runs the target model over one sequence at a time (see the module docstring)."""

    name: str
    expand_kv: bool  # grouped K/V heads are expanded before attention (sdpa_backend)

    def __init__(self, model):
        self.model = fp32_rotary(model)
        self.device = model.device
        self.dtype = next(model.parameters()).dtype
        self.threads: int | None = None  # engine.threads as applied; None: torch's count as found
        self.thread_choice: dict | None = None  # engine.threads=auto: how it was chosen (choose_threads)

    def set_threads(self, threads: int | str | None) -> None:
        """engine.threads: ``N`` threads, or ``auto``: on the CPU, ``OMP_NUM_THREADS`` where the environment sets
        it, else the fastest count measured at the start (``choose_threads``); None leaves torch's count."""
        if threads is None or (threads == AUTO and self.device.type != "cpu"):
            return
        cores = usable_cores()
        if threads != AUTO and threads > cores:
            raise HarnessError(f"engine.threads={threads} but this process may use {cores} CPU core(s): more threads "
                               f"than cores only contend for them; set engine.threads=auto or at most {cores}")
        if threads == AUTO:
            if os.environ.get("OMP_NUM_THREADS"):
                self.thread_choice = {"threads": torch.get_num_threads(), "from": "OMP_NUM_THREADS"}
            else:
                self.thread_choice = choose_threads(self)
            threads = self.thread_choice["threads"]
        self.threads = threads
        self.use_threads()

    def use_threads(self) -> None:
        """Make torch run with this engine's thread count again (a process-wide setting: another engine in the
        same process, a side-by-side benchmark's, may have changed it)."""
        if self.threads is not None and torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    def start(self, capacity: int) -> None:
        raise NotImplementedError

    @property
    def length(self) -> int:
        """Committed entries in the cache."""
        raise NotImplementedError

    def forward(self, tokens: torch.Tensor, tree: Tree | None = None, *, last_only: bool = False,
                hidden: bool | tuple[int, ...] = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [n, vocab] (``last_only``: [1, vocab]) of ``tokens`` [n] placed after the committed
        prefix, and with ``hidden`` the last hidden states [n, hidden] (what the lm_head reads); with ``hidden``
        a tuple of layer indices, the inputs of those decoder layers side by side [n, len(hidden) * hidden]
        (transformers' ``hidden_states[i]``: EAGLE-3's features).

        ``tree=None`` or a chain: causal attention. A tree: node i at position ``length + depth[i]``,
        seeing the prefix and its ancestors. The n entries are appended (``length`` grows by n);
        ``commit`` then keeps the accepted ones.
        """
        raise NotImplementedError

    def commit(self, start: int, path: list[int]) -> None:
        """Keep, of the entries appended from slot ``start`` on, the nodes ``path`` (increasing) only."""
        raise NotImplementedError

    def prepare(self, sizes: list[int] | None) -> None:
        """Get ready for steps of these sizes (tree nodes) before anything is timed (compiled engines compile)."""

    def summary(self) -> dict:
        """What the run summary records about the engine: its name, its attention kernel, compiled graphs."""
        cfg = self.model.config
        heads, kv_heads = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        out = {"name": self.name, "attention": sdpa_backend(heads, kv_heads, head_dim, self.dtype, self.device,
                                                            expand_kv=self.expand_kv)}
        if self.device.type == "cpu":
            out["threads"] = self.threads or torch.get_num_threads()
        if self.thread_choice is not None:
            out["thread_choice"] = self.thread_choice
        return out


def sdpa_backend(heads: int, kv_heads: int, head_dim: int, dtype, device, expand_kv: bool) -> dict:
    """The kernel ``scaled_dot_product_attention`` picks for a tree step: 8 queries, 64 keys, a bool mask.

    With grouped-query attention (``kv_heads < heads``) and a mask, no fused CUDA kernel takes ``enable_gqa``
    (PyTorch falls back to the math path), so on CUDA the K/V heads are expanded first (``expand_kv``).
    """
    q = torch.zeros(1, heads, 8, head_dim, dtype=dtype, device=device)
    k = torch.zeros(1, heads if expand_kv else kv_heads, 64, head_dim, dtype=dtype, device=device)
    mask = torch.ones(8, 64, dtype=torch.bool, device=device)
    return {"backend": sdpa_choice(q, k, k, mask),
            "gqa": ("expanded" if expand_kv else "enable_gqa") if heads != kv_heads else "none"}


def sdpa_choice(q, k, v, mask) -> str:
    """The name of the kernel ``scaled_dot_product_attention(q, k, v, attn_mask=mask)`` runs (``enable_gqa``
    when k has fewer heads than q)."""
    from torch.nn.attention import SDPBackend

    try:
        return SDPBackend(torch._fused_sdp_choice(q, k, v, mask, 0.0, False, enable_gqa=k.shape[1] != q.shape[1])).name
    except Exception as e:  # a private function: report what it said rather than fail a run over it
        return f"unknown ({type(e).__name__})"


class HFEngine(Engine):
    """The stock Hugging Face forward over a ``DynamicCache`` (the reference)."""

    name = "hf"
    expand_kv = True  # transformers expands grouped K/V heads itself when a mask is passed (its use_gqa_in_sdpa)

    def __init__(self, model, *, threads: int | str | None = None):
        super().__init__(model)
        self.cache = None
        self.set_threads(threads)

    def start(self, capacity: int) -> None:
        self.cache = kv.new_cache(self.model)

    @property
    def length(self) -> int:
        return kv.length(self.cache)

    def forward(self, tokens, tree=None, *, last_only=False, hidden=False):
        kwargs = {}
        if tree is not None and not tree.is_chain:
            kwargs = dict(position_ids=(tree.depth + self.length).view(1, -1),
                          attention_mask=tree_mask(tree, self.length, self.dtype))
        out = self.model(input_ids=tokens.view(1, -1), past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1 if last_only else 0, output_hidden_states=bool(hidden), **kwargs)
        if isinstance(hidden, tuple):
            return out.logits[0], torch.cat([out.hidden_states[i][0] for i in hidden], dim=-1)
        return out.logits[0], (out.hidden_states[-1][0] if hidden else None)

    def commit(self, start: int, path: list[int]) -> None:
        kv.commit(self.cache, start, path)


class _Layer:
    """One Llama decoder layer on 2-D activations [n, hidden]."""

    def __init__(self, layer, pack: bool, expand_kv: bool):
        at, mlp = layer.self_attn, layer.mlp
        self.q, self.k, self.v, self.o = (Linear(m, pack) for m in (at.q_proj, at.k_proj, at.v_proj, at.o_proj))
        self.gate, self.up, self.down = (Linear(m, pack) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        self.act = mlp.act_fn
        self.norm1, self.norm2 = layer.input_layernorm, layer.post_attention_layernorm
        self.heads, self.kv_heads, self.head_dim = at.config.num_attention_heads, at.config.num_key_value_heads, \
            at.head_dim
        self.scale = at.scaling
        self.expand = expand_kv and self.heads != self.kv_heads  # see sdpa_backend

    def qkv(self, x, cos, sin):
        """Pre-attention: the rotated queries [heads, n, d] and keys and values [kv_heads, n, d]."""
        n = x.shape[0]
        h = self.norm1(x)
        q = self.q(h).view(n, self.heads, self.head_dim).transpose(0, 1)
        k = self.k(h).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        v = self.v(h).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def attend(self, q, keys, values, mask):
        if self.expand:
            group = self.heads // self.kv_heads
            keys, values = keys.repeat_interleave(group, dim=0), values.repeat_interleave(group, dim=0)
        o = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, scale=self.scale,
                                           enable_gqa=self.heads != keys.shape[0])
        return o[0].transpose(0, 1).reshape(q.shape[1], self.heads * self.head_dim)

    def rest(self, x, o):
        """Post-attention: output projection, residual, MLP, residual."""
        x = x + self.o(o)
        h = self.norm2(x)
        return x + self.down(self.act(self.gate(h)) * self.up(h))


SPAN = 64  # attention reads the cache up to the committed length + n, rounded up to this many slots
EXACT_GRAPHS = 4  # up to this many step sizes compile a graph each; more are padded to powers of two


def graph_sizes(sizes: list[int]) -> list[int]:
    """The step sizes to compile for a proposer that drafts trees of ``sizes`` nodes: those sizes when they are
    few, else the powers of two that cover them (a step is padded up to the next compiled size).

    >>> graph_sizes([81]), graph_sizes(range(1, 12))
    ([81], [1, 2, 4, 8, 16])
    """
    sizes = sorted(set(sizes))
    if len(sizes) <= EXACT_GRAPHS:
        return sizes
    return sorted({1 << (n - 1).bit_length() for n in sizes})


class StaticEngine(Engine):
    """The lean Llama forward over a preallocated cache (see the module docstring)."""

    name = "static"

    def __init__(self, model, *, pack: bool | None = None, compile: bool = False, mode: str = "default",
                 threads: int | str | None = None):
        super().__init__(model)
        cfg = model.config
        if cfg.model_type != "llama":
            raise HarnessError(f"engine=static runs Llama-architecture models; this one is '{cfg.model_type}'. "
                              f"Use engine=hf")
        auto = pack is None
        if auto:
            pack = can_pack(self.device, self.dtype)
        elif pack and not can_pack(self.device, self.dtype):
            raise HarnessError(f"engine.pack=true needs the CPU with float32 or bfloat16 and oneDNN (bfloat16: a "
                              f"CPU with AVX-512 or AVX-NE-CONVERT); here {self.device.type}, {self.dtype}. Set "
                              f"engine.pack=auto")
        inner = model.model
        self.embed, self.norm, self.rotary = inner.embed_tokens, inner.norm, inner.rotary_emb
        self.lm_head = Linear(model.lm_head, pack)
        self.pack = pack and not compile
        self.expand_kv = self.device.type == "cuda"
        self.layers = [_Layer(layer, self.pack, self.expand_kv) for layer in inner.layers]
        self.head_dim = self.layers[0].head_dim
        self.cache: kv.StaticKV | None = None
        self._rope = (torch.empty(0), torch.empty(0))
        self._compiled = None  # the compiled steps (engine.compile)
        self.graphs: dict[int, float] = {}  # compiled step size -> seconds its compilation took (prepare)
        self.late: set[int] = set()  # sizes compiled inside a timed step (a proposer that did not declare them)
        self.pack_choice: dict | None = None  # engine.pack=auto: what was measured (choose_pack)
        self.set_threads(threads)  # first: the pack choice is timed, and cached, for the thread count used
        if auto and self.pack:  # measured; not under compile, whose graphs take the plain weights
            self.pack_choice = choose_pack(self)
            self._use_pack(self.pack_choice["pack"])
            if not self.pack:
                for lin in self._linears():
                    lin.packed = None  # not kept twice
        if compile:
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            self._compiled = torch.compile(self._layers, dynamic=False, fullgraph=True, mode=mode)

    @torch.inference_mode()
    def start(self, capacity: int) -> None:
        if self.cache is None:
            self.cache = kv.StaticKV(len(self.layers), self.model.config.num_key_value_heads, self.head_dim,
                                     0, self.dtype, self.device)  # sized by _room
        self.cache.length = 0
        self._room(capacity)

    def _room(self, n: int) -> int:
        """Cache slots and rotary tables for ``n`` positions (grown, never shrunk: allocated once per size);
        returns ``n`` rounded up to whole spans."""
        n = -(-n // SPAN) * SPAN
        if n > self.cache.capacity:
            self.cache.reserve(n)
            if self._compiled is not None and self.device.type == "cuda":  # CUDA graphs replay on it in place
                torch._dynamo.mark_static_address(self.cache.keys)
                torch._dynamo.mark_static_address(self.cache.values)
        if self._rope[0].shape[0] < n:
            pos = torch.arange(self.cache.capacity, device=self.device)[None]
            cos, sin = self.rotary(torch.empty(1, dtype=self.dtype, device=self.device), pos)
            self._rope = (cos[0], sin[0])  # [capacity, head_dim]
        return n

    @property
    def length(self) -> int:
        return self.cache.length

    @torch.inference_mode()
    def prepare(self, sizes: list[int] | None) -> None:
        """Compile (engine.compile) a graph for every step size the proposer can produce, before any timing:
        each is run three times on a dummy sequence (CUDA graphs record on the later runs)."""
        if self._compiled is None or not sizes:
            return
        for size in graph_sizes(sizes):
            if size in self.graphs:
                continue
            chain = Tree.chain(size).to(self.device)
            tokens = torch.zeros(size, dtype=torch.long, device=self.device)
            self.graphs[size] = 0.0  # a prepared size from now on
            sync(self.device)
            t0 = time.perf_counter()
            self.start(2 * SPAN + size)
            self.forward(tokens[:1])  # the prefill (eager)
            for _ in range(3):
                self.forward(tokens, chain)
                self.commit(1, [])
            sync(self.device)
            self.graphs[size] = time.perf_counter() - t0

    def _use_pack(self, on: bool) -> None:
        for lin in self._linears():
            lin.use_packed = on and lin.packed is not None
        self.pack = on

    def _linears(self) -> list[Linear]:
        return [self.lm_head] + [lin for layer in self.layers for lin in
                                 (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down)]

    def summary(self) -> dict:
        out = {**super().summary(), "pack": self.pack, "compile": self._compiled is not None}
        if self.pack_choice is not None:
            out["pack_choice"] = self.pack_choice
        if self._compiled is not None:
            out["compiled"] = {"graphs": sorted(self.graphs), "seconds": round(sum(self.graphs.values()), 2),
                               "compiled_while_timed": sorted(self.late)}
        return out

    def _graph_size(self, n: int) -> int:
        """The compiled size a step of ``n`` nodes runs as (padded); a size not prepared compiles now."""
        size = min((g for g in self.graphs if g >= n), default=None)
        if size is None:
            self.late.add(n)
            size = n
        return size

    @torch.inference_mode()
    def forward(self, tokens, tree=None, *, last_only=False, hidden=False):
        n, past = tokens.shape[0], self.cache.length
        step = self._compiled is not None and tree is not None  # a compiled step (the prefill stays eager)
        size = self._graph_size(n) if step else n
        span = self._room(past + size)
        cache = self.cache
        if tree is None or tree.is_chain:
            positions = torch.arange(past, past + n, device=self.device)
            ancestors = None
        else:
            positions, ancestors = tree.depth + past, tree.ancestors
        # [n, span] bool: the committed prefix, then the node's ancestors (or the causal triangle) among the n new.
        rel = torch.arange(span, device=self.device) - past
        if ancestors is None:
            mask = rel[None, :] <= torch.arange(n, device=self.device)[:, None]
        else:
            mask = (rel < 0) | ((rel < n) & ancestors[:, rel.clamp(0, n - 1)])
        if size > n:  # padding nodes: each sees only itself, and is written past the step's own entries
            pad = torch.arange(n, size, device=self.device)
            tokens = torch.cat([tokens, torch.zeros_like(pad)])
            positions = torch.cat([positions, torch.full_like(pad, past)])
            mask = torch.cat([mask, rel[None, :] == pad[:, None]])
        cos, sin = self._rope[0][positions], self._rope[1][positions]
        slots = torch.arange(past, past + size, device=self.device)
        x = self.embed(tokens)
        taps: list[torch.Tensor] | None = [] if isinstance(hidden, tuple) else None
        if step and taps is None:  # one graph per size (steps that tap inner layers run eagerly)
            for t, dim in ((mask, 1), (cache.keys, 2), (cache.values, 2)):  # any span, any cache capacity
                torch._dynamo.maybe_mark_dynamic(t, dim)
            x = self._compiled(x, cos, sin, mask, slots, cache.keys, cache.values)[:n]
        else:
            x = self._layers(x, cos, sin, mask, slots, cache.keys, cache.values, hidden if taps is not None else (),
                             taps)[:n]
        cache.length = past + n
        h = self.norm(x)
        if taps is not None:
            return self.lm_head(h[-1:] if last_only else h), torch.cat(taps, dim=-1)[:n]
        return self.lm_head(h[-1:] if last_only else h), (h if hidden else None)

    def _layers(self, x, cos, sin, mask, slots, keys, values, layers=(), taps=None):
        """The decoder layers over [n, hidden] activations; writes the n new entries into the cache
        ``keys/values`` [layers, kv_heads, capacity, head_dim] and attends over the first ``mask.shape[1]``;
        appends the input of every layer in ``layers`` to ``taps``."""
        span = mask.shape[1]
        for i, layer in enumerate(self.layers):
            if i in layers:
                taps.append(x)
            q, k, v = layer.qkv(x, cos, sin)
            k, v = kv.StaticKV.write(keys, values, i, slots, k, v, span)
            x = layer.rest(x, layer.attend(q, k, v, mask))
        return x

    @torch.inference_mode()
    def commit(self, start: int, path: list[int]) -> None:
        self.cache.commit(start, path)


TIMED_SIZES = (1, 8, 32)  # tokens per forward timed by choose_pack and choose_threads: a plain step, two drafts
TIMED_CONTEXT = 128  # cached tokens while timing
TIMED_REPEATS = 5
CHOICES = CACHE / "engine"  # the pack choices, one file per machine kind, thread count, dtype and shape


@torch.inference_mode()
def time_variants(engine: Engine, variants: dict[str, Callable[[], None]], sizes=TIMED_SIZES,
                  repeats: int = TIMED_REPEATS) -> dict[str, dict[int, float]]:
    """The fastest of ``repeats`` forwards of N tokens (a causal chain) after ``TIMED_CONTEXT`` cached ones under
    each variant (a function that switches the engine to it: packed weights, a thread count), in milliseconds.
    The variants are interleaved, so that a shared machine's slow spell falls on all of them."""
    gen = torch.Generator().manual_seed(0)
    vocab = engine.model.config.vocab_size
    engine.start(TIMED_CONTEXT + max(sizes))
    engine.forward(torch.randint(vocab, (TIMED_CONTEXT,), generator=gen).to(engine.device), last_only=True)
    best = {label: {n: float("inf") for n in sizes} for label in variants}
    for i in range(repeats + 1):
        for label, use in variants.items():
            use()
            for n in sizes:
                tokens = torch.randint(vocab, (n,), generator=gen).to(engine.device)
                t = time.perf_counter()
                engine.forward(tokens)
                sync(engine.device)
                if i:  # the first round warms every variant up
                    best[label][n] = min(best[label][n], 1000 * (time.perf_counter() - t))
                engine.commit(TIMED_CONTEXT, [])
    return best


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _shape(engine: Engine) -> str:
    cfg = engine.model.config
    return f"{cfg.num_hidden_layers}x{cfg.hidden_size}x{cfg.intermediate_size}x{cfg.vocab_size}"


def _timing(t0: float) -> dict:
    """How a choice was measured, for the run summary."""
    return {"sizes": list(TIMED_SIZES), "context": TIMED_CONTEXT, "fastest_of": TIMED_REPEATS,
            "seconds": round(time.perf_counter() - t0, 1)}


def _rounded(ms: dict[str, dict[int, float]]) -> dict:
    return {k: {n: round(v, 2) for n, v in row.items()} for k, row in ms.items()}


def choose_pack(engine: "StaticEngine") -> dict:
    """engine.pack=auto: pack the weights for oneDNN only where that measured faster on this machine.

    Which wins depends on the CPU (packing won 1.8-2.4x for the MLP weights on an AVX-512 EPYC, 1.1-1.5x on an
    AVX2 EPYC, and lost 1.2x in float32 on an AMX Xeon), so it is timed (``time_variants``), once per machine
    kind, thread count, dtype and model shape, and cached in ``data/cache/engine/``. Packed is chosen when its
    times over ``TIMED_SIZES`` have a geometric mean below the plain ones'. The choice and its timings go into
    the run summary."""
    from methods.machine import machine_key

    file = CHOICES / f"pack-{machine_key()}-{str(engine.dtype).removeprefix('torch.')}-{_shape(engine)}.json"
    try:
        cached = json.loads(file.read_text())
        if isinstance(cached, dict) and isinstance(cached.get("pack"), bool):
            return cached | {"cached": str(file)}
    except (OSError, ValueError):
        pass  # none yet, or unreadable: measured (again)
    t0 = time.perf_counter()
    ms = time_variants(engine, {"packed": partial(engine._use_pack, True), "plain": partial(engine._use_pack, False)})
    ratio = geomean(ms["packed"][n] / ms["plain"][n] for n in TIMED_SIZES)
    choice = {"pack": ratio < 1, "packed_vs_plain": round(ratio, 3), "ms": _rounded(ms), "measured": _timing(t0)}
    try:
        write_json_atomic(file, choice, indent=1)
    except OSError:
        pass  # a read-only cache: measured again next time
    return choice


def thread_counts(cores: int) -> list[int]:
    """engine.threads=auto's candidates: the powers of two below ``cores``, and ``cores``."""
    return sorted({1 << i for i in range(cores.bit_length()) if 1 << i < cores} | {cores})


_THREADS: dict[tuple, dict] = {}  # engine.threads=auto's choices made in this process


def choose_threads(engine: Engine) -> dict:
    """engine.threads=auto: the thread count whose forwards over ``TIMED_SIZES`` have the lowest geometric mean
    (``time_variants``; the static engine's weights packed where they can be). More threads are not always
    faster: a one-token step of a small model mostly reads weights and gains little from a second thread, a
    step of many tokens computes enough to gain, and a core that another job holds makes every count that
    needs it slow. That last makes the choice a property of the moment as much as of the machine, so it is
    timed once per process (per model and dtype: every runner of a side-by-side benchmark, whatever its
    engine, gets the same count) and never cached on disk, unlike the pack choice."""
    cores = usable_cores()
    counts = thread_counts(cores)
    if len(counts) == 1:
        return {"threads": cores, "from": "one core"}
    cfg = engine.model.config  # any architecture the hf engine runs: its type and size, not Llama's fields
    key = (str(engine.dtype), cfg.model_type, sum(p.numel() for p in engine.model.parameters()), cores)
    if key in _THREADS:
        return _THREADS[key] | {"from": "measured earlier in this process"}
    before, t0 = torch.get_num_threads(), time.perf_counter()
    try:
        ms = time_variants(engine, {str(n): partial(torch.set_num_threads, n) for n in counts})
    finally:
        torch.set_num_threads(before)
    mean = {n: geomean(ms[str(n)].values()) for n in counts}
    best = min(counts, key=mean.get)
    _THREADS[key] = {"threads": best, "vs_fastest": {n: round(mean[n] / mean[best], 3) for n in counts},
                     "ms": _rounded(ms), "measured": _timing(t0)}
    return _THREADS[key]


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
    compile: bool = param(False, "true: every verification step runs as a torch.compile graph (one per step "
                          "size), cached in data/cache/inductor; eager measured faster on the CPUs tried "
                          "(results/MEASUREMENTS.md)")
    compile_mode: str = param("default", "torch.compile's mode; reduce-overhead adds CUDA graphs on a GPU",
                              choices=COMPILE_MODES)
    threads: int | str = _threads()


ENGINE_PARAMS = {"hf": HFParams, "static": StaticParams}  # engine=NAME: the declarations (methods.params)


def build_engine(model, params: dict) -> Engine:
    """The engine ``params['name']`` for ``model``, its other parameters checked against its declaration."""
    params = dict(params)
    name = params.pop("name", None)
    if name not in ENGINE_PARAMS:
        raise HarnessError(f"unknown engine '{name}'; known: {', '.join(ENGINE_PARAMS)}")
    p = parse(ENGINE_PARAMS[name], params, f"engine '{name}'", prefix="engine")
    if name == "hf":
        return HFEngine(model, threads=p.threads)
    if p.compile:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(INDUCTOR_CACHE)  # torch sets its /tmp default on import
    return StaticEngine(model, pack=None if p.pack == AUTO else p.pack, compile=p.compile, mode=p.compile_mode,
                        threads=p.threads)
