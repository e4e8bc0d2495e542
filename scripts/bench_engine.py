"""Vanilla decoding through the engine versus Hugging Face ``model.generate``, side by side.

    python -m scripts.bench_engine [--per-task 2] [--max-new-tokens 64] [--repeats 2]

Both decode the same Spec-Bench prompts (first turns of a stratified sample) in
one process, alternating per prompt so that machine noise hits both alike. It
checks that the tokens agree and prints tokens/s and the engine/generate ratio.
"""
from __future__ import annotations

import argparse
import time

import torch
from omegaconf import OmegaConf

from evaluation.data import load_bench
from evaluation.models import ModelSpec, load_model, stop_token_ids
from evaluation.paths import ROOT
from evaluation.prompts import prompt_ids
from methods.base import build_proposer
from methods.decode import generate


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--per-task", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    spec = ModelSpec(**OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / f"{args.model}.yaml")))
    model, tok, device = load_model(spec)
    stop = stop_token_ids(model, tok)
    prompts = [prompt_ids(spec.template, tok, [q.turns[0]], [])
               for q in load_bench(None, limit_per_category=args.per_task)]
    vanilla = build_proposer("vanilla", {}, vocab_size=model.config.vocab_size, device=device)

    def hf(ids):
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids], device=device), max_new_tokens=args.max_new_tokens,
                                 do_sample=False, eos_token_id=sorted(stop))
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out[0, len(ids):].tolist(), time.perf_counter() - t

    def engine(ids):
        g = generate(model, vanilla, ids, max_new_tokens=args.max_new_tokens, stop_ids=stop)
        return g.token_ids, g.wall_time

    hf(prompts[0]), engine(prompts[0])  # warm-up
    totals = {"generate": [0, 0.0], "engine": [0, 0.0]}
    ratios = []  # per prompt: engine tokens/s / generate tokens/s
    mismatches = 0
    for _ in range(args.repeats):
        for ids in prompts:
            results, secs = {}, {}
            for name, fn in (("generate", hf), ("engine", engine)):
                results[name], secs[name] = fn(ids)
                totals[name][0] += len(results[name])
                totals[name][1] += secs[name]
            ratios.append(secs["generate"] / secs["engine"] * len(results["engine"]) / len(results["generate"]))
            mismatches += results["generate"] != results["engine"]
    rate = {k: n / s for k, (n, s) in totals.items()}
    print(f"{len(prompts)} prompts x {args.repeats}, {args.max_new_tokens} new tokens, {spec.name} on {device}, "
          f"{torch.get_num_threads()} threads")
    for k in rate:
        print(f"  {k:9s} {rate[k]:7.2f} tokens/s  ({totals[k][0]} tokens in {totals[k][1]:.1f} s)")
    print(f"  ratio engine/generate: {rate['engine'] / rate['generate']:.3f} overall, "
          f"{sorted(ratios)[len(ratios) // 2]:.3f} median per prompt")
    print(f"  token mismatches: {mismatches} of {len(prompts) * args.repeats} prompts")


if __name__ == "__main__":
    main()
