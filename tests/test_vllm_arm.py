"""engine=vllm without vLLM: what it refuses and why, how our methods map onto vLLM's speculative configs, the
one-line error where vLLM is missing, and ``methods.vllm_drafter`` (our proposers as vLLM's custom_class drives them)
fed as vLLM's model runner feeds it. The tier that runs vLLM itself: tests/test_vllm.py (make test-vllm)."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from evaluation.running import vllm
from methods.common import ROOT, HarnessError
from methods.proposers.pld import lookup
from methods.vllm_drafter import Drafter

PLD = {"max_ngram": 3, "num_pred_tokens": 4, "match": "transformers"}


def _rows(*seqs, width=64):
    """vLLM's token table (``InputBatch.token_ids_cpu``): one row per request, then its lengths."""
    table = np.zeros((len(seqs) + 1, width), dtype=np.int64)
    for i, s in enumerate(seqs):
        table[i, : len(s)] = s
    return table, np.array([len(s) for s in seqs])


def test_the_drafter_knows_a_request_by_its_tokens_when_vllm_moves_its_row():
    a, b = [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 6, 9]
    d = Drafter(method="pld", params=PLD, k=4, max_len=64)
    table, n = _rows(a, b)
    out = d.propose([[a[-1]], [b[-1]]], n, table)  # both just prefilled
    assert out == [lookup(torch.tensor(s), 3, 4, "transformers").tolist() for s in (a, b)]
    assert d.started == 2 and out[0] == [4, 1, 2, 3]
    b_request = d.rows[1]
    b2 = b + [8, 7]  # a has finished; vLLM moved b to row 0, which committed two tokens
    table, n = _rows(b2)
    out = d.propose([[8, 7]], n, table)
    assert d.rows[0] is b_request and d.started == 2 and d.finished == 1
    assert out == [lookup(torch.tensor(b2), 3, 4, "transformers").tolist()]
    # a row still prefilling its prompt in chunks gets no draft and no proposer yet
    b3 = b2 + [9]
    out = d.propose([[9], []], np.array([len(b3), 5]), _rows(b3, [3, 3, 3, 3, 3])[0])
    assert out == [lookup(torch.tensor(b3), 3, 4, "transformers").tolist(), []]
    assert d.started == 2


def test_the_drafter_caps_drafts_at_k_and_at_the_context():
    seq = [5, 6, 7, 8, 9, 10, 5, 6]
    table, n = _rows(seq, width=10)
    assert Drafter(method="pld", params=PLD, k=2, max_len=64).propose([[6]], n, table) == [[7, 8]]
    assert Drafter(method="pld", params=PLD, k=4, max_len=9).propose([[6]], n, table) == [[7]]


def test_an_answer_that_leaves_the_batch_joins_suffix_decodings_global_tree():
    d = Drafter(method="suffix", params={"backend": "python"}, k=8, max_len=64)
    table, _ = _rows([5, 6, 10, 11, 12, 13])
    assert d.propose([[10]], np.array([3]), table) == [[]]  # prompt 5 6, first token 10: nothing to match yet
    assert d.propose([[11, 12, 13]], np.array([6]), table) == [[]]
    table, n = _rows([7, 8, 10])  # the first request left; a new one starts with token 10
    assert d.propose([[10]], n, table) == [[11]]  # from the first answer (a match of 1 token drafts 1)
    assert d.finished == 1


@pytest.mark.parametrize("method, overrides, drafter, says", [
    ("tr", {}, "auto", "vllm/v1/sample/logits_processor/__init__.py:208-209"),
    ("sam_tr", {}, "auto", "gpu_model_runner.py:4778-4784"),
    ("eagle2", {}, "auto", "hidden states, logits or a model of its own"),
    ("pia", {}, "auto", "before the prefill's first token"),
    ("sam", {"max_draft": "auto"}, "auto", "method.max_draft=auto is calibrated against our engine"),
    ("suffix", {"tree": True}, "auto", "vLLM's suffix drafts chains"),
    ("sam", {}, "vllm", "vLLM has no speculative method for method=sam"),
])
def test_what_cannot_run_inside_vllm_is_refused_with_its_reason(method, overrides, drafter, says):
    from methods.base import registry
    from methods.params import parse

    cls = registry()[method]
    params = vars(parse(cls.Params, overrides, f"method '{method}'", prefix="method"))
    assert says in vllm.refusal(method, params, drafter)


def test_our_settings_map_onto_vllms_speculative_configs():
    from methods.base import build_proposer, registry
    from methods.params import parse

    def config(method, overrides, drafter="auto"):
        params = vars(parse(registry()[method].Params, overrides, method, prefix="method"))
        assert vllm.refusal(method, params, drafter) is None
        proposer = build_proposer(method, params, vocab_size=100, device=torch.device("cpu"))
        return vllm.speculative_config(method, params, drafter, proposer)

    assert config("vanilla", {}) is None
    assert config("pld", {"max_ngram": 4, "num_pred_tokens": 7}) == {
        "method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 1, "num_speculative_tokens": 7}
    assert config("suffix", {"max_depth": 32, "max_spec_tokens": 16, "min_token_prob": 0.2}) == {
        "method": "suffix", "num_speculative_tokens": 16, "suffix_decoding_max_tree_depth": 32,
        "suffix_decoding_max_cached_requests": 10000, "suffix_decoding_max_spec_factor": 1.0,
        "suffix_decoding_min_token_prob": 0.2}
    assert config("pld", {"num_pred_tokens": 7}, "ours") == {
        "method": "custom_class", "model": "methods.vllm_drafter.Drafter", "num_speculative_tokens": 7}
    assert config("sam", {"max_draft": 12, "corpus": None})["num_speculative_tokens"] == 12


def test_without_vllm_the_error_names_the_install_command(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    monkeypatch.setattr(vllm, "VENV_PYTHON", tmp_path / "bin" / "python")
    with pytest.raises(HarnessError, match=r"vLLM is not installed .* run make vllm"):
        vllm.python_with_vllm("auto")


def test_a_run_whose_vllm_python_is_missing_ends_in_one_line_and_leaves_no_folder(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "evaluation.run", "engine=vllm", "engine.python=/nonexistent/python",
                        "method=pld", f"hydra.run.dir={out}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith("error: engine.python=/nonexistent/python: no such file") and "make vllm" in lines[-1]
    assert "Traceback" not in p.stderr and not out.exists()


def test_engine_vllm_refuses_sampling_in_one_line(tmp_path):
    from evaluation.running.config import compose_config

    cfg = compose_config(["engine=vllm", "sampling.temperature=0.7"])
    with pytest.raises(HarnessError, match="engine=vllm decodes greedily"):
        vllm.make_runner(cfg)


def test_a_tree_is_sent_as_its_chain_of_first_children_and_learns_that_path():
    """vLLM verifies chains: of a tree draft it gets the first children's chain, and the proposer's ``update`` sees
    the accepted nodes of that chain by their indices in its own tree."""
    from methods.base import Draft, Proposer
    from methods.tree import Tree
    from methods.vllm_drafter import _Request

    class TwoBranches(Proposer):
        name = "two_branches"

        def reset(self, prompt_ids, turn, prompt_logits, prompt_hidden=None):
            self.seen = []

        def propose(self, context):  # root, then 6 and 7 as its children, 8 under 6: first children 6 -> 8
            return Draft(torch.tensor([int(context[-1]), 6, 7, 8]), Tree.from_parents([-1, 0, 0, 1]))

        def update(self, draft, result):
            self.seen.append((result.path, result.new_tokens))

    p = TwoBranches()
    request = _Request(p, np.array([1, 2, 3]))
    assert request.propose(4) == [6, 8] and request.propose(1) == [6]
    request.propose(4)
    request.learn(np.array([1, 2, 3, 6, 9]))  # vLLM accepted 6, then its bonus 9
    assert p.seen == [([0, 1], [6, 9])]
