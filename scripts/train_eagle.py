"""Train an EAGLE draft head for any target model from the target's own hidden states.

    python -m scripts.train_eagle [--model smollm2-135m] [--out data/eagle/smollm2-135m] [--minutes 40]

1. Prompts: ``evaluation.own_prompts.training_prompts()`` and ``more_prompts()``, our own instruction
   templates crossed with our own topics (writing, explanation, advice, roleplay, stories, code,
   lists) and requests of Spec-Bench's other kinds from our own word lists (German sentences
   to translate, factual questions, word problems), plus summaries of and questions over
   passages that the target wrote in step 2. None is a Spec-Bench question (the tests check it).
2. Responses: the target's own greedy answers (self-distillation: the head learns what the
   target says, which is what it must draft), generated in batches and stored by prompt as they
   come (a killed run resumes; a larger prompt set generates only its new prompts).
3. Features: one target forward over prompt + response gives ``f_j`` (the last hidden
   state, what lm_head reads) and the target's greedy token after every position.
4. Training: the head reads (f_j + noise, x_{j+1}) and predicts f_{j+1}; loss = smooth L1
   on the feature + 0.1 x cross-entropy of lm_head(prediction) against the target's
   next-token distribution softmax(lm_head(f_{j+1})) (EAGLE's recipe; ``--labels greedy``: against
   its greedy token), Adam, on the response part. Each epoch ends with the
   validation figure on held-out sequences: the share of positions where the head's top
   token equals the target's, for the first draft and for the third draft in a row
   (the head fed its own predictions), and a checkpoint (fp16 safetensors + config.json,
   the published layout, so ``method.head=<out>`` loads it).
   ``--unroll N`` trains depths 2..N too, as drafting runs them: depth s reads depth s-1's
   predicted feature and attends to its draft ancestors (EAGLE-3's "training-time test"
   idea), which raises the acceptance of the deeper drafts; ``--init`` starts from a head.

Generated data is cached under ``data/cache/eagle/<model>/``; a rerun trains from it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path

import torch
from torch.nn import functional as F
from tqdm import tqdm
from transformers import DynamicCache

from methods.common import CACHE, ROOT, HarnessError, exit_on_error, load_torch_safe, save_torch_atomic
from evaluation.models import load_model
from evaluation.own_prompts import TOPICS, TOPICS_2, more_prompts, training_prompts
from evaluation.prompts import prompt_ids
from evaluation.run import compose_config, model_spec
from methods.eagle import EagleHead, expected_shapes, load_head, random_head
from methods.tree import additive_mask

# Prompts whose answers are long texts: the passages that the summaries and questions are built over.
PASSAGE_ASKS = ("Write a short blog post", "Explain", "Write a news article", "Write a short story",
                "Act as a university professor", "Pretend you are a museum guide")


def topic_of(prompt: str) -> str:
    return next((t for t in TOPICS + TOPICS_2 if t in prompt), "this")


def passage_prompts(passages: list[tuple[str, str]], seed: int = 0) -> list[str]:
    """Requests over the target's own texts, given as (topic, text): short asks about one text, and, like
    Spec-Bench's summarisation and RAG, summaries of several texts run together and a question after
    several texts (the copying those tasks need)."""
    rng = random.Random(seed)
    asks = ["Summarize the following text in two sentences.", "What is the main point of this text?",
            "List three facts stated in the text below.", "Rewrite the following text for a younger audience."]
    questions = ["what is {t}?", "why is {t} important?", "how does {t} work?", "what are the benefits of {t}?"]
    texts = [t for _, t in passages]
    out = [f"{rng.choice(asks)}\n\n{t}" for t in texts]
    for _ in range(min(len(passages), 150)):
        out.append("Summarize: " + " ".join(rng.sample(texts, min(4, len(texts)))))
        chosen = rng.sample(passages, min(3, len(passages)))
        topic = rng.choice(chosen)[0]
        out.append(" ".join(t for _, t in chosen) + "\n" + rng.choice(questions).format(t=topic).capitalize())
    return list(dict.fromkeys(out))


@torch.no_grad()
def respond(model, tok, spec, prompts: list[str], max_new: int, batch: int, device,
            store: Path | None = None) -> tuple[list[list[int]], list[int]]:
    """The target's greedy answers, batched (left padding): (prompt + answer ids, prompt length) per prompt.

    With ``store``, answers are kept there by prompt after every batch: a killed run resumes, and a larger
    prompt set generates only its new prompts."""
    tok.padding_side = "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = tok.eos_token_id
    done = load_torch_safe(store) if store and store.is_file() else {}
    ids = {p: prompt_ids(spec, tok, [p], []) for p in prompts}
    todo = sorted((p for p in dict.fromkeys(prompts) if p not in done), key=len)  # similar lengths: less padding
    for i in tqdm(range(0, len(todo), batch), desc=f"responses ({len(prompts) - len(todo)} stored)", unit="batch"):
        chunk = todo[i:i + batch]
        width = max(len(ids[p]) for p in chunk)
        x = torch.tensor([[pad] * (width - len(ids[p])) + ids[p] for p in chunk], device=device)
        attn = (torch.arange(width, device=device)[None] >= torch.tensor([width - len(ids[p]) for p in chunk],
                                                                           device=device)[:, None]).long()
        gen = model.generate(x, attention_mask=attn, max_new_tokens=max_new, do_sample=False, pad_token_id=pad)
        for p, row in zip(chunk, gen[:, width:].tolist()):
            done[p] = row[: row.index(eos) + 1] if eos in row else row
        if store:
            save_torch_atomic(store, done)
    return [ids[p] + done[p] for p in prompts], [len(ids[p]) for p in prompts]


@torch.no_grad()
def features(model, seqs: list[list[int]], device) -> list[dict]:
    """Per sequence: token ids, the target's last hidden states (fp16) and its greedy next token everywhere."""
    data = []
    for s in tqdm(seqs, desc="features", unit="seq"):
        out = model(torch.tensor([s], device=device), output_hidden_states=True)
        data.append({"ids": torch.tensor(s), "feats": out.hidden_states[-1][0].half().cpu(),
                     "greedy": out.logits[0].argmax(-1).cpu()})
    return data


