"""Decoding methods side by side in one process: MAT, tokens/s and speedup per Spec-Bench task.

    python -m scripts.bench_methods "method=vanilla" "method=tr" "method=tr method.start=cold" \\
        [--bench spec_bench_sample] [--warmup 1] [--batch 1] [--generate] [--phases] [--out DIR]

Each positional argument is one method as Hydra overrides (as for evaluation.run); the
first is the baseline. All methods decode the same questions in one process, question by
question, the order of the methods rotating from one question to the next, so that the
drift of a shared machine falls on all alike. ``--batch B`` decodes at batch size B
(``runtime.batch_size``, continuous batching: ``Runner.answer_all``): the questions are split
into chunks of 4B in a row (``CHUNK``), every method answers a whole chunk in turn, the order
rotating from chunk to chunk, and each chunk is its own clock segment, so that a method's
throughput (``evaluation.metrics.batch_stats``) counts only its own decoding; a second table
gives it. ``--generate`` adds Hugging Face ``model.generate(do_sample=False)`` as an outside
reference, at the same batch size (left padding): the engine reference. Writes one answer file per
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
"""
from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf

from evaluation.answers import ANSWERS, SUMMARY, folder_lock, to_file
from evaluation.config import batch_size, compose_config, method_params, model_spec, sampling_settings
from evaluation.data import Question, load_bench
from evaluation.equal import NEAR_TIE, compare, explain
from evaluation.metrics import batch_stats
from evaluation.models import load_model
from evaluation.prompts import prompt_ids
from evaluation.runner import Runner, environment
from evaluation.speed import markdown, speed_table
from methods import machine
from methods.base import check_method
from methods.common import RESULTS, HarnessError, exit_on_error, write_json_atomic, write_jsonl_atomic
from methods.decode import Generation, PhaseTimer

GENERATE = "generate"
CHUNK = 4  # at batch B, each method answers CHUNK * B questions in a row: the batch stays full for most of the chunk
PHASES = ("forward", "propose", "accept", "update", "commit")  # methods.decode's loop


class GenerateRunner(Runner):
    """Hugging Face generate in the runner's shoes: same prompts, same record format, the same batch size.

    ``answer_all`` answers ``batch`` questions at a time: one ``model.generate`` for the group's first turns (left
    padded, with their attention mask), then one for the second turns of those that have one, each prompt holding
    the answers before it. Every turn of a call gets the call's time as its ``wall_time`` and clock, no
    ``first_token_time`` (generate does not tell), and accept lengths of 1. With one slot: one turn at a time."""

    def answer_all(self, questions: list[Question], done: Callable[[dict], None], batch: int | None = None) -> None:
        self.engine.use_threads()
        size = batch or self.batch_size
        for at in range(0, len(questions), size):
            group = questions[at: at + size]
            answers, turns, loads = ([[] for _ in group] for _ in range(3))
            for i in range(max(len(q.turns) for q in group)):
                rows = [j for j, q in enumerate(group) if i < len(q.turns)]
                prompts = [prompt_ids(self.spec, self.tok, list(group[j].turns[: i + 1]), answers[j]) for j in rows]
                for j, ids in zip(rows, prompts):
                    if len(ids) >= self.context:
                        raise HarnessError(f"question {group[j].question_id} turn {i + 1}: the prompt has {len(ids)} "
                                           f"tokens but {self.spec.name} takes {self.context}; leave it out with "
                                           f"bench.question_ids or raise model.max_context if the model allows it")
                with machine.Load() as load:  # how busy the machine was while this call was timed
                    gens = self.generate(prompts, [min(self.max_new_tokens, self.context - len(ids))
                                                   for ids in prompts])
                for j, gen in zip(rows, gens):
                    text_ids = gen.token_ids[:-1] if gen.stop == "eos" else gen.token_ids
                    answers[j].append(self.tok.decode(text_ids, skip_special_tokens=True).strip())
                    turns[j].append(gen)
                    loads[j].append(load)
            for j, q in enumerate(group):
                done(self._record(q, answers[j], turns[j], loads[j], size))

    def generate(self, prompts: list[list[int]], limits: list[int]) -> list[Generation]:
        """One greedy ``model.generate`` of ``prompts`` (left padded), each row cut at its own limit and first stop
        token (a row generates on, padded, until the batch's last one stops)."""
        longest = max(map(len, prompts))
        pad = next(t for t in (self.tok.pad_token_id, self.tok.eos_token_id, min(self.stop_ids)) if t is not None)
        ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        t = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=mask, max_new_tokens=max(limits), do_sample=False,
                                      eos_token_id=sorted(self.stop_ids), pad_token_id=pad)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        end = time.perf_counter()
        gens = []
        for row, limit in zip(out[:, longest:].tolist(), limits):
            new = row[:limit]
            new = new[: next((k + 1 for k, token in enumerate(new) if token in self.stop_ids), len(new))]
            stop = "eos" if new and new[-1] in self.stop_ids else "length"
            gens.append(Generation(new, [1] * len(new), 0.0, end - t, stop, clock=(t, end)))
        return gens


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("methods", nargs="+", help='each one method as overrides, e.g. "method=tr method.k=4"')
    ap.add_argument("--bench", default="spec_bench_sample", help="bench config, plus any bench.* overrides")
    ap.add_argument("--set", nargs="*", default=[], help="overrides for every method (model=..., bench.*=...)")
    ap.add_argument("--warmup", type=int, default=1, help="passes over the first question per method")
    ap.add_argument("--batch", type=int, default=1, help="batch size of every method (runtime.batch_size)")
    ap.add_argument("--generate", action="store_true", help="add model.generate as a reference")
    ap.add_argument("--phases", action="store_true", help="split each method's step time by phase")
    ap.add_argument("--out", default=str(RESULTS / "bench" / time.strftime("%Y-%m-%d_%H-%M-%S")))
    args = ap.parse_args(argv)
    out = Path(args.out)
    with folder_lock(out, fix="wait for it to finish, or choose another --out"):
        return bench(args, out)


