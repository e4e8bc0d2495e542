"""Speed on every machine kind: the machine said in every summary, engine.pack=auto and engine.threads=auto chosen
by measurement and cached per machine kind, reports that refuse to divide timings taken on different machines."""
import copy
import json
import os

import pytest
import torch

from methods import machine
from methods.common import HarnessError
from methods.engine import HFEngine, StaticEngine, build_engine
from methods.engine import tuning as engine_mod


def test_the_machine_is_read_from_the_cpu():
    flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    c = machine.cpu()
    assert c["isa"] == [f for f in machine.ISA_FLAGS if f in flags]
    assert c["threads"] == torch.get_num_threads() and c["cores"] >= 1 and c["model"]
    expected = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else None
    assert expected is None or c["kind"].split("+")[0] == expected
    assert ("amx" in c["kind"]) == ("amx_bf16" in flags) and ("bf16" in c["kind"]) == ("avx512_bf16" in flags)
    assert machine.native(torch.float32)
    assert machine.native(torch.bfloat16) == bool({"avx512_bf16", "amx_bf16"} & set(flags))
    line = machine.describe(c)
    assert c["model"] in line and c["kind"] in line and f"{c['threads']} threads" in line
    # The cache key changes with the thread count: a choice measured on 2 threads is not reused on 1.
    before, threads = machine.machine_key(), torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        assert machine.machine_key() != before
    finally:
        torch.set_num_threads(threads)


