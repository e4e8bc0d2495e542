"""scripts.bench_long's arithmetic: a proposer's time per step over the steps of an answer's first and last tokens."""
import pytest

from scripts.bench_long import split, table


def test_windows_are_the_steps_of_the_first_and_last_tokens_and_the_prefill_forward_is_left_out():
    # six steps of 2 tokens at positions 0, 2, ..., 10 (12 tokens); the prefill's forward first, then one per step
    calls = {"propose": [0.001] * 3 + [0.003] * 3, "update": [0.001] * 6, "forward": [0.5] + [0.010] * 3 + [0.020] * 3}
    calls["propose"][1] = 0.101  # a pause (a garbage collection) in one step: the median leaves it out
    row = split(calls, [0, 2, 4, 6, 8, 10], tokens=12, window=6)  # the steps at 0, 2 and 4; at 6, 8 and 10
    assert row["steps"] == 6
    assert row["proposer_start"] == pytest.approx(2.0) and row["proposer_end"] == pytest.approx(4.0)
    assert row["forward_start"] == pytest.approx(10.0) and row["forward_end"] == pytest.approx(20.0)
    assert row["token_start"] == pytest.approx(1000.0) and row["token_end"] == pytest.approx(2000.0)  # µs, 2 a step
    assert split(calls, [0, 2, 4, 6, 8, 10], tokens=12, window=7) is None  # 12 tokens hold no two windows of 7
    one = split(calls, [0, 2, 4, 6, 8, 10], tokens=12, window=1)  # one step in each window
    assert one["proposer_start"] == pytest.approx(2.0) and one["proposer_end"] == pytest.approx(4.0)


def test_the_table_gives_each_methods_ratio_and_its_short_answers():
    rows = [{"question_id": 1, "tokens": 100, "steps": 10, "proposer_start": 2.0, "proposer_end": 3.0,
             "token_start": 1.0, "token_end": 1.0, "forward_start": 10.0, "forward_end": 12.0}]
    t = table({"pld": (rows, 1), "sam": ([], 2)}).set_index("method")
    assert t.loc["pld", "proposer end/start"] == pytest.approx(1.5) and t.loc["pld", "too short"] == 1
    assert t.loc["pld", "per token end/start"] == pytest.approx(1.0)
    assert t.loc["sam", "answers"] == 0 and t.loc["sam", "too short"] == 2
