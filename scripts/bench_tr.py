"""Where a Token Recycling step spends its time: forward, and TR's own drafting, acceptance and update.

    python -m scripts.bench_tr [--per-task 2] [--max-new-tokens 64] [--tree paper] [--engine static|hf]

Decodes the first turns of a stratified Spec-Bench sample with the embedded model
(hot start, one warm-up pass), timing every phase of every step, and prints each
phase's share of the step time. The paper reports about 3% for drafting ("retrieval"),
verification and update together; this harness's target is at most 5% on the CPU.
"""
from __future__ import annotations

import argparse

from omegaconf import OmegaConf

from evaluation.records.bench import load_bench
from evaluation.running.models import ModelSpec, load_model, stop_token_ids
from evaluation.running.prompts import prompt_ids
from methods.base import build_proposer
from methods.common import ROOT
from methods.decode import PhaseTimer, generate
from methods.engine import ENGINE_PARAMS, build_engine

OWN = ("propose", "accept", "update")  # TR's own work; "forward" and "commit" are the shared engine's


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--per-task", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--tree", default="paper")
    ap.add_argument("--engine", default="static", choices=list(ENGINE_PARAMS))
    args = ap.parse_args(argv)

    spec = ModelSpec(**OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / f"{args.model}.yaml")))
    model, tok, device = load_model(spec)
    engine = build_engine(model, {"name": args.engine})
    stop = stop_token_ids(model, tok)
    prompts = [prompt_ids(spec, tok, [q.turns[0]], [])
               for q in load_bench(None, limit_per_category=args.per_task)]
    tr = build_proposer("tr", {"tree": args.tree}, vocab_size=model.config.vocab_size, device=device)
    generate(engine, tr, prompts[0], max_new_tokens=args.max_new_tokens, stop_ids=stop)  # warm-up
    timer = PhaseTimer(device)
    tokens = steps = 0
    for ids in prompts:
        g = generate(engine, tr, ids, max_new_tokens=args.max_new_tokens, stop_ids=stop, timer=timer)
        tokens, steps = tokens + len(g.token_ids), steps + len(g.accept_lengths) - 1
    total = sum(timer.seconds.values())
    print(f"TR, tree {args.tree} ({tr.tree.size} nodes), {len(prompts)} prompts, {steps} steps, "
          f"MAT {tokens / (steps + len(prompts)):.2f}, {spec.name} on {device}, engine {args.engine}")
    for phase, secs in sorted(timer.seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {phase:8s} {1000 * secs / steps:8.2f} ms/step  {100 * secs / total:5.1f}%")
    own = sum(timer.seconds[p] for p in OWN)
    print(f"  TR's own work (drafting + acceptance + update): {100 * own / total:.1f}% of step time (target <= 5%)")


if __name__ == "__main__":
    main()
