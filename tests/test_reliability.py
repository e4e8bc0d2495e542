"""What the harness promises when input is bad or a run is disturbed (evaluation/README.md, "Reliability: what is
tested"): one line, a non-zero exit, nothing half-written, every finished answer kept; through the real command
lines."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from evaluation.merge import merge
from evaluation.records.answers import ABSENT, ANSWERS, LOCK, AnswerWriter, first_difference, folder_lock, read_answers
from evaluation.records.bench import load_bench
from evaluation.running.config import RESULT_NEUTRAL, compose_config, config_mismatch, folder_name
from evaluation.running.models import ModelSpec, load_model
from methods.base import known_methods
from methods.common import RESULTS, ROOT, HarnessError, load_torch_safe
from methods.tree import TreeError, load_template
from tests.checkpoints import save_model
from tests.helpers import cli
from tests.test_cli import QIDS, _bad, run_args, run_overrides

pytestmark = pytest.mark.xdist_group("test_reliability")  # on one worker (make test), so that finished is made once

FINISHED = ("bench.question_ids=[81,161]",)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished two-question vanilla run (copy it before changing it)."""
    out = tmp_path_factory.mktemp("reliability") / "run"
    cli(*run_args(out, *FINISHED))
    return out


def copy_of(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest)
    return dest


def files(folder: Path) -> dict:
    return {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file() and f.name != LOCK}


# --- 1. one process per folder ------------------------------------------------------------------------

def hold(folder: Path) -> subprocess.Popen:
    """Another process holding ``folder``'s lock until killed."""
    code = ("import time; from pathlib import Path; from evaluation.records.answers import folder_lock\n"
            f"with folder_lock(Path({str(folder)!r})):\n    print('held', flush=True); time.sleep(120)")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


@pytest.mark.slow  # another process holds the folder
def test_a_held_folder_is_refused_naming_the_holder_and_released_by_a_kill(tmp_path):
    folder = tmp_path / "run"
    p = hold(folder)
    try:
        with pytest.raises(HarnessError, match=rf"{folder} is in use by another process \(PID {p.pid}\)"):
            with folder_lock(folder):
                pass
        with pytest.raises(HarnessError, match=r"in use by another process .*choose another --out"):
            merge([tmp_path / "shard0"], folder)  # evaluation.merge's output folder too
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    with folder_lock(folder):  # the killed holder left no stale lock
        assert (folder / LOCK).read_text().strip() == str(os.getpid())


