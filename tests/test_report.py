"""evaluation.report on small result sets with hand-computed numbers; Spec-Bench interchange."""
import json
import math

import numpy as np
import pytest

from evaluation import report as rp
from evaluation.records.metrics import accept_histogram, repeat_table, task_table
from evaluation.reporting.collect import engine_name
from methods.common import HarnessError

ENV = {"device": "cpu", "device_name": "x86_64", "cpu_threads": 2, "dtype": "float32", "torch": "2.13.0",
       "transformers": "5.23.0"}
BENCH = {"name": "tiny", "max_new_tokens": 20}


def rec(qid, category, tokens, seconds, accepts, model="tiny-llama", text="x"):
    """One answer record in Spec-Bench's format (one turn), plus nothing of ours."""
    assert sum(accepts) == tokens
    return {"question_id": qid, "category": category, "answer_id": f"a{qid}", "model_id": model, "tstamp": 0.0,
            "choices": [{"index": 0, "turns": [text], "decoding_steps": [len(accepts)], "new_tokens": [tokens],
                         "wall_time": [seconds], "accept_lengths": accepts}]}


def write_run(folder, method, records, params=None, state=None, model="tiny-llama", env=ENV, bench=BENCH,
              engine=None):
    folder.mkdir(parents=True)
    (folder / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "summary.json").write_text(json.dumps({
        "status": "finished", "model": model, "method": method,
        "config": {"method": {"name": method, **(params or {})}, "bench": bench,
                   **({"engine": engine} if engine else {})},
        "environment": env, "method_state": state or {}}))
    return folder


# Hand-computed set: vanilla 5 tok/s on both tasks; two repeats of tr.
VANILLA = [rec(1, "qa", 10, 2.0, [1] * 10), rec(2, "rag", 20, 4.0, [1] * 20)]
TR_A = [rec(1, "qa", 10, 1.0, [1, 4, 5]), rec(2, "rag", 20, 2.0, [1, 9, 10])]   # 10 and 10 tok/s
TR_B = [rec(1, "qa", 10, 0.5, [1, 4, 5]), rec(2, "rag", 20, 4.0, [1, 9, 10])]   # 20 and 5 tok/s


@pytest.fixture
def runs(tmp_path):
    write_run(tmp_path / "vanilla", "vanilla", VANILLA)
    write_run(tmp_path / "tr" / "r1", "tr", TR_A, {"k": 8}, {"k": 8})
    write_run(tmp_path / "tr" / "r2", "tr", TR_B, {"k": 8}, {"k": 8})
    return tmp_path


def test_main_table_equals_hand_computed_numbers(runs, tmp_path):
    result = rp.report([str(runs)], tmp_path / "out", figures=False)
    t = result["table"].set_index("method")
    assert list(t.index) == ["vanilla", "tr"] and t.loc["tr", "repeats"] == 2
    # qa: 2.0 and 4.0 -> mean 3, std sqrt(2); rag: 2.0 and 1.0; overall 30/3 and 30/4.5 tok/s over 30/6.
    assert t.loc["tr", "qa"] == pytest.approx(3.0) and t.loc["tr", "qa_std"] == pytest.approx(math.sqrt(2))
    assert t.loc["tr", "rag"] == pytest.approx(1.5) and t.loc["tr", "rag_std"] == pytest.approx(math.sqrt(0.5))
    assert t.loc["tr", "speedup"] == pytest.approx((2.0 + 4 / 3) / 2)
    assert t.loc["tr", "speedup_std"] == pytest.approx(abs(2.0 - 4 / 3) / math.sqrt(2))
    assert t.loc["tr", "tok_per_s"] == pytest.approx((10 + 20 / 3) / 2)
    assert t.loc["tr", "mat"] == pytest.approx(5.0) and t.loc["tr", "mat_std"] == pytest.approx(0.0)
    assert t.loc["vanilla", "mat"] == 1.0 and t.loc["vanilla", "speedup"] == pytest.approx(1.0)
    assert math.isnan(t.loc["vanilla", "speedup_std"])  # one run: no spread, and none is invented
    md = (tmp_path / "out" / "main_table.md").read_text()
    # One question per task: no interval to give, and the cell says so rather than show one of width zero
    assert ("| tiny-llama | tr | 3.00 ± 1.41× (n=1) | 1.50 ± 0.71× (n=1) | 5.00 ± 0.00 (n=1 per task) "
            "| 5.00 ± 0.00 (n=1 per task) | 8.33 ± 2.36 | 1.67 ± 0.47× (n=1 per task) |") in md
    csv = (tmp_path / "out" / "main_table.csv").read_text().splitlines()
    assert csv[0].startswith("model,method,baseline,repeats,memory,qa,qa_std,qa_lo,qa_hi,qa_n,rag,rag_std,rag_lo,rag_hi,"
                             "rag_n,mat")


