"""The static engine's one compiled kernel: a decode step's attention on the CPU (``kernels/decode_attention.cpp``).

A one-token step attends over its row's committed entries and needs no mask. torch's CPU attention kernel takes one
row per call for that (a batch padded to its longest row reads every shorter row's padding), and at one query a
head it reads the cache at about a third of the memory's speed: on a 2-core AVX2 EPYC, 8 rows of 40 to 770 cached
tokens took 650 us a layer in 8 calls, against 270 us in one call of this kernel, which reads each row's span once
for all the query heads that share its K/V head and gives the threads equal shares of the rows.

It is built once per machine kind and torch version with the compiler torch's extensions use (about 30 s on
2 cores, into ``data/cache/native/``); where it cannot be built (no compiler), the engine says why in its summary and
uses torch's kernel (``engine.decode_attention``). Its sums run in a fixed order, so a row's result does not depend
on the batch around it: one token decoded alone and in a batch of 16 gives the same numbers.
"""
from __future__ import annotations

from pathlib import Path

import torch

from methods import machine
from methods.common import CACHE

SOURCE = Path(__file__).parent / "kernels" / "decode_attention.cpp"
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp"]  # OpenMP: torch's own runtime (libgomp.so.1)

_built: dict[str, object] = {}  # "module" or "error" once tried


def kernel():
    """The built extension module, or None (``error()`` says why); built or loaded once per process."""
    if not _built:
        try:
            from torch.utils.cpp_extension import load

            where = CACHE / "native" / f"{machine.kind()}-torch{torch.__version__.split('+')[0]}"
            where.mkdir(parents=True, exist_ok=True)
            _built["module"] = load("decode_attention", [str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                                    build_directory=str(where), verbose=False)
        except Exception as e:  # no compiler, a failed build: torch's kernel instead, and the reason in the summary
            _built["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200] if str(e).strip() else ''}"
    return _built.get("module")


def error() -> str | None:
    """Why the kernel could not be built (None: it was, or was not tried)."""
    return _built.get("error")


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rows: list[int], starts: list[int],
                     ends: list[int], scale: float) -> torch.Tensor:
    """Queries [R, heads, d] (one token a row) over cache rows ``rows`` of one layer's ``keys, values`` [rows, kv_heads,
    capacity, d], row i reading slots ``starts[i]`` to ``ends[i] - 1``: [R, heads, d]."""
    return kernel().decode_attention(q, keys, values, rows, starts, ends, scale)
