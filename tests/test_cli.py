"""End to end on the embedded model through the real command lines; their error messages in this process (each
entry point also keeps a test of its own command line)."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from evaluation import equal, speed
from evaluation.records.answers import read_answers
from evaluation.records.equality import compare
from evaluation.running.prompts import prompt_ids
from methods.common import ROOT
from tests.helpers import cli, generate_greedy

pytestmark = pytest.mark.xdist_group("test_cli")  # on one worker (make test), so that vanilla_run is made once

# 81: two turns (writing); then translation, summarization (its shortest prompt: a prefill is most of a step's cost), qa,
# math
QIDS = [81, 161, 277, 321, 401]
MAX_NEW = 24


def run_overrides(*extra, warmup=0):
    """The overrides of the runs here (``evaluation.run`` on QIDS), as the command line or ``compose_config``
    takes them."""
    return [f"warmup={warmup}", "runtime.progress=false", f"bench.question_ids=[{','.join(map(str, QIDS))}]",
            f"bench.max_new_tokens={MAX_NEW}", *extra]


def run_args(out, *extra, warmup=0):
    return ("evaluation.run", f"hydra.run.dir={out}", *run_overrides(*extra, warmup=warmup))


def entry_error(main, args, capsys) -> str:
    """A command line's ``main(args)`` in this process, expected to refuse in one line and exit 2: its stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(list(map(str, args)))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def vanilla_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "vanilla"
    cli(*run_args(out))
    return out


