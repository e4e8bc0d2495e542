"""The cost of a verification step: latency of one forward of N new tokens after C cached ones.

    python -m scripts.profile_cost [--set model=smollm2-135m ...] [--tokens 1,2,4,8,16,32,64,128]
                                   [--contexts 128,512,1024] [--repeats 5] [--shape vicuna-7b] [--out DIR]

Each point runs the shared verifier (``methods.verify.verify``) on a draft of N nodes (a
root and N - 1 children: the tree-attention path every tree method takes; N = 1 is a plain
step) after a cache of C tokens, then drops the draft from the cache; the median of
``--repeats`` timed runs after one untimed run is kept. The curve, in milliseconds and as a
multiple of the plain step, goes to ``cost.csv`` and ``cost.png``/``.pdf`` under --out
(default ``results/cost/<model>-<device>-<dtype>/``), with the environment in ``cost.json``.
``--shape vicuna-7b|vicuna-13b`` times a randomly initialised Llama of that shape instead of
the configured checkpoint: timing needs no trained weights (for GPUs without the weights).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from evaluation.errors import HarnessError, exit_on_error
from evaluation.models import load_model
from evaluation.paths import RESULTS
from evaluation.run import compose_config, environment, model_spec
from methods import kv
from methods.base import Draft
from methods.decode import _sync
from methods.tree import Tree
from methods.verify import verify

# Llama shapes of the published checkpoints (config.json of lmsys/vicuna-*-v1.3), for --shape.
SHAPES = {
    "vicuna-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, max_position_embeddings=2048),
    "vicuna-13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                       num_key_value_heads=40, vocab_size=32000, max_position_embeddings=2048),
}


def ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise HarnessError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise HarnessError(f"expected positive integers, got {text!r}")
    return values


def star(n: int) -> Tree:
    """A root and n - 1 children: n tokens through tree attention (n = 1: a plain step)."""
    return Tree.from_parents([-1] + [0] * (n - 1))


@torch.inference_mode()
def measure(model, device, tokens: list[int], contexts: list[int], repeats: int) -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    for c in contexts:
        cache = kv.new_cache(model)
        model(input_ids=torch.randint(vocab, (1, c), generator=gen).to(device), past_key_values=cache, use_cache=True)
        for n in tokens:
            draft = Draft(torch.randint(vocab, (n,), generator=gen).to(device), star(n).to(device))
            times = []
            for i in range(repeats + 1):
                _sync(device)
                t = time.perf_counter()
                verify(model, cache, draft)
                _sync(device)
                if i:
                    times.append(time.perf_counter() - t)
                kv.truncate(cache, c)
            rows.append({"context": c, "tokens": n, "ms": 1000 * statistics.median(times),
                         "ms_min": 1000 * min(times)})
            print(f"context {c:5d}  tokens {n:4d}  {rows[-1]['ms']:8.2f} ms")
    for r in rows:
        plain = next(x["ms"] for x in rows if x["context"] == r["context"] and x["tokens"] == min(tokens))
        r["vs_plain"] = r["ms"] / plain
    return rows


def plot(rows: list[dict], out: Path, title: str, footer: str) -> None:
    from evaluation.report import _figure_style, _save

    plt = _figure_style()
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.5, 3.3))
    for c in sorted({r["context"] for r in rows}):
        pts = [r for r in rows if r["context"] == c]
        a.plot([r["tokens"] for r in pts], [r["ms"] for r in pts], marker="o", label=f"{c} cached tokens")
        b.plot([r["tokens"] for r in pts], [r["vs_plain"] for r in pts], marker="o", label=f"{c} cached tokens")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per forward (tree size, root included)")
    a.set_ylabel("latency per verification step (ms)")
    b.set_ylabel("latency / plain step (×)")
    a.set_title(title)
    b.set_title("Cost of a tree relative to one token")
    b.legend()
    _save(fig, out, "cost", footer)


@exit_on_error
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", nargs="*", default=[], help="config overrides (model=..., model.device=..., ...)")
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64,128", type=ints)
    ap.add_argument("--contexts", default="128,512,1024", type=ints)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shape", choices=sorted(SHAPES), help="time a random Llama of this shape instead")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        raise HarnessError("--repeats must be at least 1")
    spec = model_spec(compose_config(list(args.set)))
    if args.shape:
        from transformers import LlamaConfig, LlamaForCausalLM

        from evaluation.models import resolve_device, resolve_dtype

        device = resolve_device(spec.device)
        dtype = resolve_dtype(spec.dtype, device)
        with torch.device(device):
            model = LlamaForCausalLM(LlamaConfig(**SHAPES[args.shape], attn_implementation=spec.attn_implementation))
        model = model.to(dtype).eval()
        name = f"{args.shape}-random"
    else:
        model, _, device = load_model(spec)
        name = spec.name
    dtype = next(model.parameters()).dtype
    env = environment(device, dtype)
    out = Path(args.out) if args.out else RESULTS / "cost" / f"{name}-{device.type}-{env['dtype']}"
    rows = measure(model, device, args.tokens, args.contexts, args.repeats)
    out.mkdir(parents=True, exist_ok=True)
    import pandas as pd

    pd.DataFrame(rows).to_csv(out / "cost.csv", index=False)
    (out / "cost.json").write_text(json.dumps({"model": name, "engine": "eager", "environment": env,
                                               "rows": rows}, indent=2) + "\n")
    footer = f"{env['device_name']}, {env['cpu_threads']} threads, {env['dtype']}, torch {env['torch']}, " \
             f"transformers {env['transformers']}, eager"
    plot(rows, out, f"Verification cost · {name}", footer)
    print(f"-> {out}/cost.csv, cost.png, cost.pdf")


if __name__ == "__main__":
    main()
