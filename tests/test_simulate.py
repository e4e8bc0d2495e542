"""``python -m evaluation.simulate --traces FILE``: acceptance replayed over requests no run of ours wrote (token ids,
or texts and a tokenizer), per drafter and output position, the memory across requests fed in the file's order, a
training part only remembered, and an engine's recorded acceptance beside ours."""
import json

import pandas as pd
import pytest

from evaluation.simulate import main

A = [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rows():
    """Three requests whose answers repeat each other (the second and third the first's): an engine recorded
    ``acc_ngram`` for them, 3 tokens from output token 1, else 1, one per token of its own output, which for the third
    was 12 tokens, not 13 (it diverged, as the published EAGLE runs' outputs often do)."""
    acc = lambda n: {"acc_len": [1, 3] + [1] * (n - 2)}  # noqa: E731
    return [{"id": "a", "prompt_token_ids": [1, 2, 3], "generated_token_ids": A, "acc_ngram": acc(10)},
            {"id": "b", "prompt_token_ids": [1, 2], "generated_token_ids": A, "acc_ngram": acc(10), "category": "rag"},
            {"id": "c", "prompt_token_ids": [3], "generated_token_ids": A + [4, 5, 6], "acc_ngram": acc(12),
             "category": "rag"}]


def overall(out) -> dict:
    t = pd.read_csv(out / "simulated.csv", keep_default_na=False)
    return {m: float(v) for m, v in t[(t["task"] == "overall") & (t["position"] == "")][["method", "mat"]].values}


def test_a_trace_file_is_replayed_by_each_drafter_with_its_memory(tmp_path, capsys):
    out = tmp_path / "out"
    main(["--traces", str(write(tmp_path / "t.jsonl", rows())), "--out", str(out), "--method", "pld",
          "--method", "suffix", "--method", "suffix method.max_cached_requests=0", "--method", "suffix method.tree=true"])
    mat = overall(out)
    # the engine's steps: the prefill's token, then 3 tokens from token 1, then one at a time: 10 tokens in 8 steps,
    # 10 in 8, and its own 12 in 10
    assert mat["recorded ngram"] == pytest.approx(32 / 26)
    # the global tree holds the first answer when the second and third come: they are drafted far beyond what their
    # own prompts (no repeats) give
    assert mat["suffix"] > 1.5 * mat["suffix method.max_cached_requests=0"]
    assert mat["suffix method.max_cached_requests=0"] == mat["pld"] < 1.1  # within a request, only c's end repeats
    t = pd.read_csv(out / "simulated.csv", keep_default_na=False)
    assert set(t["task"]) == {"t", "rag", "overall"} and set(t[t["position"] != ""]["position"]) == {"0"}
    assert set(t["kind"]) == {"simulated", "recorded"}
    assert (out / "simulated_suffix_method.tree=true.jsonl").is_file()
    printed = capsys.readouterr().out
    assert "MAT by output position" in printed and "recorded ngram" in printed


def test_a_training_part_is_remembered_not_decoded(tmp_path):
    """``--train 1``: the first request only feeds the memory (and is the corpus of SAM's static automaton and REST's
    datastore): the two others are decoded from the start with it."""
    trace = write(tmp_path / "t.jsonl", rows())
    main(["--traces", str(trace), "--out", str(tmp_path / "all"), "--method", "suffix"])
    main(["--traces", str(trace), "--out", str(tmp_path / "split"), "--train", "1", "--method", "suffix",
          "--method", "rest", "--method", "sam method.threshold=2"])
    split = pd.read_json(tmp_path / "split" / "simulated_suffix.jsonl", lines=True)
    assert list(split["trace_id"]) == ["b", "c"]
    mat = overall(tmp_path / "split")
    assert mat["suffix"] > overall(tmp_path / "all")["suffix"]  # no cold first request among those decoded
    assert mat["rest"] > 1.5 and mat["sam method.threshold=2"] > 1.5  # both draft from the first answer


@pytest.mark.slow  # the embedded model's tokenizer
def test_texts_are_tokenized_with_the_given_tokenizer(tmp_path):
    texts = [{"prompt": "Repeat: the cat sat on the mat.", "response": "the cat sat on the mat. the cat sat on the mat."}]
    out = tmp_path / "out"
    main(["--traces", str(write(tmp_path / "t.jsonl", texts)), "--tokenizer", "smollm2-135m", "--out", str(out),
          "--method", "pld"])
    rec = pd.read_json(out / "simulated_pld.jsonl", lines=True).iloc[0]
    assert len(rec["choices"][0]["token_ids"][0]) > 10 and overall(out)["pld"] > 1


@pytest.mark.parametrize("line,says", [
    ({"prompt": "a", "response": "b"}, "give --tokenizer"),
    ({"prompt_token_ids": [1, 2], "generated_token_ids": "x"}, "not a list of token ids"),
    ({"text": "a"}, "has neither prompt_token_ids"),
])
def test_a_bad_trace_line_is_one_line_and_exit_2(tmp_path, capsys, line, says):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["--traces", str(write(tmp_path / "t.jsonl", [line])), "--out", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and len(err.strip().splitlines()) == 1 and not out.exists()
