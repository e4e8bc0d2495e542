"""The vLLM side of ``engine=vllm`` (``evaluation.running.vllm``): run by the Python that has vLLM (``make vllm``'s
``.venv-vllm``), with the project on its path, driven over stdin/stdout by one JSON object a line.

    {"start": {LLM's keyword arguments}, "drafter": {...} | null}  -> {"version", "seconds"}
    {"add": ID, "prompt": [ids], "max_tokens": N, "stop": [ids]}   -> nothing
    {"step": true}   -> {"finished": [...], "steps": N}: vLLM's engine steps (N of them) until at least one request
                        has finished
    {"metrics": true} -> {"metrics": {name: value}}: vLLM's spec-decode counters (``LLM.get_metrics``)

The requests run with vLLM's continuous batching (``LLMEngine.add_request`` / ``step``, as ``LLM.generate`` drives
it): at most ``max_num_seqs`` at once, a request added when the caller has one (a conversation's next turn after its
answer). Each finished request comes back with its tokens, per engine step the tokens it committed (the accept
lengths: 1 for the step that ended its prefill, then accepted drafts + 1) and the seconds from its ``add`` to that
step's end, and vLLM's own per-request acceptance record (``per_request_spec_decode_metrics="detailed"``). vLLM's
log goes to stderr (the caller keeps it in a file); stdout carries only the replies.
"""
from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's prints and its engine processes' output: to stderr, never into the replies
    llm = engine = None
    live: dict[str, dict] = {}  # request id -> its clock and steps
    for line in sys.stdin:
        msg = json.loads(line)
        if "start" in msg:
            if msg.get("drafter") is not None:
                from methods.vllm_drafter import DRAFTER_ENV

                os.environ[DRAFTER_ENV] = json.dumps(msg["drafter"])  # read in vLLM's engine process
            import vllm
            from vllm import LLM

            t = time.perf_counter()
            llm = LLM(**msg["start"])
            engine = llm.llm_engine
            replies.write(json.dumps({"version": vllm.__version__, "seconds": round(time.perf_counter() - t, 3)})
                          + "\n")
        elif "add" in msg:
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            params = SamplingParams(temperature=0.0, max_tokens=msg["max_tokens"], stop_token_ids=msg["stop"],
                                    detokenize=False)  # the caller decodes the text, as our engine's runs do
            live[msg["add"]] = {"start": time.perf_counter(), "steps": [], "times": [], "tokens": []}
            engine.add_request(msg["add"], TokensPrompt(prompt_token_ids=msg["prompt"]), params)
        elif "step" in msg:
            finished, steps = [], 0
            while not finished:
                outputs = engine.step()
                steps += 1
                now = time.perf_counter()
                for out in outputs:
                    state = live[out.request_id]
                    new = list(out.outputs[0].token_ids)  # the whole output so far (RequestOutputKind.CUMULATIVE)
                    if len(new) > len(state["tokens"]):
                        state["steps"].append(len(new) - len(state["tokens"]))
                        state["times"].append(round(now - state["start"], 6))
                        state["tokens"] = new
                    if out.finished:
                        metrics = out.outputs[0].spec_decode_metrics
                        finished.append({"id": out.request_id, "token_ids": new, "steps": state["steps"],
                                         "step_times": state["times"], "reason": out.outputs[0].finish_reason,
                                         "spec": metrics.to_dict() if metrics is not None else None})
                        del live[out.request_id]
                if not outputs and not engine.has_unfinished_requests():
                    raise RuntimeError(f"vLLM has no request left but {sorted(live)} never finished")
            replies.write(json.dumps({"finished": finished, "steps": steps}) + "\n")
        elif "metrics" in msg:
            out = {}
            for m in llm.get_metrics():
                if m.name.startswith("vllm:spec_decode"):
                    out[m.name] = getattr(m, "values", None) or getattr(m, "value", None)
            replies.write(json.dumps({"metrics": out}) + "\n")
    replies.close()


if __name__ == "__main__":
    main()