@pytest.mark.slow
def test_answer_file_format(vanilla_run):
    recs = read_answers(vanilla_run)
    assert [r["question_id"] for r in recs] == QIDS
    for r in recs:
        c = r["choices"][0]
        n_turns = 2 if r["question_id"] == 81 else 1
        assert len(c["turns"]) == len(c["new_tokens"]) == len(c["wall_time"]) == len(c["token_ids"]) == n_turns
        assert sum(c["new_tokens"]) == sum(c["accept_lengths"]) == sum(map(len, c["token_ids"]))
        assert c["decoding_steps"] == c["new_tokens"]  # vanilla: one token per forward
        assert all(t > 0 for t in c["wall_time"])
        assert r["model_id"] == "smollm2-135m" and r["method"] == "vanilla"
    summary = json.loads((vanilla_run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["answered"] == len(QIDS)
    assert summary["environment"]["transformers"] and summary["config"]["method"]["name"] == "vanilla"


@pytest.mark.slow
def test_vanilla_equals_model_generate(vanilla_run, embedded):
    """Engine tokens == HF generate(do_sample=False) on Spec-Bench prompts, turn 2 built on turn 1's answer."""
    model, tok, spec = embedded
    from evaluation.records.bench import load_bench

    questions = {q.question_id: q for q in load_bench(None, question_ids=QIDS)}
    for rec in read_answers(vanilla_run):
        q, c = questions[rec["question_id"]], rec["choices"][0]
        for turn in range(len(q.turns)):
            ids = prompt_ids(spec, tok, list(q.turns[: turn + 1]), c["turns"][:turn])
            assert generate_greedy(model, ids, MAX_NEW) == c["token_ids"][turn], (q.question_id, turn)


def kill_after(n_answers, args, questions=len(QIDS)):
    """Start a run of ``questions`` questions, SIGKILL it once it has written ``n_answers`` lines, then resume it to
    the end."""
    out = Path(args[1].split("=", 1)[1])
    p = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    answers = out / "answers.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (answers.exists() and answers.read_text().count("\n") >= n_answers):
        time.sleep(0.2)
    p.send_signal(signal.SIGKILL)
    p.wait()
    done_before = answers.read_text().count("\n")
    assert n_answers <= done_before < questions
    with open(answers, "a") as f:  # a line cut short by the kill
        f.write('{"question_id": 999, "choi')
    cli(*args)
    return read_answers(out)


@pytest.mark.slow
def test_killed_run_resumes_and_answers_each_question_once(vanilla_run, tmp_path):
    recs = kill_after(2, run_args(tmp_path / "killed"))
    assert sorted(r["question_id"] for r in recs) == QIDS
    same, total, mismatches, unit = compare(read_answers(vanilla_run), recs)
    assert unit == "token" and not mismatches and same == total == len(QIDS) + 1


@pytest.mark.slow
@pytest.mark.long  # TR's state across a stop: tests/test_resume.py; a SIGKILL's cut line: the vanilla kill above
def test_killed_tr_run_resumes_with_the_same_state(vanilla_run, tmp_path):
    """Hot start across a kill: the matrix is saved with every answer, so accept lengths match an unbroken run (a
    30-node tree: a cheaper step, the same matrix; three questions: one answered before the kill at least, one
    after it at least)."""
    qids = QIDS[:3]
    args = lambda out: run_args(out, "method=tr", "method.tree=grown-n30-d6",  # noqa: E731
                                f"bench.question_ids=[{','.join(map(str, qids))}]", warmup=1)
    whole = tmp_path / "whole"
    cli(*args(whole))
    resumed = kill_after(1, args(tmp_path / "killed"), len(qids))
    unbroken = read_answers(whole)
    assert [r["question_id"] for r in resumed] == qids
    for a, b in zip(unbroken, resumed):
        assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
        assert a["choices"][0]["accept_lengths"] == b["choices"][0]["accept_lengths"], a["question_id"]
    assert compare([r for r in read_answers(vanilla_run) if r["question_id"] in qids], resumed)[2] == []  # lossless


@pytest.mark.slow
def test_rerun_of_a_finished_run_does_nothing(vanilla_run):
    before = (vanilla_run / "answers.jsonl").read_text()
    p = cli(*run_args(vanilla_run))
    assert "5/5 questions answered" in p.stdout
    assert (vanilla_run / "answers.jsonl").read_text() == before


@pytest.mark.slow
def test_resume_refuses_a_different_config(vanilla_run, run_error):
    before = {f.name: f.read_bytes() for f in vanilla_run.iterdir() if f.is_file() and f.name != ".lock"}
    said = run_error(*run_overrides("bench.max_new_tokens=7"), out=vanilla_run, base=())
    assert "bench.max_new_tokens is 24 there but 7 here" in said.err
    # the engine decides timings: part of the check
    said = run_error(*run_overrides("engine=hf"), out=vanilla_run, base=())
    assert "engine.name is 'static' there but 'hf' here" in said.err
    assert {f.name: f.read_bytes() for f in vanilla_run.iterdir() if f.is_file() and f.name != ".lock"} == before


@pytest.mark.slow
def test_equal_compares_the_questions_both_runs_answered(vanilla_run, tmp_path):
    """A method's run of a few questions against a vanilla run of more: the common questions, and how many of each
    side were left out (a settings difference is still refused: test_trust.py)."""
    recs = read_answers(vanilla_run)
    few = tmp_path / "few.jsonl"
    few.write_text("".join(json.dumps(r) + "\n" for r in recs[:2]))
    p = cli("evaluation.equal", str(vanilla_run), str(few))
    assert f"note: compared on the 2 question(s) both answered; left out: {len(recs) - 2} of" in p.stdout
    assert "EQUAL" in p.stdout and p.returncode == 0


@pytest.mark.slow
def test_equal_checker_reports_first_difference(vanilla_run, tmp_path):
    recs = read_answers(vanilla_run)
    recs[1]["choices"][0]["token_ids"][0][5] += 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in recs))
    ok = cli("evaluation.equal", str(vanilla_run), str(vanilla_run))
    assert "identical turns (tokens): 6/6 (100.0%)" in ok.stdout and "EQUAL" in ok.stdout
    p = cli("evaluation.equal", str(vanilla_run), str(bad), check=False)
    assert p.returncode == 1
    assert "identical turns (tokens): 5/6 (83.3%)" in p.stdout
    first = recs[1]["choices"][0]["token_ids"][0][5]
    assert f"question {QIDS[1]} turn 1: first difference at position 5: {first - 1} vs {first}" in p.stdout


@pytest.mark.slow
def test_speed_report_against_itself(vanilla_run, tmp_path):
    p = cli("evaluation.speed", str(vanilla_run), "--baseline", str(vanilla_run), "--out", str(tmp_path))
    assert "| vanilla | overall | 5 | 1.000 |" in p.stdout
    assert (tmp_path / "speed.csv").exists() and (tmp_path / "speed.md").exists()


def _bad(tmp_path, *args):
    """``evaluation.run ARGS`` on the command line, expected to fail in a message without a traceback and to leave
    no files (the refusals Hydra itself makes, before the runner: ``run_error`` cannot reach them)."""
    out = tmp_path / "run"
    p = cli("evaluation.run", f"hydra.run.dir={out}", "warmup=0", "runtime.progress=false", *args, check=False)
    assert p.returncode != 0
    assert "Traceback" not in p.stderr + p.stdout
    assert not out.exists() or not any(out.iterdir()), "a failed run left files behind"
    return p.stderr + p.stdout


