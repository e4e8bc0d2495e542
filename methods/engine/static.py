"""``engine=static``: a lean forward of Llama-family models over a preallocated cache (``methods.engine`` says
how it differs from the hf engine; ``engine.compile`` runs its steps as CUDA graphs, ``graphs``, or torch.compile
graphs, ``true``)."""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from methods.common import CACHE, HarnessError
from methods.engine import arch, kv, masks, native
from methods.engine.core import Engine
from methods.engine.graphs import StepGraphs, buckets, span_bucket
from methods.engine.ops import Linear, can_pack, rotate_half, sync
from methods.engine.tuning import choose_pack
from methods.tree import Tree

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
INDUCTOR_CACHE = CACHE / "inductor"


class _Layer:
    """One decoder layer on 2-D activations [n, hidden]: Llama's, with its architecture's parts (``arch``)."""

    def __init__(self, layer, pack: bool, fold_gqa: bool):
        at, mlp = layer.self_attn, layer.mlp
        self.plan = arch.layer_plan(layer)
        self.window, self.rope = self.plan.window, self.plan.rope
        self.qkv_proj = Linear.fused([at.q_proj, at.k_proj, at.v_proj], pack)  # q, k, v side by side
        self.o = Linear(at.o_proj, pack)
        self.gate_up = Linear.fused([mlp.gate_proj, mlp.up_proj], pack)
        self.down = Linear(mlp.down_proj, pack)
        self.split = (at.q_proj.out_features, at.k_proj.out_features, at.v_proj.out_features)
        self.act = mlp.act_fn
        self.norm1 = arch.norm(layer.input_layernorm)
        self.heads, self.kv_heads, self.head_dim = at.config.num_attention_heads, at.config.num_key_value_heads, \
            at.head_dim
        self.scale = at.scaling
        self.fold = fold_gqa and self.heads != self.kv_heads  # see sdpa_backend

    def qkv(self, x, cos, sin):
        """Pre-attention: the rotated queries [heads, n, d] and keys and values [kv_heads, n, d] (a batch's rows:
        x [b, n, hidden] gives [b, heads, n, d] and [b, kv_heads, n, d], with cos, sin [b, 1, n, d])."""
        *lead, n, _ = x.shape
        q, k, v = self.qkv_proj(self.norm1(x)).split(self.split, dim=-1)
        q = self.plan.q_norm(q.reshape(*lead, n, self.heads, self.head_dim)).transpose(-3, -2)
        k = self.plan.k_norm(k.reshape(*lead, n, self.kv_heads, self.head_dim)).transpose(-3, -2)
        v = v.reshape(*lead, n, self.kv_heads, self.head_dim).transpose(-3, -2)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def attend(self, q, keys, values, mask):
        """Attention of queries [heads, n, d] over keys and values [kv_heads, span, d] with ``mask`` [n, span] (a
        batch's rows: [b, heads, n, d], [b, kv_heads, span, d], [b, 1, n, span]); returns [(b,) n, heads * d].

        ``fold``: the queries of each K/V head's group are folded into its query rows, [b, kv_heads, group * n, d]
        (query head h reads K/V head h // group, as transformers' ``repeat_kv``; row g * n + i is head g's query
        i, so the mask repeats group times), one attention without grouped heads: the fused CUDA kernels take no
        ``enable_gqa`` with a mask, and expanding the keys instead copies the whole cache every layer."""
        rows = q.dim() == 4
        if not rows:
            q, keys, values = q[None], keys[None], values[None]
        b, _, n, d = q.shape
        if self.fold:
            group = self.heads // self.kv_heads
            q = q.reshape(b, self.kv_heads, group * n, d)
            mask = mask.repeat(group, 1) if mask.dim() == 2 else mask.repeat(1, 1, group, 1)
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale,
                                           enable_gqa=not self.fold and self.heads != self.kv_heads)
        o = o.reshape(b, self.heads, n, d).transpose(1, 2).reshape(b, n, self.heads * d)
        return o if rows else o[0]

    def attend_span(self, q, keys, values):
        """Attention without a mask over exactly what the queries see (``StaticEngine._unmasked``): queries
        [heads, n, d] after the first ``span - n`` cached entries, keys and values [kv_heads, span, d] (the row's own
        span, no padding): one query sees all of them (its window's last ``window`` only), several see them causally
        (a prompt from slot 0: the kernel skips the blocks above the diagonal). Returns [n, heads * d]."""
        n, d = q.shape[1], q.shape[2]
        if n == 1 and self.window is not None:
            keys, values = keys[:, -self.window:], values[:, -self.window:]
        fold = self.fold and n == 1  # one query a head: its group's queries are its K/V head's rows, no mask needed
        q = q.reshape(self.kv_heads, self.heads // self.kv_heads, d) if fold else q
        o = F.scaled_dot_product_attention(q[None], keys[None], values[None], scale=self.scale, is_causal=n > 1,
                                           enable_gqa=not fold and self.heads != self.kv_heads)
        return o.reshape(self.heads, n, d).transpose(0, 1).reshape(n, self.heads * d)

    def attend_ones(self, q, keys, values, rows: list[int], ends: list[int]):
        """One query token a row (``native``'s kernel, ``StaticEngine.native``): queries [heads, R, d] over cache rows
        ``rows`` of one layer's keys and values [rows, kv_heads, capacity, d], row i seeing its slots before
        ``ends[i]`` (a sliding window: its last ``window``). Returns [R, heads * d]."""
        starts = [max(0, e - self.window) for e in ends] if self.window is not None else [0] * len(ends)
        with torch.profiler.record_function("native::decode_attention"):  # named in a profile (bench_batch_step)
            o = native.decode_attention(q.transpose(0, 1), keys, values, rows, starts, ends, self.scale)
        return o.reshape(len(rows), self.heads * self.head_dim)

    def rest(self, x, o):
        """Post-attention: output projection, residual, MLP, residual."""
        x = x + self.plan.after_attention(self.o(o))
        h = self.plan.before_mlp(x)
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        return x + self.plan.after_mlp(self.down(self.act(gate) * up))


SPAN = 64  # attention reads the cache up to the committed length + n, rounded up to this many slots
EXACT_GRAPHS = 4  # up to this many step sizes compile a graph each; more are padded to powers of two
PREPARE_SPAN = 2048  # engine.compile=graphs: prepare records each step size's graphs for spans up to this
STEPS = {False: "eager", True: "inductor", "graphs": "cuda-graphs"}  # engine.compile -> Engine.step_mode


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
    """The lean decoder forward over a preallocated cache (see the module docstring; its architectures: ``arch``)."""

    name = "static"
    ragged = True

    def __init__(self, model, *, pack: bool | None = None, compile: bool | str = False, mode: str = "default",
                 threads: int | str | None = None, attention: str = "auto"):
        """``compile``: False (eager), ``"graphs"`` (CUDA graphs of the eager step; on a CPU its static-shape
        step runs eagerly, for the tests) or True (torch.compile, ``mode``)."""
        super().__init__(model)
        self.plan = arch.plan(model)
        auto = pack is None
        if auto:
            pack = can_pack(self.device, self.dtype)
        elif pack and not can_pack(self.device, self.dtype):
            raise HarnessError(f"engine.pack=true needs the CPU with float32 or bfloat16 and oneDNN (bfloat16: a "
                              f"CPU with AVX-512 or AVX-NE-CONVERT); here {self.device.type}, {self.dtype}. Set "
                              f"engine.pack=auto")
        inner = model.model
        self.embed, self.norm, self.rotary = inner.embed_tokens, arch.norm(inner.norm), inner.rotary_emb
        self.lm_head = Linear(model.lm_head, pack)
        self.pack = pack and not compile
        self.gqa = "folded" if self.device.type == "cuda" else "enable_gqa"  # see sdpa_backend
        self.layers = [_Layer(layer, self.pack, self.gqa == "folded") for layer in inner.layers]
        self.head_dim = self.layers[0].head_dim
        self.native = self._native(attention)  # one-token steps through native's kernel (else torch's SDPA)
        self.cache: kv.StaticKV | None = None
        self._rope: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # rotary table -> cos, sin [capacity, d]
        self.step_mode = STEPS[compile] + (f":{mode}" if compile is True and mode != "default" else "")
        self._compiled = None  # the torch.compile'd layers (engine.compile=true)
        self._graphs = StepGraphs(self._step, self.device, self.device.type == "cuda") if compile == "graphs" \
            else None  # the CUDA graphs (engine.compile=graphs)
        self.graphs: dict[int, float] = {}  # prepared step size -> seconds its compilation took (engine.compile)
        self.late: set[int] = set()  # sizes compiled inside a timed step (a proposer that did not declare them)
        self.graphs_error: str | None = None  # why CUDA graphs could not be recorded (the engine went on eagerly)
        self.prepare_span = PREPARE_SPAN  # prepare records graphs for spans up to this (short sequences: less)
        self.pack_choice: dict | None = None  # engine.pack=auto: what was measured (choose_pack)
        self.set_threads(threads)  # first: the pack choice is timed, and cached, for the thread count used
        if auto and self.pack:  # measured; not under compile, whose graphs take the plain weights
            self.pack_choice = choose_pack(self)
            start = self.pack_choice.get("pack_from")
            self._use_pack(start is not None, start or 1)
            if not self.pack:
                for lin in self._linears():
                    lin.packed = None  # not kept twice
        if compile is True:
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            self._compiled = torch.compile(self._row, dynamic=False, fullgraph=True, mode=mode)

    @torch.inference_mode()
    def start(self, capacity: int, rows: int = 1) -> None:
        if self.cache is None or self.cache.rows != rows:
            self.cache = kv.StaticKV(len(self.layers), self.model.config.num_key_value_heads, self.head_dim,
                                     0, self.dtype, self.device, rows)  # sized by _room
            if self._graphs is not None:
                self._graphs.clear()
        self.cache.lengths = [0] * rows
        self._room(capacity)

    def open(self, row: int, capacity: int) -> None:
        self.cache.lengths[row] = 0
        self._room(capacity)

    def _room(self, n: int) -> int:
        """Cache slots and rotary tables for ``n`` positions (grown, never shrunk: allocated once per size);
        returns ``n`` rounded up to whole spans."""
        n = -(-n // SPAN) * SPAN
        if n > self.cache.capacity:
            self.cache.reserve(n)
            if self._compiled is not None and self.device.type == "cuda":  # CUDA graphs replay on it in place
                for t in (*self.cache.row_keys, *self.cache.row_values):
                    torch._dynamo.mark_static_address(t)
            if self._graphs is not None:  # recorded over the old cache's addresses
                self._graphs.clear()
        if not self._rope or next(iter(self._rope.values()))[0].shape[0] < n:
            self._rope = self.plan.rope_tables(self.rotary, self.dtype,
                                               torch.arange(self.cache.capacity, device=self.device))
            if self._graphs is not None:
                self._graphs.clear()
        return n

    @property
    def length(self) -> int:
        return self.cache.lengths[0]

    def length_of(self, row: int) -> int:
        return self.cache.lengths[row]

    @torch.inference_mode()
    def prepare(self, sizes: list[int] | None) -> None:
        """Ready a graph for every step size the proposer can produce, before any timing: CUDA graphs
        (``engine.compile=graphs``) for every span bucket up to ``prepare_span``; torch.compile
        (``engine.compile=true``) runs each three times on a dummy sequence (CUDA graphs record on the later runs)."""
        if not sizes or (self._compiled is None and self._graphs is None):
            return
        todo = [size for size in graph_sizes(sizes) if size not in self.graphs]
        if self._graphs is not None and todo:
            self.start(self.prepare_span + max(todo))
        for size in todo:
            chain = Tree.chain(size).to(self.device)
            tokens = torch.zeros(size, dtype=torch.long, device=self.device)
            self.graphs[size] = 0.0  # a prepared size from now on
            sync(self.device)
            t0 = time.perf_counter()
            if self._graphs is not None:
                for span in buckets(self.prepare_span):
                    if span >= size:
                        self._graphs(span, size, tokens, 0, chain, prepared=True)
            else:
                self.start(2 * SPAN + size)
                self.forward(tokens[:1])  # the prefill (eager)
                for _ in range(3):
                    self.forward(tokens, chain)
                    self.commit(1, [])
            sync(self.device)
            self.graphs[size] = time.perf_counter() - t0

    def _use_pack(self, on: bool, start: int = 1) -> None:
        """Packed weights (``on``) for forwards of at least ``start`` tokens (``choose_pack``'s ``pack_from``)."""
        for lin in self._linears():
            lin.use_packed, lin.pack_from = on and lin.packed is not None, start
        self.pack = on

    def _native(self, attention: str) -> bool:
        """``engine.decode_attention``: auto takes ``native``'s kernel for one-token steps on a CPU in float32 where it
        builds, sdpa torch's kernel always, native requires it."""
        if attention == "sdpa":
            return False
        fits = self.device.type == "cpu" and self.dtype == torch.float32 and self.head_dim % 8 == 0
        if fits and native.kernel() is not None:
            return True
        if attention == "native":
            why = native.error() or f"it runs float32 on a CPU with head sizes in 8s; here {self.device.type}, " \
                                    f"{self.dtype}, head size {self.head_dim}"
            raise HarnessError(f"engine.decode_attention=native: the decode kernel cannot run here ({why}); set "
                               f"engine.decode_attention=auto")
        return False

    def _linears(self) -> list[Linear]:
        return [self.lm_head] + [lin for layer in self.layers for lin in
                                 (layer.qkv_proj, layer.o, layer.gate_up, layer.down)]

    def summary(self) -> dict:
        out = {**super().summary(), "pack": self.pack, "compile": self._compiled is not None,
               "decode_attention": "native" if self.native else "sdpa"}
        if native.error():
            out["native_error"] = native.error()
        if self.pack_choice is not None:
            out["pack_choice"] = self.pack_choice
        if self._graphs is not None:
            out["cuda_graphs"] = self._graphs.summary()
        if self.graphs_error:
            out["graphs_error"] = self.graphs_error
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
    def forward(self, tokens, tree=None, *, row=0, last_only=False, hidden=False):
        n, past = tokens.shape[0], self.cache.lengths[row]
        if self._graphs is not None and tree is not None and not isinstance(hidden, tuple) and self.cache.rows == 1:
            return self._graph_forward(tokens, tree, past, last_only, hidden)
        step = self._compiled is not None and tree is not None  # a compiled step (the prefill stays eager)
        size = self._graph_size(n) if step else n
        span = self._room(past + size)
        keys, values = self.cache.row(row)
        at = masks.positions(past, n, tree, size, self.device)
        rope = {name: (cos[at], sin[at]) for name, (cos, sin) in self._rope.items()}
        slots = torch.arange(past, past + size, device=self.device)
        taps: list[torch.Tensor] | None = [] if isinstance(hidden, tuple) else None
        if not step and self._unmasked(past, n, tree):
            end = past + n
            if n == 1 and self.native:
                def attend(layer, q, k, v):
                    return layer.attend_ones(q, k[None], v[None], [0], [end])
            else:
                def attend(layer, q, k, v):
                    return layer.attend_span(q, k, v)
            x = self._layers(self.embed(tokens), rope,
                             lambda i, k, v: kv.StaticKV.write(keys, values, i, slots, k, v, end), attend,
                             hidden if taps is not None else (), taps)
            self.last_slots = n
            return self._out(x, row, n, last_only, hidden, taps)
        windows = masks.windowed(masks.step_mask(past, n, tree, span, size, self.device), past, at, self.plan.windows)
        if size > n:  # padding nodes: each sees only itself, and is written past the step's own entries
            tokens = torch.cat([tokens, torch.zeros(size - n, dtype=tokens.dtype, device=self.device)])
        x = self.embed(tokens)
        if step and taps is None:  # one graph per size (steps that tap inner layers run eagerly)
            for t, dim in (*((m, 1) for m in windows.values()), (keys, 2), (values, 2)):  # any span, any capacity
                torch._dynamo.maybe_mark_dynamic(t, dim)
            x = self._compiled(x, rope, windows, slots, keys, values)[:n]
        else:
            x = self._row(x, rope, windows, slots, keys, values, hidden if taps is not None else (), taps)[:n]
        self.last_slots = size
        return self._out(x, row, n, last_only, hidden, taps)

    def _unmasked(self, past: int, n: int, tree) -> bool:
        """A step whose attention needs no mask (``_Layer.attend_span``): one token after its prefix, or a prompt
        from slot 0 where every layer attends causally over the whole prefix (no sliding window) and the grouped
        heads need no folding (folding is for one query a head)."""
        if tree is not None and not tree.is_chain:
            return False
        return n == 1 or (past == 0 and self.plan.windows == (None,) and self.gqa != "folded")

    def _out(self, x, row, n, last_only, hidden, taps):
        """A forward's end: the row's length past its ``n`` new entries, the logits (``last_only``: the last
        position's) and what ``hidden`` asked for."""
        self.cache.lengths[row] += n
        h = self.norm(x)
        logits = self.plan.logits(self.lm_head, h[-1:] if last_only else h)
        if taps is not None:
            return logits, torch.cat(taps, dim=-1)[:n]
        return logits, (h if hidden else None)

    def _graph_forward(self, tokens, tree, past, last_only, hidden):
        """``forward`` of a verification step as a CUDA graph (``methods.engine.graphs``; row 0 of a cache of one
        row, no inner layers tapped); a graph that cannot be recorded leaves the engine eager, and says why in its
        summary."""
        n = tokens.shape[0]
        size = self._graph_size(n)
        span = span_bucket(past + size)
        self._room(span)
        try:
            h = self._graphs(span, size, tokens, past, tree)[:n]
        except RuntimeError as e:  # e.g. an operation a graph cannot record on this torch: eager from now on
            self.graphs_error, self._graphs = f"{type(e).__name__}: {e}"[:300], None
            self.step_mode = "eager (recording CUDA graphs failed)"
            return self.forward(tokens, tree, last_only=last_only, hidden=hidden)
        self.cache.lengths[0] = past + n
        self.last_slots = size
        logits = self.plan.logits(self.lm_head, h[-1:] if last_only else h)
        return logits, (h.clone() if hidden else None)

    def _step(self, span, tokens, past, depth, ancestors):
        """A verification step of static shapes, from tensors only (what a CUDA graph records): ``tokens`` [size]
        after ``past`` (0-d) committed entries of row 0, node i at position past + depth[i] seeing the prefix and
        the nodes ``ancestors[i]`` (a padding node: itself), attending over the first ``span`` cache slots
        (``masks.graph_masks``); writes the step's KV entries at slots past.. and returns the last hidden states
        [size, hidden]."""
        at, windows = masks.graph_masks(past, depth, ancestors, span, self.plan.windows)
        rope = {name: (cos[at], sin[at]) for name, (cos, sin) in self._rope.items()}
        keys, values = self.cache.row(0)
        slots = past + torch.arange(tokens.shape[0], device=tokens.device)
        return self.norm(self._row(self.embed(tokens), rope, windows, slots, keys, values))

    @torch.inference_mode()
    def forward_rows(self, rows, tokens, trees, *, hidden=False, keep=None):
        """One forward of several rows' steps (``Engine.forward_rows``), packed: the rows' tokens side by side as
        one sequence [sum of n, hidden] through every weight (no padding), each row's queries attending over its
        own cache only (``masks.step_mask`` of its prefix and tree; rows of as many tokens at consecutive cache rows
        in one call, ``masks.groups``; a row that needs no mask, ``_unmasked``, over its own span alone, and every
        one-token row together in one call of the decode kernel, ``native``); a row's entries are written at its own
        slots (``kv.StaticKV.write_tokens``); the lm_head runs on the kept positions only."""
        if len(rows) == 1:  # one row: forward (the compiled steps)
            return super().forward_rows(rows, tokens, trees, hidden=hidden, keep=keep)
        counts = [t.shape[0] for t in tokens]
        keep = counts if keep is None else [n if k is None else min(k, n) for n, k in zip(counts, keep)]
        dev, lengths = self.device, self.cache.lengths
        pasts = [lengths[r] for r in rows]
        spans = [self._room(p + n) for p, n in zip(pasts, counts)]  # each row's own, in whole spans
        places = [masks.positions(p, n, tree, n, dev) for p, n, tree in zip(pasts, counts, trees)]
        unmasked = [self._unmasked(p, n, tree) for p, n, tree in zip(pasts, counts, trees)]
        spans = [p + n if u else span for p, n, u, span in zip(pasts, counts, unmasked, spans)]  # exact: no mask
        row_masks = [None if u else masks.windowed(masks.step_mask(p, n, tree, span, n, dev), p, at, self.plan.windows)
                     for p, n, tree, span, at, u in zip(pasts, counts, trees, spans, places, unmasked)]
        at = torch.cat(places)
        rope = {name: (cos[at], sin[at]) for name, (cos, sin) in self._rope.items()}  # [T, d] each
        where = kv.StaticKV.places(rows, pasts, counts, dev)
        ends = torch.tensor(counts).cumsum(0).tolist()
        runs = masks.groups(rows, counts, spans, row_masks)
        taps: list[torch.Tensor] | None = [] if isinstance(hidden, tuple) else None

        ones = [(a, r, span) for r, g, n, a, span, mask in runs if mask is None and n == 1] if self.native else []
        runs = [run for run in runs if not (ones and run[5] is None and run[2] == 1)]  # the kernel takes those
        if ones:
            one_at = torch.tensor([a for a, _, _ in ones], device=dev)
            one_rows, one_ends = [r for _, r, _ in ones], [span for _, _, span in ones]

        def attend(layer, q, keys, values):  # [heads, T, d] over each run's rows' caches [rows, kv_heads, capacity, d]
            parts = [(a, layer.attend_span(q[:, a:a + n], keys[r, :, :span], values[r, :, :span]) if mask is None
                      else layer.attend(q[:, a:a + g * n].unflatten(1, (g, n)).transpose(0, 1),
                                        keys[r:r + g, :, :span], values[r:r + g, :, :span],
                                        mask[layer.window]).flatten(0, 1))
                     for r, g, n, a, span, mask in runs]
            if not ones:
                return torch.cat([o for _, o in parts])
            out = q.new_empty(q.shape[1], q.shape[0] * q.shape[2])
            out.index_copy_(0, one_at, layer.attend_ones(q[:, one_at], keys, values, one_rows, one_ends))
            for a, o in parts:
                out[a:a + o.shape[0]] = o
            return out

        x = self._layers(self.embed(torch.cat(tokens)), rope, lambda i, k, v: self.cache.write_tokens(i, where, k, v),
                         attend, hidden if taps is not None else (), taps)  # [T, hidden]
        h = self.norm(x)
        kept = [torch.arange(e - k, e) for e, k in zip(ends, keep)]
        logits = self.plan.logits(self.lm_head, h[torch.cat(kept).to(dev)]).split(keep)
        if taps is not None:
            states = torch.cat(taps, dim=-1).split(counts)
        else:
            states = h.split(counts) if hidden else [None] * len(rows)
        for r, n in zip(rows, counts):
            lengths[r] += n
        self.last_slots = ends[-1]
        return list(zip(logits, states))

    def _layers(self, x, rope, write, attend, taps=(), tapped=None):
        """The decoder layers, the engine's one loop, over activations [T, hidden] (``rope``: each rotary table's
        cos, sin [T, d]): each layer's new keys and values stored by ``write(i, k, v)``, which returns what its
        attention reads, and its queries attending through ``attend(layer, q, keys, values)``; the input of every
        layer in ``taps`` appended to ``tapped``."""
        for i, layer in enumerate(self.layers):
            if i in taps:
                tapped.append(x)
            q, k, v = layer.qkv(x, *rope[layer.rope])
            keys, values = write(i, k, v)
            x = layer.rest(x, attend(layer, q, keys, values))
        return x

    def _row(self, x, rope, windows, slots, keys, values, taps=(), tapped=None):
        """``_layers`` over one row's step: [n, hidden] written at ``slots`` of the row's cache ``keys/values``
        ([layers, kv_heads, capacity, head_dim]: passed in, so that a compiled step takes them as inputs), attending
        over the first ``span`` slots with ``windows`` (window -> mask [n, span])."""
        span = next(iter(windows.values())).shape[1]
        return self._layers(x, rope, lambda i, k, v: kv.StaticKV.write(keys, values, i, slots, k, v, span),
                            lambda layer, q, k, v: layer.attend(q, k, v, windows[layer.window]), taps, tapped)

    @torch.inference_mode()
    def commit(self, start: int, path: list[int], row: int = 0) -> None:
        self.cache.commit(start, path, row)