def test_mat_in_both_conventions(tmp_path):
    """Ours counts every forward (the prefill's one token too); Spec-Bench's drafting scripts verify their first
    drafts in the prompt's forward, so a turn whose first step was our prefill has one step fewer there. The
    runner writes that count (spec_bench_steps); files without it (Spec-Bench's own) count steps as they are."""
    from evaluation.records.metrics import task_table

    ours = rec(1, "qa", 10, 1.0, [1, 4, 5])
    ours["choices"][0].update(prefill_step=[True], spec_bench_steps=[2])
    tree_first = rec(2, "qa", 10, 1.0, [5, 5])  # TR's reference prefill: no prefill step to fold
    tree_first["choices"][0].update(prefill_step=[False], spec_bench_steps=[2])
    theirs = rec(3, "qa", 10, 1.0, [5, 5])  # a Spec-Bench file
    t = task_table([ours, tree_first, theirs]).loc["overall"]
    assert t["mat"] == pytest.approx(30 / 7) and t["mat_specbench"] == pytest.approx(30 / 6)
    write_run(tmp_path / "v", "vanilla", VANILLA[:1])
    write_run(tmp_path / "pld", "pld", [ours])
    table = rp.report([str(tmp_path)], tmp_path / "out", figures=False)["table"].set_index("method")
    assert table.loc["pld", "mat"] == pytest.approx(10 / 3) and table.loc["pld", "mat_specbench"] == 5.0
    assert "| MAT | MAT (Spec-Bench) |" in (tmp_path / "out" / "main_table.md").read_text()


def test_a_table_of_separate_runs_says_so(runs, tmp_path):
    rp.report([str(runs)], tmp_path / "separate", figures=False)
    assert "made at different times" in (tmp_path / "separate" / "main_table.md").read_text()
    for name in ("vanilla", "tr/r1", "tr/r2"):  # as scripts.bench_methods writes them: one session
        summary = json.loads((runs / name / "summary.json").read_text())
        (runs / name / "summary.json").write_text(json.dumps({**summary, "session": "s1"}))
    rp.report([str(runs)], tmp_path / "together", figures=False)
    assert "different times" not in (tmp_path / "together" / "main_table.md").read_text()


def test_spec_bench_speedup_definition_beside_ours(runs, tmp_path):
    stats = rp.report([str(runs / "vanilla"), str(runs / "tr" / "r1")], tmp_path / "o", figures=False)["stats"]
    o = stats[(stats["method"] == "tr") & (stats["task"] == "overall")].iloc[0]
    # Spec-Bench: mean per-question tok/s (10, 10) over the baseline's (5, 5) = 2.0; ours: 30/3 over 30/6 = 2.0.
    assert o["speedup_specbench"] == pytest.approx(2.0) and o["speedup"] == pytest.approx(2.0)
    b = rp.report([str(runs / "vanilla"), str(runs / "tr" / "r2")], tmp_path / "p", figures=False)["stats"]
    o = b[(b["method"] == "tr") & (b["task"] == "overall")].iloc[0]
    assert o["speedup_specbench"] == pytest.approx(((20 + 5) / 2) / 5) and o["speedup"] == pytest.approx(4 / 3)