@pytest.mark.parametrize("args, message", [
    (["method=trr"], "method=trr: no such method (did you mean tr?); known: eagle,"),
    (["model=gpt5"], "model=gpt5: no such model; known: deepseek-r1-distill-llama-8b, gemma3-270m,"),
    (["bench=nope"], "bench=nope: no such bench; known: spec_bench,"),
    (["model.checkpoint=/nonexistent/vicuna"], "model.checkpoint=/nonexistent/vicuna: no such folder here, and not a hub id"),
    (["bench.path=/nonexistent/q.jsonl"], "question file /nonexistent/q.jsonl does not exist"),
    (["bench.max_new_tokens=0"], "bench.max_new_tokens must be an integer of at least 1, got 0"),
    (["warmup=-1"], "warmup must be an integer of at least 0, got -1"),
    (["bench.limit_per_category=0"], "bench.limit_per_category must be at least 1"),
    (["bench.question_ids=[81]", "model.max_context=20"], "question 81: its first turn's prompt has"),
    (["model.checkpoint=/"], "cannot load model 'smollm2-135m' from '/'"),
    (["method=tr", "method.k=4"], "tree 'paper' uses ranks up to 7, which needs method.k >= 8"),
    (["method=tr", "method.start=warm"], "method.start must be one of hot, cold, prompt"),
    (["method=tr", "+method.depth=3"], "method 'tr' has no parameter depth"),
    (["model.device=cuda:0"] if not torch.cuda.is_available() else ["model.dtype=float8"],
     "CUDA is not available" if not torch.cuda.is_available() else "unknown model.dtype"),
])
def test_bad_input_gets_one_clear_message(run_error, args, message):
    assert message in run_error(*args).err


@pytest.mark.slow
def test_unknown_name_lists_known_options(tmp_path):
    """On the command line: an unknown config name is one message with the known ones."""
    text = _bad(tmp_path, "method=trr")
    assert "vanilla" in text  # the known options are listed
    text = _bad(tmp_path, "model=gpt5")
    assert "smollm2-135m" in text and "vicuna-7b" in text


def test_malformed_question_line(tmp_path, run_error):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["hi"]}) + "\n{oops\n")
    assert f"{q}:2: not valid JSON" in run_error(f"bench.path={q}").err


@pytest.mark.parametrize("content, message", [
    ('{"question_id": 1, "category": "qa", "turns": ["hi"]}\n', "missing 'choices'"),
    ('{"question_id": 1, "choices": [{"turns": ["x"]}]}\n', "lacks decoding_steps"),
    ("not json\n", "not valid JSON"),
])
@pytest.mark.slow
def test_checker_and_report_refuse_wrong_format(tmp_path, vanilla_run, content, message, capsys):
    f = tmp_path / "wrong.jsonl"
    f.write_text(content)
    for main, args in ((equal.main, (vanilla_run, f)), (speed.main, (f,))):
        assert message in entry_error(main, args, capsys)


def test_checker_missing_file(tmp_path, capsys):
    assert "no answer file at" in entry_error(equal.main, (tmp_path / "a", tmp_path / "b"), capsys)


@pytest.mark.slow
def test_experiment_multirun_ends_in_a_table(tmp_path):
    """An ablation experiment runs as a Hydra multirun, says which job of how many runs, and writes its table,
    speedups against report.baseline (a vanilla run of the same questions and new tokens: evaluation.records.consistency)."""
    settings = ["warmup=0", "runtime.progress=false", f"bench.question_ids=[{QIDS[1]}]", "bench.max_new_tokens=6"]
    cli("evaluation.run", "method=vanilla", f"hydra.run.dir={tmp_path / 'vanilla'}", *settings)
    sweep = tmp_path / "sweep"
    p = cli("evaluation.run", "experiment=tr_start", f"hydra.sweep.dir={sweep}", *settings,
            f"report.baseline={tmp_path / 'vanilla'}")
    table = (sweep / "sweep.md").read_text().splitlines()
    assert len(table) == 2 + 3  # header, rule, one row per start policy
    assert table[0].startswith("| run | method | k | tree |")
    assert table[0].rstrip().endswith("| speedup | speedup 95% low | speedup 95% high |")
    assert {line.split("|")[7].strip() for line in table[2:]} == {"hot", "cold", "prompt"}
    assert "sweep.md" in p.stdout and "sweep job 3 of 3: method.start=" in p.stdout
    assert (sweep / "report" / "start_policies.png").is_file() and (sweep / "report" / "main_table.tex").is_file()
