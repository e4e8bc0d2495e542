"""Our engine's vanilla step beside vLLM's, at B = 1, 4, 8 and 16 requests at once: the same prompts (token ids),
greedy, the same cores, in one process and one sequence (the two engines alternate, round after round), with the
tokens of the two engines compared prompt by prompt in the same run.

    python -m scripts.bench_engine                         # the embedded model; vLLM beside it where make vllm ran
    python -m scripts.bench_engine --batches 8 --rounds 3 --sets first
    python -m scripts.bench_engine --no-vllm model.dtype=bfloat16

The prompt sets: ``first``, the first turns of Spec-Bench's smoke sample (questions 81, 82, 161, 162, 241, 242, 321,
322, 401, 402, 481, 482: 40 to 769 prompt tokens in SmolLM2's template), and ``smoke``, the whole smoke sample (14
turns: the two writing questions' second turns follow our answers to their first). B requests decode at once with
continuous batching (a freed slot takes the next prompt), ``--tokens`` new tokens at most. Ours: ``evaluation.api``'s
decoder on the configured engine (static: threads chosen as a run chooses them); vLLM's: its offline engine
(``engine=vllm``'s worker, its settings from ``--vllm-set``: eager, prefix caching off as ours has none, its
worker computing on every core, ``VLLM_CPU_NUM_OF_RESERVED_CPU=0``), ``max_num_seqs`` the largest B, and at most
B requests in it at once. Printed per set and B: tokens/s (the tokens over the wall-clock seconds of the whole set,
prefills included), ms per forward (ours: forwards of the batch, a prefill one; vLLM: engine steps), each the best
of ``--rounds``, ours over vLLM's, and how many prompts' tokens are identical in both engines (every round).
"""
from __future__ import annotations

import argparse
import time

from methods import machine
from methods.common import HarnessError, exit_on_error

IDS = (81, 82, 161, 162, 241, 242, 321, 322, 401, 402, 481, 482)  # the smoke sample's questions


def prompt_sets(spec, tok, names: list[str], answer) -> dict[str, list[list[int]]]:
    """The prompts (token ids) of each set in ``names``; ``answer(prompt_ids)`` gives the text of our first answer
    where a second turn needs it."""
    from evaluation.records.bench import fetch, read_questions
    from evaluation.running.prompts import prompt_ids

    questions = {q.question_id: q for q in read_questions(fetch("spec_bench"))}
    first = [prompt_ids(spec, tok, [questions[i].turns[0]], []) for i in IDS]
    out = {"first": first}
    if "smoke" in names:
        out["smoke"] = first + [prompt_ids(spec, tok, list(questions[i].turns[:2]), [answer(p)])
                                for i, p in zip(IDS, first) if len(questions[i].turns) > 1]
    return {name: out[name] for name in names}


class Ours:
    """Our decoder, counting the forwards of the batch."""

    def __init__(self, overrides: list[str], batch: int):
        from evaluation.api import load

        self.decoder = load(method="vanilla", overrides=overrides, batch_size=batch)
        engine = self.decoder.engine
        self.forwards, rows = 0, engine.forward_rows

        def counted(*args, **kwargs):
            self.forwards += 1
            return rows(*args, **kwargs)
        engine.forward_rows = counted  # an instance attribute: this decoder's engine only

    def run(self, prompts, tokens: int, batch: int) -> tuple[list[list[int]], float, int]:
        self.forwards = 0
        t = time.perf_counter()
        gens = self.decoder.decode(prompts, tokens, slots=batch)
        return [g.token_ids for g in gens], time.perf_counter() - t, self.forwards


class Vllm:
    """vLLM's offline engine in ``engine=vllm``'s worker, fed at most B requests at once."""

    def __init__(self, overrides: list[str], batch: int):
        from evaluation.running.config import compose_config
        from evaluation.running.vllm import make_runner

        self.runner = make_runner(compose_config(["method=vanilla", "engine=vllm", *overrides,
                                                  f"runtime.batch_size={batch}"]))
        self.worker, self.stops = self.runner.engine.worker, sorted(self.runner.stop_ids)

    def run(self, prompts, tokens: int, batch: int) -> tuple[list[list[int]], float, int]:
        queue, out, steps, busy = list(enumerate(prompts)), {}, 0, 0
        t = time.perf_counter()
        while queue or busy:
            while queue and busy < batch:
                i, p = queue.pop(0)
                self.worker.send({"add": str(i), "prompt": p, "max_tokens": tokens, "stop": self.stops}, reply=False)
                busy += 1
            reply = self.worker.send({"step": True})
            steps += reply["steps"]
            for done in reply["finished"]:
                out[int(done["id"])] = done["token_ids"]
                busy -= 1
        return [out[i] for i in range(len(prompts))], time.perf_counter() - t, steps

    def close(self) -> None:
        self.runner.close()