def test_latex_table_is_booktabs_and_marks_the_best(runs, tmp_path):
    write_run(runs / "pld", "pld", [rec(1, "qa", 10, 1.5, [2, 8]), rec(2, "rag", 20, 1.0, [20])])
    rp.report([str(runs)], tmp_path / "out", figures=False)
    tex = (tmp_path / "out" / "main_table.tex").read_text()
    for part in (r"\toprule", r"\midrule", r"\bottomrule", r"\begin{tabular}{llrrrrrr}", r"tiny-llama"):
        assert part in tex
    rows = {line.split(" & ")[1]: line for line in tex.splitlines() if line.startswith("tiny-llama")}
    assert r"\textbf{4.00$\times$ (n=1)}" in rows["pld"]  # rag (one question): pld 20 tok/s over 5 beats tr's 1.50
    assert r"\textbf{3.00 $\pm$ 1.41$\times$ (n=1)}" in rows["tr"]  # qa: tr beats pld's 1.33
    assert r"\textbf" not in rows["vanilla"]


def test_labels_tell_configurations_apart(runs, tmp_path):
    write_run(runs / "tr_k4", "tr", TR_A, {"k": 4}, {"k": 4})
    labels = list(rp.report([str(runs)], tmp_path / "o", figures=False)["table"]["method"])
    assert labels == ["vanilla", "tr (k=4)", "tr (k=8)"]  # a method's settings in natural order


def test_each_engine_is_measured_against_its_own_vanilla(tmp_path):
    """Runs on two engines: labelled apart, and each method's speedup taken against vanilla on its engine."""
    static = {"name": "static", "pack": "auto"}
    write_run(tmp_path / "v_hf", "vanilla", VANILLA, engine={"name": "hf"})
    write_run(tmp_path / "v_static", "vanilla", [rec(1, "qa", 10, 1.0, [1] * 10), rec(2, "rag", 20, 2.0, [1] * 20)],
              engine=static)
    write_run(tmp_path / "tr_static", "tr", TR_A, {"k": 8}, {"k": 8}, engine=static)
    t = rp.report([str(tmp_path)], tmp_path / "out", figures=False)["table"].set_index("method")
    assert set(t.index) == {"vanilla (engine=hf)", "vanilla (engine=static)", "tr"}
    assert t.loc["tr", "speedup"] == pytest.approx(1.0)  # 10 tok/s against static vanilla's 10, not hf's 5
    assert t.loc["vanilla (engine=static)", "speedup"] == pytest.approx(1.0)
    write_run(tmp_path / "tr_hf_only" / "tr", "tr", TR_A, {"k": 8}, {"k": 8}, engine={"name": "hf"})
    with pytest.raises(HarnessError, match="no vanilla run of model tiny-llama on engine static"):
        rp.report([str(tmp_path / "v_hf"), str(tmp_path / "tr_static")], tmp_path / "out2", figures=False)


def test_accept_histogram_and_repeats():
    h = accept_histogram(TR_A)
    assert h.to_dict() == pytest.approx({1: 2 / 6, 4: 1 / 6, 5: 1 / 6, 9: 1 / 6, 10: 1 / 6})
    t = repeat_table([TR_A, TR_B], [VANILLA, VANILLA])
    assert t.loc["overall", "speedup"] == pytest.approx((2.0 + 4 / 3) / 2) and t.loc["overall", "repeats"] == 2


