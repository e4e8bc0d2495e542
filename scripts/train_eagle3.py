"""Train an EAGLE-3 head (three target layers in, its own draft-vocabulary lm_head) for any Llama target.

    python -m scripts.train_eagle3 [--model smollm2-135m] [--out data/eagle3/smollm2-135m] [--minutes 15]

The data is Medusa's and Hydra's (``scripts.training``: EAGLE's pipeline, the target's own greedy answers
to our own prompts), with the inputs of the target's layers 2, L // 2 and L - 3 beside its last hidden state
(cached under ``data/cache/eagle/<model>/``: the responses are shared, the features computed once more); the
recipe is ``methods.heads.eagle3.train`` (training-time test over ``--unroll`` depths, soft labels over the draft
vocabulary: the ``--draft-vocab`` tokens most frequent in the responses; ``--intermediate-size`` narrows the
head's MLP). The checkpoint is EAGLE-3's layout
(``methods.heads.eagle3.save_head``), loaded by ``method=eagle3 method.head=<out>``, with ``train_log.json`` beside it.
"""
from __future__ import annotations

from methods.common import HarnessError, exit_on_error
from methods.heads import eagle3
from scripts.training import arguments, prepared


@exit_on_error
def main(argv=None) -> None:
    ap = arguments(__doc__.split("\n")[0], "eagle3", heads=False)
    ap.add_argument("--unroll", type=int, default=3, help="depths of the training-time test (EAGLE-3's: 7)")
    ap.add_argument("--draft-vocab", type=int, default=4096, help="draft vocabulary size (EAGLE-3's Llama-3: 32000)")
    ap.add_argument("--intermediate-size", type=int, default=None,
                    help="the head's MLP width (default and EAGLE-3's: the target's)")
    args = ap.parse_args(argv)
    if args.unroll < 1 or args.draft_vocab < 1 or (args.intermediate_size is not None and args.intermediate_size < 1):
        raise HarnessError("--unroll, --draft-vocab and --intermediate-size must be positive")
    run = prepared(args, "eagle3", layers=eagle3.feature_layers)
    model = run["model"]
    tokens = eagle3.draft_vocabulary(run["train"], args.draft_vocab)
    head = eagle3.new_head(model.config, tokens, args.intermediate_size)
    embed = model.get_input_embeddings().requires_grad_(False)
    lm_head = model.get_output_embeddings().requires_grad_(False)
    result = eagle3.train(head, embed, lm_head, run["train"], run["val"], minutes=args.minutes, lr=args.lr,
                          unroll=args.unroll, positions=args.positions, seed=args.seed)
    print(f"held-out top-1 per depth: {result['top1_per_depth']}")
    log = {**run["log"], "draft_vocab": len(tokens), **result}
    eagle3.save_head(head, run["out"], {"train_log.json": log}, base=run["spec"].checkpoint)
    print(f"-> {run['out']} (method=eagle3 method.head={run['out']})")


if __name__ == "__main__":
    main()