def build_data(model, tok, spec, args, device) -> list[dict]:
    cache = Path(args.data) if args.data else \
        CACHE / "eagle" / args.model / f"data-v3-n{args.max_new_tokens}-l{args.limit or 'all'}.pt"
    if cache.is_file():
        print(f"training data from {cache}")
        return load_torch_safe(cache)
    store = cache.parent / f"responses-n{args.max_new_tokens}.pt"
    prompts = (training_prompts() + more_prompts())[: args.limit]
    seqs, starts = respond(model, tok, spec, prompts, args.max_new_tokens, args.batch, device, store)
    texts = [tok.decode(s[start:], skip_special_tokens=True).strip() for s, start in zip(seqs, starts)]
    passages = [(topic_of(p), t) for t, p in zip(texts, prompts) if p.startswith(PASSAGE_ASKS)]
    more, more_starts = respond(model, tok, spec, passage_prompts(passages), args.max_new_tokens, args.batch,
                                device, store)
    data = features(model, seqs + more, device)
    for d, start in zip(data, starts + more_starts):
        d["start"] = start  # the loss covers the response
    save_torch_atomic(cache, data)
    return data


def causal(n: int, dtype) -> torch.Tensor:
    return additive_mask(torch.ones(n, n, dtype=torch.bool).tril(), 0, dtype)


def head_pass(head: EagleHead, embed, d: dict, noise: float = 0.0, unroll: int = 1) -> list[torch.Tensor]:
    """Predicted features ``outs[s-1][i]`` for f_{i+s} (the target's feature at position i+s) for every depth
    ``s`` = 1..``unroll``; ``outs[0]`` is teacher-forced from (f_j, x_{j+1}) at positions 0..T-2.

    Depth ``s`` > 1 runs as drafting does: at position ``p`` it reads depth ``s-1``'s prediction made at
    ``p-1`` with the true token x_{p+1}, and attends to the teacher-forced entries up to ``p-s+1``, to its
    ancestors' entries at positions ``p-s+2 .. p-1`` (one per earlier depth) and to itself: the query of a
    draft at depth ``s`` in the head's tree attention, for all positions in one forward each."""
    feats = d["feats"].float()[:-1]
    if noise:
        feats = feats + (torch.rand_like(feats) * 2 - 1) * noise * feats.pow(2).mean(-1, keepdim=True).sqrt()
    n = len(feats)
    emb = embed(d["ids"][1:])
    cache = DynamicCache(config=head.config)
    outs = [head(emb[None], feats[None], torch.arange(n)[None], causal(n, feats.dtype), cache)[0]]
    for s in range(2, unroll + 1):
        m = n - s + 1  # positions p = s-1 .. n-1
        if m < 1:
            break
        p = torch.arange(s - 1, n)
        blocks = [torch.arange(n)[None] <= (p - s + 1)[:, None]]  # teacher-forced entries, positions 0..n-1
        for k in range(2, s + 1):  # depth k's entries sit at positions k-1 .. n-1; the ancestor is at p-s+k
            blocks.append(torch.arange(k - 1, n)[None] == (p - s + k)[:, None])
        allowed = torch.cat(blocks, dim=1)
        mask = additive_mask(allowed, 0, feats.dtype)
        outs.append(head(emb[s - 1:][None], outs[-1][:m][None], p[None], mask, cache)[0])
    return outs


