"""scripts.train_eagle and methods.heads.eagle_train: the prompts hold no Spec-Bench question; a short run writes a head
that loads and drafts; the data's cache name is a hash of what it holds."""
import json

import pytest
import torch

from evaluation.records.bench import load_bench
from evaluation.running.own_prompts import more_prompts, training_prompts
from evaluation.running.prompts import prompt_ids
from methods.base import build_proposer
from methods.decode import generate
from methods.heads.eagle import load_head
from methods.heads.eagle_train import causal, data_key, head_pass, respond
from scripts.training import passage_prompts
from tests.test_cli import cli


def test_training_prompts_hold_no_spec_bench_question():
    turns = {t.strip() for q in load_bench(None) for t in q.turns}
    prompts = training_prompts() + more_prompts() + passage_prompts([("bridges", "A short passage about bridges."),
                                                                     ("tea", "Tea is a drink.")])
    assert len(prompts) > 2000 and len(set(prompts)) == len(prompts)
    for p in prompts:
        assert p.strip() not in turns
        assert not any(len(t) > 40 and t in p for t in turns), p


@pytest.mark.slow  # trains through the command line
@pytest.mark.long  # heads are trained offline (scripts/train_*.py); their published layouts: tests/test_eagle.py
def test_a_short_training_run_writes_a_loadable_head(tmp_path, embedded):
    model, tok, spec = embedded
    out = tmp_path / "head"
    cli("scripts.train_eagle", "--limit", "6", "--max-new-tokens", "8", "--epochs", "2", "--out", str(out),
        "--data", str(tmp_path / "data.pt"))
    log = json.loads((out / "train_log.json").read_text())
    assert [e["epoch"] for e in log["epochs"]] == [1, 2] and 0 <= log["epochs"][-1]["top1"] <= 1
    assert (out / "model.safetensors").stat().st_size < 10 * 2**20
    # Fine-tuning that head with unrolled depths: a new head whose log keeps how its start was made.
    cli("scripts.train_eagle", "--init", str(out), "--unroll", "3", "--epochs", "1", "--out", str(tmp_path / "ft"),
        "--data", str(tmp_path / "data.pt"))
    ft = json.loads((tmp_path / "ft" / "train_log.json").read_text())
    assert ft["args"]["unroll"] == 3 and ft["init_log"] == log
    head = load_head(str(out), model.config)
    assert head.fc.weight.shape == (576, 1152)
    p = build_proposer("eagle", {"head": str(out)}, vocab_size=model.config.vocab_size, device=torch.device("cpu"),
                       target=model)
    prompt = tok("The capital of France is", add_special_tokens=False).input_ids
    gen = generate(model, p, prompt, max_new_tokens=12, stop_ids=set())
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt):].tolist()
    assert gen.token_ids == ref


@pytest.mark.slow  # generates on the embedded model
def test_responses_are_stored_by_prompt_and_only_new_prompts_are_generated(tmp_path, embedded):
    model, tok, spec = embedded
    store, prompts = tmp_path / "responses.pt", ["Name a color.", "Say hello.", "Count to three."]
    ids = {p: prompt_ids(spec, tok, [p], []) for p in prompts}
    answer = dict(max_new=6, batch=2, device=torch.device("cpu"), pad_id=tok.pad_token_id, eos_id=tok.eos_token_id,
                  store=store)
    seqs, starts = respond(model, {p: ids[p] for p in prompts[:2]}, **answer)
    kept = torch.load(store, weights_only=True)
    assert list(kept) == sorted(prompts[:2], key=len) and [s[n:] for s, n in zip(seqs, starts)] == [kept[p] for p in prompts[:2]]
    kept[prompts[0]] = [7, 8]  # a stored answer is read back, not regenerated
    torch.save(kept, store)
    seqs, starts = respond(model, ids, **answer)
    assert seqs[0][starts[0]:] == [7, 8] and seqs[1][starts[1]:] == kept[prompts[1]]
    ref = model.generate(torch.tensor([seqs[2][:starts[2]]]), max_new_tokens=6, do_sample=False)[0, starts[2]:].tolist()
    if tok.eos_token_id in ref:
        ref = ref[: ref.index(tok.eos_token_id) + 1]
    assert seqs[2][starts[2]:] == ref
    assert set(torch.load(store, weights_only=True)) == set(prompts)


def test_unrolled_depths_equal_step_by_step_drafting(embedded):
    """head_pass's depth s at position i is what drafting computes: the head over the true pairs up to i, then
    fed its own predicted feature with the next true token, s-1 times (each draft seeing its ancestors)."""
    from transformers import DynamicCache

    from methods.heads.eagle import random_head

    model, _, _ = embedded
    head, embed = random_head(model.config, seed=1).float().eval(), model.get_input_embeddings()
    torch.manual_seed(0)
    T = 14
    d = {"ids": torch.randint(0, model.config.vocab_size, (T,)), "feats": torch.randn(T, model.config.hidden_size)}
    with torch.no_grad():
        outs = head_pass(head, embed, d, unroll=3)
        assert [len(o) for o in outs] == [T - 1, T - 2, T - 3]
        for i in (0, 4, T - 4):
            cache = DynamicCache(config=head.config)
            n = i + 1
            feat = head(embed(d["ids"][1:n + 1])[None], d["feats"][None, :n], torch.arange(n)[None],
                        causal(n, torch.float32), cache)[0, -1]
            torch.testing.assert_close(outs[0][i], feat)
            for depth in (2, 3):
                pos = i + depth - 1
                feat = head(embed(d["ids"][pos + 1].view(1, 1)), feat.view(1, 1, -1), torch.tensor([[pos]]),
                            torch.zeros(1, 1, 1, pos + 1), cache)[0, -1]
                torch.testing.assert_close(outs[depth - 1][i], feat, atol=1e-5, rtol=1e-4)


def test_the_data_cache_is_named_by_what_it_holds():
    """The generated data's file name is a hash of the prompts' token ids and the settings that shape the data:
    the same inputs give the same name, any change another (no version number to remember to raise)."""
    prompts = [[1, 2, 3], [4, 5]]
    key = data_key(prompts, max_new_tokens=160, passages=[["Explain"]])
    assert len(key) == 12 and int(key, 16) >= 0
    assert key == data_key([[1, 2, 3], [4, 5]], passages=[["Explain"]], max_new_tokens=160)
    assert len({key, data_key(prompts[:1], max_new_tokens=160, passages=[["Explain"]]),
                data_key(prompts[::-1], max_new_tokens=160, passages=[["Explain"]]),
                data_key(prompts, max_new_tokens=161, passages=[["Explain"]]),
                data_key(prompts, max_new_tokens=160, passages=[["Explain", "Write"]])}) == 5
