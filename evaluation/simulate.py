"""Simulated acceptance of the token-only drafters over a run's recorded answers (``evaluation.reporting.simulate``).

    python -m evaluation.simulate RUN [--method pld --method sam ...] [--set method.max_ngram=2 ...] [--out DIR]

RUN is a run folder of ours (its config.yaml rebuilds the prompts: the model's format, the bench's paradigm). Each
``--method`` (default: every registered method whose drafts depend on the tokens alone, ``Proposer.token_only``)
is built with its defaults for the run's model (its corpus, its datastore) and ``--set`` overrides, and decodes every
answer of RUN as if the target had produced it greedily. Writes, per method, ``simulated_<method>.jsonl`` (the
answers with the simulated steps) and ``simulated.csv`` (MAT per task and by output position, each row marked
simulated), and prints the MAT per method. No model is loaded: only the tokenizer.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf

from evaluation.records.answers import answer_file, read_answers, to_file
from evaluation.records.bench import load_bench
from evaluation.records.metrics import position_table
from evaluation.reporting.render import markdown
from evaluation.reporting.simulate import simulate, simulated_mat
from evaluation.running.config import ModelSpec, compose_config, method_params
from evaluation.running.models import load_tokenizer
from evaluation.running.paradigms import Paradigm
from evaluation.running.prompts import thinking_marker
from methods.base import build_proposer, registry
from methods.common import HarnessError, exit_on_error, write_jsonl_atomic, write_text_atomic

BUCKET = 256


def run_prompts(run: Path, records: list[dict]) -> tuple[dict, dict, object]:
    """(the run's config, (question, turn) -> the turn's prompt ids, the tokenizer), as the run built them."""
    config_file = run / "config.yaml"
    if not config_file.is_file():
        raise HarnessError(f"{run} has no config.yaml to rebuild its prompts from; give a run folder of ours")
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


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="a run folder of ours")
    ap.add_argument("--method", action="append", help="a token-only method (default: all of them)")
    ap.add_argument("--set", nargs="*", default=[], help="method overrides, e.g. method.max_ngram=2")
    ap.add_argument("--out", help="output folder (default: the run folder)")
    args = ap.parse_args(argv)
    run = answer_file(args.run).parent
    records = read_answers(run)
    cfg, prompts, tok = run_prompts(run, records)
    names = args.method or [n for n, cls in registry().items() if cls.token_only is True]
    out = Path(args.out) if args.out else run
    rows = []
    for name in names:
        method_cfg = compose_config([f"model={cfg['model']['name']}", f"method={name}", *args.set])
        method, params = method_params(method_cfg)

        def make():
            p = build_proposer(method, params, vocab_size=len(tok), device=torch.device("cpu"))
            if not p.token_only:
                raise HarnessError(f"method '{method}' drafts from the target's logits or states, which recorded "
                                   f"answers do not hold; simulate a token-only method ({', '.join(names)})")
            return p

        sim = simulate(records, prompts, make)
        write_jsonl_atomic(out / f"simulated_{name}.jsonl", [to_file(r) for r in sim])
        rows += [{"method": name, "simulated": True, "task": task, "position": "", "mat": mat}
                 for task, mat in simulated_mat(sim).items()]
        rows += [{"method": name, "simulated": True, "task": "overall", "position": int(pos), "mat": row["mat"]}
                 for pos, row in position_table(sim, BUCKET).iterrows()]
    table = pd.DataFrame(rows)
    write_text_atomic(out / "simulated.csv", table.to_csv(index=False))
    overall = table[(table["task"] == "overall") & (table["position"] == "")]
    print(markdown(overall[["method", "mat"]].rename(columns={"mat": "MAT (simulated)"}), digits=2))
    print(f"-> {out / 'simulated.csv'}, " + ", ".join(str(out / f"simulated_{n}.jsonl") for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
