"""The machine tuning of the engines: the thread count (``engine.threads=auto``) and packing the weights for
oneDNN (``engine.pack=auto``), each chosen by timing forwards on the machine at hand (of the
``methods.engine.Engine`` each function takes)."""
from __future__ import annotations

import json
import math
import time
from functools import partial
from typing import Callable

import torch

from methods.common import CACHE, write_json_atomic
from methods.engine.ops import sync
from methods.machine import machine_key, usable_cores

TIMED_SIZES = (1, 4, 8, 32)  # tokens per forward timed by choose_pack and choose_threads: a plain step, a batch's
#                               or a small draft, two drafts
TIMED_CONTEXT = 128  # cached tokens while timing
TIMED_REPEATS = 5
CHOICES = CACHE / "engine"  # the pack choices, one file per machine kind, thread count, dtype and shape


@torch.inference_mode()
def time_variants(engine, variants: dict[str, Callable[[], None]], sizes=TIMED_SIZES,
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


def _shape(engine) -> str:
    cfg = engine.model.config
    return f"{cfg.num_hidden_layers}x{cfg.hidden_size}x{cfg.intermediate_size}x{cfg.vocab_size}"


def _timing(t0: float) -> dict:
    """How a choice was measured, for the run summary."""
    return {"sizes": list(TIMED_SIZES), "context": TIMED_CONTEXT, "fastest_of": TIMED_REPEATS,
            "seconds": round(time.perf_counter() - t0, 1)}


def _rounded(ms: dict[str, dict[int, float]]) -> dict:
    return {k: {n: round(v, 2) for n, v in row.items()} for k, row in ms.items()}


def choose_pack(engine) -> dict:
    """engine.pack=auto: pack the weights for oneDNN only where that measured faster on this machine.

    Which wins depends on the CPU (packing won 1.8-2.4x for the MLP weights on an AVX-512 EPYC, 1.1-1.5x on an
    AVX2 EPYC, and lost 1.2x in float32 on an AMX Xeon), so it is timed (``time_variants``), once per machine
    kind, thread count, dtype and model shape, and cached in ``data/cache/engine/``. ``pack`` says whether the
    packed times over ``TIMED_SIZES`` have a geometric mean below the plain ones'; the engine packs for forwards of
    at least ``pack_from`` tokens (``pack_from``), so that a batch's many-token steps get the packed kernel where
    it wins even when a lone sequence's one-token steps do not. The choice and its timings go into the run
    summary."""

    file = CHOICES / f"pack-{machine_key()}-{str(engine.dtype).removeprefix('torch.')}-{_shape(engine)}.json"
    try:
        cached = json.loads(file.read_text())
        if isinstance(cached, dict) and isinstance(cached.get("pack"), bool) \
                and cached.get("measured", {}).get("sizes") == list(TIMED_SIZES):  # else timed again
            return cached | {"cached": str(file), "pack_from": pack_from(cached)}
    except (OSError, ValueError):
        pass  # none yet, or unreadable: measured (again)
    t0 = time.perf_counter()
    ms = time_variants(engine, {"packed": partial(engine._use_pack, True), "plain": partial(engine._use_pack, False)})
    ratio = geomean(ms["packed"][n] / ms["plain"][n] for n in TIMED_SIZES)
    choice = {"pack": ratio < 1, "packed_vs_plain": round(ratio, 3), "ms": _rounded(ms), "measured": _timing(t0)}
    choice["pack_from"] = pack_from(choice)
    try:
        write_json_atomic(file, choice, indent=1)
    except OSError:
        pass  # a read-only cache: measured again next time
    return choice


def pack_from(choice: dict) -> int | None:
    """The fewest tokens per forward from which the packed weights run: the smallest timed size from which packed
    was at least as fast at every larger timed size (batched steps are many tokens even where a lone sequence's are
    one; on an AMX Xeon plain won at 1 token and packed at 8 and 32); None: never. A choice timed without
    per-size times: all sizes or none, as it says."""
    try:  # sizes are ints as measured, strings as cached
        plain, packed = ({int(n): float(v) for n, v in choice["ms"][k].items()} for k in ("plain", "packed"))
        faster = {n: packed[n] <= plain[n] for n in plain}
    except (KeyError, TypeError, ValueError, AttributeError):
        return 1 if choice.get("pack") else None
    return next((n for n in sorted(faster) if all(faster[m] for m in faster if m >= n)), None)


def thread_counts(cores: int) -> list[int]:
    """engine.threads=auto's candidates: the powers of two below ``cores``, and ``cores``."""
    return sorted({1 << i for i in range(cores.bit_length()) if 1 << i < cores} | {cores})


_THREADS: dict[tuple, dict] = {}  # engine.threads=auto's choices made in this process


def choose_threads(engine) -> dict:
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
