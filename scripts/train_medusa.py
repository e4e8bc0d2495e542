"""Train Medusa heads (ResBlocks on the target's last hidden state, its lm_head shared) for any target.

    python -m scripts.train_medusa [--model smollm2-135m] [--out data/medusa/smollm2-135m] [--minutes 15]

The data comes from EAGLE's pipeline (``scripts.training.build_data``: the target's own greedy answers to our
own prompts and its features over them, cached under ``data/cache/eagle/<model>/``; without EAGLE's passage
requests, whose long prompts take most of the generation time); the recipe is
``methods.heads.medusa.train`` (self-distillation: head k learns the target's greedy token k + 2 places ahead);
the checkpoint is Medusa's layout (``methods.heads.medusa.save_heads``), loaded by ``method=medusa method.head=<out>``,
with ``train_log.json`` beside it (settings, data, time, the held-out top-1 accuracy of every head).
"""
from __future__ import annotations

from methods.common import exit_on_error
from methods.heads import medusa
from scripts.training import arguments, prepared


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
