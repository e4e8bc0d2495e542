"""scripts.bench_methods end to end on the embedded model: side by side, engines per method, the phase split."""
import json

import pandas as pd
import pytest

from evaluation.records.answers import read_answers
from evaluation.records.equality import compare
from scripts.bench_methods import main
from tests.test_trust import _main

pytestmark = pytest.mark.slow  # every test decodes on the embedded model with several methods


def test_side_by_side_with_generate_and_phases(tmp_path, capsys):
    out = tmp_path / "bench"
    main(["method=vanilla", "method=vanilla engine=hf", "method=tr", "--bench", "spec_bench_smoke", "--warmup", "0",
          "--set", "bench.question_ids=[321,401]", "bench.max_new_tokens=12", "--generate", "--phases",
          "--out", str(out)])
    text = capsys.readouterr().out
    tr = "tr"
    labels = ["vanilla", "vanilla,engine=hf", tr, "generate"]
    for label in labels:
        assert f"{label}: 2/2 turns token-identical to vanilla" in text
        assert compare(read_answers(out / "vanilla"), read_answers(out / label))[2] == []
    phases = pd.read_csv(out / "phases.csv").set_index("method")
    assert list(phases.index) == ["vanilla", "vanilla,engine=hf", tr]  # generate has no phases to split
    assert (phases["forward_ms"] > 0).all() and (phases["steps"] == [22, 22, phases.loc[tr, "steps"]]).all()
    shares = phases[[c for c in phases.columns if c.endswith("_%")]].sum(axis=1)
    assert ((shares - 100).abs() < 1e-6).all()
    # TR's 24 tokens come from its steps alone (its first step is a tree, no prefill step): some commit several
    assert phases.loc[tr, "steps"] < 24


@pytest.mark.long  # bf16's near-ties classified: tests/test_equal.py
def test_a_method_in_another_dtype_is_checked_against_its_own_vanilla(tmp_path, capsys):
    """"method=... model.dtype=bfloat16" loads a second model; its methods are compared with the first method of
    that model (bf16 vanilla), never with fp32's tokens, and every divergence is classified."""
    import json

    from methods import machine

    out = tmp_path / "bench"
    rc = main(["method=vanilla", "method=vanilla model.dtype=bfloat16", "method=pld model.dtype=bfloat16",
               "--bench", "spec_bench_smoke", "--warmup", "0", "--set", "bench.question_ids=[321,401]",
               "bench.max_new_tokens=12", "--out", str(out)])
    text = capsys.readouterr().out
    bf16, pld = "vanilla,model.dtype=bfloat16", "pld,model.dtype=bfloat16"
    assert f"{bf16}: 2/2 turns token-identical to {bf16}" in text
    verdict = next(line for line in text.splitlines() if line.startswith(f"{pld}: "))
    assert f"turns token-identical to {bf16}" in verdict
    if not verdict.startswith(f"{pld}: 2/2"):  # a divergence in bf16: classified, and only a real one fails
        assert "divergence(s) in bfloat16" in verdict and "of them near-ties" in verdict
    assert rc == (1 if "NOT LOSSLESS" in text else 0)
    for label, dtype in (("vanilla", "float32"), (bf16, "bfloat16"), (pld, "bfloat16")):
        summary = json.loads((out / label / "summary.json").read_text())
        assert summary["environment"]["dtype"] == dtype and summary["environment"]["cpu"] == machine.cpu()
        assert (out / label / "config.yaml").is_file()  # evaluation.equal rebuilds the model from it
    assert f"against {bf16}:" in text and machine.describe(machine.cpu()) in text