@pytest.mark.slow  # renders every figure
def test_figures_for_methods_and_ablations(tmp_path):
    root = tmp_path / "runs"
    write_run(root / "vanilla", "vanilla", VANILLA)
    for k, secs in ((2, 3.0), (4, 2.0), (8, 1.5)):
        write_run(root / f"k{k}", "tr", [rec(1, "qa", 10, secs / 2, [1, 4, 5]), rec(2, "rag", 20, secs, [1, 9, 10])],
                  {"k": k, "tree": "paper", "start": "hot"}, {"k": k, "tree_nodes": 81, "tree_depth": 6})
    for name, nodes, depth in (("small", 31, 6), ("deep", 81, 8)):
        write_run(root / name, "tr", [rec(1, "qa", 10, 1.0, [2, 8]), rec(2, "rag", 20, 2.0, [10, 10])],
                  {"k": 8, "tree": name, "start": "hot"}, {"k": 8, "tree_nodes": nodes, "tree_depth": depth})
    for start in ("cold", "prompt"):
        write_run(root / start, "tr", TR_A, {"k": 8, "tree": "paper", "start": start},
                  {"k": 8, "tree_nodes": 81, "tree_depth": 6})
    out = tmp_path / "out"
    files = rp.report([str(root)], out)["files"]
    for name in ("speedup_per_task", "accept_lengths", "ablation_k", "ablation_tree_size", "ablation_tree_depth",
                 "start_policies"):
        for ext in ("png", "pdf"):
            assert out / f"{name}.{ext}" in files and (out / f"{name}.{ext}").stat().st_size > 5000, name
    env = json.loads((out / "environment.json").read_text())
    assert "cpu x86_64, 2 threads, float32, torch 2.13.0" in env["environment"]


@pytest.mark.parametrize("case, message", [
    ("no_baseline", "no vanilla run of model other-llama on engine hf (runs: tr); add that model's vanilla run"),
    ("baseline_of_other_model", "is a run of ['tiny-llama'] but tr runs other-llama"),
    ("not_repeats", "are both tr on tiny-llama but answer different questions"),
    ("missing", "does not exist"),
    ("disjoint", "answer no question in common"),
])
def test_a_set_that_cannot_make_a_table_is_refused(tmp_path, capsys, case, message):
    write_run(tmp_path / "vanilla", "vanilla", VANILLA)
    args = [str(tmp_path / "vanilla")]
    if case in ("no_baseline", "baseline_of_other_model"):
        write_run(tmp_path / "other", "tr", TR_A, model="other-llama")
        args += [str(tmp_path / "other")] + (["--baseline", str(tmp_path / "vanilla")]
                                              if case == "baseline_of_other_model" else [])
    elif case == "not_repeats":
        write_run(tmp_path / "a", "tr", TR_A)
        write_run(tmp_path / "b", "tr", TR_A[:1])
        args += [str(tmp_path / "a"), str(tmp_path / "b")]
    elif case == "missing":
        args += [str(tmp_path / "nowhere")]
    else:
        write_run(tmp_path / "a", "tr", [rec(9, "qa", 10, 1.0, [1, 4, 5])])
        args += [str(tmp_path / "a")]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        rp.main(args + ["--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()  # nothing half-written


def test_reads_spec_bench_answer_files(tmp_path):
    """Files written by Spec-Bench's own harness: its fields only, named <model>-<method>-<dtype>.jsonl."""
    folder = tmp_path / "model_answer"
    folder.mkdir()
    for name, recs in (("vicuna-7b-v1.3-vanilla-float16", VANILLA), ("vicuna-7b-v1.3-tr-float16", TR_A)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({**r, "model_id": name}) + "\n" for r in recs))
    base = folder / "vicuna-7b-v1.3-vanilla-float16.jsonl"
    result = rp.report([f"tr={folder / 'vicuna-7b-v1.3-tr-float16.jsonl'}"], tmp_path / "out", baseline=str(base))
    t = result["table"].set_index("method")
    assert list(t.index) == ["vicuna-7b-v1.3-vanilla-float16", "tr"]
    assert t.loc["tr", "speedup"] == pytest.approx(2.0) and t.loc["tr", "mat"] == pytest.approx(5.0)
    assert "environment not recorded" in rp.environment_line(result["groups"])
    # Without a baseline named, the message says how to give one.
    with pytest.raises(HarnessError, match="name a baseline with --baseline RUN"):
        rp.report([str(folder)], tmp_path / "o2")


def spec_bench_speed(path, base_path, tokenizer, task):
    """(MAT, speedup) as Spec-Bench's evaluation/speed.py computes them from two answer files (its rules, written
    here from its documented behaviour): MAT the mean of every accept_lengths entry of the task's questions; speedup
    the mean over the method's questions of new_tokens / wall_time over the same mean for the baseline, whose tokens
    are each turn's text re-tokenized, minus one."""
    mt = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}

    def rows(p):
        recs = [json.loads(line) for line in open(p)]
        return [r for r in recs if task == "overall" or r["category"] == task or (task == "mt_bench"
                                                                                  and r["category"] in mt)]

    mine, base = rows(path), rows(base_path)
    speeds = [sum(r["choices"][0]["new_tokens"]) / sum(r["choices"][0]["wall_time"]) for r in mine]
    speeds0 = [sum(len(tokenizer(t).input_ids) - 1 for t in r["choices"][0]["turns"]) / sum(r["choices"][0]["wall_time"])
               for r in base]
    return np.mean([a for r in mine for a in r["choices"][0]["accept_lengths"]]), np.mean(speeds) / np.mean(speeds0)


