"""Why two runs' tokens differ: the reference run's model re-run, teacher-forced on the common prefix, at each
first divergence (``evaluation.records.equality.classify`` judges the logits it gives)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from omegaconf import OmegaConf

from evaluation.records.answers import SUMMARY
from evaluation.records.bench import load_bench
from evaluation.records.equality import REAL, Mismatch, classify, classify_draw
from evaluation.running.models import ModelSpec, load_model
from evaluation.running.paradigms import Paradigm
from evaluation.running.prompts import thinking_marker
from methods.common import HarnessError
from methods.sampling import Sampler, Sampling


def explain(run: Path, recs: list[dict], mismatches: list[Mismatch]) -> str:
    """Classify every first divergence of a turn by re-running ``run``'s model (the reference); returns the
    run's dtype name. Raises HarnessError when ``run`` holds no config to rebuild the model from."""
    config_file = run / "config.yaml"
    if not config_file.is_file():
        raise HarnessError(f"{run} has no config.yaml to rebuild its model from (a Spec-Bench file?)")
    cfg = OmegaConf.to_container(OmegaConf.load(config_file), resolve=True)
    env = json.loads((run / SUMMARY).read_text()).get("environment", {}) if (run / SUMMARY).is_file() else {}
    dtype = env.get("dtype", cfg["model"].get("dtype", "float32"))
    device = env.get("device", "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"note: the run used {device}; re-running its model on the CPU in {dtype}")
        device = "cpu"
    spec = replace(ModelSpec(**cfg["model"]), dtype=dtype, device=device)
    sampling = Sampling(**cfg.get("sampling", {}))
    model, tok, dev = load_model(spec)
    b = cfg["bench"]
    par = Paradigm(b.get("rounds", 1), b.get("num_choices", 1), b.get("bon_reference", False),
                   b.get("force_end_of_thinking", False))
    marker = thinking_marker(spec, tok)
    todo = [m for m in mismatches if m.turn is not None and m.kind is None]
    questions = {q.question_id: q for q in load_bench(cfg["bench"].get("path"), cfg["bench"].get("file", "spec_bench"),
                                                      question_ids=sorted({m.question_id for m in todo}))}
    answers = {r["question_id"]: r["choices"][0] for r in recs}
    for m in todo:
        if "<end>" in (m.a, m.b):
            m.kind, m.why = REAL, "one run stopped where the other went on"
            continue
        q, c = questions[m.question_id], answers[m.question_id]
        per = par.turns(q)  # the turn's conversation (a choice of Best-of-N) and its turn there
        choice, turn = divmod(m.turn - 1, per)
        ids = par.prompt(spec, tok, q, turn, c["turns"][choice * per: choice * per + turn], marker)
        ids += c["token_ids"][m.turn - 1][: m.position]
        with torch.inference_mode():
            logits = model(torch.tensor([ids], device=dev), logits_to_keep=1).logits[0, -1]
        if sampling.greedy:
            m.kind, m.why = classify(logits, int(m.a), int(m.b), logits.dtype)
        else:
            m.kind, m.why = classify_draw(logits, int(m.a), int(m.b), logits.dtype,
                                          Sampler(sampling, m.question_id, m.turn - 1), m.position)
    return dtype