def sampling_key(cfg) -> str:
    return repr(sampling_settings(cfg))


def bench(args, out: Path) -> int:
    common = [f"bench={args.bench}", f"warmup={args.warmup}", *args.set, f"runtime.batch_size={args.batch}"]
    labels = [m.replace("method=", "").replace(" ", ",") for m in args.methods]
    cfgs = [compose_config(common + m.split()) for m in args.methods]
    b = cfgs[0].bench
    questions = load_bench(b.path, categories=b.categories, question_ids=b.question_ids,
                           limit_per_category=b.limit_per_category, skip_per_category=b.skip_per_category)
    if args.generate and not all(sampling_settings(c).greedy for c in cfgs):
        raise HarnessError("--generate compares with greedy model.generate: leave it out at sampling.temperature > 0 "
                           "(sampled methods are checked against vanilla sampling with the same seed)")
    for cfg in cfgs:  # what each method's settings alone refuse, before any model loads
        check_method(*method_params(cfg))
        if batch_size(cfg) != args.batch:
            raise HarnessError(f"a method sets runtime.batch_size={batch_size(cfg)}: give the batch size of every "
                               f"method with --batch (here {args.batch})")
    if args.batch > len(questions):
        raise HarnessError(f"--batch {args.batch} but the bench has {len(questions)} question(s), so the batch could "
                           f"never be full; give a batch size of at most {len(questions)} or more questions")
    models: dict[str, tuple] = {}  # one model per distinct spec ("method=vanilla model.dtype=bfloat16" loads another)
    # Each method's tokens are checked against the first method of its model setting and sampling settings.
    runners, run_cfgs, same_model = {}, dict(zip(labels, cfgs)), {}
    for label, cfg in zip(labels, cfgs):
        key = repr(model_spec(cfg))
        if key not in models:
            models[key] = load_model(model_spec(cfg))
        runners[label] = Runner(cfg, models[key])
        same_model.setdefault((key, sampling_key(cfg)), []).append(label)
    loaded = next(iter(models.values()))
    if args.generate:
        run_cfgs[GENERATE] = compose_config(common + ["method=vanilla"])
        runners[GENERATE] = GenerateRunner(run_cfgs[GENERATE], loaded)
        same_model[repr(model_spec(cfgs[0])), sampling_key(cfgs[0])].append(GENERATE)
    for r in runners.values():
        for _ in range(args.warmup):
            r.answer(questions[0])
        if args.phases and not isinstance(r, GenerateRunner):
            r.timer = PhaseTimer(r.device)

    records = {label: [] for label in runners}
    order = list(runners)
    chunk = 1 if args.batch == 1 else CHUNK * args.batch  # batch 1: question by question
    from tqdm import tqdm

    with tqdm(total=len(questions), desc="questions", unit="q") as bar:
        for i, at in enumerate(range(0, len(questions), chunk)):
            part = questions[at: at + chunk]
            for label in order[i % len(order):] + order[: i % len(order)]:
                r = runners[label]
                # the chunk is its own clock segment: the method's throughput counts its own decoding time alone
                r.segment, r.clock0 = uuid.uuid4().hex[:12], time.perf_counter()
                r.answer_all(part, lambda rec, label=label: records[label].append({**rec, "method": label}))
            bar.update(len(part))
    session = uuid.uuid4().hex
    for label, recs in records.items():
        write_jsonl_atomic(out / label / ANSWERS, [to_file(r) for r in recs])
        r = runners[label]
        r.engine.use_threads()  # the environment below records the thread count this method ran with
        OmegaConf.save(run_cfgs[label], out / label / "config.yaml", resolve=True)  # evaluation.equal rebuilds from it
        write_json_atomic(out / label / SUMMARY, {
            "status": "finished", "model": r.spec.name, "method": GENERATE if label == GENERATE else r.method,
            "bench": b.name,
            "questions": len(questions), "side_by_side": list(runners),
            "session": session,  # one process: evaluation.report knows these runs were timed side by side
            "config": OmegaConf.to_container(run_cfgs[label], resolve=True),
            "environment": environment(r.device, next(r.model.parameters()).dtype),
            "engine": r.engine.summary(),
            "method_state": r.proposer.summary()})
    unequal = []
    for group in same_model.values():  # each method against the first of its own model (dtype) and sampling
        ref = group[0]
        for label in group:
            if not runners[label].proposer.samples_like_vanilla \
                    and not sampling_settings(run_cfgs[label]).greedy:
                same, total, _, _ = compare(records[ref], records[label])
                print(f"{label}: {same}/{total} turns token-identical to {ref}; its rule keeps the target's "
                      f"distribution, not vanilla's draws (not checked token by token)")
                continue
            mismatches, fails, verdict = lossless(out, ref, label, records)
            if fails:
                unequal.append((ref, label))
            print(f"{label}: {verdict}")
            for m in mismatches:
                print("    " + m.describe())
    env = environment(loaded[2], next(loaded[0].parameters()).dtype)
    print(f"\n{len(questions)} questions, {b.max_new_tokens} new tokens, {loaded[2]} "
          f"({machine.describe(env['cpu'])}); speedup against {labels[0]}:")
    # The first method's sampling settings, every model setting (a bf16 run against fp32 vanilla too): one table
    first = [label for (_, s), group in same_model.items() if s == sampling_key(cfgs[0]) for label in group]
    table, notes = speed_table([str(out / label) for label in first], str(out / labels[0]))
    print(markdown(table))
    tables = [table]
    for (_, s), group in list(same_model.items())[1:]:  # another dtype, model or sampling: against its own first
        print(f"\nagainst {group[0]}:")
        vs, more = speed_table([str(out / label) for label in group], str(out / group[0]))
        notes += [n for n in more if n not in notes]
        print(markdown(vs[vs["task"] == "overall"]))
        if s != sampling_key(cfgs[0]):
            tables.append(vs)
    table = pd.concat(tables, ignore_index=True)
    for note in notes:  # a busy machine, named (the numbers stay)
        print(f"\n{note}")
    table.to_csv(out / "speed.csv", index=False)
    (out / "speed.md").write_text(markdown(table) + "\n" + "".join(f"\n{n}\n" for n in notes))
    if args.generate:
        print(f"\nagainst {GENERATE}:")
        vs, _ = speed_table([str(out / label) for label in records], str(out / GENERATE))
        print(markdown(vs[vs["task"] == "overall"]))
        vs.to_csv(out / "speed_vs_generate.csv", index=False)
    if args.batch > 1:
        rates = throughput_table(records, labels[0])
        print(f"\nthroughput at batch {args.batch} (tokens/s over each method's own decoding time):")
        print(markdown(rates, digits=2))
        rates.to_csv(out / "throughput.csv", index=False)
    if args.phases:
        split = phase_table(runners, records)
        print("\nper-step time split (ms per step after the prefill; share of the step):")
        print(markdown(split, digits=2))
        split.to_csv(out / "phases.csv", index=False)
    print(f"-> {out}")
    if unequal:
        ref, label = unequal[0]
        print(f"NOT LOSSLESS: {', '.join(b for _, b in unequal)} differ(s) from their reference beyond near-ties "
              f"(python -m evaluation.equal {out / ref} {out / label} says where and why)")
        return 1
    return 0


