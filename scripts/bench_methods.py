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
Each method is its overrides, the engine included: ``"method=tr engine=hf"`` runs TR on
the reference engine. ``--phases`` also splits every method's step time into forward,
drafting (propose), acceptance, update and cache commit (``methods.decode.PhaseTimer``;
on a GPU its synchronisations slow the run a little).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

import torch
from omegaconf import OmegaConf

from evaluation.data import load_bench
from evaluation.equal import compare
from evaluation.errors import exit_on_error
from evaluation.models import load_model
from evaluation.answers import ANSWERS, SUMMARY, folder_lock, write_json_atomic
from evaluation.paths import RESULTS
from evaluation.run import Runner, compose_config, environment, model_spec
from evaluation.speed import markdown, speed_table
from methods.decode import Generation, PhaseTimer

GENERATE = "generate"
PHASES = ("forward", "propose", "accept", "update", "commit")  # methods.decode's loop


class GenerateRunner(Runner):
    """Hugging Face generate in the runner's shoes: same prompts, same record format."""

    def decode(self, ids: list[int], max_new_tokens: int, turn: int) -> Generation:
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


def bench(args, out: Path) -> int:
    common = [f"bench={args.bench}", f"warmup={args.warmup}", *args.set]
    labels = [m.replace("method=", "").replace(" ", ",") for m in args.methods]
    cfgs = [compose_config(common + m.split()) for m in args.methods]
    b = cfgs[0].bench
    questions = load_bench(b.path, categories=b.categories, question_ids=b.question_ids,
                           limit_per_category=b.limit_per_category, skip_per_category=b.skip_per_category)
    loaded = load_model(model_spec(cfgs[0]))
    runners = {label: Runner(cfg, loaded) for label, cfg in zip(labels, cfgs)}
    run_cfgs = dict(zip(labels, cfgs))
    if args.generate:
        run_cfgs[GENERATE] = compose_config(common + ["method=vanilla"])
        runners[GENERATE] = GenerateRunner(run_cfgs[GENERATE], loaded)
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
    env = environment(loaded[2], next(loaded[0].parameters()).dtype)  # one process: one environment
    for label, recs in records.items():
        (out / label).mkdir(parents=True, exist_ok=True)
        tmp = out / label / (ANSWERS + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in recs))
        os.replace(tmp, out / label / ANSWERS)
        r = runners[label]
        write_json_atomic(out / label / SUMMARY, {
            "status": "finished", "model": r.spec.name, "method": GENERATE if label == GENERATE else r.method,
            "bench": b.name,
            "questions": len(questions), "side_by_side": labels + ([GENERATE] if args.generate else []),
            "session": session,  # one process: evaluation.report knows these runs were timed side by side
            "config": OmegaConf.to_container(run_cfgs[label], resolve=True),
            "environment": env,
            "method_state": r.proposer.summary()})
    unequal = []
    for label in records:
        _, total, mismatches, _ = compare(records[labels[0]], records[label])
        print(f"{label}: {total - len(mismatches)}/{total} turns token-identical to {labels[0]}")
        if mismatches:
            unequal.append(label)
    print(f"\n{len(questions)} questions, {b.max_new_tokens} new tokens, {loaded[2]}, "
          f"{torch.get_num_threads()} threads; speedup against {labels[0]}:")
    table = speed_table([str(out / label) for label in records], str(out / labels[0]))
    print(markdown(table))
    table.to_csv(out / "speed.csv", index=False)
    (out / "speed.md").write_text(markdown(table) + "\n")
    if args.generate:
        print(f"\nagainst {GENERATE}:")
        vs = speed_table([str(out / label) for label in records], str(out / GENERATE))
        print(markdown(vs[vs["task"] == "overall"]))
        vs.to_csv(out / "speed_vs_generate.csv", index=False)
    if args.phases:
        split = phase_table(runners, records)
        print("\nper-step time split (ms per step after the prefill; share of the step):")
        print(markdown(split, digits=2))
        split.to_csv(out / "phases.csv", index=False)
    print(f"-> {out}")
    if unequal:
        print(f"NOT LOSSLESS: {', '.join(unequal)} differ from {labels[0]} (python -m evaluation.equal "
              f"{out / labels[0]} {out / unequal[0]} says where and why)")
        return 1
    return 0


def phase_table(runners: dict, records: dict):
    """ms per decoding step (prefill excluded) spent in each phase, per method, and the phases' shares."""
    import pandas as pd

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
