"""What a run says about its input before it decodes (issue 35): a refusal is one line on stderr naming the problem
and the fix, exit 2, nothing written; a note is one line. In this process: ``evaluation.run``'s entry point with its
command line, or ``run(compose_config(overrides), out)`` on the embedded model."""
import json
import sys
from pathlib import Path

import pytest

from evaluation.records.answers import ANSWERS
from evaluation.records.bench import load_bench
from evaluation.running.config import compose_config
from methods.common import HarnessError
from methods.tree import TreeError, load_template


def question_file(tmp_path, *questions: list[str], category: str = "qa") -> Path:
    """A question file holding one question per list of turns, ids 1, 2, ..."""
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps({"question_id": i, "category": category, "turns": turns}) + "\n"
                         for i, turns in enumerate(questions, start=1)))
    return f


def command_error(monkeypatch, capsys, tmp_path, *args) -> str:
    """``python -m evaluation.run ARGS`` in this process (Hydra reads ``sys.argv``), expected to refuse: exit 2, one
    line on stderr and nothing else there, no run folder. Returns the line."""
    from evaluation import run

    out = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["evaluation.run", f"hydra.run.dir={out}", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run.main()
    said = capsys.readouterr()
    lines = said.err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), said
    assert not out.exists()
    return lines[0]


def one_line(said) -> str:
    """The one line a refused run (``run_error``) printed on stderr (besides the progress bar of a model loading)."""
    lines = [line for line in said.err.strip().splitlines() if not line.startswith("Loading weights")]
    assert len(lines) == 1, said.err
    return lines[0]


# --- 1, 2. the command line's config: misspelt keys, unknown options --------------------------------------

@pytest.mark.parametrize("args, message", [
    (["method=tr", "method.kk=3"],
     "method 'tr' has no parameter kk (did you mean method.k?); known: k, tree, start, fit_tree_to_k, first_step"),
    (["method.kk=3"], "method 'vanilla' has no parameter kk; it takes none"),
    (["bench.max_new_token=16"], "unknown setting bench.max_new_token (did you mean bench.max_new_tokens?); the keys "
                                 "of bench: name, file, path, categories, question_ids, limit_per_category, "
                                 "skip_per_category, max_new_tokens, rounds, num_choices, bon_reference, "
                                 "force_end_of_thinking"),
    (["warmupp=1"], "unknown setting warmupp (did you mean warmup?); the keys of the config: hydra, warmup,"),
    (["engine.thread=2"], "engine 'static' has no parameter thread (did you mean engine.threads?); known: "),
])
def test_a_misspelt_key_names_the_known_ones(monkeypatch, capsys, tmp_path, args, message):
    assert command_error(monkeypatch, capsys, tmp_path, *args).startswith(f"error: {message}")


@pytest.mark.parametrize("args, message", [
    (["model=vicuna7b"], "model=vicuna7b: no such model (did you mean vicuna-7b?); known: "
                         "deepseek-r1-distill-llama-8b, gemma3-270m, llama-2-7b-chat, llama-3-8b-instruct, "
                         "llama-3.1-8b-instruct, qwen2.5-7b-instruct, qwen3-8b, smollm2-135m, vicuna-13b, vicuna-33b, "
                         "vicuna-7b"),
    (["method=trr"], "method=trr: no such method (did you mean tr?); known: eagle, eagle2, eagle3, hydra,"),
    (["bench=spec_bench_smok"], "bench=spec_bench_smok: no such bench (did you mean spec_bench_smoke?); known: "
                                "spec_bench, spec_bench_sample, spec_bench_smoke"),
    (["experiment=tr-k"], "experiment=tr-k: no such experiment (did you mean tr_k?); known: batch_sweep, budget_sweep, paper_table,"),
])
def test_an_unknown_option_is_one_line_with_the_known_ones(monkeypatch, capsys, tmp_path, args, message):
    assert command_error(monkeypatch, capsys, tmp_path, *args).startswith(f"error: {message}")


