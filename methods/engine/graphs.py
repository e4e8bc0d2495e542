"""CUDA graphs of the static engine's verification steps (``engine.compile=graphs``, what ``auto`` runs on CUDA).

An eager step of a 7B model launches about a thousand kernels from Python: on an H200 that took 30 ms a step
whatever its size (results/MEASUREMENTS.md), ten times the 3 ms in which the GPU reads the weights once. A CUDA
graph replays the recorded kernels with one launch. It needs fixed shapes and fixed addresses, so:

* a step of ``n`` tree nodes runs at a fixed size (``n`` itself where the proposer declared it, else ``n`` padded;
  a padding node sees only itself and is never committed) over a fixed number of cache slots, the attention span
  rounded up by ``span_bucket`` (at most a quarter more keys than needed, each one masked);
* what changes between steps (the tokens, the committed length, the tree's depths and ancestor mask) is copied
  into the graph's input buffers (``StepGraphs.__call__``); the step's positions, masks and cache slots are
  computed inside the graph from them (the engine's ``_step``), and its KV entries are written in place;
* a graph is recorded the first time its (size, span) is met, or before anything is timed (``prepare``), and every
  graph is dropped when the cache or the rotary tables are reallocated (``clear``): they are its inputs by address.

Graphs are recorded over the eager step's own kernels (no code generation: a recording takes about two eager
steps), not through ``torch.compile`` (inductor's mode ``reduce-overhead`` does both, at minutes per step size for
a 7B model). On a CPU there is nothing to record: the same step runs eagerly over the same buffers (``record``
False), which is how the tests check its masks and positions against the eager engine's.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch

MIN_BUCKET = 256  # the smallest span a graph attends over


def span_bucket(span: int) -> int:
    """The cache slots a step over ``span`` slots attends over as a graph: rounded up to a multiple of a quarter of
    its power of two (at least ``MIN_BUCKET``), so that a few graphs cover every context and none reads more than
    a quarter more keys than the span.

    >>> [span_bucket(s) for s in (64, 300, 1000, 1100, 5000, 16384)]
    [256, 512, 1024, 1280, 5120, 16384]
    """
    step = max(MIN_BUCKET, (1 << (span.bit_length() - 1)) // 4)
    return -(-span // step) * step


def buckets(upto: int) -> list[int]:
    """Every span bucket up to the one that holds ``upto`` slots.

    >>> buckets(1100)
    [256, 512, 768, 1024, 1280]
    """
    out = [MIN_BUCKET]
    while out[-1] < upto:
        out.append(span_bucket(out[-1] + 1))
    return out


class StepGraphs:
    """The recorded steps of one engine: ``(size, span) -> (graph, output)``, with input buffers per size.

    ``step(span, tokens, past, depth, ancestors) -> hidden [size, hidden]`` is the engine's step over static
    shapes (tokens [size], past a 0-d tensor, depth [size], ancestors [size, size] bool); ``record`` False runs it
    eagerly (a CPU)."""

    def __init__(self, step: Callable, device: torch.device, record: bool):
        self.step, self.device, self.record = step, device, record
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.inputs: dict[int, tuple[torch.Tensor, ...]] = {}  # size -> tokens, depth, ancestors, identity
        self.past = torch.zeros((), dtype=torch.long, device=device)
        self.pool = torch.cuda.graph_pool_handle() if record else None  # one memory pool: graphs replay in turn
        self.seconds = 0.0  # spent recording
        self.recorded: list[tuple[int, int]] = []  # every (size, span) recorded, in order (again after a clear)
        self.while_decoding = 0  # recorded at a step's first use rather than in ``prepare``

    def clear(self) -> None:
        self.graphs.clear()

    def _buffers(self, size: int) -> tuple[torch.Tensor, ...]:
        if size not in self.inputs:
            eye = torch.eye(size, dtype=torch.bool, device=self.device)
            self.inputs[size] = (torch.zeros(size, dtype=torch.long, device=self.device),
                                 torch.zeros(size, dtype=torch.long, device=self.device), eye.clone(), eye)
        return self.inputs[size]

    def __call__(self, span: int, size: int, tokens: torch.Tensor, past: int, tree, prepared: bool = False):
        """The step's last hidden states [size, hidden] for ``tokens`` [n] (n <= size) with ``tree`` after ``past``
        committed entries, over ``span`` cache slots (a ``span_bucket``): its graph replayed, recorded first if
        new. Rows past n are padding. The result is the graph's own output buffer: read it before the next step."""
        n = tokens.shape[0]
        ids, depth, ancestors, eye = self._buffers(size)
        ids[:n].copy_(tokens)
        depth[:n].copy_(tree.depth)
        # A breadth-first tree's node never has a later ancestor, so rows < n need nothing past column n; the
        # padding rows see only themselves.
        ancestors[:n, :n].copy_(tree.ancestors)
        if n < size:
            ids[n:].zero_()
            depth[n:].zero_()
            ancestors[n:].copy_(eye[n:])
        self.past.fill_(past)
        inputs = (ids, self.past, depth, ancestors)
        if not self.record:
            return self.step(span, *inputs)
        key = (size, span)
        if key not in self.graphs:
            self._record(key, inputs, prepared)
        graph, out = self.graphs[key]
        graph.replay()
        return out

    def _record(self, key: tuple[int, int], inputs: tuple, prepared: bool) -> None:
        """Record the step of ``key``: one eager run on a side stream first (library handles and workspaces are
        created outside the graph; it writes the same KV entries the replay then writes), then the recording."""
        torch.cuda.synchronize(self.device)
        t = time.perf_counter()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.step(key[1], *inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.step(key[1], *inputs)
        self.graphs[key] = (graph, out)
        torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - t
        self.recorded.append(key)
        self.while_decoding += not prepared

    def summary(self) -> dict:
        return {"graphs": len(self.graphs), "recorded": len(self.recorded), "seconds": round(self.seconds, 2),
               "recorded_while_decoding": self.while_decoding,
               "sizes": sorted({s for s, _ in self.recorded}), "spans": sorted({s for _, s in self.recorded})}
