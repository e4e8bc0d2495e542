"""The cost of a verification step: latency of one forward of N new tokens after C cached ones.

    python -m scripts.profile_cost [--set model=smollm2-135m ...] [--tokens 1,2,4,8,16,32,64,128]
                                   [--contexts 128,512,1024] [--repeats 5] [--shape vicuna-7b] [--out DIR]

Each point runs the shared verifier (``methods.verify.verify``) on a draft of N nodes (a
root and N - 1 children: the tree-attention path every tree method takes; N = 1 is a plain
step) after a cache of C tokens through the configured engine (``--set engine=hf`` for the
reference forward), then drops the draft from the cache; the median of
``--repeats`` timed runs after one untimed run is kept. The curve, in milliseconds and as a
multiple of the plain step, goes to ``cost.csv`` and ``cost.png``/``.pdf`` under --out
(default ``results/cost/<model>-<device>-<dtype>-<engine>/``), with the environment in ``cost.json``.
``--shape NAME`` (a shipped model config: ``scripts.shapes``) times a randomly initialised Llama of that
shape instead of the configured checkpoint: timing needs no trained weights (for GPUs without the weights).
``--mat`` (TR's measured MAT with the paper tree) and ``--accept`` (a tree=auto acceptance
table) print the TR speedups this curve implies: the paper tree's, and tree=auto's choice.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from omegaconf import OmegaConf

from evaluation.reporting.collect import engine_name
from evaluation.running.config import compose_config, model_spec
from evaluation.running.folder import environment
from evaluation.running.models import load_model
from methods.autotree import choose_tree, cost_curve, measure_cost
from methods.common import RESULTS, HarnessError, exit_on_error, write_json_atomic, write_text_atomic
from methods.engine import build_engine
from scripts.shapes import SHAPES, random_model

PAPER_TOKENS = 81  # TR's paper tree: the root and 80 drafts

def ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise HarnessError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise HarnessError(f"expected positive integers, got {text!r}")
    return values


def plot(rows: list[dict], out: Path, title: str, footer: str) -> None:
    from evaluation.reporting.figures import figure_style, save_figure

    plt = figure_style()
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
    save_figure(fig, out, "cost", footer)


@exit_on_error
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", nargs="*", default=[], help="config overrides (model=..., model.device=..., ...)")
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64,128", type=ints)
    ap.add_argument("--contexts", default="128,512,1024", type=ints)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shape", choices=sorted(SHAPES), help="time a random Llama of this shape instead")
    ap.add_argument("--mat", type=float, help="a measured MAT of TR's paper tree: project its speedup on this curve")
    ap.add_argument("--accept", help="an acceptance table (data/cache/autotree/*.json): project tree=auto's choice")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        raise HarnessError("--repeats must be at least 1")
    cfg = compose_config(list(args.set))
    spec = model_spec(cfg)
    if args.shape:
        from evaluation.running.models import resolve_device, resolve_dtype

        device = resolve_device(spec.device)
        model = random_model(args.shape, dtype=resolve_dtype(spec.dtype, device), device=device,
                             attn_implementation=spec.attn_implementation)
        name = f"{args.shape}-random"
    else:
        model, _, device = load_model(spec)
        name = spec.name
    dtype = next(model.parameters()).dtype
    engine_cfg = OmegaConf.to_container(cfg.engine, resolve=True)
    engine = build_engine(model, engine_cfg)
    kind = engine_name(engine_cfg, engine.summary(), str(device))
    env = environment(device, dtype)
    out = Path(args.out) if args.out else RESULTS / "cost" / f"{name}-{device.type}-{env['dtype']}-{kind}"
    rows = measure_cost(engine, args.tokens, args.contexts, args.repeats)
    for r in rows:
        print(f"context {r['context']:5d}  tokens {r['tokens']:4d}  {r['ms']:8.2f} ms  {r['vs_plain']:5.2f}x plain")
    import pandas as pd

    write_text_atomic(out / "cost.csv", pd.DataFrame(rows).to_csv(index=False))
    projection = project(rows, args.mat, args.accept)
    write_json_atomic(out / "cost.json", {"model": name, "engine": kind, "environment": env, "rows": rows,
                                          "projection": projection})
    footer = f"{env['device_name']}, {env['cpu_threads']} threads, {env['dtype']}, torch {env['torch']}, " \
             f"transformers {env['transformers']}, engine {kind}"
    plot(rows, out, f"Verification cost · {name}", footer)
    print(f"-> {out}/cost.csv, cost.png, cost.pdf")


def project(rows: list[dict], mat: float | None, accept: str | None) -> dict:
    """Projected TR speedups on this curve (at its shortest context): the paper tree from a measured MAT
    (MAT / cost of 81 tokens in plain steps), and tree=auto's choice from an acceptance table."""
    c = min(r["context"] for r in rows)
    curve = cost_curve([r for r in rows if r["context"] == c])
    out = {"context": c}
    if mat:
        if max(curve) < PAPER_TOKENS:
            raise HarnessError(f"--mat projects the paper tree ({PAPER_TOKENS} tokens): measure --tokens up to it")
        out["paper"] = {"mat": mat, "cost_vs_plain": curve[PAPER_TOKENS] / curve[1],
                        "speedup": mat * curve[1] / curve[PAPER_TOKENS]}
        print(f"paper tree: MAT {mat:.2f} / {out['paper']['cost_vs_plain']:.2f} plain steps "
              f"-> projected speedup {out['paper']['speedup']:.2f}x")
    if accept:
        path = Path(accept)
        if not path.is_file():
            raise HarnessError(f"no acceptance table {accept}; a tree=auto run caches one in data/cache/autotree/")
        table = json.loads(path.read_text())
        measured = {int(n): m for n, m in table.get("measured", {}).items()} or None
        choice = choose_tree(table["accept"], curve, table["source"]["k"], measured=measured)
        mat = choice["mat"]
        out["auto"] = {"drafts": choice["drafts"], "mat": mat, "speedup": choice["expected_speedup"],
                       "parents": list(choice["tree"].parents)}
        print(f"tree=auto: {choice['drafts']} drafts, MAT {mat:.2f} ({choice['mat_source']}) "
              f"-> projected speedup {choice['expected_speedup']:.2f}x")
    return out


if __name__ == "__main__":
    main()
