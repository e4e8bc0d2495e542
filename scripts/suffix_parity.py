"""``method=suffix`` step for step against arctic-inference itself: every draft over recorded answers compared with
what the library's ``SuffixDecodingCache`` drafts when vLLM's proposer drives it.

    python -m scripts.suffix_parity RUN [--backend python|arctic] [--set method.max_spec_factor=2 ...]
    python -m scripts.suffix_parity --traces FILE.jsonl [--tokenizer MODEL] ...

RUN is a run folder of ours (a vanilla run of ``bench=spec_bench_sample``, say), or ``--traces`` a trace file
(``evaluation.simulate``'s layouts). Every answer is decoded as ``evaluation.simulate`` decodes it (the recorded
tokens as the target's), one proposer over all answers in their order, so that the global tree holds the answers
before; at every step the same context goes to the library's cache (arctic-inference 0.3.0,
snowflakedb/ArcticInference 9d46438, ``arctic_inference/suffix_decoding/cache.py``) as vLLM's
``SuffixDecodingProposer.propose`` hands it over (``vllm/v1/spec_decode/suffix_decoding.py``: a request starts with
its prompt at its first step, the tokens sampled since are added, the last ``max_depth`` tokens speculated from; a
finished request's last tokens added, then it stops), and its draft (tokens, ``parents``, probabilities, score, match
length) must be ours exactly. Both modes (chain and tree), the global tree on (``--set`` overrides both sides'
settings). Prints the steps compared and the first mismatches; exit 1 when any step differs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from evaluation.records.answers import answer_file, read_answers
from evaluation.reporting.simulate import simulate_turn
from evaluation.running.config import compose_config, method_params
from evaluation.simulate import read_traces, run_prompts
from methods.base import build_proposer
from methods.common import HarnessError, exit_on_error
from methods.suffix_tree import native


class VllmDriven:
    """arctic-inference's ``SuffixDecodingCache``, driven as vLLM's suffix proposer drives it, one request at a
    time: ``draft(context, prompt_len)`` at every step, ``finish(answer)`` when a request ends."""

    def __init__(self, params):
        native()  # the library, or a one-line error
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.p = params
        self.cache = SuffixDecodingCache(max_tree_depth=params.max_depth,
                                         max_cached_requests=params.max_cached_requests)
        self.request, self.next, self.prompt, self.fed = None, 0, [], 0

    def _start(self, prompt: list[int]) -> None:
        self.request, self.next, self.prompt, self.fed = self.next, self.next + 1, prompt, 0
        self.cache.start_request(self.request, prompt)

    def draft(self, context: list[int], prompt_len: int):
        if self.request is None:
            self._start(context[:prompt_len])
        new = context[prompt_len + self.fed:]
        self.cache.add_active_response(self.request, new)
        self.fed += len(new)
        p = self.p
        return self.cache.speculate(self.request, context[-p.max_depth:],
                                    max_spec_tokens=p.max_depth if p.max_spec_tokens is None else p.max_spec_tokens,
                                    max_spec_factor=p.max_spec_factor, max_spec_offset=p.max_spec_offset,
                                    min_token_prob=p.min_token_prob, use_tree_spec=p.tree)

    def finish(self, prompt: list[int], answer: list[int]) -> None:
        if self.request is None:
            self._start(prompt)
        if answer[self.fed:]:
            self.cache.add_active_response(self.request, answer[self.fed:])
        self.cache.stop_request(self.request)
        self.request = None


def compare(records: list[dict], prompts: dict, overrides: list[str]) -> tuple[int, list[str]]:
    """(steps compared, a line per differing step) of ``method=suffix`` with ``overrides`` against the library."""
    name, params = method_params(compose_config(["method=suffix", *overrides]))
    ours = build_proposer(name, params, vocab_size=1, device=torch.device("cpu"))
    theirs = VllmDriven(ours.params)
    steps, diffs = 0, []

    def watch(context, draft):
        nonlocal steps
        steps += 1
        lib, mine = theirs.draft(context.tolist(), ours.prompt_len), ours.last
        got = (list(lib.token_ids), list(lib.parents), list(lib.probs), lib.score, lib.match_len)
        want = (mine.token_ids, mine.parents, mine.probs, mine.score, mine.match_len)
        if got != want:
            diffs.append(f"request {theirs.request}, {len(context)} tokens: arctic {got}, ours {want}")

    for r in records:
        for t, ids in enumerate(r["choices"][0]["token_ids"]):
            prompt = prompts[r["question_id"], t]
            simulate_turn(ours, prompt, ids, t, watch)
            theirs.finish(prompt, ids)
    return steps, diffs


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", nargs="?", help="a run folder of ours (or --traces FILE)")
    ap.add_argument("--traces", help="a JSON-lines trace file (evaluation.simulate's layouts)")
    ap.add_argument("--tokenizer", help="a trace file of texts: a model config name, or a tokenizer's folder")
    ap.add_argument("--backend", default="python", choices=("python", "arctic"), help="whose trees ours drafts with")
    ap.add_argument("--set", nargs="*", default=[], help="method=suffix's overrides, e.g. method.max_spec_factor=2")
    args = ap.parse_args(argv)
    if bool(args.run) == bool(args.traces):
        raise HarnessError("give a run folder of ours or --traces FILE (one of them)")
    for o in args.set:
        if o.startswith(("method.tree=", "method.backend=")):
            raise HarnessError(f"--set {o}: both modes run, each compared (the backend: --backend); leave it out")
        if o == "method.max_spec_tokens=auto":
            raise HarnessError("--set method.max_spec_tokens=auto: auto is ours (a cap calibrated on this machine), "
                               "the library has none; give a number")
    if args.traces:
        records, prompts, _ = read_traces(Path(args.traces), args.tokenizer)
    else:
        run = answer_file(args.run).parent
        records = read_answers(run)
        prompts = run_prompts(run, records)[1]
    failed = False
    for tree in ("false", "true"):
        steps, diffs = compare(records, prompts, [f"method.backend={args.backend}", f"method.tree={tree}", *args.set])
        print(f"tree={tree}: {steps} steps over {len(records)} answers, {len(diffs)} differ from arctic-inference's "
              f"SuffixDecodingCache.speculate")
        for line in diffs[:5]:
            print(f"  {line}")
        failed |= bool(diffs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
