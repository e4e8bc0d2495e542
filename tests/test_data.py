import json

import pytest

from evaluation.records.bench import (
    MT_BENCH_CATEGORIES,
    QUESTION_FILES,
    TASKS,
    fetch,
    read_questions,
    select,
    sha256,
)
from methods.common import HarnessError


@pytest.fixture(scope="module")
def spec_bench():
    return read_questions(fetch("spec_bench"))


def test_the_real_file(spec_bench):
    assert sha256(fetch("spec_bench")) == QUESTION_FILES["spec_bench"].sha256
    assert len(spec_bench) == 480
    assert [q.question_id for q in spec_bench] == list(range(81, 561))
    assert {q.task for q in spec_bench} == set(TASKS[:6])
    assert all(len(q.turns) == 2 for q in spec_bench if q.task == "mt_bench")


def test_stratified_sample(spec_bench):
    sample = select(spec_bench, limit_per_category=10)
    assert len(sample) == 60
    mt = [q for q in sample if q.task == "mt_bench"]
    assert {q.category for q in mt} == set(MT_BENCH_CATEGORIES)  # spread over all 8
    assert [q.question_id for q in sample] == sorted(q.question_id for q in sample)  # file order kept


def test_disjoint_second_sample(spec_bench):
    first = {q.question_id for q in select(spec_bench, limit_per_category=10)}
    second = select(spec_bench, limit_per_category=10, skip_per_category=10)
    assert len(second) == 60 and not first & {q.question_id for q in second}
    with pytest.raises(HarnessError, match="skip_per_category must be 0 or more"):
        select(spec_bench, skip_per_category=-1)


def test_select_by_task_category_and_id(spec_bench):
    assert {q.category for q in select(spec_bench, categories=["qa", "rag"])} == {"qa", "rag"}
    assert len(select(spec_bench, categories=["writing"])) == 10
    assert len(select(spec_bench, categories=["mt_bench"])) == 80
    assert [q.question_id for q in select(spec_bench, question_ids=[82, 81])] == [81, 82]
    with pytest.raises(HarnessError, match="unknown bench.categories.*'qaa'"):
        select(spec_bench, categories=["qaa"])
    with pytest.raises(HarnessError, match=r"\[9999\]"):
        select(spec_bench, question_ids=[9999])
    with pytest.raises(HarnessError, match="at least 1"):
        select(spec_bench, limit_per_category=0)
    for key in ("question_ids", "categories"):  # empty: neither nothing nor, silently, everything
        with pytest.raises(HarnessError, match=rf"bench.{key}=\[\] selects no question; leave bench.{key} out"):
            select(spec_bench, **{key: []})


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ('["a"]', "expected a JSON object"),
    ('{"question_id": "x", "category": "qa", "turns": ["hi"]}', "'question_id' must be an integer"),
    ('{"question_id": 3, "category": "qa", "turns": []}', "'turns' must be a non-empty list"),
    ('{"question_id": 3, "turns": ["a"]}', "'category'"),
])
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    p = tmp_path / "q.jsonl"
    good = json.dumps({"question_id": 1, "category": "qa", "turns": ["hello"]})
    p.write_text(good + "\n" + line + "\n")
    with pytest.raises(HarnessError, match=rf"q.jsonl:2: .*{message}"):
        read_questions(p)


def test_duplicate_and_missing(tmp_path):
    p = tmp_path / "q.jsonl"
    good = json.dumps({"question_id": 1, "category": "qa", "turns": ["hello"]})
    p.write_text(good + "\n" + good + "\n")
    with pytest.raises(HarnessError, match="appears twice"):
        read_questions(p)
    with pytest.raises(HarnessError, match="does not exist"):
        read_questions(tmp_path / "nope.jsonl")
