"""Decoding methods side by side in one process: MAT, tokens/s and speedup per Spec-Bench task.

    python -m scripts.bench_methods "method=vanilla" "method=tr" "method=tr method.start=cold" \\
        [--bench spec_bench_sample] [--warmup 1] [--batch 1] [--chunk N] [--passes 1] [--generate] [--phases]
        [--out DIR]

Each positional argument is one method as Hydra overrides (as for evaluation.run); the
first is the baseline. All methods decode the same questions in one process, question by
question, the order of the methods rotating from one question to the next, so that the
drift of a shared machine falls on all alike. ``--batch B`` decodes at batch size B
(``runtime.batch_size``, continuous batching: ``Runner.answer_all``): the questions are split
into chunks of ``--chunk`` in a row (default 4B: ``side_by_side.CHUNK``), every method answers a
whole chunk in turn, the order rotating from chunk to chunk, and each chunk is its own clock
segment, so that a method's throughput (``evaluation.records.metrics.batch_stats``) counts only its
own decoding; a second table gives it, with its 95% interval paired over the chunks
(``load_interval``). A smaller chunk (down to B) interleaves the methods more finely, for a machine
whose speed drifts between the stretches of a long chunk (its interval shows it); each chunk's
batch then drains sooner, as every method's does. ``--generate`` adds Hugging Face
``model.generate(do_sample=False)`` as an outside reference, at the same batch size (left
padding): the engine reference. Writes one answer file per
method under --out, checks that all produced the same tokens, and prints the speed
table (evaluation.speed) against the baseline and, with --generate, against generate.
Each method is its overrides, the engine and the model included: ``"method=tr engine=hf"``
runs TR on the reference engine, ``"method=tr model.dtype=bfloat16"`` on a second copy of
the model in bf16 (one model is loaded per distinct model setting), and
``"method=tr sampling.temperature=0.7"`` samples. Each method's tokens are compared with the
first method of its own model setting and sampling settings (put a vanilla first for
each: a sampled method must reproduce vanilla sampling with the same seed); every divergence is
classified by re-running the model (``evaluation.equal``): in fp32 any divergence fails
(exit 1), in bf16/fp16 only one that is not a near-tie. ``--phases`` also splits every
method's step time into forward, drafting (propose), acceptance, update and cache commit
(``methods.decode.PhaseTimer``; on a GPU its synchronisations slow the run a little).
``--passes N`` decodes the questions N times in a row, each method keeping what it remembers across
requests (``Proposer.memory``: SuffixDecoding's global tree, Token Recycling's hot matrix) from one
pass to the next, each pass written, checked and reported in ``--out``'s ``pass1/``, ``pass2/``...:
how much a second look at the same requests gains.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import pandas as pd

from evaluation.records.answers import folder_lock
from evaluation.records.metrics import batch_stats, load_interval, spec_acceptance
from evaluation.reporting.render import markdown
from evaluation.reporting.speed_table import speed_table
from evaluation.running import side_by_side as sbs
from evaluation.running.folder import environment
from methods import machine
from methods.common import RESULTS, HarnessError, exit_on_error
from methods.decode import PhaseTimer

PHASES = ("forward", "propose", "accept", "update", "commit")  # methods.decode's loop


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("methods", nargs="+", help='each one method as overrides, e.g. "method=tr method.k=4"')
    ap.add_argument("--bench", default="spec_bench_sample", help="bench config, plus any bench.* overrides")
    ap.add_argument("--set", nargs="*", default=[], help="overrides for every method (model=..., bench.*=...)")
    ap.add_argument("--warmup", type=int, default=1, help="passes over the first question per method")
    ap.add_argument("--batch", type=int, default=1, help="batch size of every method (runtime.batch_size)")
    ap.add_argument("--chunk", type=int, default=None, help="questions each method answers in its turn at --batch B "
                    "(default 4B; at least B)")
    ap.add_argument("--passes", type=int, default=1, help="decode the questions this many times in a row, each "
                    "method remembering from pass to pass (out/pass1, out/pass2, ...)")
    ap.add_argument("--generate", action="store_true", help="add model.generate as a reference")
    ap.add_argument("--phases", action="store_true", help="split each method's step time by phase")
    ap.add_argument("--out", default=str(RESULTS / "bench" / time.strftime("%Y-%m-%d_%H-%M-%S")))
    args = ap.parse_args(argv)
    if args.passes < 1:
        raise HarnessError(f"--passes {args.passes}: give 1 or more")
    out = Path(args.out)
    with folder_lock(out, fix="wait for it to finish, or choose another --out"):
        return bench(args, out)


def bench(args, out: Path) -> int:
    common = [f"bench={args.bench}", f"warmup={args.warmup}", *args.set, f"runtime.batch_size={args.batch}"]
    b = sbs.compose(args.methods, common, args.batch, args.generate, args.chunk)
    try:
        sbs.load(b)
        return _passes(args, b, out)
    finally:
        for r in b.runners.values():
            r.close()  # engine=vllm: its worker process


def _passes(args, b: sbs.Bench, out: Path) -> int:
    sbs.warm_up(b, args.warmup, args.phases)
    failed = False
    for k in range(1, args.passes + 1):
        where = out / f"pass{k}" if args.passes > 1 else out
        if args.passes > 1:
            print(f"\npass {k} of {args.passes}")
        sbs.decode(b)
        sbs.write(b, where)
        lines, unequal = sbs.check(b, where)
        print("\n".join(lines))
        report(args, b, where)
        print(f"-> {where}")
        if unequal:
            ref, label = unequal[0]
            print(f"NOT LOSSLESS: {', '.join(m for _, m in unequal)} differ(s) from their reference (in fp32 every "
                  f"divergence counts, a near-tie too; in reduced precision those that are not near-ties; each is "
                  f"classified above, and python -m evaluation.equal {where / ref} {where / label} says where and "
                  f"why)")
            failed = True
    return 1 if failed else 0


def acceptance(b: sbs.Bench, out: Path, positions: int = 4) -> None:
    """Every drafting method's acceptance as vLLM reports it (``spec_acceptance``: vLLM's own record for its runs,
    ours computed from the same kind of steps), beside its MAT: printed and written to acceptance.md."""
    rows = []
    for label, recs in b.records.items():
        a = spec_acceptance(recs)
        if a["drafts"]:
            steps = sum(len(r["choices"][0]["accept_lengths"]) for r in recs)
            tokens = sum(sum(r["choices"][0]["new_tokens"]) for r in recs)
            rows.append({"method": label, "MAT": tokens / steps, "mean acceptance length": a["mean_acceptance_length"],
                         "acceptance rate": a["rate"], "verify steps": a["drafts"],
                         **{f"pos {i + 1}": p for i, p in enumerate(a["per_position"][:positions])}})
    if rows:
        text = markdown(pd.DataFrame(rows), digits=3)
        print(f"\nacceptance as vLLM reports it (over the steps that verified drafts; MAT over every step):\n{text}")
        (out / "acceptance.md").write_text(text + "\n")


def report(args, b: sbs.Bench, out: Path) -> None:
    """The speed tables against each group's first method (files: speed.md and .csv), throughput at batch B and
    the phases of a step, printed and written beside the runs."""
    first_cfg = b.cfgs[b.labels[0]]
    loaded = next(iter(b.runners.values()))
    env = environment(loaded.device, loaded.dtype)
    print(f"\n{len(b.questions)} questions, {first_cfg.bench.max_new_tokens} new tokens, {loaded.device} "
          f"({machine.describe(env['cpu'])}); speedup against {b.labels[0]}:")
    # The first method's sampling settings, every model setting (a bf16 run against fp32 vanilla too): one table
    key = sbs.sampling_key(first_cfg)
    first = [label for (_, s), group in b.groups.items() if s == key for label in group]
    table, notes = speed_table([str(out / label) for label in first], str(out / b.labels[0]))
    print(markdown(overall(table), digits=2))
    tables = [table]
    for (_, s), group in list(b.groups.items())[1:]:  # another dtype, model or sampling: against its own first
        print(f"\nagainst {group[0]}:")
        vs, more = speed_table([str(out / label) for label in group], str(out / group[0]))
        notes += [n for n in more if n not in notes]
        print(markdown(overall(vs), digits=2))
        if s != key:
            tables.append(vs)
    engines = [label for label in b.labels if b.cfgs[label].engine.name == "vllm"]
    if len(engines) > 1 and b.cfgs[engines[0]].method.name == "vanilla":  # vLLM's methods over vLLM's own vanilla
        print(f"\nagainst {engines[0]} (vLLM's methods over its own vanilla):")
        vs, _ = speed_table([str(out / label) for label in engines], str(out / engines[0]))
        print(markdown(overall(vs), digits=2))
    if engines:
        acceptance(b, out)
    table = pd.concat(tables, ignore_index=True)
    for note in notes:  # a busy machine, named (the numbers stay)
        print(f"\n{note}")
    table.to_csv(out / "speed.csv", index=False)
    (out / "speed.md").write_text(markdown(table) + "\n" + "".join(f"\n{n}\n" for n in notes))
    print(f"every task and number: {out / 'speed.md'} (and .csv)")
    if args.generate:
        print(f"\nagainst {sbs.GENERATE}:")
        vs, _ = speed_table([str(out / label) for label in b.records], str(out / sbs.GENERATE))
        print(markdown(overall(vs), digits=2))
        vs.to_csv(out / "speed_vs_generate.csv", index=False)
    if args.batch > 1:
        rates = throughput_table(b.records, b.labels[0])
        print(f"\nthroughput at batch {args.batch} (tokens/s over each method's own decoding time; 95% interval "
              f"paired over the {math.ceil(len(b.questions) / b.chunk)} chunks of "
              f"{b.chunk} questions):")
        print(markdown(rates, digits=2))
        rates.to_csv(out / "throughput.csv", index=False)
    if args.phases:
        split = phase_table(b.runners, b.records)
        print("\nper-step time split (ms per step after the prefill; share of the step):")
        print(markdown(split, digits=2))
        split.to_csv(out / "phases.csv", index=False)


def overall(table: pd.DataFrame) -> pd.DataFrame:
    """A speed table's overall rows in the columns a terminal has room for: method, questions, MAT, tokens/s and
    the speedup with its 95% interval (the files hold every task and number)."""
    t = table[table["task"] == "overall"]
    out = t[[c for c in ("method", "sampling", "questions", "MAT", "tokens/s", "speedup") if c in t]].copy()
    if "speedup 95% low" in t:
        out["95% interval"] = [f"[{lo:.2f}, {hi:.2f}]" if lo != hi else "n=1 per task"
                               for lo, hi in zip(t["speedup 95% low"], t["speedup 95% high"])]
    return out


def throughput_table(records: dict, base: str):
    """Per method: its throughput (``evaluation.records.metrics.batch_stats``: all its tokens over the seconds it spent
    decoding its chunks), against the baseline's with its 95% interval (``load_interval``: paired over the chunks)
    and, with --generate, against generate's at the same batch size."""
    rates = {label: batch_stats(recs)["throughput"] for label, recs in records.items()}
    rows = []
    for label, rate in rates.items():
        row = {"method": label, "tokens/s": rate, f"speedup vs {base}": rate / rates[base]}
        span = load_interval(records[label], records[base]) if label != base else None
        row["95% interval"] = f"[{span[0]:.2f}, {span[1]:.2f}]" if span else "-"
        if sbs.GENERATE in rates:
            row[f"vs {sbs.GENERATE}"] = rate / rates[sbs.GENERATE]
        rows.append(row)
    return pd.DataFrame(rows)


def phase_table(runners: dict, records: dict):
    """ms per decoding step (prefill excluded) spent in each phase, per method, and the phases' shares."""
    rows = []
    for label, r in runners.items():
        if not isinstance(r.timer, PhaseTimer):
            continue
        steps = sum(d - p for rec in records[label]
                    for d, p in zip(rec["choices"][0]["decoding_steps"], rec["choices"][0]["prefill_step"]))
        total = sum(r.timer.seconds.values())
        row = {"method": label, "steps": steps}
        for phase in PHASES:
            row[f"{phase}_ms"] = 1000 * r.timer.seconds.get(phase, 0.0) / max(steps, 1)
        for phase in PHASES:
            row[f"{phase}_%"] = 100 * r.timer.seconds.get(phase, 0.0) / total if total else 0.0
        rows.append(row)
    return pd.DataFrame(rows)


if __name__ == "__main__":
    sys.exit(main())
