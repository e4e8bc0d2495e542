"""scripts.bench_long's arithmetic: a proposer's time per step over the first and the last window of an answer."""
import pytest

from scripts.bench_long import split, table


def test_windows_are_the_first_and_last_steps_and_the_prefill_forward_is_left_out():
    calls = {"propose": [0.001] * 6 + [0.003] * 4, "update": [0.001] * 10,
             "forward": [0.5] + [0.010] * 5 + [0.020] * 5}  # the prefill's forward first, then one per step
    row = split(calls, window=4)
    assert row["steps"] == 10
    assert row["proposer_start"] == pytest.approx(2.0) and row["proposer_end"] == pytest.approx(4.0)
    assert row["forward_start"] == pytest.approx(10.0) and row["forward_end"] == pytest.approx(20.0)
    assert split(calls, window=6) is None  # 10 steps hold no two windows of 6


def test_the_table_gives_each_methods_ratio_and_its_short_answers():
    rows = [{"question_id": 1, "tokens": 100, "steps": 10, "proposer_start": 2.0, "proposer_end": 3.0,
             "forward_start": 10.0, "forward_end": 12.0}]
    t = table({"pld": (rows, 1), "sam": ([], 2)}).set_index("method")
    assert t.loc["pld", "proposer end/start"] == pytest.approx(1.5) and t.loc["pld", "too short"] == 1
    assert t.loc["sam", "answers"] == 0 and t.loc["sam", "too short"] == 2