def test_scripts_composing_the_config_get_the_same_line():
    """``compose_config`` (scripts.bench_methods, the training scripts) says what the command line says."""
    with pytest.raises(HarnessError, match=r"^unknown setting bench\.max_new_token \(did you mean "
                                           r"bench\.max_new_tokens\?\)"):
        compose_config(["bench.max_new_token=16"])
    with pytest.raises(HarnessError, match=r"^model=vicuna7b: no such model \(did you mean vicuna-7b\?\)"):
        compose_config(["model=vicuna7b"])


# --- 3. what the config alone tells, before the target's weights load ---------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (["model=vicuna-7b", "method=eagle3"], "method 'eagle3' needs an EAGLE-3 head and the model config names none"),
    (["model=llama-2-7b-chat", "method=medusa"], "method 'medusa' needs Medusa heads and the model config names none"),
    (["model=llama-3-8b-instruct", "method=hydra"], "method 'hydra' needs Hydra heads and the model config names"),
    (["model=vicuna-7b", "method=eagle2", "method.head=null"], "method 'eagle2' needs a draft head"),
    (["model=vicuna-7b", "method=sam_eagle2", "method.head=null"], "needs a draft head and the model config names"),
    (["model=vicuna-7b", "method=sps", "method.drafter=null"], "method 'sps' needs a drafter"),
    (["model=vicuna-7b", "method=sam"], "method.corpus=data/sam/vicuna-7b.npz: no such file"),
    (["model=vicuna-7b", "method=rest"], "method.datastore=data/sam/vicuna-7b.npz: no such file"),
    (["method=tr", "method.k=0"], "method.k must be an integer from 1"),
])
def test_what_the_config_alone_tells_comes_before_the_model_loads(run_error, monkeypatch, overrides, message):
    import evaluation.running.runner

    monkeypatch.setattr(evaluation.running.runner, "load_model", lambda spec: pytest.fail("the target model was loaded"))
    assert message in one_line(run_error(*overrides))


def test_a_head_not_to_be_had_is_said_before_the_target_loads(run_error, monkeypatch):
    """Offline, the target cached but its EAGLE-3 head not: the head's download is named before any weight loads
    (it was named only after the target's weights had loaded)."""
    import evaluation.running.runner
    from methods import hub

    monkeypatch.setattr(hub, "offline", lambda: True)
    monkeypatch.setattr(hub, "in_cache", lambda repo: repo == "meta-llama/Llama-3.1-8B-Instruct")
    monkeypatch.setattr(evaluation.running.runner, "load_model", lambda spec: pytest.fail("the target was loaded"))
    line = one_line(run_error("model=llama-3.1-8b-instruct", "method=eagle3"))
    assert "download yuhuili/EAGLE3-LLaMA3.1-Instruct-8B or set method.head=PATH" in line


