"""scripts.bench_methods end to end on the embedded model: side by side, engines per method, the phase split."""
import pandas as pd

from evaluation.answers import read_answers
from evaluation.equal import compare
from scripts.bench_methods import main


def test_side_by_side_with_generate_and_phases(tmp_path, capsys):
    out = tmp_path / "bench"
    main(["method=vanilla", "method=vanilla engine=hf", "method=tr", "--bench", "spec_bench_smoke", "--warmup", "0",
          "--set", "bench.question_ids=[321,401]", "bench.max_new_tokens=12", "--generate", "--phases",
          "--out", str(out)])
    text = capsys.readouterr().out
    labels = ["vanilla", "vanilla,engine=hf", "tr", "generate"]
    for label in labels:
        assert f"{label}: 2/2 turns token-identical to vanilla" in text
        assert compare(read_answers(out / "vanilla"), read_answers(out / label))[2] == []
    phases = pd.read_csv(out / "phases.csv").set_index("method")
    assert list(phases.index) == ["vanilla", "vanilla,engine=hf", "tr"]  # generate has no phases to split
    assert (phases["forward_ms"] > 0).all() and (phases["steps"] == [22, 22, phases.loc["tr", "steps"]]).all()
    shares = phases[[c for c in phases.columns if c.endswith("_%")]].sum(axis=1)
    assert ((shares - 100).abs() < 1e-6).all()
    # TR's 24 tokens come from its steps alone (its first step is a tree, no prefill step): some commit several
    assert phases.loc["tr", "steps"] < 24