def test_pack_auto_is_chosen_by_measurement_and_cached(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(engine_mod, "CHOICES", tmp_path)
    first = StaticEngine(tiny_model)
    choice = first.pack_choice
    ms = choice["ms"]
    assert set(ms) == {"packed", "plain"} and all(set(row) == set(engine_mod.TIMED_SIZES) for row in ms.values())
    assert all(v > 0 for row in ms.values() for v in row.values())
    assert choice["pack"] == (choice["packed_vs_plain"] < 1) and first.pack == choice["pack"]
    assert all(lin.use_packed == choice["pack"] for lin in first._linears())
    assert first.summary()["pack_choice"] == choice
    files = list(tmp_path.glob("pack-*.json"))
    assert len(files) == 1 and machine.kind() in files[0].name and "float32" in files[0].name
    # The next engine on this machine reads the choice instead of timing again; a cached "plain" is obeyed and
    # the packed copies are dropped.
    saved = json.loads(files[0].read_text())
    files[0].write_text(json.dumps({**saved, "pack": False}))
    second = StaticEngine(tiny_model)
    assert second.pack_choice["cached"] == str(files[0]) and second.pack is False
    assert all(lin.packed is None and not lin.use_packed for lin in second._linears())
    # Either choice computes the reference forward's function.
    ids = torch.randint(96, (12,), generator=torch.Generator().manual_seed(3))
    ref = HFEngine(tiny_model)
    ref.start(16)
    want = ref.forward(ids)[0]
    for eng in (first, second):
        eng.start(16)
        assert torch.allclose(eng.forward(ids)[0], want, atol=1e-4)


def test_pack_is_measured_only_where_it_is_a_choice(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(engine_mod, "CHOICES", tmp_path)
    assert StaticEngine(tiny_model, pack=False).pack_choice is None  # told: nothing timed
    assert StaticEngine(tiny_model, pack=True).pack_choice is None
    half = build_engine(copy.deepcopy(tiny_model).half(), {"name": "static", "pack": "auto"})
    assert half.pack is False and half.pack_choice is None  # fp16 on the CPU: oneDNN cannot pack it
    assert not list(tmp_path.iterdir())


@pytest.fixture
def threads_kept():
    """Restores torch's thread count after a test that sets it (a process-wide setting)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_thread_candidates():
    assert engine_mod.thread_counts(1) == [1] and engine_mod.thread_counts(2) == [1, 2]
    assert engine_mod.thread_counts(6) == [1, 2, 4, 6] and engine_mod.thread_counts(16) == [1, 2, 4, 8, 16]
    assert 1 <= engine_mod.usable_cores() <= (os.cpu_count() or 1)


@pytest.mark.parametrize("name", ["static", "hf"])
def test_threads_auto_is_chosen_by_measurement_once_per_process(name, tiny_model, tmp_path, monkeypatch,
                                                               threads_kept):
    monkeypatch.setattr(engine_mod, "CHOICES", tmp_path)
    monkeypatch.setattr(engine_mod, "_THREADS", {})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = max(2, engine_mod.usable_cores())  # a one-core machine still times 1 against 2
    monkeypatch.setattr(engine_mod, "usable_cores", lambda: cores)
    torch.set_num_threads(cores)
    first = build_engine(tiny_model, {"name": name, "threads": "auto"})
    choice = first.thread_choice
    counts = engine_mod.thread_counts(cores)
    assert set(choice["ms"]) == {str(n) for n in counts}
    assert all(set(row) == set(engine_mod.TIMED_SIZES) and min(row.values()) > 0 for row in choice["ms"].values())
    means = {n: engine_mod.geomean(choice["ms"][str(n)].values()) for n in counts}
    assert choice["threads"] == min(counts, key=means.get) and choice["vs_fastest"][choice["threads"]] == 1
    assert first.threads == choice["threads"] == torch.get_num_threads()
    assert first.summary()["threads"] == choice["threads"] and first.summary()["thread_choice"] == choice
    if name == "static":  # the pack choice is timed, and cached, for the thread count chosen
        assert [f.name for f in tmp_path.iterdir()] and all(
            f.name.startswith(f"pack-{machine.kind()}-t{choice['threads']}-") for f in tmp_path.iterdir())
    else:
        assert not list(tmp_path.iterdir())  # the thread count itself is never cached on disk
    # The next engine of this process, of either kind, takes the same count without timing again; another dtype
    # is timed for itself.
    torch.set_num_threads(cores + 1 - choice["threads"])  # as another runner would leave it
    other = "hf" if name == "static" else "static"
    second = build_engine(tiny_model, {"name": other, "threads": "auto"})
    assert second.thread_choice == {**choice, "from": "measured earlier in this process"}
    assert second.threads == choice["threads"] == torch.get_num_threads()
    half = build_engine(copy.deepcopy(tiny_model).to(torch.bfloat16), {"name": name, "threads": "auto"})
    assert "from" not in half.thread_choice and len(engine_mod._THREADS) == 2
    # Side by side in one process, each engine runs with its own count again.
    torch.set_num_threads(cores + 1 - choice["threads"])
    first.use_threads()
    assert torch.get_num_threads() == first.threads


def test_threads_auto_times_any_architecture_the_hf_engine_runs(monkeypatch, threads_kept):
    from transformers import GPT2Config, GPT2LMHeadModel

    monkeypatch.setattr(engine_mod, "_THREADS", {})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = max(2, engine_mod.usable_cores())
    monkeypatch.setattr(engine_mod, "usable_cores", lambda: cores)
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, bos_token_id=0,
                                      eos_token_id=0)).eval()
    eng = build_engine(gpt2, {"name": "hf", "threads": "auto"})
    assert set(eng.thread_choice["ms"]) == {str(n) for n in engine_mod.thread_counts(cores)}
    assert eng.threads == eng.thread_choice["threads"] == torch.get_num_threads()


def test_threads_follow_the_environment_or_the_config(tiny_model, monkeypatch, threads_kept):
    monkeypatch.setattr(engine_mod, "_THREADS", {})
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a launcher's or the user's choice: kept, nothing timed
    torch.set_num_threads(1)
    eng = build_engine(tiny_model, {"name": "static", "threads": "auto", "pack": False})
    assert eng.thread_choice == {"threads": 1, "from": "OMP_NUM_THREADS"} and eng.summary()["threads"] == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    cores = engine_mod.usable_cores()
    eng = build_engine(tiny_model, {"name": "hf", "threads": cores})
    assert eng.threads == cores == torch.get_num_threads() and eng.thread_choice is None
    with pytest.raises(HarnessError, match=rf"engine.threads={cores + 1} but this process may use {cores} CPU "
                                           rf"core\(s\).*engine.threads=auto or at most {cores}"):
        build_engine(tiny_model, {"name": "static", "threads": cores + 1})
    with pytest.raises(HarnessError, match="engine.threads must be an integer from 1 or auto, got 0"):
        build_engine(tiny_model, {"name": "static", "threads": 0})
    assert HFEngine(tiny_model).threads is None  # built in code without the setting: torch's count, untouched
    assert not engine_mod._THREADS  # nothing was timed


def test_every_summary_says_which_machine(tmp_path):
    from evaluation.running.folder import environment

    env = environment(torch.device("cpu"), torch.float32)
    assert env["cpu"] == machine.cpu()


def _run(folder, cpu):
    from tests.test_report import ENV, VANILLA, write_run

    return write_run(folder, folder.name, VANILLA, env={**ENV, "cpu": cpu})


def test_a_report_refuses_speedups_across_machines(tmp_path):
    from evaluation import report as rp

    here = machine.cpu()
    other = {**here, "model": "Intel Xeon", "id": "6/143/8", "isa": here["isa"] + ["amx_bf16"],
             "kind": here["kind"] + "+amx"}
    _run(tmp_path / "a" / "vanilla", here)
    _run(tmp_path / "a" / "tr", other)
    with pytest.raises(HarnessError, match=r"tr on tiny-llama mixes machines: .* ran on .* but .* on Intel Xeon "
                                           r"\(6/143/8\), .*\+amx.*--mixed-machines"):
        rp.report([str(tmp_path / "a")], tmp_path / "out", figures=False)
    assert not (tmp_path / "out").exists()
    result = rp.report([str(tmp_path / "a")], tmp_path / "out", figures=False, mixed_machines=True)
    assert "mixed environments" in rp.environment_line(result["groups"])
    # One machine, another thread count: also another machine for timings.
    _run(tmp_path / "b" / "vanilla", here)
    _run(tmp_path / "b" / "tr", {**here, "threads": here["threads"] + 1})
    with pytest.raises(HarnessError, match="mixes machines"):
        rp.report([str(tmp_path / "b")], tmp_path / "out2", figures=False)
    _run(tmp_path / "c" / "vanilla", here)
    _run(tmp_path / "c" / "tr", here)
    result = rp.report([str(tmp_path / "c")], tmp_path / "out3", figures=False)
    assert machine.describe(here) in rp.environment_line(result["groups"])
