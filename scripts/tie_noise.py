"""How far two ways of computing the same logits disagree in a dtype: the basis of evaluation.equal's near-tie
threshold.

    python -m scripts.tie_noise [--dtypes float32,bfloat16,float16] [--questions 81,161,401] [--tokens 48]

For each question's greedy continuation the logits of the new positions are computed twice, by one forward of
the whole sequence (the hf engine) and step by step on the static engine (one token a step, as vanilla decodes),
and the largest difference at the two best tokens is printed, in logits and in the threshold's units (machine
epsilons of the dtype times the largest logit's magnitude at the position; ``evaluation.records.equality.TIE_EPS``). A method
can swap the two best tokens only where their margin is below the sum of two such differences.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from evaluation.records.bench import load_bench
from evaluation.records.equality import TIE_EPS
from evaluation.running.config import compose_config, model_spec
from evaluation.running.models import load_model
from evaluation.running.prompts import prompt_ids
from methods.common import exit_on_error
from methods.engine import HFEngine, StaticEngine


@exit_on_error
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", nargs="*", default=[], help="config overrides (model=...)")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--questions", default="81,161,241,321,401")
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args(argv)
    spec = model_spec(compose_config(list(args.set)))
    questions = load_bench(None, question_ids=[int(q) for q in args.questions.split(",")])
    for dtype in args.dtypes.split(","):
        model, tok, device = load_model(replace(spec, device="cpu", dtype=dtype))
        worst, worst_units = 0.0, 0.0
        eps = torch.finfo(getattr(torch, dtype)).eps
        for q in questions:
            ids = prompt_ids(spec, tok, [q.turns[0]], [])
            with torch.inference_mode():
                seq = model.generate(torch.tensor([ids]), max_new_tokens=args.tokens, do_sample=False)[0]
                start = len(ids)
                whole = HFEngine(model)
                whole.start(0)
                a = whole.forward(seq)[0][start - 1:-1].float()  # the logits that chose each new token
                steps = StaticEngine(model, pack=False)
                steps.start(len(seq) + 64)
                steps.forward(seq[:start - 1])
                b = torch.cat([steps.forward(seq[i:i + 1])[0] for i in range(start - 1, len(seq) - 1)]).float()
            top = a.topk(2, dim=-1).indices
            diff = (a - b).abs().gather(1, top).amax(dim=1)  # [positions]
            units = diff / (eps * a.abs().amax(dim=1))
            worst, worst_units = max(worst, float(diff.max())), max(worst_units, float(units.max()))
        print(f"{dtype}: largest difference at the top-2 logits {worst:.4g} = {worst_units:.1f} eps x max|logit| "
              f"(near-tie threshold {TIE_EPS.get(dtype)})")


if __name__ == "__main__":
    main()
