"""The engine interface: one sequence, its KV cache, three operations (``methods.engine`` says more), and the
thread count every engine runs with."""
from __future__ import annotations

import os

import torch

from methods.common import HarnessError
from methods.engine.ops import fp32_rotary
from methods.engine.tuning import choose_threads
from methods.machine import usable_cores
from methods.params import AUTO
from methods.tree import Tree


class Engine:
    """Runs the target model over one sequence at a time (see the module docstring)."""

    name: str
    gqa = "enable_gqa"  # how grouped K/V heads meet attention with a mask (sdpa_backend)
    step_mode = "eager"  # how a verification step runs (engine.compile: eager, cuda-graphs, inductor)
    ragged = False  # forward_rows runs rows of different sizes unpadded: a prompt's chunk may ride along a step

    def __init__(self, model):
        self.model = fp32_rotary(model)
        self.device = model.device
        self.dtype = next(model.parameters()).dtype
        self.threads: int | None = None  # engine.threads as applied; None: torch's count as found
        self.thread_choice: dict | None = None  # engine.threads=auto: how it was chosen (choose_threads)
        self.last_slots = 0  # token positions the last forward_rows computed, padding included

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

    def start(self, capacity: int, rows: int = 1) -> None:
        """New, empty sequences in ``rows`` rows (a batch's slots), room for ``capacity`` tokens each."""
        raise NotImplementedError

    def open(self, row: int, capacity: int) -> None:
        """A new, empty sequence in ``row`` (the next request in a batch's slot), room for ``capacity`` tokens."""
        raise NotImplementedError

    @property
    def length(self) -> int:
        """Committed entries in the cache (row 0's)."""
        return self.length_of(0)

    def length_of(self, row: int) -> int:
        """Committed entries in ``row``'s cache."""
        raise NotImplementedError

    def forward(self, tokens: torch.Tensor, tree: Tree | None = None, *, row: int = 0, last_only: bool = False,
                hidden: bool | tuple[int, ...] = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [n, vocab] (``last_only``: [1, vocab]) of ``tokens`` [n] placed after the committed
        prefix, and with ``hidden`` the last hidden states [n, hidden] (what the lm_head reads); with ``hidden``
        a tuple of layer indices, the inputs of those decoder layers side by side [n, len(hidden) * hidden]
        (transformers' ``hidden_states[i]``: EAGLE-3's features).

        ``tree=None`` or a chain: causal attention. A tree: node i at position ``length + depth[i]``,
        seeing the prefix and its ancestors. The n entries are appended to ``row``'s cache (its length grows by n);
        ``commit`` then keeps the accepted ones.
        """
        raise NotImplementedError

    def forward_rows(self, rows: list[int], tokens: list[torch.Tensor], trees: list[Tree | None], *,
                     hidden: bool | tuple[int, ...] = False, keep: list[int | None] | None = None
                     ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """``forward`` of several rows' steps in one forward of the model (a batch): row ``rows[i]`` runs
        ``tokens[i]`` with ``trees[i]``, seeing its own prefix and ancestors only; one (logits, states) per row,
        the logits of its last ``keep[i]`` tokens only (None: all; 0: none, a prompt's chunk before its last).
        ``last_slots`` then says how many token positions it computed, padding included. One row: ``forward``."""
        if len(rows) != 1:
            raise NotImplementedError(f"engine '{self.name}' runs one row per forward")
        n = tokens[0].shape[0]
        k = n if keep is None or keep[0] is None else min(keep[0], n)
        logits, states = self.forward(tokens[0], trees[0], row=rows[0], last_only=k < n, hidden=hidden)
        self.last_slots = n
        return [(logits[logits.shape[0] - k:], states)]

    def commit(self, start: int, path: list[int], row: int = 0) -> None:
        """Keep, of ``row``'s entries appended from slot ``start`` on, the nodes ``path`` (increasing) only."""
        raise NotImplementedError

    def prepare(self, sizes: list[int] | None) -> None:
        """Get ready for steps of these sizes (tree nodes) before anything is timed (compiled engines compile)."""

    def summary(self) -> dict:
        """What the run summary records about the engine: its name, its attention kernel, compiled graphs."""
        cfg = self.model.config
        heads, kv_heads = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        out = {"name": self.name, "step": self.step_mode, "attention": sdpa_backend(heads, kv_heads, head_dim, self.dtype, self.device,
                                                            gqa=self.gqa)}
        if self.device.type == "cpu":
            out["threads"] = self.threads or torch.get_num_threads()
        if self.thread_choice is not None:
            out["thread_choice"] = self.thread_choice
        return out


def sdpa_backend(heads: int, kv_heads: int, head_dim: int, dtype, device, gqa: str) -> dict:
    """The kernel ``scaled_dot_product_attention`` picks for a tree step: 8 queries, 64 keys, a bool mask.

    With grouped-query attention (``kv_heads < heads``) and a mask, no fused CUDA kernel takes ``enable_gqa``
    (PyTorch falls back to the math path), so on CUDA an engine either expands the K/V heads first (``gqa``
    ``expanded``: transformers) or folds each group's queries into its K/V head's query rows (``folded``: the
    static engine, ``static._Layer.attend``); ``enable_gqa`` passes the grouped heads as they are (the CPU).
    """
    group = heads // kv_heads
    rows = 8 * group if gqa == "folded" else 8
    q = torch.zeros(1, kv_heads if gqa == "folded" else heads, rows, head_dim, dtype=dtype, device=device)
    k = torch.zeros(1, heads if gqa == "expanded" else kv_heads, 64, head_dim, dtype=dtype, device=device)
    mask = torch.ones(rows, 64, dtype=torch.bool, device=device)
    return {"backend": sdpa_choice(q, k, k, mask), "gqa": gqa if heads != kv_heads else "none"}


def sdpa_choice(q, k, v, mask) -> str:
    """The name of the kernel ``scaled_dot_product_attention(q, k, v, attn_mask=mask)`` runs (``enable_gqa``
    when k has fewer heads than q)."""
    from torch.nn.attention import SDPBackend

    try:
        return SDPBackend(torch._fused_sdp_choice(q, k, v, mask, 0.0, False, enable_gqa=k.shape[1] != q.shape[1])).name
    except Exception as e:  # a private function: report what it said rather than fail a run over it
        return f"unknown ({type(e).__name__})"
