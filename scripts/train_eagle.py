"""Train an EAGLE draft head for any target model from the target's own hidden states.

    python -m scripts.train_eagle [--model smollm2-135m] [--out data/eagle/smollm2-135m] [--minutes 40]

This script chooses the prompts and the paths; ``methods.heads.eagle_train`` holds the recipe (responses,
features, loss, training, validation) and ``methods.heads.eagle.save_head`` the checkpoint layout.

1. Prompts: ``evaluation.own_prompts.training_prompts()`` and ``more_prompts()``, our own instruction
   templates crossed with our own topics (writing, explanation, advice, roleplay, stories, code,
   lists) and requests of Spec-Bench's other kinds from our own word lists (German sentences
   to translate, factual questions, word problems), plus summaries of and questions over
   passages that the target wrote in step 2 (``passage_prompts``). None is a Spec-Bench question (the
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

from evaluation.config import compose_config, model_spec
from evaluation.models import load_model
from evaluation.own_prompts import TOPICS, TRAINING_ONLY_TOPICS, more_prompts, training_prompts
from evaluation.prompts import prompt_ids
from methods.common import CACHE, ROOT, HarnessError, exit_on_error, load_torch_safe, save_torch_atomic
from methods.heads import eagle_train
from methods.heads.eagle import load_head, random_head

# Prompts whose answers are long texts: the passages that the summaries and questions are built over.
PASSAGE_ASKS = ("Write a short blog post", "Explain", "Write a news article", "Write a short story",
                "Act as a university professor", "Pretend you are a museum guide")
# The requests over those passages: one text with an ask, or a question after several texts.
PASSAGE_REQUESTS = ("Summarize the following text in two sentences.", "What is the main point of this text?",
                    "List three facts stated in the text below.",
                    "Rewrite the following text for a younger audience.")
PASSAGE_QUESTIONS = ("what is {t}?", "why is {t} important?", "how does {t} work?", "what are the benefits of {t}?")


def topic_of(prompt: str) -> str:
    return next((t for t in TOPICS + TRAINING_ONLY_TOPICS if t in prompt), "this")


def passage_prompts(passages: list[tuple[str, str]], seed: int = 0) -> list[str]:
    """Requests over the target's own texts, given as (topic, text): short asks about one text, and, like
    Spec-Bench's summarisation and RAG, summaries of several texts run together and a question after
    several texts (the copying those tasks need)."""
    rng = random.Random(seed)
    asks, questions = list(PASSAGE_REQUESTS), list(PASSAGE_QUESTIONS)
    texts = [t for _, t in passages]
    out = [f"{rng.choice(asks)}\n\n{t}" for t in texts]
    for _ in range(min(len(passages), 150)):
        out.append("Summarize: " + " ".join(rng.sample(texts, min(4, len(texts)))))
        chosen = rng.sample(passages, min(3, len(passages)))
        topic = rng.choice(chosen)[0]
        out.append(" ".join(t for _, t in chosen) + "\n" + rng.choice(questions).format(t=topic).capitalize())
    return list(dict.fromkeys(out))


def tokenized(spec, tok, prompts: list[str]) -> dict[str, list[int]]:
    """Each prompt's token ids as the target reads a one-turn request (its chat template or conversation)."""
    return {p: prompt_ids(spec, tok, [p], []) for p in prompts}


def build_data(model, tok, spec, args, device, passages: bool = True, layers: tuple[int, ...] = ()) -> list[dict]:
    """The training records (``methods.heads.eagle_train.features``) of the target's answers to our prompts and, with
    ``passages``, to requests over its own passages, from the cache when it holds them; with ``layers``, the
    records hold those layers' inputs too (EAGLE-3's ``taps``)."""
    prompts = tokenized(spec, tok, (training_prompts() + more_prompts())[: args.limit])
    key = eagle_train.data_key(list(prompts.values()), max_new_tokens=args.max_new_tokens,
                               passages=[PASSAGE_ASKS, PASSAGE_REQUESTS, PASSAGE_QUESTIONS] if passages else None,
                               **({"layers": list(layers)} if layers else {}))
    cache = Path(args.data) if args.data else CACHE / "eagle" / args.model / f"data-{key}.pt"
    if cache.is_file():
        print(f"training data from {cache}")
        return load_torch_safe(cache)
    store = cache.parent / f"responses-n{args.max_new_tokens}.pt"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    answer = dict(max_new=args.max_new_tokens, batch=args.batch, device=device, pad_id=pad,
                  eos_id=tok.eos_token_id, store=store)
    seqs, starts = eagle_train.respond(model, prompts, **answer)
    if passages:
        texts = [tok.decode(s[start:], skip_special_tokens=True).strip() for s, start in zip(seqs, starts)]
        asks = [(topic_of(p), t) for t, p in zip(texts, prompts) if p.startswith(PASSAGE_ASKS)]
        more, more_starts = eagle_train.respond(model, tokenized(spec, tok, passage_prompts(asks)), **answer)
        seqs, starts = seqs + more, starts + more_starts
    data = eagle_train.features(model, seqs, starts, device, layers)
    save_torch_atomic(cache, data)
    return data


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
           "prompts": "scripts/train_eagle.py training_prompts() + more_prompts() + passage_prompts()",
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
