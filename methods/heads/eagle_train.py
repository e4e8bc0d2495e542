"""Training an EAGLE draft head (``methods.heads.eagle.EagleHead``) on its target's own hidden states.

The recipe of EAGLE (arXiv 2401.15077, SafeAILab/EAGLE's eagle/train/), self-distilled:

1. Responses: the target's own greedy answers to the prompts (the head learns what the target says, which
   is what it must draft), generated in batches and stored by prompt as they come (``respond``: a killed run
   resumes; a larger prompt set generates only its new prompts).
2. Features: one target forward over prompt + response gives ``f_j`` (the last hidden state, what lm_head
   reads) and the target's greedy token after every position (``features``).
3. Training (``train``): the head reads (f_j + noise, x_{j+1}) and predicts f_{j+1}; loss = smooth L1 on the
   feature + 0.1 x cross-entropy of lm_head(prediction) against the target's next-token distribution
   softmax(lm_head(f_{j+1})) (EAGLE's soft labels; ``labels="greedy"``: against its greedy token), AdamW
   with a one-cycle schedule, on the response part only. ``unroll`` > 1 trains depths 2..N as drafting runs
   them: depth s reads depth s-1's predicted feature and attends to its draft ancestors (the
   "training-time test" of EAGLE-3, arXiv 2503.01840), which raises the acceptance of the deeper drafts.
   Each epoch ends with ``validate`` on held-out sequences and a checkpoint in the published layout
   (``methods.heads.eagle.save_head``).

The prompts, and the model that answers them, come from the caller (``scripts.train_eagle``): this module
takes token ids and the target, so that ``methods`` never reaches into ``evaluation``.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import time
from pathlib import Path

import torch
from torch.nn import functional as F
from tqdm import tqdm
from transformers import DynamicCache

from methods.common import load_torch_safe, save_torch_atomic
from methods.heads.eagle import EagleHead, save_head
from methods.tree import additive_mask

LOG_FILE = "train_log.json"  # beside the head: how it was made (the run's settings, data and every epoch)


def data_key(prompt_ids: list[list[int]], **settings) -> str:
    """A name for generated data that says what it holds: the first 12 hex digits of the sha256 of the
    prompts' token ids (the prompts, their order and the model's prompt format) and ``settings`` (what else
    changes the data, such as the response length), so a changed prompt set or setting gets its own file
    and never reads another's."""
    blob = json.dumps({"prompt_ids": prompt_ids, **settings}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@torch.no_grad()
def respond(model, prompts: dict[str, list[int]], max_new: int, batch: int, device, *, pad_id: int,
            eos_id: int | None, store: Path | None = None) -> tuple[list[list[int]], list[int]]:
    """The target's greedy answers to ``prompts`` (prompt -> its token ids), batched with left padding:
    (prompt + answer ids, prompt length) per prompt, in order. An answer ends at its first ``eos_id``.

    With ``store``, answers are kept there by prompt after every batch: a killed run resumes, and a larger
    prompt set generates only its new prompts."""
    done = load_torch_safe(store) if store and store.is_file() else {}
    todo = sorted((p for p in prompts if p not in done), key=len)  # similar lengths: less padding
    for i in tqdm(range(0, len(todo), batch), desc=f"responses ({len(prompts) - len(todo)} stored)", unit="batch"):
        chunk = todo[i:i + batch]
        width = max(len(prompts[p]) for p in chunk)
        x = torch.tensor([[pad_id] * (width - len(prompts[p])) + prompts[p] for p in chunk], device=device)
        attn = (torch.arange(width, device=device)[None] >= torch.tensor([width - len(prompts[p]) for p in chunk],
                                                                           device=device)[:, None]).long()
        gen = model.generate(x, attention_mask=attn, max_new_tokens=max_new, do_sample=False, pad_token_id=pad_id)
        for p, row in zip(chunk, gen[:, width:].tolist()):
            done[p] = row[: row.index(eos_id) + 1] if eos_id in row else row
        if store:
            save_torch_atomic(store, done)
    return [ids + done[p] for p, ids in prompts.items()], [len(ids) for ids in prompts.values()]


def compact(x: torch.Tensor) -> torch.Tensor:
    """Half the memory of fp32 for stored features: fp16, or bf16 where a value is beyond fp16's range (Gemma 3's
    residual stream reaches past 65,504, which fp16 would store as inf)."""
    return (x.half() if x.abs().max() < torch.finfo(torch.float16).max else x.bfloat16()).cpu()


@torch.no_grad()
def features(model, seqs: list[list[int]], starts: list[int], device, layers: tuple[int, ...] = ()) -> list[dict]:
    """One training record per sequence: token ids, the target's last hidden states (``compact``), its greedy
    next token everywhere, and ``start``, where the response begins (the loss covers the response only); with
    ``layers``, ``taps`` too: the inputs of those decoder layers side by side (``compact``; EAGLE-3's features)."""
    data = []
    for s, start in zip(tqdm(seqs, desc="features", unit="seq"), starts):
        out = model(torch.tensor([s], device=device), output_hidden_states=True)
        data.append({"ids": torch.tensor(s), "feats": compact(out.hidden_states[-1][0]),
                     "greedy": out.logits[0].argmax(-1).cpu(), "start": start})
        if layers:
            data[-1]["taps"] = compact(torch.cat([out.hidden_states[i][0] for i in layers], dim=-1))
    return data


def split(data: list[dict], rng: random.Random) -> tuple[list[dict], list[dict]]:
    """(held-out, training) records: ``data`` shuffled in place by ``rng``, a twentieth (at least 4) held out."""
    rng.shuffle(data)
    n_val = max(4, len(data) // 20)
    return data[:n_val], data[n_val:]


def causal(n: int, dtype) -> torch.Tensor:
    return additive_mask(torch.ones(n, n, dtype=torch.bool).tril(), 0, dtype)


def head_pass(head: EagleHead, embed, d: dict, noise: float = 0.0, unroll: int = 1,
              key: str = "feats") -> list[torch.Tensor]:
    """Predicted features ``outs[s-1][i]`` for f_{i+s} (the target's feature at position i+s) for every depth
    ``s`` = 1..``unroll``; ``outs[0]`` is teacher-forced from (f_j, x_{j+1}) at positions 0..T-2 (``f`` the
    record's ``key``: EAGLE-3's head reads ``taps`` and returns its own outputs, which deeper depths read).

    Depth ``s`` > 1 runs as drafting does: at position ``p`` it reads depth ``s-1``'s prediction made at
    ``p-1`` with the true token x_{p+1}, and attends to the teacher-forced entries up to ``p-s+1``, to its
    ancestors' entries at positions ``p-s+2 .. p-1`` (one per earlier depth) and to itself: the query of a
    draft at depth ``s`` in the head's tree attention, for all positions in one forward each."""
    feats = d[key].float()[:-1]
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


def loss(head: EagleHead, embed, lm_head, d: dict, noise: float, unroll: int, labels: str) -> torch.Tensor:
    """EAGLE's loss on one record's response, summed over the depths 1..``unroll``: smooth L1 between the
    predicted and the target's features + 0.1 x cross-entropy of their tokens against the target's next-token
    distribution (``labels="soft"``) or its greedy token (``"greedy"``)."""
    total, s = 0.0, d["start"]
    target = d["feats"].float()[s:]  # the response's f_s .. f_{T-1}; and the target's next-token labels:
    wanted = F.softmax(lm_head(target), -1) if labels == "soft" else d["greedy"][s:]
    for depth, predicted in enumerate(head_pass(head, embed, d, noise, unroll), start=1):
        pred = predicted[s - depth:]  # [i] predicts f_{i+depth}
        total = total + F.smooth_l1_loss(pred, target) + 0.1 * F.cross_entropy(lm_head(pred), wanted)
    return total


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


def train(head: EagleHead, target, train_set: list[dict], val: list[dict], out: Path, log: dict,
          rng: random.Random, *, epochs: int, minutes: float, lr: float, accumulate: int, noise: float,
          labels: str, unroll: int) -> dict:
    """Train ``head`` (float32, train mode) on ``train_set`` with ``target``'s frozen embeddings and lm_head,
    for ``epochs`` or until ``minutes`` of training have passed. After every epoch: ``validate`` on ``val``,
    the figures appended to ``log["epochs"]``, and the head with ``log`` (as train_log.json) saved to ``out``,
    so a stopped run leaves its last epoch's head. Returns ``log``."""
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    for p in target.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    steps_total = epochs * math.ceil(len(train_set) / accumulate)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps_total, pct_start=0.05)
    log.setdefault("epochs", [])
    start = time.time()
    for epoch in range(epochs):
        rng.shuffle(train_set)
        bar = tqdm(train_set, desc=f"epoch {epoch + 1}/{epochs}", unit="seq")
        for i, d in enumerate(bar):
            value = loss(head, embed, lm_head, d, noise, unroll, labels)
            (value / accumulate).backward()
            if (i + 1) % accumulate == 0 or i + 1 == len(train_set):
                torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
                opt.step()
                opt.zero_grad()
                if sched.last_epoch + 1 < steps_total:
                    sched.step()
            bar.set_postfix(loss=f"{value.item():.3f}")
            if (time.time() - start) / 60 > minutes:
                break
        head.eval()
        figures = validate(head, embed, lm_head, val)
        head.train()
        elapsed = (time.time() - start) / 60
        log["epochs"].append({"epoch": epoch + 1, "minutes": round(elapsed, 2), "loss": round(value.item(), 4),
                              **{k: round(v, 4) for k, v in figures.items()}})
        print(f"epoch {epoch + 1}: validation {figures} after {elapsed:.1f} min")
        save_head(head, out, extra_json={LOG_FILE: log})
        if elapsed > minutes:
            print(f"time budget of {minutes} min reached")
            break
    return log
