"""Decoding methods side by side in one process: MAT, tokens/s and speedup per Spec-Bench task.

    python -m scripts.bench_methods "method=vanilla" "method=tr" "method=tr method.start=cold" \\
        [--bench spec_bench_sample] [--warmup 1] [--generate] [--phases] [--out DIR]

Each positional argument is one method as Hydra overrides (as for evaluation.run); the
first is the baseline. All methods decode the same questions in one process, question by
question, the order of the methods rotating from one question to the next, so that the
drift of a shared machine falls on all alike. ``--generate`` adds Hugging Face
``model.generate(do_sample=False)`` as an outside reference. Writes one answer file per
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
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf

from evaluation.answers import ANSWERS, SUMMARY, folder_lock, to_file
from evaluation.config import compose_config, method_params, model_spec, sampling_settings
from evaluation.data import load_bench
from evaluation.equal import NEAR_TIE, compare, explain
from evaluation.models import load_model
from evaluation.runner import Runner, environment
from evaluation.speed import markdown, speed_table
from methods.base import check_method
from methods.common import RESULTS, HarnessError, exit_on_error, write_json_atomic, write_jsonl_atomic
from methods.decode import Generation, PhaseTimer
from methods.machine import describe

GENERATE = "generate"
PHASES = ("forward", "propose", "accept", "update", "commit")  # methods.decode's loop


class GenerateRunner(Runner):
    """Hugging Face generate in the runner's shoes: same prompts, same record format."""

    def decode(self, ids: list[int], max_new_tokens: int, turn: int, question: int = 0) -> Generation:
        t = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(torch.tensor([ids], device=self.device), max_new_tokens=max_new_tokens,
                                      do_sample=False, eos_token_id=sorted(self.stop_ids))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        new = out[0, len(ids):].tolist()
        stop = "eos" if new and new[-1] in self.stop_ids else "length"
        return Generation(new, [1] * len(new), 0.0, time.perf_counter() - t, stop)


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("methods", nargs="+", help='each one method as overrides, e.g. "method=tr method.k=4"')
    ap.add_argument("--bench", default="spec_bench_sample", help="bench config, plus any bench.* overrides")
    ap.add_argument("--set", nargs="*", default=[], help="overrides for every method (model=..., bench.*=...)")
    ap.add_argument("--warmup", type=int, default=1, help="passes over the first question per method")
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
    common = [f"bench={args.bench}", f"warmup={args.warmup}", *args.set]
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
    from tqdm import tqdm

    for i, q in enumerate(tqdm(questions, desc="questions", unit="q")):
        for label in order[i % len(order):] + order[: i % len(order)]:
            rec = runners[label].answer(q)
            rec["method"] = label
            records[label].append(rec)
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
          f"({describe(env['cpu'])}); speedup against {labels[0]}:")
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