@pytest.mark.slow  # two runs of the embedded model
def test_our_answer_files_read_as_spec_bench_files(tmp_path, embedded, reuse_embedded):
    """Spec-Bench's speed computation on a real run's answer files gives our "Spec-Bench" columns, per task and
    overall, in the report and in evaluation.speed; our own MAT stays ours (the prefill's token its own step)."""
    from evaluation.reporting.speed_table import speed_table
    from tests.helpers import run_here
    from tests.test_cli import run_overrides

    runs = {m: run_here(tmp_path / m, *run_overrides(f"method={m}", "bench.question_ids=[81,161,401]"))
            for m in ("vanilla", "pld")}
    for method, folder in runs.items():
        for line in (folder / "answers.jsonl").read_text().splitlines():
            r = json.loads(line)
            c = r["choices"][0]
            assert isinstance(r["question_id"], int) and isinstance(r["category"], str) and r["model_id"]
            assert len(c["turns"]) == len(c["new_tokens"]) == len(c["wall_time"]) == len(c["decoding_steps"])
            assert all(isinstance(t, str) for t in c["turns"])
            assert sum(c["decoding_steps"]) == len(c["accept_lengths"]) and sum(c["accept_lengths"]) == sum(
                c["new_tokens"]) == sum(c["our_accept_lengths"]) and sum(c["our_decoding_steps"]) == len(
                c["our_accept_lengths"])
            folded = sum(c["our_decoding_steps"]) - sum(c["decoding_steps"])
            assert folded == (len(c["turns"]) if method == "pld" else 0)  # PLD's first token joins its first step
    _, tok, _ = embedded
    stats = rp.report([str(runs["vanilla"]), str(runs["pld"])], tmp_path / "out", figures=False)["stats"]
    speed = speed_table([str(runs["pld"])], str(runs["vanilla"]))[0].set_index("task")
    for task in ("mt_bench", "translation", "math_reasoning", "overall"):
        mat, speedup = spec_bench_speed(runs["pld"] / "answers.jsonl", runs["vanilla"] / "answers.jsonl", tok, task)
        row = stats[(stats["method"] == "pld") & (stats["task"] == task)].iloc[0]
        assert round(row["mat_specbench"], 3) == round(mat, 3) and round(row["speedup_specbench"], 3) == round(
            speedup, 3), task
        assert round(speed.loc[task, "MAT (Spec-Bench)"], 3) == round(mat, 3)
        assert round(speed.loc[task, "speedup (Spec-Bench)"], 3) == round(speedup, 3)
        assert row["mat"] < row["mat_specbench"]  # ours counts the prefill's token as a step of its own


