"""The training loop that the draft heads share (Medusa's, Hydra's, EAGLE-3's): self-distillation on the
target's own greedy answers, one record a step."""
from __future__ import annotations

import time

import torch
from torch import nn


def fit(module: nn.Module, loss, train_set: list[dict], *, minutes: float, lr: float, seed: int = 0,
        max_steps: int | None = None, log=print) -> dict:
    """The training loop of draft heads (Medusa's, Hydra's, EAGLE-3's): AdamW on ``module``'s trainable
    parameters, one step per record (``loss(record, generator)``, None to skip it), records in a fresh random
    order every epoch, until ``minutes`` run out or ``max_steps`` are done; ``module`` left in eval mode.
    Returns steps and minutes."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=lr)
    t0, steps = time.time(), 0
    module.train()

    def done() -> bool:
        return time.time() - t0 >= 60 * minutes or (max_steps is not None and steps >= max_steps)

    while not done():
        for d in (train_set[i] for i in torch.randperm(len(train_set), generator=gen).tolist()):
            value = loss(d, gen)
            if value is None:
                continue
            opt.zero_grad()
            value.backward()
            opt.step()
            steps += 1
            if steps % 200 == 0:
                log(f"step {steps}: loss {value.item():.3f}, {(time.time() - t0) / 60:.1f} min")
            if done():
                break
    module.eval()
    return {"steps": steps, "minutes": round((time.time() - t0) / 60, 2)}


def head_batch(d: dict, n: int, positions: int, gen) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Random response positions ``t`` of record ``d`` [p] and the label of each of ``n`` heads there [n, p]:
    head ``k``'s is ``greedy[t + k + 1]``, the target's token ``k + 2`` places after ``t`` (-1: past the end)."""
    length = len(d["ids"])
    first, last = max(d["start"] - 1, 0), length - 2  # t + 1 is a response token; head 0's label needs t + 1
    if last < first:
        return None, None
    t = torch.randint(first, last + 1, (min(positions, last - first + 1),), generator=gen)
    idx = t[None, :] + torch.arange(1, n + 1)[:, None]  # greedy[t + k + 1]
    y = torch.where(idx < length, d["greedy"][idx.clamp(max=length - 1)], -1)
    return t, y


@torch.no_grad()
def top1(predict, n: int, val: list[dict]) -> list[float]:
    """Top-1 accuracy of ``n`` heads, head ``k`` against ``greedy[t + k + 1]`` at every response position ``t``
    of the held-out records; ``predict(record, t)`` gives the logits [n, len(t), vocab]."""
    hits, total = torch.zeros(n), torch.zeros(n)
    for d in val:
        length, first = len(d["ids"]), max(d["start"] - 1, 0)
        t = torch.arange(first, length - 1)
        if not len(t):
            continue
        idx = t[None, :] + torch.arange(1, n + 1)[:, None]
        ok = idx < length
        pred = predict(d, t).argmax(-1)
        hits += ((pred == d["greedy"][idx.clamp(max=length - 1)]) & ok).sum(1)
        total += ok.sum(1)
    return [round(float(h / max(c, 1)), 4) for h, c in zip(hits, total)]
