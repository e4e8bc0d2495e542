"""Every derived number of the harness, defined once.

Raw counters come from answer records (``new_tokens``, ``wall_time``,
``accept_lengths`` per question). Conventions:

* **accept length** of a step = tokens it committed, the bonus token included
  (vanilla: always 1). A prefill that yields the first token counts as one step of
  length 1 (``prefill_step``; the reference prefills of Token Recycling and Lookahead,
  which the loop follows for them, yield none).
* **MAT** (mean accepted tokens) = mean of all accept lengths of a task
  = total new tokens / total steps: every target forward is a step.
* **MAT (Spec-Bench)** = the same tokens over the steps Spec-Bench's scripts count
  (``spec_bench_steps`` per turn): their drafting methods (PLD, EAGLE, TR) verify the
  first drafts in the prompt's own forward, so its first token belongs to their first
  step, and a turn whose first step was our prefill's one token has one step fewer
  there. Vanilla (Spec-Bench's baseline: ``generate``, a step per token) is 1 in both.
  Worked example: a turn of accept lengths ``[1, 3, 2]`` (prefill, two steps) has MAT
  2.0 ours, 3.0 Spec-Bench's. Our answer files hold Spec-Bench's steps under its keys
  (``[4, 2]`` here; ours under ``our_accept_lengths``: ``evaluation.records.answers``), so this
  is exactly what Spec-Bench's ``evaluation/speed.py`` prints for them: the mean of every
  ``accept_lengths`` entry of the task. A file without the field counts its accept
  lengths as they are (Spec-Bench's own files are in its convention already).
* **tokens/s** of a task = total new tokens / total wall time over its questions
  (wall time includes the prefill).
* **speedup** = tokens/s of the method / tokens/s of the baseline, over the
  questions both answered (paired by ``question_id``). Being lossless, both
  produce the same tokens, so this is the ratio of wall-clock times.
* **repeats** (several runs of one configuration, as Spec-Bench's mean of 3): each
  repeat's speedup is its tokens/s over the baseline's tokens/s averaged over the
  baseline's repeats; tables give the mean and the sample standard deviation.
* **95% interval** of a speedup or MAT (``intervals``): paired bootstrap over questions.
  A resample draws the questions of every task with replacement (as many as the task has,
  so each task keeps its weight in the overall number), takes the *same* questions from
  method and baseline and from every repeat, and computes the number as above (repeats:
  their mean); the interval is the 2.5th to 97.5th percentile of ``RESAMPLES`` resamples,
  drawn with a fixed seed so that a table is reproducible. It says how much the number depends on which questions were asked, not
  how noisy the machine was (the spread over repeats says that); a task of one question
  has an interval of width zero.
* **accepted-length distribution** = share of steps by accept length, over the
  same steps that MAT averages.
* **speedup (Spec-Bench)** = mean over questions of per-question tokens/s of the
  method / the same mean for the baseline, where (as Spec-Bench's ``evaluation/speed.py``
  counts them) the method's tokens are its ``new_tokens`` and the baseline's are each
  turn's text re-tokenized with the model's tokenizer, minus one (the BOS of Llama's
  tokenizers) (``baseline_tokens``, given by the report from the baseline's run; without
  a tokenizer its ``new_tokens``): the number that script prints, kept beside ours so
  that published tables can be compared.
* **acceptance at depth d** = the share of steps whose draft reached depth d (an
  acceptable draft node that deep: ``draft_depths``) and whose path reached depth d - 1,
  that accepted a draft at depth d: how often a depth-d draft is accepted given that its
  parent was. For a chain this is exact; for a tree, "its parent" is the accepted node
  at depth d - 1, whichever it was, and the step counts if the tree reaches depth d
  anywhere. Each turn's last step is left out (the budget or a stop token may have cut
  it short), as are prefill steps (no draft).
* **load** of a run (``load_stats``; from the per-turn ``cpu_wait``, ``cpu_others`` the
  runner records with ``methods.machine.Load``): ``wait_share`` = seconds its threads
  waited for a CPU (summed over the threads and turns) / its wall time; ``others`` = the cores other
  processes used meanwhile (time-weighted mean); ``step_spread`` = the slowest turn's
  time per decoding step over the median turn's (turns of at least 4 steps after the
  prefill; not in batched runs, where a turn waits for the rows beside it), a signal that
  old runs and foreign files carry too.
* **under load** (``batch_stats``; batched runs, ``runtime.batch_size``, and every run that records its ``clock``):
  ``throughput`` = all new tokens / the seconds the run spent decoding (per process part of the run, ``clock.segment``:
  its last turn's end less its first turn's start, summed over the parts, so a resumed run adds its parts up);
  ``ttft`` = seconds from a turn's start (its prefill) to its first new token, and ``tpot`` = the turn's seconds after
  that per further token, each as mean, p50 and p90 over turns; ``forward_tokens`` = the token positions one
  verifying forward computed for the drafts (engine=hf: the batch's rows times its widest draft; engine=static, which
  runs rows ragged: the sum of the rows' drafts), averaged over forwards; ``padding`` = the share of those that were
  padding (rows' drafts narrower than the widest, slots with no request: 0 on the static engine). A step of a
  forward that verified r rows counts 1/r of it, so that every forward counts once. The speedup under load
  (``load_speedup``) is the method's throughput over vanilla's at the same batch size. Repeats of one configuration
  are pooled as the parts of one run. Its **95% interval** (``load_interval``) is a paired bootstrap over the parts
  that method and baseline decoded of the same questions (side by side: ``scripts.bench_methods``' chunks, timed in
  turn): a resample draws the parts with replacement and takes each part's tokens and seconds from both. It says
  how much the speedup depends on which stretch of the machine's time and which questions each part had (a
  machine whose speed drifts between parts widens it); runs with fewer than two such parts have none.
* **crossover** (``crossover``) of a method measured at several batch sizes: the first batch size at which its speedup
  under load falls below 1.0, interpolated linearly in log2 of the batch size between the measured point before (at
  or above 1.0) and the first one below (1.5x at B=2 and 0.5x at B=8 cross at B=4); the smallest batch size measured
  when the speedup is below 1.0 there already, and none when it never falls below. A point with a 95% interval
  falls below only where the whole interval does (0.99x [0.97, 1.01] is not told apart from 1.0); after such a
  point, the crossing is at the first point clearly below, not interpolated.
* **per-drafter** numbers (hybrids, ``step_info``): a drafter's share of the steps
  that drafted, and the MAT of its steps (mean accept length over them).
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd

from evaluation.records.bench import TASKS, task_of

OVERALL = "overall"
RESAMPLES = 2000  # bootstrap resamples of an interval
INTERVAL = 0.95


def spec_bench_tokens(records: list[dict], tokenizer) -> dict[int, int]:
    """Per question, the new tokens Spec-Bench's ``evaluation/speed.py`` counts for a baseline: each turn's text
    re-tokenized by ``tokenizer`` (special tokens added, as its call does), minus one."""
    return {r["question_id"]: sum(len(tokenizer(t).input_ids) - 1 for t in r["choices"][0]["turns"]) for r in records}


def per_question(records: list[dict], tokens: dict[int, int] | None = None) -> pd.DataFrame:
    """One row per question: raw counters summed over its turns; ``tokens``: the new tokens Spec-Bench counts
    (``spec_bench_tokens``; default ``new_tokens``)."""
    rows = []
    for r in records:
        c = r["choices"][0]
        steps = len(c["accept_lengths"])
        rows.append({
            "question_id": r["question_id"],
            "task": task_of(r.get("category", "")),
            "new_tokens": sum(c["new_tokens"]),
            "wall_time": sum(c["wall_time"]),
            "steps": steps,
            "steps_specbench": sum(c.get("spec_bench_steps", [steps])),
            "accepted": sum(c["accept_lengths"]),
            "tokens_specbench": sum(c["new_tokens"]) if tokens is None else tokens[r["question_id"]],
        })
    df = pd.DataFrame(rows).set_index("question_id")
    df["tok_per_s"] = df["new_tokens"] / df["wall_time"]
    df["tok_per_s_specbench"] = df["tokens_specbench"] / df["wall_time"]
    return df


def _aggregate(q: pd.DataFrame) -> dict:
    return {
        "questions": len(q),
        "mat": q["accepted"].sum() / q["steps"].sum(),
        "mat_specbench": q["accepted"].sum() / q["steps_specbench"].sum(),
        "tok_per_s": q["new_tokens"].sum() / q["wall_time"].sum(),
        "mean_q_tok_per_s": q["tok_per_s"].mean(),
    }


def task_table(records: list[dict], baseline: list[dict] | None = None,
               baseline_tokens: dict[int, int] | None = None, ci: bool = True) -> pd.DataFrame:
    """Per task and overall: MAT, tokens/s and, given a baseline, both speedups on paired questions
    (``baseline_tokens``: the baseline's tokens as Spec-Bench counts them, ``spec_bench_tokens``); with ``ci``
    the 95% intervals of MAT and speedups (``intervals``: columns ``<metric>_lo`` and ``<metric>_hi``)."""
    q = per_question(records)
    b = per_question(baseline, baseline_tokens) if baseline is not None else None
    if b is not None:
        common = q.index.intersection(b.index)
        q, b = q.loc[common], b.loc[common]
    groups = [t for t in TASKS if t in set(q["task"])] + sorted(set(q["task"]) - set(TASKS))
    rows = {}
    for name in groups + [OVERALL]:
        sel = q if name == OVERALL else q[q["task"] == name]
        row = _aggregate(sel)
        if b is not None:
            base = _aggregate(b.loc[sel.index])
            row["baseline_tok_per_s"] = base["tok_per_s"]
            row["baseline_mean_q_tok_per_s"] = b.loc[sel.index, "tok_per_s_specbench"].mean()
            row["speedup"] = row["tok_per_s"] / base["tok_per_s"]
            row["speedup_specbench"] = row["mean_q_tok_per_s"] / row["baseline_mean_q_tok_per_s"]
        rows[name] = row
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = "task"
    if ci:
        df = df.join(intervals([records], [baseline] if baseline is not None else None, [baseline_tokens]))
    return df


def intervals(runs: list[list[dict]], baselines: list[list[dict]] | None = None,
              baseline_tokens: list[dict[int, int] | None] | None = None, resamples: int = RESAMPLES,
              seed: int = 0) -> pd.DataFrame:
    """Per task and overall, the paired bootstrap 95% intervals (the module's "95% interval") of ``mat`` and
    ``mat_specbench`` and, given baselines, ``speedup`` and ``speedup_specbench``: columns ``<metric>_lo`` and
    ``<metric>_hi``. ``runs`` are the repeats of one configuration, ``baselines`` those of its baseline; each
    resample computes the number as ``repeat_table`` does (the mean over the repeats), on the resampled
    questions of every repeat."""
    ours = [per_question(recs) for recs in runs]
    theirs = [per_question(recs, t) for recs, t in zip(baselines or [], baseline_tokens or [None] * len(runs))]
    common = ours[0].index
    for q in ours[1:] + theirs:
        common = common.intersection(q.index)
    task = ours[0].loc[common, "task"]
    m = np.stack([q.loc[common, ["accepted", "steps", "steps_specbench", "new_tokens", "wall_time", "tok_per_s"]]
                  .to_numpy(float) for q in ours], axis=2)  # question, counter, repeat
    b = np.stack([q.loc[common, ["new_tokens", "wall_time", "tok_per_s_specbench"]].to_numpy(float)
                  for q in theirs], axis=2) if theirs else None
    rng = np.random.default_rng(seed)
    tasks = [t for t in TASKS if t in set(task)] + sorted(set(task) - set(TASKS))
    sums = {}
    for name in tasks:
        rows = (task == name).to_numpy()
        draws = rng.integers(0, rows.sum(), (resamples, rows.sum()))  # the same questions for method and baseline
        sums[name] = (m[rows][draws].sum(axis=1), b[rows][draws].sum(axis=1) if b is not None else None)
    sums[OVERALL] = (sum(s[0] for s in sums.values()),
                     sum(s[1] for s in sums.values()) if b is not None else None)
    tail = 100 * (1 - INTERVAL) / 2
    out = {}
    for name, (sm, sb) in sums.items():  # sums: resample, counter, repeat
        draws = {"mat": (sm[:, 0] / sm[:, 1]).mean(axis=1), "mat_specbench": (sm[:, 0] / sm[:, 2]).mean(axis=1)}
        if sb is not None:
            draws["speedup"] = (sm[:, 3] / sm[:, 4]).mean(axis=1) / (sb[:, 0] / sb[:, 1]).mean(axis=1)
            draws["speedup_specbench"] = sm[:, 5].mean(axis=1) / sb[:, 2].mean(axis=1)  # means of one question set
        out[name] = {f"{metric}_{end}": float(np.percentile(v, p)) for metric, v in draws.items()
                     for end, p in (("lo", tail), ("hi", 100 - tail))}
    df = pd.DataFrame.from_dict(out, orient="index")
    df.index.name = "task"
    return df


def repeat_table(runs: list[list[dict]], baselines: list[list[dict]] | None = None,
                 baseline_tokens: list[dict[int, int] | None] | None = None) -> pd.DataFrame:
    """Per task and overall, the mean and spread of MAT, tokens/s and speedups over repeated runs.

    ``runs`` are the repeats of one configuration, ``baselines`` the repeats of its baseline.
    Columns: ``<metric>`` (mean over repeats) and ``<metric>_std`` (sample standard deviation,
    NaN for a single run) for ``mat``, ``tok_per_s``, ``speedup`` and ``speedup_specbench``;
    ``questions`` and ``repeats``; ``<metric>_lo`` and ``<metric>_hi``: the 95% interval over questions
    (``intervals``); ``baseline_tokens``: per baseline, its ``spec_bench_tokens``. Worked example:
    two repeats at 10 and 12 tokens/s against one baseline run at 5 tokens/s give speedup 2.2 with std 0.283
    (= stdev of 2.0 and 2.4).
    """
    tables = []
    for i, recs in enumerate(runs):
        if baselines:
            paired = [task_table(recs, b, n, ci=False)
                      for b, n in zip(baselines, baseline_tokens or [None] * len(baselines))]
            t = paired[0][["questions", "mat", "mat_specbench", "tok_per_s", "mean_q_tok_per_s"]].copy()
            base = sum(p["baseline_tok_per_s"] for p in paired) / len(paired)
            base_q = sum(p["baseline_mean_q_tok_per_s"] for p in paired) / len(paired)
            t["speedup"] = t["tok_per_s"] / base
            t["speedup_specbench"] = t["mean_q_tok_per_s"] / base_q
        else:
            t = task_table(recs, ci=False)
        tables.append(t.assign(repeat=i))
    long = pd.concat(tables).reset_index()
    order = list(dict.fromkeys(long["task"]))
    metrics = [c for c in ("mat", "mat_specbench", "tok_per_s", "speedup", "speedup_specbench") if c in long]
    g = long.groupby("task", sort=False)
    out = g[metrics].mean()
    for c in metrics:
        out[c + "_std"] = g[c].std(ddof=1)
    out["questions"] = g["questions"].first()
    out["repeats"] = g["repeat"].nunique()
    return out.loc[order].join(intervals(runs, baselines, baseline_tokens))


def load_stats(records: list[dict]) -> dict:
    """``wait_share``, ``others`` (None where the runs recorded no load) and ``step_spread`` (None with fewer than
    two turns of 4 decoding steps) of one run's records: the module's "load"."""
    wall = wait = others = 0.0
    per_step, recorded = [], True
    for r in records:
        c = r["choices"][0]
        batched = (r.get("clock") or {}).get("batch_size", 1) > 1  # a turn's time there is its batch's too
        recorded = recorded and "cpu_wait" in c
        if recorded:
            wall += sum(c["wall_time"])
            wait += sum(c["cpu_wait"])
            others += sum(o * t for o, t in zip(c["cpu_others"], c["wall_time"]))
        for turn, (seconds, steps) in enumerate(zip(c.get("decode_time", []), c["decoding_steps"])):
            steps -= bool(c.get("prefill_step", [False] * (turn + 1))[turn])
            if steps >= 4 and not batched:
                per_step.append(seconds / steps)
    recorded = recorded and wall > 0
    return {"wait_share": wait / wall if recorded else None, "others": others / wall if recorded else None,
            "step_spread": max(per_step) / float(np.median(per_step)) if len(per_step) > 1 else None}


def batch_stats(records: list[dict]) -> dict:
    """``throughput``, ``ttft_*`` and ``tpot_*`` (mean, p50, p90), ``forward_tokens`` and ``padding`` of one run's
    records (the module's "under load"), and its ``batch_size``; None for what the records do not hold (a run
    without ``clock``: Spec-Bench's files, runs from before it was recorded)."""
    tokens, ttft, tpot = 0, [], []
    forwards = slots = real = 0.0
    steps = offered = kept = 0
    expected, realised = [], []
    size = None
    for r in records:
        c = r["choices"][0]
        size = (r.get("clock") or {}).get("batch_size", size)
        tokens += sum(c["new_tokens"])
        for first, wall, n in zip(c.get("first_token_time", []), c["wall_time"], c["new_tokens"]):
            if first is not None:
                ttft.append(first)
                if n > 1:
                    tpot.append((wall - first) / (n - 1))
        nodes = c.get("draft_nodes", [])
        rows = c.get("batch_rows") or [int(n > 0) for n in nodes]  # one row alone where not batched
        for r, n, width in zip(rows, nodes, c.get("forward_slots") or nodes):
            if r:  # the prefill forwards alone, outside the batch
                forwards += 1 / r
                slots += width / r
                real += n
        drafted = c.get("offered_nodes") or nodes  # a budget's: what was drafted before its cut
        for n, o in zip(nodes, drafted):
            if n:  # a step (the prefill's size is 0)
                steps += 1
                offered += o
                kept += n
        for e, a in zip(c.get("expected_lengths") or [], c.get("accept_lengths", [])):
            if e is not None:
                expected.append(e)
                realised.append(a)
    timed = parts(records)
    seconds = sum(s for _, s in timed.values())
    out = {"batch_size": size, "throughput": tokens / seconds if timed and seconds > 0 else None,
           "forward_tokens": slots / forwards if forwards else None,
           "padding": round(1 - real / slots, 9) + 0.0 if slots else None,  # no -0.0 from the 1/r fractions' sums
           # a per-step budget (methods.budget): nodes drafted and verified per step, and the tokens the steps it chose
           # were expected to commit against what they did (the calibration of its odds)
           "offered_nodes": offered / steps if steps else None,
           "kept_nodes": kept / steps if steps else None,
           "expected_mat": float(np.mean(expected)) if expected else None,
           "realised_mat": float(np.mean(realised)) if realised else None}
    for name, values in (("ttft", ttft), ("tpot", tpot)):
        v = np.array(values)
        out.update({f"{name}_mean": float(v.mean()) if len(v) else None,
                    f"{name}_p50": float(np.percentile(v, 50)) if len(v) else None,
                    f"{name}_p90": float(np.percentile(v, 90)) if len(v) else None})
    return out


def load_speedup(records: list[dict], baseline: list[dict]) -> float | None:
    """The module's speedup under load: the throughput (``batch_stats``) of ``records`` over that of ``baseline``,
    vanilla at the same batch size (the callers' consistency check holds them to it); None where either recorded no
    clock."""
    ours, theirs = batch_stats(records)["throughput"], batch_stats(baseline)["throughput"]
    return ours / theirs if ours and theirs else None


def parts(records: list[dict]) -> dict[frozenset, tuple[int, float]]:
    """Per set of questions decoded in one clock segment (repeats of that set pooled): (new tokens, seconds decoding:
    the segment's last turn's end less its first turn's start), the parts ``batch_stats``' throughput sums."""
    spans: dict[str, list] = {}
    for r in records:
        clock = r.get("clock")
        if not clock:
            continue
        part = spans.setdefault(clock["segment"], [set(), 0, math.inf, -math.inf])
        part[0].add(r.get("question_id"))
        part[1] += sum(r["choices"][0]["new_tokens"])
        for start, end in clock["turns"]:
            part[2], part[3] = min(part[2], start), max(part[3], end)
    out: dict[frozenset, tuple[int, float]] = {}
    for questions, tokens, start, end in spans.values():
        was = out.get(frozenset(questions), (0, 0.0))
        out[frozenset(questions)] = (was[0] + tokens, was[1] + end - start)
    return out


def load_interval(records: list[dict], baseline: list[dict], resamples: int = RESAMPLES,
                  seed: int = 0) -> tuple[float, float] | None:
    """The 95% interval of ``load_speedup`` (the module's "under load"): a paired bootstrap over the parts both runs
    decoded of the same questions; None with fewer than two. Worked example: parts of (100 tokens, 1 s) and
    (100, 2 s) against the baseline's (100, 2 s) and (100, 2 s) resample to 2.0, 1.0 or 4/3: the interval spans
    [1.0, 2.0]."""
    ours, theirs = parts(records), parts(baseline)
    common = [q for q in ours if q in theirs]
    if len(common) < 2:
        return None
    a = np.array([ours[q] for q in common], float)  # part, (tokens, seconds)
    b = np.array([theirs[q] for q in common], float)
    draws = np.random.default_rng(seed).integers(0, len(common), (resamples, len(common)))
    sa, sb = a[draws].sum(axis=1), b[draws].sum(axis=1)  # resample, (tokens, seconds)
    ratio = (sa[:, 0] / sa[:, 1]) / (sb[:, 0] / sb[:, 1])
    tail = 100 * (1 - INTERVAL) / 2
    return float(np.percentile(ratio, tail)), float(np.percentile(ratio, 100 - tail))


def crossover(points: list[tuple]) -> float | None:
    """The module's "crossover" of (batch size, speedup under load) points, or (batch size, speedup, its interval's
    upper end), in any order (missing speedups left out); None when no speedup is clearly below 1.0."""
    def known(x) -> bool:
        return x is not None and not math.isnan(x)

    points = sorted((size, s, *rest) for size, s, *rest in points if known(s))
    for i, (size, speedup, *hi) in enumerate(points):
        if speedup < 1.0 and not (hi and known(hi[0]) and hi[0] >= 1.0):
            if i == 0 or points[i - 1][1] < 1.0:
                return float(size)
            before, above = points[i - 1][:2]
            share = (above - 1.0) / (above - speedup)  # of the way from the point before to this one, on log2 B
            return float(2 ** (math.log2(before) + share * (math.log2(size) - math.log2(before))))
    return None


def accept_histogram(records: list[dict]) -> pd.Series:
    """Share of steps (0..1) by accepted length, indexed 1..longest: ``[1, 1, 3, 1]`` -> {1: 0.75, 3: 0.25}."""
    lengths = pd.Series([a for r in records for a in r["choices"][0]["accept_lengths"]], dtype=int)
    return lengths.value_counts(normalize=True).sort_index().rename("share")


def _steps(records: list[dict]):
    """(accept length, draft depth, draft nodes, step info) of every step but each turn's last, from records
    that carry ``draft_depths`` (the runner writes them)."""
    for r in records:
        c = r["choices"][0]
        if "draft_depths" not in c:
            continue
        info = c.get("step_info") or [None] * len(c["accept_lengths"])
        at = 0
        for n in c["decoding_steps"]:
            for i in range(at, at + n - 1):
                yield c["accept_lengths"][i], c["draft_depths"][i], c["draft_nodes"][i], info[i]
            at += n


def depth_acceptance(records: list[dict], deepest: int | None = None) -> pd.DataFrame:
    """Per depth d (1..deepest drafted): ``tried`` (steps that could accept a depth-d draft), ``accepted``
    and ``rate`` (metrics' "acceptance at depth d"). Worked example: steps of depth 2 accepting [1, 2, 3] tokens
    (0, 1, 2 drafts): depth 1 tried 3, accepted 2; depth 2 tried 2, accepted 1."""
    tried, hit = Counter(), Counter()
    for length, depth, _, _ in _steps(records):
        drafts = length - 1
        for d in range(1, min(depth, drafts + 1) + 1):
            tried[d] += 1
            hit[d] += drafts >= d
    top = max(tried, default=0) if deepest is None else deepest
    rows = [{"depth": d, "tried": tried[d], "accepted": hit[d], "rate": hit[d] / tried[d] if tried[d] else math.nan}
            for d in range(1, top + 1)]
    return pd.DataFrame(rows, columns=["depth", "tried", "accepted", "rate"]).set_index("depth")


def drafter_table(records: list[dict]) -> pd.DataFrame:
    """Per drafter of a hybrid (``step_info``'s ``drafter``): ``steps``, ``share`` of the drafting steps, ``mat``
    (mean accept length of its steps, each turn's last left out) and ``nodes`` (mean draft size). Empty for a
    method that records no drafter."""
    steps, tokens, nodes = Counter(), Counter(), Counter()
    for length, _, size, info in _steps(records):
        if info and "drafter" in info:
            steps[info["drafter"]] += 1
            tokens[info["drafter"]] += length
            nodes[info["drafter"]] += size
    total = sum(steps.values())
    rows = [{"drafter": d, "steps": n, "share": n / total, "mat": tokens[d] / n, "nodes": nodes[d] / n}
            for d, n in steps.most_common()]
    return pd.DataFrame(rows, columns=["drafter", "steps", "share", "mat", "nodes"]).set_index("drafter")


def spec_acceptance(records: list[dict]) -> dict:
    """Acceptance as vLLM reports it (``vllm bench serve``; its ``vllm:spec_decode_*`` counters), over the steps that
    verified drafts: ``drafts`` (such steps), ``drafted`` and ``accepted`` (draft tokens), ``rate`` (accepted /
    drafted), ``mean_acceptance_length`` (1 + accepted / drafts: per verify step, the bonus token included; MAT counts
    every step) and ``per_position`` (the share of verify steps whose draft was accepted to position i, from 1).
    From vLLM's own per-request record where a run has one (engine=vllm's ``vllm_spec``), else from our per-step
    records (a step's draft tokens: its nodes less the root), so that both engines' rows read alike.

    >>> r = {"choices": [{"accept_lengths": [1, 3, 1, 2], "draft_nodes": [0, 4, 4, 1]}]}
    >>> a = spec_acceptance([r]); (a["drafts"], a["drafted"], a["accepted"], a["per_position"])
    (2, 6, 2, [0.5, 0.5])
    """
    accepted, drafted = [], 0
    for r in records:
        c = r["choices"][0]
        if c.get("vllm_spec") is not None:
            for s in filter(None, c["vllm_spec"]):
                accepted += s["per_step_accepted"]
                drafted += s["num_draft_tokens"]
        elif c.get("draft_nodes") is not None:
            for a, n in zip(c["accept_lengths"], c["draft_nodes"]):
                if n > 1:
                    accepted.append(a - 1)
                    drafted += n - 1
    drafts, total = len(accepted), sum(accepted)
    longest = max(accepted, default=0)
    return {"drafts": drafts, "drafted": drafted, "accepted": total, "rate": total / drafted if drafted else math.nan,
            "mean_acceptance_length": 1 + total / drafts if drafts else math.nan,
            "per_position": [sum(a >= i for a in accepted) / drafts for i in range(1, longest + 1)]}


# ---------------------------------------------------------------- long outputs (reasoning workloads)

LONG_RANGE = 256  # a draft copied from this many tokens back or more (or from a corpus) came from long-range memory
POSITIONS = 8  # the draft positions whose acceptance rate the reasoning table shows (the CSV: every one)


def turn_steps(record: dict) -> list[dict]:
    """Per turn of ``record`` (the runner's, with per-step records): its steps' ``accepts``, draft ``nodes``,
    commit ``times`` (seconds from the turn's start; None for records without), ``info``, their start ``positions``
    in the answer, its ``tokens``, its end of thinking (``thinking_end``: the token index, or None), whether its
    conversation's round is the last (``final``), its grade (``correct``) and ``repetition``."""
    c = record["choices"][0]
    n = len(c["accept_lengths"])
    nodes, info = c.get("draft_nodes", [0] * n), c.get("step_info") or [None] * n
    times, ends = c.get("step_times"), c.get("thinking_end") or [None] * len(c["decoding_steps"])
    rounds = (record.get("paradigm") or {}).get("round")
    last = max(rounds) if rounds else None
    out, at = [], 0
    for t, k in enumerate(c["decoding_steps"]):
        accepts = c["accept_lengths"][at:at + k]
        out.append({"accepts": accepts, "nodes": nodes[at:at + k], "info": info[at:at + k],
                    "times": times[at:at + k] if times else None,
                    "positions": list(np.cumsum([0] + accepts[:-1])), "tokens": c["token_ids"][t],
                    "thinking_end": ends[t], "final": rounds is None or rounds[t] == last,
                    "correct": (c.get("correct") or [None] * len(c["decoding_steps"]))[t],
                    "repetition": (c.get("repetition") or [None] * len(c["decoding_steps"]))[t]})
        at += k
    return out


def position_table(records: list[dict], bucket: int) -> pd.DataFrame:
    """Per bucket of ``bucket`` output positions (a step counts where its first token is): ``tokens``, ``steps``
    and ``seconds`` (the steps' own time, from the commit before them; a turn's first step from its start, the
    prefill included), ``mat`` = tokens / steps and ``tok_per_s`` = tokens / seconds."""
    rows = []
    for r in records:
        for turn in turn_steps(r):
            times = turn["times"]
            for i, (a, p) in enumerate(zip(turn["accepts"], turn["positions"])):
                dt = (times[i] - (times[i - 1] if i else 0.0)) if times else math.nan
                rows.append((int(p) // bucket * bucket, a, dt))
    df = pd.DataFrame(rows, columns=["position", "tokens", "seconds"])
    g = df.groupby("position")
    out = pd.DataFrame({"tokens": g["tokens"].sum(), "steps": g["tokens"].size(), "seconds": g["seconds"].sum()})
    out["mat"] = out["tokens"] / out["steps"]
    out["tok_per_s"] = out["tokens"] / out["seconds"]
    return out


def _looping(record: dict) -> bool:
    from evaluation.records.grading import loops

    return any(t["repetition"] and loops(t["repetition"]) for t in turn_steps(record))


def long_stats(records: list[dict], baseline: list[dict] | None = None) -> dict:
    """The reasoning table's numbers of a run (each over every turn; ``baseline``: the vanilla run of its settings):

    * ``mat``, ``mat_thinking``, ``mat_answer``: MAT over every step, over the steps inside a reasoning model's
      thinking (before its end-of-thinking token) and after it (NaN where no answer closed its thinking);
    * ``accept_rate_k`` for draft positions k = 1.. (vLLM's definition, ``vllm/v1/spec_decode/metrics.py``: the
      steps whose draft's k-th token was accepted over the drafting steps) and ``mean_acceptance_length`` (1 +
      accepted drafts / drafting steps); drafting steps: those that verified a draft (more than the root), a forced
      step of the end of thinking not among them;
    * ``long_range``: the share of drafting steps whose draft came from long-range memory (the proposer says so in its
      step info: ``reach`` at least ``LONG_RANGE`` tokens back, or a corpus; NaN for a proposer that does not say);
    * ``itl_p50/p95/p99`` (seconds between a token and the one before it in a turn: a step's tokens arrive together)
      and ``tpot`` (a turn's time after its first token per further token, averaged over turns);
    * ``looping`` (questions with an answer whose distinct 4-grams are below ``grading.LOOP_DISTINCT``), ``mat_clean``
      and, with a baseline, ``speedup`` and ``speedup_clean`` (tokens/s over the baseline's, on common questions,
      with and without the looping ones);
    * ``accuracy`` (the final round's answers graded right, ``grading.grade``) and ``pass_at_n`` (questions one of
      whose conversations' final answers is right); NaN where nothing was graded."""
    turns = [t for r in records for t in turn_steps(r)]
    steps = [(a, n, i, p, t["thinking_end"]) for t in turns
             for a, n, i, p in zip(t["accepts"], t["nodes"], t["info"], t["positions"])]
    out = {"answers": len(turns)}
    out["mat"] = sum(a for a, *_ in steps) / len(steps)
    inside = [a for a, _, _, p, e in steps if e is not None and p < e]
    after = [a for a, _, _, p, e in steps if e is not None and p >= e]
    out["mat_thinking"] = sum(inside) / len(inside) if inside else math.nan
    out["mat_answer"] = sum(after) / len(after) if after else math.nan
    drafting = [(a, i) for a, n, i, *_ in steps if n > 1 and not (i or {}).get("forced")]
    accepted = Counter()
    for a, _ in drafting:
        for k in range(1, a):
            accepted[k] += 1
    for k in range(1, max([POSITIONS, *accepted]) + 1):
        out[f"accept_rate_{k}"] = accepted[k] / len(drafting) if drafting else math.nan
    out["mean_acceptance_length"] = 1 + sum(a - 1 for a, _ in drafting) / len(drafting) if drafting else math.nan
    said = [i for _, i in drafting if i and ("reach" in i or "drafter" in i)]
    far = [i for i in said if (i.get("reach") or 0) >= LONG_RANGE or i.get("drafter") == "sam_static"]
    out["long_range"] = len(far) / len(drafting) if said else math.nan
    gaps, per_token = [], []
    for t in turns:
        if not t["times"]:
            continue
        prev = None
        for time, a in zip(t["times"], t["accepts"]):
            if prev is not None:
                gaps += [time - prev] + [0.0] * (a - 1)
            prev = time
        if len(t["tokens"]) > 1:
            per_token.append((t["times"][-1] - t["times"][0]) / (len(t["tokens"]) - 1))
    for q in (50, 95, 99):
        out[f"itl_p{q}"] = float(np.percentile(gaps, q)) if gaps else math.nan
    out["tpot"] = float(np.mean(per_token)) if per_token else math.nan
    loops = {r["question_id"] for r in records if _looping(r)}
    out["looping"] = len(loops)
    clean = [r for r in records if r["question_id"] not in loops]
    out["mat_clean"] = (sum(a for r in clean for t in turn_steps(r) for a in t["accepts"])
                        / max(1, sum(len(t["accepts"]) for r in clean for t in turn_steps(r)))) if clean else math.nan
    if baseline is not None:
        for key, keep in (("speedup", None), ("speedup_clean", loops)):
            mine = [r for r in records if keep is None or r["question_id"] not in keep]
            t = task_table(mine, baseline, ci=False) if mine else None
            out[key] = t.loc[OVERALL, "speedup"] if t is not None else math.nan
    graded = [t["correct"] for t in turns if t["final"] and t["correct"] is not None]
    out["accuracy"] = sum(graded) / len(graded) if graded else math.nan
    by_q = [[t["correct"] for t in turn_steps(r) if t["final"] and t["correct"] is not None] for r in records]
    by_q = [g for g in by_q if g]
    out["pass_at_n"] = sum(any(g) for g in by_q) / len(by_q) if by_q else math.nan
    return out