def test_bench_methods_says_it_before_any_model_loads(tmp_path, monkeypatch, capsys):
    from evaluation.running import side_by_side
    from scripts import bench_methods

    monkeypatch.setattr(side_by_side, "load_model", lambda spec: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as e:
        bench_methods.main(["method=vanilla", "method=eagle3", "--set", "model=vicuna-7b", "--out",
                            str(tmp_path / "b")])
    assert e.value.code == 2 and "method 'eagle3' needs an EAGLE-3 head" in capsys.readouterr().err


# --- 4. prompts that cannot fit the model's context -------------------------------------------------------

def test_a_prompt_beyond_the_context_is_refused_before_any_question_is_decoded(tmp_path, run_error):
    q = question_file(tmp_path, ["Say hi."], ["word " * 100])  # the first fits, the second does not
    line = one_line(run_error(f"bench.path={q}", "model.max_context=64"))
    assert "question 2: its first turn's prompt has 1" in line and "smollm2-135m's context of 64 tokens" in line
    assert "bench.question_ids" in line


def test_a_later_turn_whose_user_text_alone_passes_the_context_is_refused_at_the_start(tmp_path, run_error):
    """A later turn's prompt holds the answers before it, unknown at the start; without them it is a lower bound."""
    q = question_file(tmp_path, ["Say hi."], ["Say hi.", "word " * 100])
    line = one_line(run_error(f"bench.path={q}", "model.max_context=64"))
    assert "question 2 turn 2: its prompt has at least 1" in line and "(the answers before it left out)" in line


def test_a_prompt_that_leaves_less_than_max_new_tokens_is_said_at_the_start(tmp_path, capsys, reuse_embedded):
    from evaluation.running.runner import run

    q = question_file(tmp_path, ["word " * 20], ["Say hi."])  # prompts of 51 and 33 tokens
    run(compose_config([f"bench.path={q}", "model.max_context=56", "bench.max_new_tokens=8", "warmup=0",
                        "runtime.progress=false"]), tmp_path / "run")
    err = capsys.readouterr().err
    assert err.count("WARNING") == 1 and "WARNING: 1 question(s) (1) leave(s) less than bench.max_new_tokens=8 " \
                                           "of smollm2-135m's context of 56 tokens after the first turn's prompt" in err


# --- 5. tree files ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("tree, message", [
    ({"children": [[2, 1], [1]]}, "children level 0 lists 2 count(s) [2, 1] but depth 0 has one node, the root; give "
                                  "one count per node"),
    ({"children": [[2], [1]]}, "children level 1 lists 1 count(s) [1] but depth 1 has 2 node(s), the sum of level 0"),
    ({"children": [[2], [1, 0, 1]]}, "children level 1 lists 3 count(s) [1, 0, 1] but depth 1 has 2 node(s)"),
    ({"children": [[1], 2]}, "tree children level 1 must be a list of integers, got 2"),
    ({"children": 3}, "is malformed"),
    ({"parents": [-1, 0, 2]}, "node 2 has parent 2"),
    ({"parents": [-1, 0, 1, 0]}, "breaks breadth-first order"),
    ({"parents": [-1, 0, 0.7]}, "tree parents must be a list of integers"),
])
def test_a_tree_file_of_the_wrong_structure_is_refused_naming_the_file(tmp_path, tree, message):
    f = tmp_path / "t.json"
    f.write_text(json.dumps(tree))
    with pytest.raises(TreeError) as e:
        load_template(str(f))
    assert str(e.value).startswith(f"tree file {f}") and message in str(e.value)



def test_a_tree_file_is_read_before_the_model_loads(tmp_path, run_error, monkeypatch):
    import evaluation.running.runner

    f = tmp_path / "t.json"
    f.write_text(json.dumps({"children": [[2], [1]]}))
    monkeypatch.setattr(evaluation.running.runner, "load_model", lambda spec: pytest.fail("the target model was loaded"))
    assert one_line(run_error("method=tr", f"method.tree={f}")).startswith(f"error: tree file {f}: children level 1")

# --- 6. questions ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("turns, which", [(["Hi.", ""], 2), ([" \n"], 1)])
def test_an_empty_turn_is_refused_with_its_line(tmp_path, turns, which):
    q = question_file(tmp_path, ["Say hi."], turns)
    with pytest.raises(HarnessError, match=f"^{q}:2: question 2 turn {which} is empty; write its text or remove it"):
        load_bench(str(q))


# --- 7, 8. a sample of a question file; a resume --------------------------------------------------------------

def test_a_sample_of_a_question_file_and_a_resume_say_so_in_one_line(tmp_path, capsys, reuse_embedded):
    from evaluation.running.runner import run

    q = question_file(tmp_path, ["Say hi."], ["Say yes."], ["Say no."])  # one category: the smoke bench takes 2
    out, answers = tmp_path / "run", tmp_path / "run" / ANSWERS
    cfg = compose_config([f"bench.path={q}", "bench.max_new_tokens=2", "warmup=0", "runtime.progress=false"])
    run(cfg, out)
    said = capsys.readouterr().out
    assert (f"note: bench spec_bench_smoke takes 2 question(s) per category of {q}: 2 of its 3; bench=spec_bench "
            f"or bench.limit_per_category=null takes them all\n") in said
    assert "resuming" not in said
    first, second = answers.read_text().splitlines(keepends=True)
    answers.write_text(first + second[:30])  # the second answer cut short by a kill
    run(cfg, out)
    assert f"resuming: 1 of 2 answers kept in {answers}; a half-written last line dropped\n" in capsys.readouterr().out
    run(cfg, out)
    assert f"resuming: 2 of 2 answers kept in {answers}\n" in capsys.readouterr().out

