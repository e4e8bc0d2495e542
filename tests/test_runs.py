"""Run folders at a glance (python -m evaluation.runs) on tiny folders written here, and the notebook that reports
the runs `make run` leaves: its default is the Makefile's folder, and notebooks/README.md's command executes it."""
import io
import json
import os
import re
import shlex
import subprocess

import pandas as pd
import pytest
from omegaconf import OmegaConf

from evaluation import runs
from evaluation.records.answers import folder_lock
from evaluation.running.config import compose_config
from methods.common import ROOT

ENV = {"device": "cpu", "device_name": "x86_64", "cpu_threads": 2, "dtype": "float32", "torch": "2.13.0",
       "transformers": "5.23.0"}


def rec(qid, category, tokens, seconds, accepts):
    """One answer record in Spec-Bench's format (one turn)."""
    return {"question_id": qid, "category": category, "answer_id": f"a{qid}", "model_id": "smollm2-135m",
            "tstamp": 0.0, "choices": [{"index": 0, "turns": ["x"], "decoding_steps": [len(accepts)],
                                        "new_tokens": [tokens], "wall_time": [seconds], "accept_lengths": accepts}]}


VANILLA = [rec(1, "qa", 10, 2.0, [1] * 10), rec(2, "rag", 20, 4.0, [1] * 20)]  # MAT 1, 30 tokens in 6 s
TR = [rec(1, "qa", 10, 1.0, [1, 4, 5]), rec(2, "rag", 20, 2.0, [1, 9, 10])]     # MAT 30/6, 30 tokens in 3 s


def write_run(folder, overrides, records, status="finished", questions=2):
    """A run folder as the runner leaves it: answers (none: no question finished yet), config.yaml and a summary
    with the resolved config these overrides compose."""
    config = OmegaConf.to_container(compose_config(overrides), resolve=True)
    folder.mkdir(parents=True)
    if records:
        (folder / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(config))
    (folder / "summary.json").write_text(json.dumps({
        "status": status, "model": config["model"]["name"], "method": config["method"]["name"],
        "questions": questions, "config": config, "environment": ENV}))
    return folder


def test_lists_every_run_with_its_settings_progress_status_and_numbers(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    write_run(root / "tr-k4", ["method=tr", "method.k=4", "bench.max_new_tokens=64"], TR)
    write_run(root / "vanilla" / "stopped", ["method=vanilla"], VANILLA[:1], "interrupted", 3)
    killed = write_run(root / "vanilla" / "killed", ["method=vanilla", "warmup=0"], VANILLA[:1], "running", 3)
    (killed / ".lock").write_text("999999999\n")  # left by a process that has ended
    live = write_run(root / "vanilla" / "live", ["method=vanilla", "bench.categories=[qa,rag]"], [], "running", 3)
    (root / "broken").mkdir()
    (root / "broken" / "answers.jsonl").write_text("not json\n")
    with folder_lock(live):  # a live run holds its folder
        assert runs.main(["runs"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "| path | method | model | bench | settings | answered | status | MAT | tokens/s | busy |"
    assert out.splitlines()[2:] == [
        "| runs/broken | - | - | - | - | - | unreadable | - | - | - |",
        "| runs/tr-k4 | tr | smollm2-135m | spec_bench_smoke | method.k=4, bench.max_new_tokens=64 | 2/2 | finished "
        "| 5.00 | 10.00 |  |",
        "| runs/vanilla/killed | vanilla | smollm2-135m | spec_bench_smoke | warmup=0 | 1/3 | interrupted | 1.00 "
        "| 5.00 |  |",
        "| runs/vanilla/live | vanilla | smollm2-135m | spec_bench_smoke | bench.categories=[qa,rag] | 0/3 | running "
        "| - | - |  |",
        "| runs/vanilla/stopped | vanilla | smollm2-135m | spec_bench_smoke |  | 1/3 | interrupted | 1.00 | 5.00 |  |"]
    assert err.strip() == "note: runs/broken/answers.jsonl:1: not valid JSON (Expecting value); expected one answer " \
                          "record a line (is this an answer file?)"
    # CSV: the same rows, numbers in full; the live run's folder is free again.
    assert runs.main(["runs", "--csv"]) == 0
    table = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(table.columns) == runs.COLUMNS
    assert list(table["status"]) == ["unreadable", "finished", "interrupted", "interrupted", "interrupted"]
    assert table.loc[1, "MAT"] == 5.0 and table.loc[1, "tokens/s"] == 10.0


@pytest.mark.parametrize("given, message", [
    ("missing", "missing is not a folder"),
    ("empty", "no run folders (holding answers.jsonl or summary.json) under empty"),
])
def test_a_bad_root_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, given, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        runs.main([given])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: {message}") and len(err.strip().splitlines()) == 1


def test_the_notebook_reads_what_make_run_leaves(monkeypatch):
    """The notebook's default runs are the folder the Makefile's run target writes and reports (SMOKE)."""
    import nbformat

    makefile = (ROOT / "Makefile").read_text()
    smoke = re.search(r"^SMOKE := (\S+)$", makefile, re.M).group(1)
    assert "--out $(SMOKE)" in makefile and "evaluation.report $(SMOKE)" in makefile
    monkeypatch.delenv("REPORT_RUNS", raising=False)
    setup = nbformat.read(ROOT / "notebooks" / "report.ipynb", as_version=4).cells[1].source
    assert "RUNS =" in setup
    names = {}
    exec(setup, names)  # the cell that sets the paths: imports only
    assert names["RUNS"] == [str(ROOT / smoke)]


@pytest.mark.slow  # nbconvert and a Jupyter kernel, in processes of their own
def test_make_notebook_runs_on_a_tiny_result_set_beside_the_report_it_draws(tmp_path):
    """make notebook's command, as written, in a copy of the project's layout (its .venv and notebooks/ linked) so
    that what it writes lands here: the page beside the report's own files, its report.html not overwritten."""
    recipe = (ROOT / "Makefile").read_text().split("\nnotebook:")[1].split("\n\n")[0]
    command = recipe[recipe.index("$(VENV)/bin/jupyter"):].replace("\\\n", " ").replace("$(VENV)", ".venv")
    write_run(tmp_path / "runs" / "vanilla", ["method=vanilla"], VANILLA)
    write_run(tmp_path / "runs" / "tr", ["method=tr"], TR)
    work = tmp_path / "project"
    work.mkdir()
    for name in (".venv", "notebooks"):
        (work / name).symlink_to(ROOT / name)
    out = work / "results" / "reports" / "notebook"
    env = {**os.environ, "REPORT_RUNS": str(tmp_path / "runs"), "REPORT_OUT": str(out)}
    p = subprocess.run(shlex.split(command), cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    html = (out / "report_notebook.html").read_text()
    assert "<td>tr</td>" in html and "speedup_per_task.png" in html
    assert "data:image/png;base64" in html and "Traceback" not in html
    assert "<td>lookahead</td>" in html  # the Python API's table: every method's answer vanilla's (asserted there)
    assert (out / "speedup_per_task.pdf").is_file() and "<h1>Report</h1>" in (out / "report.html").read_text()


@pytest.mark.slow  # make, in a process of its own
def test_make_notebook_without_runs_says_what_to_run_first(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "REPORT_RUNS"}
    p = subprocess.run(["make", "-s", "notebook", f"SMOKE={tmp_path / 'none'}"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "error: no runs to draw: run make run first" in p.stdout, p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr
