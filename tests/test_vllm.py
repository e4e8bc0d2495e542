"""engine=vllm with vLLM itself (the tier of its own: ``make test-vllm``, which installs it first; CI runs it after
make test): the embedded model in fp32 through vLLM's CPU build, every turn token-identical to our vanilla greedy
(``evaluation.equal``), vLLM's ngram and our PLD through its custom_class step for step alike, at 1 and 4
requests at once."""
import json
import subprocess
import sys

import pytest

from evaluation.records.answers import read_answers
from evaluation.running.vllm import python_with_vllm
from methods.common import ROOT, HarnessError

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm")]

SHORT = ["bench=spec_bench_smoke", "bench.max_new_tokens=48", "warmup=1", "runtime.progress=false"]


@pytest.fixture(scope="module", autouse=True)
def has_vllm():
    try:
        python_with_vllm("auto")
    except HarnessError as e:
        pytest.fail(f"{e} (make test-vllm installs it before this tier)")


def _run(out, *overrides) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "evaluation.run", *SHORT, *overrides, f"hydra.run.dir={out}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def _equal(ref, run) -> str:
    p = subprocess.run([sys.executable, "-m", "evaluation.equal", str(ref), str(run)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    return p.stdout


def _steps(run) -> list[list[int]]:
    return [r["choices"][0]["accept_lengths"] for r in read_answers(run / "answers.jsonl")]


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    out = tmp_path_factory.mktemp("ours") / "vanilla"
    _run(out, "method=vanilla")
    return out


def test_the_smoke_bench_through_vllms_ngram_equals_our_vanilla(ours, tmp_path):
    """The done-when command (at 48 tokens): vLLM's ngram, one request at a time, every turn our vanilla's tokens;
    the run records vLLM's settings and its own acceptance, which agrees with the per-step lengths we count."""
    run = tmp_path / "pld"
    _run(run, "engine=vllm", "method=pld")
    assert "EQUAL" in _equal(ours, run)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["engine"]["vllm"] == "0.32.0" and summary["engine"]["speculative_config"]["method"] == "ngram"
    assert summary["engine"]["eager"] is True and summary["engine"]["prefix_caching"] is False
    for r in read_answers(run / "answers.jsonl"):
        c = r["choices"][0]
        assert sum(c["accept_lengths"]) == sum(c["new_tokens"])
        at = 0
        for steps, spec in zip(c["decoding_steps"], c["vllm_spec"]):
            ours = [a - 1 for a in c["accept_lengths"][at: at + steps] if a > 1]
            theirs = [a for a in (spec or {}).get("per_step_accepted", []) if a]
            at += steps
            # the steps that accepted drafts, in order, as vLLM counts them; its last may have accepted past the
            # answer's end (max_tokens, or a stop token among the drafts), which the output then cut
            assert theirs[:-1] == ours[:len(theirs) - 1] and len(ours) in (len(theirs), len(theirs) - 1), (ours, theirs)
    counters = summary["method_state"]["vllm_counters"]
    assert counters["vllm:spec_decode_num_accepted_tokens"] > 0


@pytest.mark.parametrize("batch", [1, 4])
def test_our_pld_inside_vllm_drafts_as_vllms_ngram_step_for_step(ours, tmp_path, batch):
    """Our PLD with vLLM's rule (match=transformers) through custom_class: the same tokens, and the same accept
    length at every step as vLLM's own ngram; at 4 requests at once our drafter follows each request from row to
    row as vLLM moves them."""
    common = ["engine=vllm", "method=pld", "method.match=transformers", f"runtime.batch_size={batch}"]
    _run(tmp_path / "ngram", *common, "engine.drafter=vllm")
    _run(tmp_path / "ours", *common, "engine.drafter=ours")
    for run in ("ngram", "ours"):
        assert "EQUAL" in _equal(ours, tmp_path / run)
    assert _steps(tmp_path / "ours") == _steps(tmp_path / "ngram")
    assert json.loads((tmp_path / "ours" / "summary.json").read_text())["engine"]["drafter"] == "ours"


@pytest.mark.parametrize("method", ["method=vanilla", "method=suffix", "method=sam method.max_draft=16"])
def test_four_requests_at_once_inside_vllm_equal_our_vanilla(ours, tmp_path, method):
    """vLLM's continuous batching over 4 slots (conversations' second turns joining as first turns finish): vLLM's
    own vanilla and suffix, and our SAM through custom_class, every turn our vanilla's tokens."""
    run = tmp_path / "run"
    _run(run, "engine=vllm", *method.split(), "runtime.batch_size=4")
    assert "EQUAL" in _equal(ours, run)
    if method != "method=vanilla":
        assert max(a for steps in _steps(run) for a in steps) > 1  # it drafted, and vLLM accepted some