def test_an_answer_line_holds_spec_bench_steps_and_ours_and_reads_back(tmp_path):
    """Under Spec-Bench's keys its steps (a drafting method's first token in its first step), ours under our_*;
    read back per forward as before; a line written before our_accept_lengths existed reads as it is."""
    from evaluation.records.answers import AnswerWriter, read_answers

    rec = {"question_id": 1, "category": "qa", "choices": [{
        "index": 0, "turns": ["a", "b"], "decoding_steps": [3, 1], "new_tokens": [6, 1], "wall_time": [1.0, 1.0],
        "accept_lengths": [1, 3, 2, 1], "spec_bench_steps": [2, 1], "draft_nodes": [0, 8, 8, 0]}]}
    AnswerWriter(tmp_path / "answers.jsonl").append(rec)
    line = json.loads((tmp_path / "answers.jsonl").read_text())["choices"][0]
    assert line["accept_lengths"] == [4, 2, 1] and line["decoding_steps"] == [2, 1]
    assert line["our_accept_lengths"] == [1, 3, 2, 1] and line["our_decoding_steps"] == [3, 1]
    assert list(line)[:6] == ["index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"]
    assert read_answers(tmp_path / "answers.jsonl") == [rec]
    (tmp_path / "old.jsonl").write_text(json.dumps(rec) + "\n")  # the old layout: ours under Spec-Bench's keys
    assert read_answers(tmp_path / "old.jsonl") == [rec]
    t = task_table(read_answers(tmp_path / "old.jsonl"))
    assert t.loc["overall", "mat"] == 7 / 4 and t.loc["overall", "mat_specbench"] == 7 / 3


@pytest.mark.slow  # a Jupyter kernel
def test_engine_names_tell_configurations_apart():
    assert engine_name(None) == "hf"
    assert engine_name({"name": "static", "pack": "auto", "compile": False}) == "static"
    assert engine_name({"name": "static", "pack": False}) == "static(pack=False)"
    assert engine_name({"name": "static", "pack": "auto", "compile": True, "compile_mode": "default"}) == \
        "static(compiled)"
    assert engine_name({"name": "static", "pack": "auto", "compile": True, "compile_mode": "reduce-overhead"}) \
        == "static(compiled:reduce-overhead)"
    auto = {"name": "static", "pack": "auto", "compile": "auto"}  # what ran is the summary's
    assert engine_name(auto, {"step": "eager"}) == "static"
    assert engine_name(auto, {"step": "eager"}, "cuda:0") == "static(eager)"  # a GPU run always says how it stepped
    assert engine_name(auto, {"step": "cuda-graphs"}, "cuda:0") == "static(cuda-graphs)"
    assert engine_name({"name": "hf"}, {"step": "eager"}, "cuda") == "hf(eager)"


def steps_rec(qid, category, accepts, depths, drafters=None, turns=None):
    """A record with the runner's per-step fields: draft depths (nodes: 2 per depth) and drafters."""
    r = rec(qid, category, sum(accepts), 1.0, accepts)
    c = r["choices"][0]
    if turns:
        c.update(decoding_steps=turns, turns=["x"] * len(turns), new_tokens=[0] * len(turns),
                 wall_time=[0.5] * len(turns))
    c.update(draft_depths=depths, draft_nodes=[2 * d for d in depths])
    if drafters:
        c["step_info"] = [{"drafter": d} if d else None for d in drafters]
    return r


def test_acceptance_per_depth_and_drafter_shares_equal_hand_computed_numbers(tmp_path):
    from evaluation.records.metrics import depth_acceptance, drafter_table

    # one turn: prefill (depth 0), then steps of depth 3 accepting 0, 1 and 3 drafts, then a last step (left out)
    records = [steps_rec(1, "qa", [1, 1, 2, 4, 2], [0, 3, 3, 3, 3], [None, "tr", "sam", "sam", "tr"])]
    t = depth_acceptance(records)
    assert t["tried"].tolist() == [3, 2, 1] and t["accepted"].tolist() == [2, 1, 1]
    assert t["rate"].tolist() == pytest.approx([2 / 3, 1 / 2, 1.0])
    d = drafter_table(records)
    assert d.loc["sam", "steps"] == 2 and d.loc["sam", "share"] == pytest.approx(2 / 3)
    assert d.loc["sam", "mat"] == pytest.approx(3.0) and d.loc["tr", "mat"] == pytest.approx(1.0)
    assert d.loc["sam", "nodes"] == pytest.approx(6.0)
    # two turns: each turn's last step is left out (here the second and the fourth)
    two = [steps_rec(2, "qa", [2, 1, 3, 1], [1, 1, 2, 2], turns=[2, 2])]
    assert depth_acceptance(two)["tried"].tolist() == [2, 1] and depth_acceptance(two)["accepted"].tolist() == [2, 1]
    assert drafter_table(two).empty and depth_acceptance([rec(1, "qa", 2, 1.0, [1, 1])]).empty

    root = tmp_path / "runs"
    write_run(root / "vanilla", "vanilla", [steps_rec(1, "qa", [1] * 10, [0] * 10)])
    write_run(root / "sam_tr", "sam_tr", records)
    result = rp.report([str(root)], tmp_path / "out", figures=False)
    md = (tmp_path / "out" / "acceptance_by_depth.md").read_text()
    assert "| tiny-llama | sam_tr | 0.667 (3) | 0.500 (2) | 1.000 (1) | - |" in md
    assert "vanilla" not in md  # no drafts, no row
    assert "| tiny-llama | sam_tr | sam | 2 | 66.7% | 3.00 | 6.0 |" in (tmp_path / "out" / "drafters.md").read_text()
    assert len(result["drafters"]) == 2