@torch.no_grad()
def validate(head: EagleHead, embed, lm_head, data: list[dict], steps: int = 3) -> dict:
    """Share of response positions where the head's top token is the target's greedy one: the first draft
    (fed the target's feature) and the ``steps``-th draft in a row (fed its own predictions, as when drafting)."""
    hit1 = hitk = total = totalk = 0
    for d in data:
        out = head_pass(head, embed, d)[0]  # out[j] predicts f_{j+1}; its token is the greedy after position j+1
        s = d["start"]
        pred = lm_head(out[s - 1:-1]).argmax(-1)
        hit1 += int((pred == d["greedy"][s:-1]).sum())
        total += len(pred)
        # Chains: from position j, draft `steps` tokens feeding predicted features; all must match.
        for j in range(s - 1, len(d["ids"]) - steps - 1, 8):
            cache = DynamicCache(config=head.config)
            n = j + 1
            prefix = head(embed(d["ids"][1:n + 1])[None], d["feats"].float()[None, :n], torch.arange(n)[None],
                          causal(n, torch.float32), cache)[0, -1]
            ok, feat = True, prefix
            for k in range(steps):
                tok_k = lm_head(feat).argmax()
                if tok_k != d["greedy"][j + 1 + k]:
                    ok = False
                    break
                feat = head(embed(tok_k.view(1, 1)), feat.view(1, 1, -1), torch.tensor([[n + k]]),
                            torch.zeros(1, 1, 1, n + k + 1), cache)[0, -1]
            hitk += ok
            totalk += 1
    return {"top1": hit1 / max(total, 1), f"chain{steps}": hitk / max(totalk, 1)}


def save(head: EagleHead, out: Path, log: dict) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().half().contiguous() for k, v in head.state_dict().items() if k in expected_shapes(head.config)}
    save_file(state, str(out / "model.safetensors.tmp"))
    os.replace(out / "model.safetensors.tmp", out / "model.safetensors")
    c = head.config
    (out / "config.json").write_text(json.dumps({
        "architectures": ["EagleHead"], "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position_embeddings, "rope_parameters": c.rope_parameters,
        "torch_dtype": "float16"}, indent=2) + "\n")
    (out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")


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
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, help="use only the first N prompts (a quick check)")
    ap.add_argument("--data", help="the generated-data file (default: data/cache/eagle/<model>/...)")
    args = ap.parse_args(argv)
    if min(args.epochs, args.max_new_tokens, args.batch, args.unroll) < 1 or args.minutes <= 0:
        raise HarnessError("--epochs, --minutes, --max-new-tokens, --batch and --unroll must be positive")
    out = Path(args.out) if args.out else ROOT / "data" / "eagle" / args.model
    spec = model_spec(compose_config([f"model={args.model}", "model.dtype=float32"]))
    model, tok, device = load_model(spec)
    t0 = time.time()
    data = build_data(model, tok, spec, args, device)
    data_minutes = (time.time() - t0) / 60
    rng = random.Random(args.seed)
    rng.shuffle(data)
    n_val = max(4, len(data) // 20)
    val, train = data[:n_val], data[n_val:]
    tokens = sum(len(d["ids"]) - d["start"] for d in train)
    print(f"{len(train)} training sequences ({tokens} response tokens), {len(val)} held out; "
          f"data took {data_minutes:.1f} min")

    head = (load_head(args.init, model.config) if args.init else random_head(model.config, args.seed)).float().train()
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    for p in model.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    steps_total = args.epochs * math.ceil(len(train) / args.accumulate)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps_total, pct_start=0.05)
    log = {"model": args.model, "prompts": "scripts/train_eagle.py training_prompts() + more_prompts() + passage_prompts()",
           "train_sequences": len(train), "train_response_tokens": tokens, "val_sequences": len(val),
           "data_minutes": round(data_minutes, 2), "args": vars(args), "epochs": []}
    if args.init and (Path(args.init) / "train_log.json").is_file():  # how the starting head was made
        log["init_log"] = json.loads((Path(args.init) / "train_log.json").read_text())
    start = time.time()
    for epoch in range(args.epochs):
        rng.shuffle(train)
        bar = tqdm(train, desc=f"epoch {epoch + 1}/{args.epochs}", unit="seq")
        for i, d in enumerate(bar):
            loss, s = 0.0, d["start"]
            target = d["feats"].float()[s:]  # the response's f_s .. f_{T-1}; and the target's next-token labels:
            labels = F.softmax(lm_head(target), -1) if args.labels == "soft" else d["greedy"][s:]
            for depth, predicted in enumerate(head_pass(head, embed, d, args.noise, args.unroll), start=1):
                pred = predicted[s - depth:]  # [i] predicts f_{i+depth}
                loss = loss + F.smooth_l1_loss(pred, target) + 0.1 * F.cross_entropy(lm_head(pred), labels)
            (loss / args.accumulate).backward()
            if (i + 1) % args.accumulate == 0 or i + 1 == len(train):
                torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
                opt.step()
                opt.zero_grad()
                if sched.last_epoch + 1 < steps_total:
                    sched.step()
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if (time.time() - start) / 60 > args.minutes:
                break
        head.eval()
        figures = validate(head, embed, lm_head, val)
        head.train()
        minutes = (time.time() - start) / 60
        log["epochs"].append({"epoch": epoch + 1, "minutes": round(minutes, 2), "loss": round(loss.item(), 4),
                              **{k: round(v, 4) for k, v in figures.items()}})
        print(f"epoch {epoch + 1}: validation {figures} after {minutes:.1f} min")
        save(head, out, log)
        if minutes > args.minutes:
            print(f"time budget of {args.minutes} min reached")
            break
    print(f"-> {out} (method=eagle method.head={out})")


if __name__ == "__main__":
    main()