def test_batched_side_by_side_with_generate(tmp_path, capsys):
    """--batch 2: every method (generate too) decodes at batch 2 and says so in its config; each chunk of questions
    is its own clock segment, so that a method's throughput counts only its own decoding time, and the chunks pair
    its throughput with the baseline's (an interval); a chunk smaller than the batch is refused."""
    import time

    import yaml

    from evaluation.records.metrics import batch_stats

    out = tmp_path / "bench"
    t = time.perf_counter()
    rc = main(["method=vanilla", "method=tr", "--bench", "spec_bench_smoke", "--warmup", "0", "--batch", "2",
               "--set", "bench.question_ids=[81,161,321,401]", "bench.max_new_tokens=8", "--generate",
               "--chunk", "2", "--out", str(out)])  # chunks of 2 questions: two of them, the order rotating
    elapsed = time.perf_counter() - t
    text = capsys.readouterr().out
    assert "tr: 5/5 turns token-identical to vanilla" in text
    verdict = next(line for line in text.splitlines() if line.startswith("generate: "))
    assert "turns token-identical to vanilla" in verdict and rc == (1 if "NOT LOSSLESS" in text else 0)
    records = {label: read_answers(out / label) for label in ("vanilla", "tr", "generate")}
    spans = 0.0
    for label, recs in records.items():
        assert yaml.safe_load((out / label / "config.yaml").read_text())["runtime"]["batch_size"] == 2
        assert {r["clock"]["batch_size"] for r in recs} == {2} and len({r["clock"]["segment"] for r in recs}) == 2
        spans += sum(sum(r["choices"][0]["new_tokens"]) for r in recs) / batch_stats(recs)["throughput"]
        if label != "generate":
            assert any(2 in r["choices"][0]["batch_rows"] for r in recs)
    assert spans < elapsed  # each method's seconds are its own chunks': together no more than the whole run
    first, second = (r["choices"][0] for r in records["generate"][:2])  # questions 81 (two turns) and 161
    assert first["wall_time"][0] == second["wall_time"][0] and len(first["wall_time"]) == 2  # one generate call
    assert first["first_token_time"] == [None, None] and set(first["accept_lengths"]) == {1}
    rates = pd.read_csv(out / "throughput.csv").set_index("method")
    assert list(rates.index) == ["vanilla", "tr", "generate"] and (rates["tokens/s"] > 0).all()
    assert rates.loc["generate", "vs generate"] == 1 and "throughput at batch 2" in text
    assert "paired over the 2 chunks of 2 questions" in text and rates.loc["vanilla", "95% interval"] == "-"
    low, high = map(float, rates.loc["tr", "95% interval"].strip("[]").split(", "))  # over the two chunks
    assert low <= round(rates.loc["tr", "speedup vs vanilla"], 2) <= high
    assert json.loads((out / "tr" / "summary.json").read_text())["chunk"] == 2
    err = _main(main, ["method=vanilla", "--batch", "4", "--chunk", "2", "--out", str(tmp_path / "no")], capsys)
    assert "--chunk 2 is smaller than the batch (4)" in err and not (tmp_path / "no").exists()


def test_a_second_pass_remembers_the_first(tmp_path, capsys):
    """--passes 2: the same questions twice in one process, each pass written and checked on its own; SuffixDecoding's
    global tree holds the first pass's answers when the second comes, so its second pass drafts far more, while
    without a memory (max_cached_requests=0) the two passes are the same step for step."""
    out = tmp_path / "bench"
    rc = main(["method=vanilla", "method=suffix", "method=suffix method.max_cached_requests=0", "--bench",
               "spec_bench_smoke", "--warmup", "1", "--passes", "2", "--set", "bench.question_ids=[321,401]",
               "bench.max_new_tokens=16", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "pass 2 of 2" in text
    off = "suffix,method.max_cached_requests=0"
    steps = {(k, label): [a for r in read_answers(out / f"pass{k}" / label) for a in r["choices"][0]["accept_lengths"]]
             for k in (1, 2) for label in ("suffix", off)}
    assert steps[2, off] == steps[1, off] and len(steps[2, "suffix"]) < len(steps[1, "suffix"]) / 2
    summary = json.loads((out / "pass2" / "suffix" / "summary.json").read_text())
    assert summary["method_state"]["memory"] == "run" and summary["method_state"]["memory_answers"] == 4
