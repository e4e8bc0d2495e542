"""``engine=static``: a lean forward of Llama-family models over a preallocated cache (``methods.engine`` says
how it differs from the hf engine; ``engine.compile`` runs its steps as torch.compile graphs)."""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from methods.common import CACHE, HarnessError
from methods.engine import kv
from methods.engine.core import Engine
from methods.engine.ops import Linear, can_pack, rotate_half, sync
from methods.engine.tuning import choose_pack
from methods.tree import Tree

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
INDUCTOR_CACHE = CACHE / "inductor"


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