@pytest.mark.slow
def test_two_runs_on_one_folder_answer_each_question_once(tmp_path):
    out = tmp_path / "twin"
    procs = [subprocess.Popen([sys.executable, "-m", *run_args(out)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    done = [(p.returncode, o, e) for p, (o, e) in zip(procs, outs)]
    assert sorted(code for code, _, _ in done) == [0, 2], done
    refused = next(e for code, _, e in done if code == 2)
    assert "is in use by another process (PID" in refused and "Traceback" not in refused
    assert [r["question_id"] for r in read_answers(out)] == QIDS


# --- 2. a resume or a merge matches the whole config ----------------------------------------------------

def test_every_setting_but_the_neutral_ones_decides_a_resume():
    def resolved(overrides):
        return OmegaConf.to_container(compose_config(overrides), resolve=True)

    base = resolved(["method=tr"])
    assert config_mismatch(base, resolved(["method=tr", "runtime.progress=false"])) is None
    assert config_mismatch(base, resolved(["method=tr", "runtime.exclusive_device=true"])) is None
    assert config_mismatch(base, resolved(["method=tr", "engine=hf"])) == \
        "engine.name is 'static' there but 'hf' here"
    assert config_mismatch(base, resolved(["method=tr", "engine.pack=false"])) == \
        "engine.pack is 'auto' there but False here"
    assert config_mismatch(base, resolved(["method=tr", "model.dtype=bfloat16"])) == \
        "model.dtype is 'auto' there but 'bfloat16' here"
    assert first_difference({"a": {"b": 1, "c": 2}}, {"a": {"c": 2}}) == ("a.b", 1, ABSENT)
    assert "runtime.progress" in RESULT_NEUTRAL and "engine" not in RESULT_NEUTRAL


# --- 3. no pickle runs code ---------------------------------------------------------------------------

class Payload:
    """Loaded with ``weights_only=False``, this makes a file: what a crafted state or data file could do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_a_crafted_tensor_file_is_refused_and_runs_nothing(tmp_path, monkeypatch):
    marker, f = tmp_path / "ran", tmp_path / "state.pt"
    torch.save({"answered": 1, "state": Payload(marker)}, f)
    torch.load(f, weights_only=False)  # the payload is real: an unsafe load runs it
    assert marker.exists()
    marker.unlink()
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # makes every load without weights_only unsafe
    with pytest.raises(HarnessError, match="holds more than tensors, so it was not loaded"):
        load_torch_safe(f)
    assert not marker.exists()
    torch.save({"ids": torch.arange(3), "rows": [[1, 2]], "name": "x"}, f)  # tensors and plain containers load
    assert load_torch_safe(f)["rows"] == [[1, 2]]


@pytest.mark.slow
def test_a_resumed_run_refuses_a_crafted_state_file(finished, tmp_path, monkeypatch, run_error):
    out = copy_of(finished, tmp_path / "resumed")
    lines = (out / ANSWERS).read_text().splitlines(keepends=True)
    (out / ANSWERS).write_text(lines[0])  # one answer left to do: the run resumes and loads its state
    marker = tmp_path / "ran"
    torch.save({"answered": 1, "state": Payload(marker)}, out / "proposer_state.pt")
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # makes every load without weights_only unsafe
    assert "holds more than tensors" in run_error(*run_overrides(*FINISHED), out=out, base=()).err
    assert not marker.exists()


def test_every_torch_load_in_the_project_is_weights_only():
    calls = [(f, line) for d in ("evaluation", "methods", "scripts")
             for f in (ROOT / d).rglob("*.py") for line in f.read_text().splitlines() if "torch.load(" in line]
    assert calls and all("weights_only=True" in line for _, line in calls), calls


# --- 4. the run folder stays inside its parent ------------------------------------------------------

def test_folder_names_are_one_component():
    assert folder_name("") == "default"
    assert folder_name("bench.path=/../../x.jsonl") == "bench.path=%2F..%2F..%2Fx.jsonl"
    assert folder_name("a=1%2F") != folder_name("a=1/")  # escaping keeps names apart
    long = folder_name("model.checkpoint=" + "/very/long/path" * 40)
    assert "/" not in long and len(long.encode()) <= 200 and long != folder_name("model.checkpoint=" + "/x" * 300)


@pytest.mark.slow
def test_a_path_override_names_a_folder_inside_results(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 7, "category": "qa", "turns": ["Say hi."]}) + "\n")
    method = RESULTS / "runs" / "spec_bench_smoke" / "smollm2-135m" / "vanilla"
    before = set(method.iterdir()) if method.is_dir() else set()
    cli("evaluation.run", f"bench.path=/../..{q}", "warmup=0", "runtime.progress=false", "bench.max_new_tokens=4")
    made = set(method.iterdir()) - before
    try:
        assert len(made) == 1 and (next(iter(made)) / ANSWERS).is_file(), made
        assert ",bench.path=%2F..%2F..%2Ftmp%2F" in next(iter(made)).name
    finally:
        for m in made:
            shutil.rmtree(m)


@pytest.mark.slow
def test_a_failed_run_leaves_no_folder_in_results():
    method = RESULTS / "runs" / "spec_bench_smoke" / "smollm2-135m" / "vanilla"
    before = set(method.iterdir()) if method.is_dir() else set()
    p = cli("evaluation.run", "model.checkpoint=/nonexistent/some/dir", "warmup=0", "runtime.progress=false",
            check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    after = set(method.iterdir()) if method.is_dir() else set()
    assert after == before and not (RESULTS / "runs" / "spec_bench_smoke" / "smollm2-135m" / "vanilla" /
                                    "model.checkpoint=").exists()


# --- 5. one line, not a traceback --------------------------------------------------------------------

BINARY = b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x00"


def test_binary_and_malformed_files_are_one_line(tmp_path, run_error):
    q = tmp_path / "q.jsonl"
    q.write_bytes(BINARY)
    assert f"{q}:1: not UTF-8 text" in run_error(f"bench.path={q}").err
    tree = tmp_path / "tree.json"
    tree.write_bytes(BINARY)
    assert "not UTF-8 text" in run_error("method=tr", f"method.tree={tree}").err
    tree.write_text(json.dumps({"parents": [-1, 0, 0.7]}))
    assert "tree parents must be a list of integers, got [-1, 0, 0.7]" in run_error("method=tr",
                                                                                     f"method.tree={tree}").err


@pytest.mark.parametrize("args, message", [
    (["bench.question_ids=[abc]"], "bench.question_ids must be question ids (integers), got 'abc'"),
    (["bench.max_new_tokens=abc"], "bench.max_new_tokens must be an integer of at least 1, got 'abc'"),
    (["bench.limit_per_category=x"], "bench.limit_per_category must be an integer, got 'x'"),
    (["warmup=1.5"], "warmup must be an integer of at least 0, got 1.5"),
    (["runtime.batch_size=0"], "runtime.batch_size must be an integer of at least 1 (the turns decoded at once), "
                               "got 0"),
    (["runtime.batch_size=3", "bench.question_ids=[81,82]"], "runtime.batch_size=3 but the run has 2 question(s)"),
    (["runtime.budget=sometimes"], "runtime.budget=sometimes is not a budget; use one of off, auto"),
    (["runtime.spec_off_above=-2"], "runtime.spec_off_above=-2 must be a number of rows (0 or more) or null"),
    (["hydra.run.dir=/proc/self"], "cannot write to /proc/self"),  # exists, and no one may write there
])
def test_bad_settings_are_one_line(run_error, args, message):
    assert message in run_error(*args).err


@pytest.mark.slow
def test_a_run_folder_that_cannot_be_made_is_one_line(tmp_path):
    """On the command line: Hydra makes the run folder before the runner starts (evaluation.sweep.RunFolder)."""
    assert "cannot make the run folder /proc/nonexistent/run" in _bad(tmp_path, "hydra.run.dir=/proc/nonexistent/run")


def test_single_names_and_ids_need_no_brackets():
    assert [q.question_id for q in load_bench(None, question_ids=81)] == [81]
    assert load_bench(None, categories="qa") == load_bench(None, categories=["qa"])


def tree_file(tmp_path, parents) -> str:
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"parents": parents}))
    return str(f)


@pytest.mark.parametrize("parents", [[-1, 0, 0.7], [-1, "0"], [-1, True], "x"])
def test_tree_parents_must_be_integers(tmp_path, parents):
    with pytest.raises(TreeError, match="tree parents must be a list of integers"):
        load_template(tree_file(tmp_path, parents))


@pytest.mark.parametrize("damage, message", [
    (lambda lines: ["{oops\n"] + lines[1:], ":1: not valid JSON"),
    (lambda lines: [BINARY.decode("latin-1") + "\n"] + lines[1:], ":1: not UTF-8 text"),
    (lambda lines: lines + lines[:1], ":3: question 81 is answered twice"),
])
@pytest.mark.slow
def test_a_damaged_answer_file_is_refused_before_the_model_loads(finished, tmp_path, damage, message, run_error):
    out = copy_of(finished, tmp_path / "damaged")
    lines = (out / ANSWERS).read_text().splitlines(keepends=True)
    text = "".join(damage(lines))
    (out / ANSWERS).write_bytes(text.encode("latin-1") if "\x89" in text else text.encode())
    before = files(out)
    said = run_error(*run_overrides(*FINISHED), out=out, base=())
    assert f"{out / ANSWERS}{message}" in said.err
    assert "prompt format" not in said.out  # refused before the model was loaded
    assert files(out) == before


@pytest.mark.slow
def test_ctrl_c_keeps_the_answers_and_says_how_to_resume(tmp_path):
    out = tmp_path / "run"
    args = run_args(out)
    # SIGINT's default action in the run, however this suite was started (a background job inherits it ignored)
    p = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while time.time() < deadline and not ((out / ANSWERS).exists() and (out / ANSWERS).read_text().count("\n")):
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    kept = (out / ANSWERS).read_text().count("\n")
    assert p.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (f"interrupted; {kept} answer(s) kept in {out / ANSWERS}; rerun the "
                                            f"same command to resume")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["answered"] == kept >= 1
    cli(*args)
    assert [r["question_id"] for r in read_answers(out)] == QIDS


@pytest.mark.parametrize("other_thread", [False, True], ids=["alone", "beside-a-thread"])
def test_a_ctrl_c_while_a_line_is_written_lands_after_it_is_counted(tmp_path, monkeypatch, other_thread):
    """The SIGINT arrives between the line reaching the disk and the answer being counted (the window where a
    run used to say "no answer had finished" with one answer in the file): it must be raised only after both,
    also while another thread runs (tqdm's monitor: a signal blocked in the main thread only went to it)."""
    import threading

    stop = threading.Event()
    if other_thread:
        threading.Thread(target=stop.wait, daemon=True).start()
    writer = AnswerWriter(tmp_path / ANSWERS)
    real_fsync = os.fsync

    def fsync_then_interrupt(fd):
        real_fsync(fd)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(os, "fsync", fsync_then_interrupt)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as when started from a terminal
    record = {"question_id": 81, "choices": [{k: [] for k in ("turns", "decoding_steps", "new_tokens", "wall_time",
                                                              "accept_lengths")}]}
    try:
        with pytest.raises(KeyboardInterrupt):
            writer.append(record)
            time.sleep(1)  # only reached if the signal were lost
    finally:
        signal.signal(signal.SIGINT, previous)
        stop.set()
    assert writer.done == {81} and [r["question_id"] for r in read_answers(tmp_path)] == [81]


def test_a_checkpoint_whose_config_and_weights_disagree_is_one_line(tmp_path):
    folder = tmp_path / "ckpt"
    save_model(folder, "vicuna-7b")
    spec = ModelSpec(name="tiny", checkpoint=str(folder), template="vicuna_v1.1", device="cpu", dtype="float32")
    config = json.loads((folder / "config.json").read_text())
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 2 * config["intermediate_size"]}))
    with pytest.raises(HarnessError, match="weight shapes differ from those config.json gives"):
        load_model(spec)
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": config["num_hidden_layers"] + 1}))
    with pytest.raises(HarnessError, match=r"its weights lack 9 tensor\(s\) its config.json needs"):
        load_model(spec)  # transformers alone would decode with a random layer
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(HarnessError, match="a truncated or damaged weight file: download it again"):
        load_model(spec)


@pytest.mark.slow
def test_reduced_precision_and_a_short_context_are_said_at_the_start(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 7, "category": "qa", "turns": ["Say hi."]}) + "\n")
    p = cli("evaluation.run", f"hydra.run.dir={tmp_path / 'run'}", f"bench.path={q}", "warmup=0",
            "runtime.progress=false", "model.dtype=bfloat16", "model.max_context=64", "bench.max_new_tokens=64")
    assert "WARNING: bfloat16: in reduced precision a method's tokens equal vanilla greedy's only up to " \
           "near-ties" in p.stderr
    assert "WARNING: bench.max_new_tokens=64 does not fit smollm2-135m's context of 64 tokens" in p.stderr
    # A CPU without bf16 instructions emulates it: trees cost far more (results/MEASUREMENTS.md, 'By machine kind').
    from methods import machine

    emulated = "has no native instructions for it (AVX512-BF16/FP16 or AMX)" in p.stderr
    assert emulated == (not machine.native(torch.bfloat16))
    assert "WARNING" not in cli(*run_args(tmp_path / "fp32", "bench.question_ids=[161]")).stderr


# --- 7. the README's examples work -----------------------------------------------------------------

def test_the_readme_run_examples_select_questions():
    lines = [line.split("#")[0].split("evaluation.run", 1)[1].split() for line in
             (ROOT / "README.md").read_text().splitlines() if line.startswith(".venv/bin/python -m evaluation.run")]
    examples = [args for args in lines if not any("..." in a or "=<" in a or a == "-m" for a in args)]
    assert len(examples) >= 5
    for args in examples:
        cfg = compose_config([a for a in args if a != "\\"])
        b = cfg.bench
        assert load_bench(b.path, categories=b.categories, question_ids=b.question_ids,
                          limit_per_category=b.limit_per_category, skip_per_category=b.skip_per_category), args


def test_the_readme_lists_every_method():
    bullet = next(line for line in (ROOT / "README.md").read_text().split("\n- ") if line.startswith("`method=`"))
    for name in known_methods():
        assert f"`{name}`" in bullet, name