def lossless(out: Path, ref: str, label: str, records: dict) -> tuple[list, bool, str]:
    """(the divergences, whether they break losslessness, a one-line verdict) for ``label`` against ``ref`` (same
    model, same dtype). Each divergence is classified by re-running the model (``evaluation.equal.explain``); in
    fp32 every one counts, in reduced precision only those that are not near-ties."""
    same, total, mismatches, _ = compare(records[ref], records[label])
    verdict = f"{same}/{total} turns token-identical to {ref}"
    if not mismatches:
        return [], False, verdict
    dtype = explain(out / ref, records[ref], mismatches)
    first = [m for m in mismatches if not (m.kind or "").startswith("follows")]
    ties = sum(m.kind == NEAR_TIE for m in first)
    verdict += f"; {len(first)} divergence(s) in {dtype}, {ties} of them near-ties"
    return mismatches, dtype == "float32" or ties < len(first), verdict


def throughput_table(records: dict, base: str):
    """Per method: its throughput (``evaluation.metrics.batch_stats``: all its tokens over the seconds it spent
    decoding its chunks), against the baseline's and, with --generate, against generate's at the same batch size."""
    rates = {label: batch_stats(recs)["throughput"] for label, recs in records.items()}
    rows = []
    for label, rate in rates.items():
        row = {"method": label, "tokens/s": rate, f"speedup vs {base}": rate / rates[base]}
        if GENERATE in rates:
            row[f"vs {GENERATE}"] = rate / rates[GENERATE]
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
