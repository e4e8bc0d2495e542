"""Does a step cost more as the answer grows? Per method, the proposer's own time per step (the loop's ``propose`` and
``update`` phases) over the steps of the first and of the last WINDOW tokens of every answer that runs that long,
beside the target's forward over the same steps (vanilla's forward grows with attention over a longer cache; that
growth is the model's, not the method's). A proposer whose per-step work is bounded (TR's matrix, PLD's n-gram
index, SAM's automata, Lookahead's pool, REST's store) keeps its end/start ratio near 1: the bar is 1.25. A step's
time is also given per token it commits (``per token end/start``): where a long answer's steps commit more tokens
(a loop that the drafter has learned), a proposer whose work is per token (SAM extends its automaton by each) takes
longer per step for that alone.

    python -m scripts.bench_long "method=vanilla" "method=pld" "method=sam" [--bench spec_tts_smoke]
        [--tokens 1024] [--window 128] [--set model=gemma3-270m ...] [--out DIR]

The methods decode the same questions one after another in one process (greedy; each step timed with a device
sync at every phase boundary, so use it for this split only, never for speedups). Answers shorter than 2 * WINDOW
tokens are left out and counted. Writes ``long_steps.csv`` (and ``.md``) under ``--out``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

from evaluation.records.metrics import turn_steps
from evaluation.reporting.render import markdown
from evaluation.running import side_by_side as sbs
from methods import machine
from methods.common import RESULTS, exit_on_error, write_text_atomic
from methods.decode import PhaseTimer

BAR = 1.25  # a bounded proposer's time per step at the end within this factor of its time at the start


def split(calls: dict[str, list[float]], positions: list[int], tokens: int, window: int) -> dict | None:
    """One answer's median ms per step over the steps that commit a token of its first ``window`` tokens, and of its
    last ``window``: the proposer's (propose + update) and the forward's. ``positions``: where each decoding step's
    tokens start in the answer (the prefill's step, if the method has one, left out); None for an answer of fewer
    than 2 * ``window`` tokens."""
    steps = min(len(calls["propose"]), len(calls["update"]), len(positions))
    if tokens < 2 * window or not steps:
        return None
    positions = positions[-steps:]
    proposer = [p + u for p, u in zip(calls["propose"][-steps:], calls["update"][-steps:])]
    forward = calls["forward"][-steps:]  # the decoding steps' forwards (the prefill's is the first, before them)
    ends = positions[1:] + [tokens]  # where each step's tokens end
    start = [i for i, p in enumerate(positions) if p < window]  # a step that commits a token of the first window
    end = [i for i, e in enumerate(ends) if e > tokens - window]  # ... of the last
    if not start or not end:
        return None

    def ms(values: list[float], at: list[int]) -> float:  # the median: a garbage collection's pause is not the step's
        return 1000 * statistics.median(values[i] for i in at)

    per_token = [t / (e - p) for t, p, e in zip(proposer, positions, ends)]  # a step's time over the tokens it commits
    return {"steps": steps, "proposer_start": ms(proposer, start), "proposer_end": ms(proposer, end),
            "token_start": 1000 * ms(per_token, start), "token_end": 1000 * ms(per_token, end),
            "forward_start": ms(forward, start), "forward_end": ms(forward, end)}


def measure(runner, questions, window: int) -> tuple[list[dict], int]:
    """Each question answered by ``runner`` with a fresh ``PhaseTimer`` (its calls, per phase): the answers long
    enough, and how many not."""
    rows, short = [], 0
    for q in questions:
        runner.timer = PhaseTimer(runner.device)
        record = runner.answer(q)
        turn = turn_steps(record)[-1]  # a single-turn question (a multi-turn one: its last turn)
        steps = turn["accepts"][1:] if record["choices"][0]["prefill_step"][-1] else turn["accepts"]
        positions = turn["positions"][-len(steps):] if steps else []
        row = split(runner.timer.calls, positions, len(turn["tokens"]), window)
        if row is None:
            short += 1
            continue
        rows.append({"question_id": q.question_id, "tokens": len(turn["tokens"]), **row})
    return rows, short


def table(per_method: dict[str, tuple[list[dict], int]]) -> pd.DataFrame:
    out = []
    for label, (rows, short) in per_method.items():
        if not rows:
            out.append({"method": label, "answers": 0, "too short": short})
            continue
        t = pd.DataFrame(rows)
        mean = t[["tokens", "proposer_start", "proposer_end", "token_start", "token_end", "forward_start",
                  "forward_end"]].mean()
        out.append({"method": label, "answers": len(t), "too short": short, "tokens": mean["tokens"],
                    "proposer ms (start)": mean["proposer_start"], "proposer ms (end)": mean["proposer_end"],
                    "proposer end/start": mean["proposer_end"] / mean["proposer_start"],
                    "per token end/start": mean["token_end"] / mean["token_start"],
                    "forward ms (start)": mean["forward_start"], "forward ms (end)": mean["forward_end"],
                    "forward end/start": mean["forward_end"] / mean["forward_start"]})
    return pd.DataFrame(out)


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("methods", nargs="+", help='one string per method, e.g. "method=tr method.tree=auto"')
    ap.add_argument("--bench", default="spec_tts_smoke", help="bench config (questions)")
    ap.add_argument("--tokens", type=int, default=1024, help="new tokens per answer (bench.max_new_tokens)")
    ap.add_argument("--window", type=int, default=128, help="tokens at the start and at the end whose steps are timed")
    ap.add_argument("--set", nargs="*", default=[], help="overrides for every method (model=..., bench.*=...)")
    ap.add_argument("--out", default=str(RESULTS / "bench" / f"long_{time.strftime('%Y-%m-%d_%H-%M-%S')}"))
    args = ap.parse_args(argv)
    if args.window < 1 or args.tokens < 2 * args.window:
        raise SystemExit(f"error: --tokens ({args.tokens}) must hold two windows of --window ({args.window}) tokens "
                         f"or more; lower --window or raise --tokens")
    common = [f"bench={args.bench}", f"bench.max_new_tokens={args.tokens}", "warmup=0", *args.set]
    b = sbs.compose(args.methods, common, batch=1)
    sbs.load(b)
    per_method = {}
    for label, runner in b.runners.items():
        runner.max_new_tokens, keep = 16, runner.max_new_tokens  # a short warm-up answer: the kernels, the caches
        runner.warm_up(b.questions[0], 1)
        runner.max_new_tokens = keep
        per_method[label] = measure(runner, b.questions, args.window)
        print(f"{label}: {len(per_method[label][0])} answer(s) of {2 * args.window}+ tokens", flush=True)
    t = table(per_method)
    device = next(iter(b.runners.values())).device
    head = (f"{len(b.questions)} questions of {args.bench}, {args.tokens} new tokens, the steps of the first and the "
            f"last {args.window} tokens, {device} ({machine.describe(machine.cpu())})")
    text = markdown(t, digits=3)
    print(f"\n{head}\n{text}")
    over = [m for m, r in zip(t["method"], t.get("proposer end/start", [])) if r > BAR]
    per_token = [m for m, k in zip(t["method"], t.get("per token end/start", [])) if k > BAR]
    verdict = (f"over {BAR}x per step: {', '.join(over) or 'none'}; per token committed: "
               f"{', '.join(per_token) or 'none'} (a step that commits more tokens does more work for them)")
    print(verdict)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t.to_csv(out / "long_steps.csv", index=False)
    write_text_atomic(out / "long_steps.md", f"{head}\n\n{text}\n\n{verdict}\n")
    print(f"-> {out / 'long_steps.md'} (and .csv)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
