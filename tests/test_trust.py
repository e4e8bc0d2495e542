"""Results a reader can trust: every command that combines runs refuses runs of other settings or unfinished ones
(evaluation.records.consistency), tables carry 95% intervals, a busy machine is named, and nothing ends in a traceback."""
import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from evaluation import equal, speed, sweep
from evaluation import report as rp
from evaluation.records.metrics import intervals, load_stats
from methods.common import HarnessError
from tests.test_report import TR_A, VANILLA, rec, write_run


def _main(entry, argv, capsys) -> str:
    """An entry point that must refuse: exit 2 and one line on stderr; returns that line."""
    with pytest.raises(SystemExit) as e:
        entry(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def test_runs_of_other_new_tokens_are_refused_by_every_command(tmp_path, capsys):
    """A vanilla run of 16 new tokens beside a TR run of 24 was one table captioned "16 new tokens"."""
    write_run(tmp_path / "vanilla", "vanilla", VANILLA, bench={"name": "tiny", "max_new_tokens": 16})
    write_run(tmp_path / "tr", "tr", TR_A, bench={"name": "tiny", "max_new_tokens": 24})
    err = _main(rp.main, [str(tmp_path), "--out", str(tmp_path / "out"), "--no-figures"], capsys)
    assert "differ in bench.max_new_tokens (16 vs 24): a settings difference" in err
    assert not (tmp_path / "out").exists()
    err = _main(speed.main, [str(tmp_path / "tr"), "--baseline", str(tmp_path / "vanilla")], capsys)
    assert "bench.max_new_tokens (24 vs 16)" in err and not (tmp_path / "tr" / "speed.md").exists()
    # evaluation.equal called this a real mismatch
    assert "a settings difference" in _main(equal.main, [str(tmp_path / "vanilla"), str(tmp_path / "tr")], capsys)


def test_an_unfinished_baseline_is_refused_or_named(tmp_path, capsys):
    """An unfinished vanilla (1 of 2 questions) quietly cut every row to its questions."""
    write_run(tmp_path / "vanilla", "vanilla", VANILLA[:1])
    summary = json.loads((tmp_path / "vanilla" / "summary.json").read_text())
    summary.update(status="interrupted", questions=2, answered=1)
    (tmp_path / "vanilla" / "summary.json").write_text(json.dumps(summary))
    write_run(tmp_path / "tr", "tr", TR_A)
    err = _main(rp.main, [str(tmp_path), "--out", str(tmp_path / "out")], capsys)
    assert "vanilla is unfinished (1/2 questions, status interrupted)" in err and "--allow-unfinished" in err
    result = rp.report([str(tmp_path)], tmp_path / "out", figures=False, allow_unfinished=True)
    assert result["table"]["questions"].tolist() == [1, 1]
    md = (tmp_path / "out" / "main_table.md").read_text()
    assert "unfinished run(s) compared on the 1 question(s) every run answered" in md
    assert "tiny, 1 questions" in json.loads((tmp_path / "out" / "environment.json").read_text())["bench"]
    assert "is unfinished" in _main(equal.main, [str(tmp_path / "vanilla"), str(tmp_path / "tr")], capsys)


def test_runs_on_other_questions_or_sampling_are_refused(tmp_path):
    write_run(tmp_path / "a" / "vanilla", "vanilla", VANILLA)
    write_run(tmp_path / "a" / "tr", "tr", TR_A[:1])  # finished, on another selection
    with pytest.raises(HarnessError, match=r"differ in questions \(2 questions \(1, 2\) vs 1 questions \(1\)\)"):
        rp.report([str(tmp_path / "a")], tmp_path / "out", figures=False)
    write_run(tmp_path / "b" / "vanilla", "vanilla", VANILLA)
    write_run(tmp_path / "b" / "tr", "tr", TR_A)
    summary = json.loads((tmp_path / "b" / "tr" / "summary.json").read_text())
    summary["config"]["sampling"] = {"temperature": 0.7, "seed": 1}
    (tmp_path / "b" / "tr" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(HarnessError, match=r"differ in sampling.\* \(greedy vs T=0.7 seed=1\)"):
        rp.report([str(tmp_path / "b" / "tr")], tmp_path / "out", baseline=str(tmp_path / "b" / "vanilla"),
                  figures=False)


def test_a_sweep_folder_of_two_settings_is_refused_and_each_sweep_gets_a_new_folder(tmp_path):
    """A sweep run twice with other settings wrote into one folder, and sweep.md mixed the points of both."""
    write_run(tmp_path / "tr" / "k=4", "tr", TR_A, {"k": 4})
    write_run(tmp_path / "tr" / "k=8", "tr", TR_A, {"k": 8}, bench={"name": "tiny", "max_new_tokens": 32})
    with pytest.raises(HarnessError, match="differ in bench.max_new_tokens .*each sweep in its own folder"):
        sweep.write_table(tmp_path, None)
    assert not (tmp_path / "sweep.md").exists()
    for experiment in (sweep.Path(__file__).parents[1] / "conf" / "experiment").glob("*.yaml"):
        sweep_conf = OmegaConf.create(experiment.read_text()).get("hydra", {}).get("sweep", {})
        folder = OmegaConf.to_container(sweep_conf).get("dir") if sweep_conf else None  # unresolved
        assert folder is None or "${now:" in folder, experiment  # its time in the name (the default's too)


def test_a_sweep_says_which_job_of_how_many(capsys):
    from hydra.types import RunMode

    progress = sweep.SweepProgress()
    start = OmegaConf.create({"hydra": {"sweeper": {"params": {"method.k": "1,2,4"}},
                                        "overrides": {"task": ["bench.max_new_tokens=8,16"]}}})
    progress.on_multirun_start(start)
    job = OmegaConf.create({"hydra": {"mode": RunMode.MULTIRUN, "job": {"num": 4},
                                      "overrides": {"task": ["method.k=4", "bench.max_new_tokens=8"]}}})
    progress.on_job_start(job, task_function=None)
    assert capsys.readouterr().out == "sweep job 5 of 6: method.k=4, bench.max_new_tokens=8\n"
    job.hydra.mode = RunMode.RUN  # a single run says nothing
    progress.on_job_start(job, task_function=None)
    assert capsys.readouterr().out == ""


def test_an_unwritable_out_folder_is_one_line(tmp_path, capsys):
    """evaluation.speed and evaluation.report --out on a folder the user cannot write ended in a traceback."""
    write_run(tmp_path / "vanilla", "vanilla", VANILLA)
    write_run(tmp_path / "tr", "tr", TR_A)
    place = "/sys/harness-test"  # not writable, even by root
    err = _main(speed.main, [str(tmp_path / "tr"), "--baseline", str(tmp_path / "vanilla"), "--out", place], capsys)
    assert err.startswith(f"error: cannot write {place}") and "writable place" in err
    err = _main(rp.main, [str(tmp_path), "--out", place, "--no-figures"], capsys)
    assert err.startswith(f"error: cannot write {place}")


def test_intervals_are_the_paired_bootstrap_over_questions():
    """Two questions of one task at 2x and 4x: a resample draws (q1, q1) with probability 1/4, so the 2.5th and
    97.5th percentiles are the speedups of q1 alone and of q2 alone; MAT likewise. Paired: the method and its
    baseline take the same questions, so a baseline as slow on q2 as the method is fast cancels out."""
    base = [rec(1, "qa", 10, 2.0, [1] * 10), rec(2, "qa", 10, 4.0, [1] * 10)]
    ours = [rec(1, "qa", 10, 1.0, [5, 5]), rec(2, "qa", 10, 1.0, [1, 4, 5])]
    t = intervals([ours], [base]).loc["qa"]
    assert (t["speedup_lo"], t["speedup_hi"]) == pytest.approx((2.0, 4.0))
    assert (t["mat_lo"], t["mat_hi"]) == pytest.approx((10 / 3, 5.0))
    same = intervals([ours], [[rec(1, "qa", 10, 3.0, [1] * 10), rec(2, "qa", 10, 3.0, [1] * 10)]]).loc["qa"]
    assert same["speedup_lo"] == same["speedup_hi"] == pytest.approx(3.0)  # equal ratios on both: no spread
    assert intervals([ours], [base]).equals(intervals([ours], [base]))  # a fixed seed: the same table each time


def test_report_tables_carry_the_intervals(tmp_path):
    write_run(tmp_path / "vanilla", "vanilla", [rec(1, "qa", 10, 2.0, [1] * 10), rec(2, "qa", 10, 4.0, [1] * 10)])
    write_run(tmp_path / "tr", "tr", [rec(1, "qa", 10, 1.0, [5, 5]), rec(2, "qa", 10, 1.0, [1, 4, 5])])
    t = rp.report([str(tmp_path)], tmp_path / "out", figures=False)["table"].set_index("method")
    assert t.loc["tr", "speedup"] == pytest.approx(3.0)
    assert (t.loc["tr", "qa_lo"], t.loc["tr", "qa_hi"]) == pytest.approx((2.0, 4.0))
    md = (tmp_path / "out" / "main_table.md").read_text()
    assert "| tiny-llama | tr | 3.00× [2.00, 4.00] | 4.00 [3.33, 5.00] |" in md and "paired bootstrap" in md
    tex = (tmp_path / "out" / "main_table.tex").read_text()
    assert r"3.00$\times$ [2.00, 4.00]" in tex
    assert "speedup_lo,speedup_hi" in (tmp_path / "out" / "main_table.csv").read_text().splitlines()[0]


def _loaded(records, waits, others=0.5):
    for r, w in zip(records, waits):
        c = r["choices"][0]
        c.update(cpu_wait=[w], cpu_others=[others], load_avg=[1.0], decode_time=c["wall_time"])
    return records


def test_a_busy_machine_is_named_and_a_quiet_one_is_not(tmp_path):
    """The three signs, each on its own: a run waiting for a CPU, a turn much slower per step than the others,
    a speedup above MAT (PLD 4.23x at MAT 1.40 on a busy machine)."""
    quiet = _loaded([rec(1, "qa", 10, 1.0, [1] * 10), rec(2, "qa", 10, 1.1, [1] * 10)], [0.001, 0.0])
    from evaluation.reporting.collect import disturbance_note

    assert load_stats(quiet)["wait_share"] == pytest.approx(0.001 / 2.1)
    assert disturbance_note({"vanilla": quiet}, [("tr", "qa", 1.5, 2.0)]) == (None, set())
    waited = _loaded([rec(1, "qa", 10, 1.0, [1] * 10), rec(2, "qa", 10, 1.0, [1] * 10)], [0.3, 0.3], 1.3)
    assert "vanilla waited for a CPU 0.30 s per second timed (other processes used 1.3 cores)" in \
        disturbance_note({"vanilla": waited}, [])[0]
    slow_turn = _loaded([rec(1, "qa", 10, 1.0, [1] * 10), rec(2, "qa", 10, 1.0, [1] * 10),
                         rec(3, "qa", 10, 5.0, [1] * 10)], [0, 0, 0])
    assert "vanilla's slowest turn took 5.0x its median time per step" in disturbance_note({"vanilla": slow_turn}, [])[0]
    note, flagged = disturbance_note({}, [("pld", "rag", 6.69, 1.40)])
    assert flagged == {"pld"} and note.startswith("WARNING: timings disturbed") and "pld's speedup on rag (6.69x) is above its MAT (1.40)" \
        in note and "The numbers stay" in note


@pytest.mark.slow
@pytest.mark.alone
def test_a_bench_beside_busy_loops_is_flagged_and_a_quiet_one_is_not(tmp_path, capsys):
    """The make-run path (scripts.bench_methods) on the embedded model, 2 questions of 12 tokens, on one thread:
    beside as many busy loops as the machine has cores its table is flagged; alone it is not. (Marked alone: make
    test runs it after the parallel tests, since the other pytest-xdist worker's subprocesses made the quiet run
    wait for a CPU.)"""
    import os

    from scripts import bench_methods

    def bench(out):
        code = bench_methods.main(["method=vanilla", "method=pld", "--bench", "spec_bench_smoke", "--warmup", "0",
                                   "--set", "bench.question_ids=[121,361]", "bench.max_new_tokens=12", "engine.threads=1",
                                   "--out", str(out)])
        return code, capsys.readouterr().out

    code, quiet = bench(tmp_path / "quiet")
    assert code == 0 and "timings disturbed" not in quiet, quiet
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        code, busy = bench(tmp_path / "busy")
    finally:
        for p in loops:
            p.kill()
    assert code == 0 and "WARNING: timings disturbed by a busy machine" in busy and "waited for a CPU" in busy, busy
    assert "timings disturbed" in (tmp_path / "busy" / "speed.md").read_text()
    recs = [json.loads(line) for line in (tmp_path / "busy" / "vanilla" / "answers.jsonl").read_text().splitlines()]
    assert all(len(r["choices"][0]["cpu_wait"]) == len(r["choices"][0]["turns"]) for r in recs)
