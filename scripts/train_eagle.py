"""Train an EAGLE draft head for any target model from the target's own hidden states.

    python -m scripts.train_eagle [--model smollm2-135m] [--out data/eagle/smollm2-135m] [--minutes 40]

This script chooses the prompts and the paths; ``methods.heads.eagle_train`` holds the recipe (responses,
features, loss, training, validation) and ``methods.heads.eagle.save_head`` the checkpoint layout.

1. Prompts: ``evaluation.running.own_prompts.training_prompts()`` and ``more_prompts()``, our own instruction
   templates crossed with our own topics (writing, explanation, advice, roleplay, stories, code,
   lists) and requests of Spec-Bench's other kinds from our own word lists (German sentences
   to translate, factual questions, word problems), plus summaries of and questions over
   passages that the target wrote in step 2 (``scripts.training.passage_prompts``). None is a Spec-Bench question (the
   tests check it).
2. Responses: the target's own greedy answers (self-distillation: the head learns what the
   target says, which is what it must draft), stored by prompt as they come (a killed run resumes; a
   larger prompt set generates only its new prompts); then the target's features over prompt + response.
3. Training: EAGLE's recipe (``methods.heads.eagle_train``), ``--labels greedy`` for greedy-token labels instead
   of the target's next-token distribution. Each epoch ends with the validation figure on held-out
   sequences (the share of positions where the head's top token equals the target's, for the first draft
   and for the third draft in a row) and a checkpoint (fp16 safetensors + config.json, the published
   layout, so ``method.head=<out>`` loads it). ``--unroll N`` trains depths 2..N too, as drafting runs
   them (EAGLE-3's "training-time test" idea); ``--init`` starts from a head.

Generated data is cached under ``data/cache/eagle/<model>/`` as ``data-<hash>.pt``, the hash of the prompts'
token ids and the settings that shape the data (``methods.heads.eagle_train.data_key``); a rerun trains from it.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from evaluation.running.config import compose_config, model_spec
from evaluation.running.models import load_model
from methods.common import ROOT, HarnessError, exit_on_error
from methods.heads import eagle_train
from methods.heads.eagle import load_head, random_head
from scripts.training import build_data


@exit_on_error
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model config name (conf/model/)")
    ap.add_argument("--out", help="output folder (default: data/eagle/<model>)")
    ap.add_argument("--max-new-tokens", type=int, default=160, help="length of the target's responses")
    ap.add_argument("--batch", type=int, default=32, help="prompts per generation batch")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--minutes", type=float, default=40.0, help="training time budget (data generation excluded)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--accumulate", type=int, default=4, help="sequences per optimiser step")
    ap.add_argument("--noise", type=float, default=0.1, help="uniform noise on input features, x feature RMS")
    ap.add_argument("--labels", choices=["soft", "greedy"], default="soft",
                    help="the classification target: the target's next-token distribution, or its greedy token")
    ap.add_argument("--unroll", type=int, default=1,
                    help="train depths 1..N as drafting runs them: depth s>1 reads depth s-1's predicted feature")
    ap.add_argument("--init", help="start from this head (a folder in the published layout) instead of random")
    ap.add_argument("--intermediate-size", type=int, default=None,
                    help="the head's MLP width (default: the target's; narrower to fit the repository's file limit)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, help="use only the first N prompts (a quick check)")
    ap.add_argument("--data", help="the generated-data file (default: data/cache/eagle/<model>/...)")
    args = ap.parse_args(argv)
    if min(args.epochs, args.max_new_tokens, args.batch, args.unroll, args.intermediate_size or 1) < 1 \
            or args.minutes <= 0:
        raise HarnessError("--epochs, --minutes, --max-new-tokens, --batch, --unroll and --intermediate-size must be "
                           "positive")
    out = Path(args.out) if args.out else ROOT / "data" / "eagle" / args.model
    spec = model_spec(compose_config([f"model={args.model}", "model.dtype=float32"]))
    model, tok, device = load_model(spec)
    t0 = time.time()
    data = build_data(model, tok, spec, args, device)
    data_minutes = (time.time() - t0) / 60
    rng = random.Random(args.seed)
    val, train = eagle_train.split(data, rng)
    tokens = sum(len(d["ids"]) - d["start"] for d in train)
    print(f"{len(train)} training sequences ({tokens} response tokens), {len(val)} held out; "
          f"data took {data_minutes:.1f} min")

    head = load_head(args.init, model.config) if args.init else \
        random_head(model.config, args.seed, args.intermediate_size)
    head = head.float().train()
    log = {"model": args.model,
           "prompts": "scripts/training.py training_prompts() + more_prompts() + passage_prompts()",
           "train_sequences": len(train), "train_response_tokens": tokens, "val_sequences": len(val),
           "data_minutes": round(data_minutes, 2), "args": vars(args), "epochs": []}
    init_log = Path(args.init) / eagle_train.LOG_FILE if args.init else None
    if init_log and init_log.is_file():  # how the starting head was made
        log["init_log"] = json.loads(init_log.read_text())
    eagle_train.train(head, model, train, val, out, log, rng, epochs=args.epochs, minutes=args.minutes, lr=args.lr,
                      accumulate=args.accumulate, noise=args.noise, labels=args.labels, unroll=args.unroll)
    print(f"-> {out} (method=eagle method.head={out})")


if __name__ == "__main__":
    main()
