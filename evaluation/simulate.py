"""Simulated acceptance of the token-only drafters over recorded answers (``evaluation.reporting.simulate``): a run
of ours, or a trace file that no run of ours wrote.

    python -m evaluation.simulate RUN [--method pld --method "suffix method.tree=true" ...] [--set ...] [--out DIR]
    python -m evaluation.simulate --traces FILE.jsonl [--tokenizer MODEL] [--model MODEL] [--train N] ...

RUN is a run folder of ours (its config.yaml rebuilds the prompts: the model's format, the bench's paradigm). A
trace file holds one request per JSON line: ``prompt_token_ids`` and ``generated_token_ids`` (the layout of the
per-token acceptance data published with arXiv 2601.11580, SpecDecode-Bench/simulator's ``data/``), or text
``prompt`` and ``response`` with ``--tokenizer`` (the layout of arctic-inference's simulator: a model config of
ours or a tokenizer's folder; the prompt is tokenized with the tokenizer's special tokens, the response without);
``category`` (else the file's name) and ``id`` where it has them. Where a line carries an engine's recorded
per-position acceptance (``acc_NAME``: ``acc_len[i]``, the accept length of a step rooted at output token i), its
MAT is printed beside ours as ``recorded NAME``: over the engine's own output, ``len(acc_len)`` tokens, as
SpecDecode-Bench's simulator reads it (``request.py``'s ``generated_len``); where that output diverged from
``generated_token_ids`` (the published files' EAGLE runs, in about half their requests), its lengths are its own.

Each ``--method`` (a name, then its overrides; default: every registered method whose drafts depend on the tokens
alone, ``Proposer.token_only``) is built with its defaults and ``--set`` overrides, and decodes every answer as if the
target had produced it greedily, one proposer over all of them in their order, as a run goes (what a method
remembers across requests, SuffixDecoding's global tree, fed in that order). ``--train N``: the first N requests
are not decoded, only remembered (arctic-inference's simulator's train split); a trace file's train part is also
the corpus of the methods that read one (SAM's static automaton, REST's datastore) unless ``--set`` names another.
A trace file's model is its own: the artefacts of ``--model`` (a model config of ours) are read only when it is
given. No model is loaded: at most a tokenizer.

Writes, per method, ``simulated_<label>.jsonl`` (the answers with the simulated steps) and ``simulated.csv`` (MAT per
task and by output position, each row marked simulated or recorded, and the proposer's own time per step, with no
target: what its drafting costs on this CPU), and prints MAT per method and by position.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf

from evaluation.records.answers import answer_file, read_answers, to_file
from evaluation.records.bench import load_bench
from evaluation.records.metrics import OVERALL, position_table
from evaluation.reporting.render import markdown
from evaluation.reporting.simulate import proposer_ms, recorded_steps, simulate, simulated_mat
from evaluation.running.config import ModelSpec, compose_config, method_params, model_spec
from evaluation.running.models import load_tokenizer
from evaluation.running.paradigms import Paradigm
from evaluation.running.prompts import thinking_marker
from methods.automata import save_corpus
from methods.base import build_proposer, registry
from methods.common import HarnessError, exit_on_error, write_jsonl_atomic, write_text_atomic
from methods.params import artefact_key

BUCKET = 256
CORPORA = ("sam_corpus", "rest_datastore")  # the artefacts that are token corpora: a trace file's train part


def run_prompts(run: Path, records: list[dict]) -> tuple[dict, dict, object]:
    """(the run's config, (question, turn) -> the turn's prompt ids, the tokenizer), as the run built them."""
    config_file = run / "config.yaml"
    if not config_file.is_file():
        raise HarnessError(f"{run} has no config.yaml to rebuild its prompts from; give a run folder of ours, or a "
                           f"trace file with --traces")
    cfg = OmegaConf.to_container(OmegaConf.load(config_file), resolve=True)
    spec = ModelSpec(**cfg["model"])
    tok = load_tokenizer(spec)
    b = cfg["bench"]
    par = Paradigm(b.get("rounds", 1), b.get("num_choices", 1), b.get("bon_reference", False),
                   b.get("force_end_of_thinking", False))
    marker = thinking_marker(spec, tok)
    questions = {q.question_id: q for q in load_bench(b.get("path"), b.get("file", "spec_bench"),
                                                      question_ids=[r["question_id"] for r in records])}
    prompts = {}
    for r in records:
        q, turns = questions[r["question_id"]], r["choices"][0]["turns"]
        per = par.turns(q)
        for t in range(len(turns)):
            choice, turn = divmod(t, per)
            prompts[q.question_id, t] = par.prompt(spec, tok, q, turn, turns[choice * per: choice * per + turn],
                                                   marker)
    return cfg, prompts, tok


def _tokenizer(name: str):
    """A model config's tokenizer (``conf/model/NAME.yaml``), else a tokenizer's folder or hub id."""
    if (Path(__file__).resolve().parents[1] / "conf" / "model" / f"{name}.yaml").is_file():
        return load_tokenizer(model_spec(compose_config([f"model={name}"])))
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise HarnessError(f"--tokenizer {name}: neither a model config of ours (conf/model/) nor a tokenizer that "
                           f"loads ({type(e).__name__}); give a model config's name or a tokenizer's folder") from None


def _ids(value, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise HarnessError(f"{where} is not a list of token ids; a trace line holds prompt_token_ids and "
                           f"generated_token_ids (lists of integers), or prompt and response texts with --tokenizer")
    return value


def read_traces(path: Path, tokenizer: str | None) -> tuple[list[dict], dict, dict[str, list[list[int]]]]:
    """(records in our answer format, one turn each; (id, 0) -> prompt ids; recorded accept lengths per engine
    name: ``acc_NAME`` fields, each request's steps as ``recorded_steps`` gives them) of a trace file."""
    if not path.is_file():
        raise HarnessError(f"--traces {path}: no such file; give a JSON-lines file of prompt_token_ids and "
                           f"generated_token_ids (or prompt and response with --tokenizer)")
    tok = _tokenizer(tokenizer) if tokenizer else None
    records, prompts, recorded = [], {}, {}
    with open(path) as f:
        lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    for i, (n, line) in enumerate(lines):
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise HarnessError(f"{where} is not JSON ({e.msg}); a trace file holds one JSON object per line") from None
        if "prompt_token_ids" in row:
            prompt = _ids(row["prompt_token_ids"], f"{where} prompt_token_ids")
            answer = _ids(row.get("generated_token_ids"), f"{where} generated_token_ids")
        elif "prompt" in row and "response" in row:
            if tok is None:
                raise HarnessError(f"{where} holds texts (prompt, response): give --tokenizer MODEL to make them "
                                   f"token ids")
            prompt = tok(row["prompt"]).input_ids
            answer = tok(row["response"], add_special_tokens=False).input_ids
        else:
            raise HarnessError(f"{where} has neither prompt_token_ids and generated_token_ids nor prompt and "
                               f"response; it has {', '.join(sorted(row)) or 'no fields'}")
        qid = i
        records.append({"question_id": qid, "category": str(row.get("category", path.stem)),
                        "trace_id": row.get("id", row.get("question_id", i)),
                        "choices": [{"index": 0, "turns": [""], "token_ids": [answer], "new_tokens": [len(answer)],
                                     "wall_time": [math.nan], "decoding_steps": [0], "accept_lengths": []}]})
        prompts[qid, 0] = prompt
        for key, value in row.items():
            if key.startswith("acc_"):
                acc = value.get("acc_len") if isinstance(value, dict) else value
                if isinstance(acc, list) and acc:  # one per token of the engine's own output (below)
                    recorded.setdefault(key.removeprefix("acc_"), {})[qid] = recorded_steps(acc, len(acc))
    if not records:
        raise HarnessError(f"--traces {path} holds no requests")
    full = {name: steps for name, steps in recorded.items() if len(steps) == len(records)}
    return records, prompts, {name: [full[name][r["question_id"]] for r in records] for name in full}


def method_specs(given: list[str] | None) -> list[tuple[str, str, list[str]]]:
    """(label, method name, its overrides) per ``--method`` (``"suffix method.tree=true"``), or every token-only
    method's defaults."""
    if not given:
        return [(n, n, []) for n, cls in registry().items() if cls.token_only is True]
    out = []
    for spec in given:
        name, *overrides = spec.split()
        name = name.removeprefix("method=")
        out.append((" ".join([name, *overrides]), name, overrides))
    return out


def build(label: str, name: str, overrides: list[str], common: list[str], model: str, vocab: int, corpus: Path | None,
          own_artefacts: bool):
    """A factory of ``name``'s proposer with the overrides, or the reason it cannot be built."""
    cfg = compose_config([f"model={model}", f"method={name}", *common, *overrides])
    method, params = method_params(cfg)
    declared = registry()[method].Params
    given = {o.split("=", 1)[0].removeprefix("method.") for o in [*common, *overrides] if o.startswith("method.")}
    for f in dataclasses.fields(declared):
        key = artefact_key(f)
        if key and f.name not in given:  # a trace's model is its own: no artefact of another model's
            params[f.name] = str(corpus) if key in CORPORA and corpus is not None else (
                params[f.name] if own_artefacts else None)
    cls = registry()[method]
    if cls.token_only is not True:
        raise HarnessError(f"method '{method}' drafts from the target's logits or states, which recorded answers do "
                           f"not hold; simulate a token-only method")
    build_proposer(method, params, vocab_size=vocab, device=torch.device("cpu"))  # refused here, not mid-way

    def make():
        return build_proposer(method, params, vocab_size=vocab, device=torch.device("cpu"))

    return make


def label_file(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", nargs="?", help="a run folder of ours (or --traces FILE)")
    ap.add_argument("--traces", help="a JSON-lines trace file (module docstring)")
    ap.add_argument("--tokenizer", help="a trace file of texts: a model config name, or a tokenizer's folder")
    ap.add_argument("--model", help="a trace file: the model config whose artefacts (corpus, datastore) the methods "
                    "read (default: none: the trace's model is not ours)")
    ap.add_argument("--train", type=int, default=0, help="the first N requests are only remembered, not decoded")
    ap.add_argument("--method", action="append", help='a token-only method and its overrides, e.g. "suffix '
                    'method.tree=true" (default: all of them)')
    ap.add_argument("--set", nargs="*", default=[], help="overrides for every method, e.g. method.max_ngram=2")
    ap.add_argument("--out", help="output folder (default: the run folder, or the trace file's name beside it)")
    args = ap.parse_args(argv)
    if bool(args.run) == bool(args.traces):
        raise HarnessError("give a run folder of ours or --traces FILE (one of them)")
    if args.traces:
        path = Path(args.traces)
        records, prompts, recorded = read_traces(path, args.tokenizer)
        model, own = args.model or "smollm2-135m", args.model is not None
        vocab = 1 + max(t for r in records for ids in (prompts[r["question_id"], 0], r["choices"][0]["token_ids"][0])
                        for t in ids)
        out = Path(args.out) if args.out else path.with_suffix("").parent / f"{path.stem}_simulated"
    else:
        run = answer_file(args.run).parent
        records = read_answers(run)
        cfg, prompts, tok = run_prompts(run, records)
        model, own, vocab, recorded = cfg["model"]["name"], True, len(tok), {}
        out = Path(args.out) if args.out else run
    if not 0 <= args.train < len(records):
        raise HarnessError(f"--train {args.train}: keep at least one of the {len(records)} requests to decode")
    train = [(prompts[r["question_id"], t], ids) for r in records[: args.train]
             for t, ids in enumerate(r["choices"][0]["token_ids"])]
    records = records[args.train:]
    corpus = None
    if args.traces and train:  # the training answers, as a corpus file for SAM's static automaton and REST
        corpus = out / "train_corpus.npz"
        out.mkdir(parents=True, exist_ok=True)
        save_corpus(corpus, [a for _, a in train], {"source": f"{args.traces}, the first {args.train} requests"})
    makers, skipped = {}, {}
    for label, name, overrides in method_specs(args.method):
        try:
            makers[label] = build(label, name, overrides, args.set, model, vocab, corpus, own)
        except HarnessError as e:
            if args.method:
                raise
            skipped[label] = str(e)
    rows = []
    for label, make in makers.items():
        sim = simulate(records, prompts, make, train)
        write_jsonl_atomic(out / f"simulated_{label_file(label)}.jsonl", [to_file(r) for r in sim])
        rows += _rows(label, "simulated", sim, proposer_ms(sim))
    for name, steps in recorded.items():
        rec = [{**r, "choices": [{**r["choices"][0], "accept_lengths": s, "decoding_steps": [len(s)]}]}
               for r, s in zip(records, steps[args.train:])]
        rows += _rows(f"recorded {name}", "recorded", rec)
    table = pd.DataFrame(rows)
    write_text_atomic(out / "simulated.csv", table.to_csv(index=False))
    overall = table[(table["task"] == OVERALL) & (table["position"] == "")]
    print(f"{len(records)} requests{f' after {args.train} remembered' if train else ''}: MAT")
    print(markdown(overall[["method", "kind", "mat", "proposer_ms_per_step"]].rename(
        columns={"mat": "MAT", "proposer_ms_per_step": "proposer ms/step"}), digits=3))
    by = table[(table["task"] == OVERALL) & (table["position"] != "")]
    if len(by):
        wide = by.pivot(index="position", columns="method", values="mat")[list(dict.fromkeys(by["method"]))]
        wide = wide.reset_index()
        print(f"\nMAT by output position (buckets of {BUCKET} tokens)")
        print(markdown(wide, digits=2))
    for label, why in skipped.items():
        print(f"skipped {label}: {why}")
    print(f"-> {out / 'simulated.csv'}")
    return 0


def _rows(label: str, kind: str, records: list[dict], ms: float | None = None) -> list[dict]:
    rows = [{"method": label, "kind": kind, "task": task, "position": "", "mat": mat,
             "proposer_ms_per_step": ms if task == OVERALL else None}
            for task, mat in simulated_mat(records).items()]
    return rows + [{"method": label, "kind": kind, "task": OVERALL, "position": int(pos), "mat": row["mat"]}
                   for pos, row in position_table(records, BUCKET).iterrows()]


if __name__ == "__main__":
    sys.exit(main())
