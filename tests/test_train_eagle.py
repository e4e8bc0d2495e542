"""scripts.train_eagle: its prompts hold no Spec-Bench question; a short run writes a head that loads and drafts."""
import json

import torch

from evaluation.data import load_bench
from methods.base import build_proposer
from methods.decode import generate
from methods.eagle import load_head
from scripts.train_eagle import passage_prompts, training_prompts
from tests.test_cli import cli


def test_training_prompts_hold_no_spec_bench_question():
    turns = {t.strip() for q in load_bench(None) for t in q.turns}
    prompts = training_prompts() + passage_prompts([("bridges", "A short passage about bridges."), ("tea", "Tea is a drink.")])
    assert len(prompts) > 800 and len(set(prompts)) == len(prompts)
    for p in prompts:
        assert p.strip() not in turns
        assert not any(len(t) > 40 and t in p for t in turns), p


def test_a_short_training_run_writes_a_loadable_head(tmp_path, embedded):
    model, tok, spec = embedded
    out = tmp_path / "head"
    cli("scripts.train_eagle", "--limit", "6", "--max-new-tokens", "8", "--epochs", "2", "--out", str(out),
        "--data", str(tmp_path / "data.pt"))
    log = json.loads((out / "train_log.json").read_text())
    assert [e["epoch"] for e in log["epochs"]] == [1, 2] and 0 <= log["epochs"][-1]["top1"] <= 1
    assert (out / "model.safetensors").stat().st_size < 10 * 2**20
    head = load_head(str(out), model.config)
    assert head.fc.weight.shape == (576, 1152)
    p = build_proposer("eagle", {"head": str(out)}, vocab_size=model.config.vocab_size, device=torch.device("cpu"),
                       target=model)
    prompt = tok("The capital of France is", add_special_tokens=False).input_ids
    gen = generate(model, p, prompt, max_new_tokens=12, stop_ids=set())
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt):].tolist()
    assert gen.token_ids == ref
