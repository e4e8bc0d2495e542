"""What the draft-head trainers share (``scripts/train_eagle.py``, ``train_medusa.py``, ``train_hydra.py``,
``train_eagle3.py``): EAGLE's training data (the target's own greedy answers to our own prompts, and to requests over
its own passages, with its features over them: ``build_data``, cached under ``data/cache/eagle/<model>/``), and the
options and preparation of the trainers on that data (``arguments``, ``prepared``)."""
from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from evaluation.running.config import compose_config, model_spec
from evaluation.running.models import load_model
from evaluation.running.own_prompts import TOPICS, TRAINING_ONLY_TOPICS, more_prompts, training_prompts
from evaluation.running.prompts import prompt_ids
from methods.common import CACHE, ROOT, HarnessError, load_torch_safe, save_torch_atomic
from methods.heads import eagle_train
from methods.tree import HEADS_TREE, load_template

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
    source = (f"{args.data}: a data file of scripts.training.build_data" if args.data else
              "scripts.training.build_data(passages=False): EAGLE's training prompts (the first --limit) and the "
              "target's greedy answers")
    log = {"model": args.model, "data": source,
           "train_sequences": len(train), "train_response_tokens": tokens, "val_sequences": len(val),
           "data_minutes": round(data_minutes, 2), "args": vars(args)}
    out = Path(args.out) if args.out else ROOT / "data" / kind / args.model
    return {"model": model, "spec": spec, "out": out, "train": train, "val": val, "log": log}
