"""Where a batched step's time goes: one forward of B one-token rows (B = 1, 2, 4, 8, 16), each row after its own
cached prompt, and a prompt chunk alone or riding along B - 1 such rows (``runtime.prefill_chunk``), timed side by
side in one process on the engine a run would build.

    python -m scripts.bench_batch_step                      # the embedded model, engine=static
    python -m scripts.bench_batch_step --context 600 model.dtype=bfloat16
    python -m scripts.bench_batch_step --batches 8 --chunks --profile   # where a step of 8 rows spends its time

Prints milliseconds per forward and the tokens per second they imply, with each batch size's throughput as a ratio
of B = 1's: the ceiling of ``runtime.batch_size=B`` for vanilla before prefills, the queue's tail and the loop.
"""
from __future__ import annotations

import argparse
import time

import torch

from evaluation.running.config import compose_config, model_spec
from evaluation.running.models import load_model
from evaluation.running.runner import Runner
from methods import machine
from methods.common import exit_on_error


def timed(step, repeats: int) -> float:
    """Milliseconds per call, the fastest of three rounds of ``repeats`` calls (after one warm-up call)."""
    step()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(repeats):
            step()
        best = min(best, (time.perf_counter() - t) / repeats)
    return 1000 * best


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=300, help="cached tokens per row (rows differ by 17 each)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--chunks", type=int, nargs="*", default=[64, 256], help="prompt chunks timed at the largest B")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--profile", action="store_true", help="torch's profiler over 10 steps of the largest B: the "
                                                            "operations that take most of a step")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (model=..., engine=...)")
    args = ap.parse_args(argv)
    cfg = compose_config(["method=vanilla", *args.overrides])
    runner = Runner(cfg, load_model(model_spec(cfg)))
    engine = runner.engine
    engine.use_threads()
    gen = torch.Generator().manual_seed(0)
    vocab = engine.model.config.vocab_size
    room = args.context + 17 * max(args.batches) + max(args.chunks, default=0) + 64 * args.repeats

    def fresh(rows: int) -> None:
        engine.start(room, rows)
        for r in range(rows):
            engine.open(r, room)
            engine.forward(torch.randint(vocab, (args.context + 17 * r,), generator=gen).to(engine.device), row=r,
                           last_only=True)

    one = torch.ones(1, dtype=torch.long, device=engine.device)
    print(f"{runner.spec.name}, engine={engine.name}, {machine.describe(machine.cpu())}; {args.context}+ cached tokens per row")
    base = None
    for b in args.batches:
        fresh(b)
        ms = timed(lambda: engine.forward_rows(list(range(b)), [one] * b, [None] * b), args.repeats)
        base = base or b / ms
        print(f"B={b:<3} step {ms:7.1f} ms  {1000 * b / ms:7.1f} tokens/s  x{b / ms / base:.2f} of B=1")
    b = max(args.batches)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        fresh(b)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                engine.forward_rows(list(range(b)), [one] * b, [None] * b)
        print(f"torch's profiler, 10 steps of B={b} (per step: the self time / 10):")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    for c in args.chunks:
        chunk = torch.randint(vocab, (c,), generator=gen).to(engine.device)
        times = {}
        for label, rows in (("alone", [b - 1]), (f"with {b - 1} rows", list(range(b)))):
            fresh(b)

            def step(rows=rows):
                engine.forward_rows(rows, [one] * (len(rows) - 1) + [chunk], [None] * len(rows),
                                    keep=[None] * (len(rows) - 1) + [0])
                engine.cache.lengths[b - 1] -= c  # the chunk again at the same place
            times[label] = timed(step, args.repeats)
        fresh(b)
        steps = timed(lambda: engine.forward_rows(list(range(b - 1)), [one] * (b - 1), [None] * (b - 1)), args.repeats)
        apart = times["alone"] + steps
        print(f"chunk of {c}: alone {times['alone']:.1f} ms + a step of {b - 1} rows {steps:.1f} ms = {apart:.1f} ms; "
              f"together {times[f'with {b - 1} rows']:.1f} ms (x{apart / times[f'with {b - 1} rows']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
