"""Train Hydra heads (sequentially dependent: each reads the draft path's embeddings) for any target.

    python -m scripts.train_hydra [--model smollm2-135m] [--out data/hydra/smollm2-135m] [--minutes 15]

The data is Medusa's (``scripts.training``: EAGLE's pipeline, the target's own greedy answers to our own
prompts and its features over them, cached under ``data/cache/eagle/<model>/``, shared by all three
trainers); the recipe is ``methods.heads.hydra.train``, by default Hydra++'s (zankner/Hydra's README: prefix-mlp,
4 layers, teacher loss, dropout 0.2) with the target's lm_head shared instead of a copy per head. The
checkpoint is Hydra's layout (``methods.heads.hydra.save_heads``), loaded by ``method=hydra method.head=<out>``, with
``train_log.json`` beside it (settings, data, time, the held-out top-1 accuracy of every head).
"""
from __future__ import annotations

import torch

from methods.common import HarnessError, exit_on_error
from methods.heads import hydra
from scripts.training import arguments, prepared


@exit_on_error
def main(argv=None) -> None:
    ap = arguments(__doc__.split("\n")[0], "hydra")
    ap.add_argument("--arch", choices=hydra.ARCHS, default="prefix-mlp",
                    help="head architecture (Hydra++: prefix-mlp)")
    ap.add_argument("--layers", type=int, default=4, help="ResBlock applications per head (Hydra++: 4)")
    ap.add_argument("--labels", choices=hydra.LABELS, default="teacher",
                    help="the target's next-token distribution (Hydra++'s teacher loss) or its greedy token")
    ap.add_argument("--dropout", type=float, default=0.2, help="before every ResBlock and lm_head (Hydra++: 0.2)")
    args = ap.parse_args(argv)
    if args.layers < 1 or not 0 <= args.dropout < 1:
        raise HarnessError("--layers must be at least 1 and --dropout in [0, 1)")
    run = prepared(args, "hydra")
    model = run["model"]
    heads = hydra.HydraHeads(model.config, args.heads, args.layers, args.arch)
    for block in heads.modules():  # as Hydra's ResBlocks start: the SiLU branch's weight zero
        if isinstance(block, hydra.ResBlock):
            block.linear.weight.data.zero_()
    if heads.prefix is not None:  # as transformers initialises the LlamaModel Hydra's prefix is
        for m in heads.prefix.modules():
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.normal_(m.weight, std=model.config.initializer_range)
    embed = model.get_input_embeddings().requires_grad_(False)
    lm_head = model.get_output_embeddings().requires_grad_(False)
    result = hydra.train(heads, embed, lm_head, run["train"], run["val"], minutes=args.minutes, lr=args.lr,
                         positions=args.positions, labels=args.labels, dropout=args.dropout, seed=args.seed)
    print(f"held-out top-1 per head: {result['top1_per_head']}")
    hydra.save_heads(heads, run["out"], {"train_log.json": {**run["log"], **result}}, base=run["spec"].checkpoint)
    print(f"-> {run['out']} (method=hydra method.head={run['out']})")


if __name__ == "__main__":
    main()