def vllm_ready() -> bool:
    """Whether vLLM's arm is installed (``make vllm``)."""
    from evaluation.running.vllm import python_with_vllm

    try:
        python_with_vllm("auto")
        return True
    except HarnessError:
        return False


@exit_on_error
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--sets", nargs="+", default=["first", "smoke"], choices=["first", "smoke"])
    ap.add_argument("--tokens", type=int, default=128, help="new tokens at most per prompt")
    ap.add_argument("--rounds", type=int, default=2, help="each engine's runs of every set and B (the best kept)")
    ap.add_argument("--no-vllm", action="store_true", help="our engine only")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of our side (model=..., engine.threads=...); the "
                                                 "model ones go to vLLM too")
    ap.add_argument("--vllm-set", nargs="*", default=["engine.kv_cache_gib=1"], help="engine=vllm's settings")
    args = ap.parse_args(argv)
    if min(args.batches) < 1 or args.tokens < 1 or args.rounds < 1:
        raise HarnessError("--batches, --tokens and --rounds take whole numbers of at least 1")
    if any(o.replace(" ", "").lower() == "engine.prefix_caching=true" for o in args.vllm_set):
        raise HarnessError("--vllm-set engine.prefix_caching=true: our engine has no prefix cache, so the two steps "
                           "would not compare; leave vLLM's off")
    ours = Ours(args.overrides, max(args.batches))
    spec_name = ours.decoder.name
    use_vllm = not args.no_vllm and vllm_ready()
    theirs = Vllm([o for o in args.overrides if not o.startswith("engine")] + args.vllm_set, max(args.batches)) \
        if use_vllm else None
    from evaluation.running.config import compose_config, model_spec

    spec = model_spec(compose_config(["method=vanilla", *args.overrides]))
    tok = ours.decoder.tokenizer
    sets = prompt_sets(spec, tok, args.sets,
                       lambda p: tok.decode(ours.decoder.decode([p], args.tokens, slots=1)[0].token_ids,
                                            skip_special_tokens=True))
    engines = {"ours": ours, **({"vllm": theirs} if theirs else {})}
    print(f"{spec_name}, vanilla, greedy, {args.tokens} new tokens at most; {machine.describe(machine.cpu())}; "
          f"ours: engine={ours.decoder.engine.name} ({ours.decoder.engine.threads} threads)"
          + (f"; vLLM {theirs.runner.engine.reply['version']} (eager, prefix caching "
             f"{'on' if theirs.runner.engine.start['enable_prefix_caching'] else 'off'}, all cores)" if theirs
             else "; vLLM: not installed (make vllm) or --no-vllm"))
    for name, prompts in sets.items():
        for engine in engines.values():  # warm-up: every B's shapes once, untimed
            engine.run(prompts[:max(args.batches)], 8, max(args.batches))
        best: dict[tuple, tuple] = {}
        same: dict[int, list[int]] = {}
        for r in range(args.rounds):
            for b in args.batches:
                order = list(engines.items()) if r % 2 == 0 else list(engines.items())[::-1]
                answers = {}
                for label, engine in order:
                    ids, seconds, forwards = engine.run(prompts, args.tokens, b)
                    answers[label] = ids
                    tokens = sum(map(len, ids))
                    if (label, b) not in best or seconds < best[label, b][1]:
                        best[label, b] = (tokens, seconds, forwards)
                if theirs:
                    same.setdefault(b, []).append(sum(a == v for a, v in zip(answers["ours"], answers["vllm"])))
        print(f"\n{name}: {len(prompts)} prompts, {min(map(len, prompts))} to {max(map(len, prompts))} tokens")
        print("|   B | ours tok/s | ours ms/forward |" + (" vLLM tok/s | vLLM ms/step | ours / vLLM | same tokens |"
                                                          if theirs else ""))
        print("|---:|---:|---:|" + ("---:|---:|---:|---|" if theirs else ""))
        for b in args.batches:
            t, s, f = best["ours", b]
            line = f"| {b:3d} | {t / s:10.1f} | {1000 * s / f:15.1f} |"
            if theirs:
                vt, vs, vf = best["vllm", b]
                line += (f" {vt / vs:10.1f} | {1000 * vs / vf:12.1f} | {(t / s) / (vt / vs):10.2f}x | "
                         f"{min(same[b])}/{len(prompts)} |")
            print(line)
    if theirs:
        theirs.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
