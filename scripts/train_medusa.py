"""Train Medusa heads (ResBlocks on the target's last hidden state, its lm_head shared) for any target.

    python -m scripts.train_medusa [--model smollm2-135m] [--out data/medusa/smollm2-135m] [--minutes 15]

The data comes from EAGLE's pipeline (``scripts.train_eagle.build_data``: the target's own greedy answers to our
own prompts and its features over them, cached under ``data/cache/eagle/<model>/``; without EAGLE's passage
requests, whose long prompts take most of the generation time); the recipe is
``methods.heads.medusa.train`` (self-distillation: head k learns the target's greedy token k + 2 places ahead);
the checkpoint is Medusa's layout (``methods.heads.medusa.save_heads``), loaded by ``method=medusa method.head=<out>``,
with ``train_log.json`` beside it (settings, data, time, the held-out top-1 accuracy of every head).
"""
from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from evaluation.config import compose_config, model_spec
from evaluation.models import load_model
from methods.common import ROOT, HarnessError, exit_on_error
from methods.heads import eagle_train, medusa
from methods.tree import HEADS_TREE, load_template
from scripts.train_eagle import build_data


def arguments(description: str, kind: str, heads: bool = True) -> argparse.ArgumentParser:
    """The options every draft-head trainer on EAGLE's data takes (Medusa's, Hydra's, EAGLE-3's; ``heads``:
    the number of heads too); ``kind`` names the default output folder, data/<kind>/<model>."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", default="smollm2-135m", help="a model config name (conf/model/)")
    ap.add_argument("--out", help=f"output folder (default: data/{kind}/<model>)")
    if heads:
        ap.add_argument("--heads", type=int, help="number of heads (default: the depth of the medusa tree, 4)")
    ap.add_argument("--minutes", type=float, default=15.0, help="training time budget (data generation excluded)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--positions", type=int, default=64, help="random response positions per sequence and step")
    ap.add_argument("--limit", type=int, help="use only the first N prompts of EAGLE's training prompts")
    ap.add_argument("--max-new-tokens", type=int, default=160, help="length of the target's responses")
    ap.add_argument("--batch", type=int, default=32, help="prompts per generation batch")
    ap.add_argument("--data", help="the generated-data file (default: EAGLE's, data/cache/eagle/<model>/...)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def prepared(args, kind: str, layers=None) -> dict:
    """Check the shared options, load the target (fp32) and the data (``layers(config)``: the layers whose
    inputs the records hold too, EAGLE-3's): the model, its spec, the output folder, the training and
    held-out records, and the log's data entries."""
    if "heads" in vars(args):
        args.heads = args.heads or load_template(HEADS_TREE).max_depth
    if min(getattr(args, "heads", 1), args.positions, args.max_new_tokens, args.batch) < 1 or args.minutes <= 0:
        raise HarnessError("--minutes, --positions, --max-new-tokens, --batch (and --heads) must be positive")
    spec = model_spec(compose_config([f"model={args.model}", "model.dtype=float32"]))
    model, tok, device = load_model(spec)
    t0 = time.time()
    data = build_data(model, tok, spec, args, device, passages=False,
                      layers=layers(model.config.num_hidden_layers) if layers else ())
    data_minutes = (time.time() - t0) / 60
    val, train = eagle_train.split(data, random.Random(args.seed))
    tokens = sum(len(d["ids"]) - d["start"] for d in train)
    print(f"{len(train)} training sequences ({tokens} response tokens), {len(val)} held out; data took "
          f"{data_minutes:.1f} min")
    source = (f"{args.data}: a data file of scripts.train_eagle.build_data" if args.data else
              "scripts.train_eagle.build_data(passages=False): EAGLE's training prompts (the first --limit) and the "
              "target's greedy answers")
    log = {"model": args.model, "data": source,
           "train_sequences": len(train), "train_response_tokens": tokens, "val_sequences": len(val),
           "data_minutes": round(data_minutes, 2), "args": vars(args)}
    out = Path(args.out) if args.out else ROOT / "data" / kind / args.model
    return {"model": model, "spec": spec, "out": out, "train": train, "val": val, "log": log}


@exit_on_error
def main(argv=None) -> None:
    args = arguments(__doc__.split("\n")[0], "medusa").parse_args(argv)
    run = prepared(args, "medusa")
    model = run["model"]
    heads = medusa.MedusaHeads(model.config.hidden_size, args.heads, 1)
    for block in heads.modules():  # ResBlocks start as the identity (Medusa zero-initialises their weights)
        if isinstance(block, medusa.ResBlock):
            block.linear.weight.data.zero_()
            block.linear.bias.data.zero_()
    lm_head = model.get_output_embeddings().requires_grad_(False)
    result = medusa.train(heads, lm_head, run["train"], run["val"], minutes=args.minutes, lr=args.lr,
                          positions=args.positions, seed=args.seed)
    print(f"held-out top-1 per head: {result['top1_per_head']}")
    medusa.save_heads(heads, run["out"], {"train_log.json": {**run["log"], **result}}, base=run["spec"].checkpoint)
    print(f"-> {run['out']} (method=medusa method.head={run['out']})")


if __name__ == "__main__":
    main()