def test_a_reference_run_says_so_and_a_busy_row_is_marked(tmp_path):
    """method.reference=true is named in its row even without a sibling to tell it from; a row whose timings the
    note flags carries a mark (and ``disturbed`` in the CSV)."""
    write_run(tmp_path / "vanilla", "vanilla", VANILLA)
    write_run(tmp_path / "sam", "sam", TR_A, {"reference": True})
    fast = [rec(1, "qa", 10, 0.1, [1, 4, 5]), rec(2, "rag", 20, 0.2, [1, 9, 10])]  # 20x at MAT 5: disturbed
    write_run(tmp_path / "pld", "pld", fast, {"reference": False})
    result = rp.report([str(tmp_path)], tmp_path / "out", figures=False)
    t = result["table"].set_index("method")
    assert "sam (reference=True)" in t.index and "pld" in t.index
    assert bool(t.loc["pld", "disturbed"]) and not bool(t.loc["sam (reference=True)", "disturbed"])
    md = (tmp_path / "out" / "main_table.md").read_text()
    assert "| tiny-llama | pld † |" in md and "| tiny-llama | sam (reference=True) |" in md
    assert "pld's speedup on overall" in md


def test_a_run_argument_is_a_label_only_before_a_path_that_exists(tmp_path):
    from evaluation.reporting.collect import labelled

    folder = tmp_path / "bench.question_ids=[81,161],warmup=0"
    folder.mkdir()
    assert labelled(str(folder)) == (None, str(folder))
    assert labelled(f"tr={folder}") == ("tr", str(folder))
    missing = str(tmp_path / "runs" / "bench.question_ids=[81,161],warmup=0")
    assert labelled(missing) == (None, missing)  # reported whole, not cut at its first '='
    with pytest.raises(HarnessError, match=r"bench.question_ids=\[81,161\],warmup=0 does not exist"):
        rp.report([missing], tmp_path / "out", figures=False)


def test_explanations_under_the_depth_and_drafter_tables(tmp_path):
    from evaluation.reporting.tables import DEPTH_NOTE, DRAFTER_NOTE

    assert "d=k: rate (tries)" in DEPTH_NOTE and "sam_static, a chain from the corpus's automaton" in DRAFTER_NOTE


def test_what_a_method_remembered_is_a_column_where_one_did(tmp_path):
    """A run's summary says what its method remembered across requests (``Proposer.memory``); the main table shows
    it beside the method where any row remembered something (the global tree's answers counted), and not otherwise."""
    write_run(tmp_path / "v", "vanilla", VANILLA, state={"memory": "none"})
    write_run(tmp_path / "s", "suffix", TR_A, state={"memory": "run", "memory_answers": 2})
    rp.report([str(tmp_path / "v"), str(tmp_path / "s")], tmp_path / "out", figures=False)
    md = (tmp_path / "out" / "main_table.md").read_text()
    assert "| Model | Method | Memory |" in md and "| tiny-llama | suffix | run (2 answers) |" in md
    tex = (tmp_path / "out" / "main_table.tex").read_text()
    assert r"\begin{tabular}{lll" in tex
    rp.report([str(tmp_path / "v")], tmp_path / "none", figures=False)
    assert "Memory" not in (tmp_path / "none" / "main_table.md").read_text()
