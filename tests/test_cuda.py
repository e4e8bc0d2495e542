"""On a CUDA device (skipped elsewhere, and reported as skipped): the GPU check's steps as tests.

``scripts/gpu_check.py`` holds the steps (every registered method on both engines, with and without CUDA graphs,
equal to CPU greedy in fp32, fp16 divergences only near-ties; sampling; torch.compile; the attention kernel the
engine picks); here each must pass. No weights travel: the models are tiny random ones of the shipped architectures,
built on the CPU and moved. ``test_gpu_check_dry_run`` runs the whole check on the CPU, so that it is known to work
before a GPU is lent.
"""
import csv
import subprocess
import sys

import pytest
import torch

from methods.base import known_methods
from methods.common import ROOT
from scripts import gpu_check

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
CUDA = torch.device("cuda")


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@cuda
def test_every_method_on_cuda_equals_cpu_greedy(tmp_path):
    plan = [(arch, torch.float32, ["static-graphs", "static", "hf"], 2) for arch in ("llama-3-8b-instruct", "vicuna-7b")]
    verdict = gpu_check.lossless(gpu_check.Check(tmp_path, 900, CUDA), plan + [("llama-3-8b-instruct", torch.float16,
                                                                                   ["static-graphs"], 1)])
    runs = rows(tmp_path / "methods.csv")
    assert {r["method"] for r in runs} == set(known_methods())
    assert {r["engine"] for r in runs} == {"hf", "static", "static-graphs"}
    assert all(r["equal"] == "True" for r in runs if r["dtype"] == "float32"), [r for r in runs if r["equal"] != "True"]
    assert not [r for r in runs if r["kind"] == "real mismatch"], "an fp16 divergence that is not a near-tie"
    assert verdict.startswith("ok")


@cuda
def test_every_method_samples_vanillas_tokens_on_cuda(tmp_path):
    verdict = gpu_check.sampled(gpu_check.Check(tmp_path, 900, CUDA), "llama-3-8b-instruct")
    assert verdict.startswith("ok"), verdict


@cuda
def test_inductor_steps_with_cuda_graphs(tmp_path):
    verdict = gpu_check.inductor(gpu_check.Check(tmp_path, 900, CUDA), "llama-3-8b-instruct")
    assert verdict.startswith("ok"), verdict


@cuda
def test_cuda_graphs_are_recorded_and_replayed():
    """engine.compile=auto on CUDA records each step size's graph once per span bucket, before timing where the
    proposer declared its sizes, and decodes as ``model.generate`` does on the CPU."""
    from methods.base import build_proposer
    from methods.decode import generate
    from methods.engine import build_engine

    model = gpu_check.tiny("llama-3-8b-instruct", 2, CUDA)
    engine = build_engine(model, {"name": "static"})
    assert engine.summary()["step"] == "cuda-graphs"
    p = build_proposer("tr", {}, vocab_size=model.config.vocab_size, device=CUDA, target=model)
    engine.prepare(p.step_sizes())
    prompt = gpu_check.PROMPTS[1]
    ref = gpu_check.tiny("llama-3-8b-instruct", 2).generate(torch.tensor([prompt]), max_new_tokens=40,
                                                           do_sample=False)[0, len(prompt):].tolist()
    assert generate(engine, p, prompt, max_new_tokens=40, stop_ids=set()).token_ids == ref
    graphs = engine.summary()["cuda_graphs"]
    assert graphs["sizes"] == [81] and graphs["recorded_while_decoding"] == 0 and graphs["seconds"] > 0


@pytest.mark.parametrize("arch", ["llama-3-8b-instruct", "vicuna-7b", "qwen3-8b", "gemma3-270m"])
def test_the_checks_models_are_built_on_the_cpu_and_moved(arch, monkeypatch):
    """A CUDA generator draws other numbers than the CPU's for one seed, so the check builds every tiny model on the
    CPU in fp32, whatever device it is for and whatever torch's defaults say, then moves it: the model for another
    device has the CPU model's weights bit for bit (on CUDA, ``test_the_device_model_is_the_cpu_model``)."""
    built = []
    build = gpu_check.random_model
    monkeypatch.setattr(gpu_check, "random_model", lambda *a, **kw: built.append(kw["device"]) or build(*a, **kw))
    ref = gpu_check.tiny(arch, 2)
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        with torch.device("meta"):
            other = gpu_check.tiny(arch, 2, device="cpu")
        assert next(gpu_check.tiny(arch, 2, device="meta").parameters()).is_meta  # moved there, built elsewhere
    finally:
        torch.set_default_dtype(default)
    assert built == ["cpu"] * 3
    assert all(torch.equal(a, b) and a.dtype == torch.float32
               for a, b in zip(ref.state_dict().values(), other.state_dict().values()))


@cuda
@pytest.mark.parametrize("arch", ["llama-3-8b-instruct", "gemma3-270m"])
def test_the_device_model_is_the_cpu_model(arch):
    cpu, dev = gpu_check.tiny(arch, 2), gpu_check.tiny(arch, 2, CUDA)
    assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu.state_dict().values(), dev.state_dict().values()))


@cuda
def test_the_static_engine_avoids_the_math_kernel_with_gqa():
    from methods.engine import sdpa_backend

    assert sdpa_backend(32, 8, 128, torch.float16, CUDA, "folded")["backend"] != "MATH"


@cuda
def test_eagle_head_on_an_fp16_cuda_target_keeps_fp32_rotary():
    from methods.base import build_proposer
    from scripts.shapes import random_model

    model = random_model("llama-3-8b-instruct", small=True, dtype=torch.float16, device=CUDA)
    p = build_proposer("eagle2", {"head": "random"}, vocab_size=model.config.vocab_size, device=CUDA, target=model)
    assert p.head.rotary.inv_freq.dtype == torch.float32 and p.head.fc.weight.dtype == torch.float16


def test_the_eagle2_projection_counts_its_head_and_rests_where_drafts_do_not_pay():
    """A flat cost (a GPU at small batches): every one of the 59 drafts kept, the fitted odds' 4.36 tokens a step over
    the forward and the head's 6 forwards at 1% each; a cost per token as dear as a step: plain steps (1.0)."""
    accept, tree = gpu_check.eagle2_odds()
    flat = [{"tokens": n, "ms_min": 10.0} for n in (1, 8, 32, 81, 128)]
    speedup, kept = gpu_check.eagle2_projection(accept, tree, flat, 1, 0.01)
    assert kept == 60 and speedup == pytest.approx(4.36 / 1.06, rel=1e-6)
    speedup, kept = gpu_check.eagle2_projection(accept, tree, flat, 4, 0.01)  # 4 rows, the same per row
    assert kept == 60 and speedup == pytest.approx(4.36 / 1.06, rel=1e-6)
    steep = [{"tokens": n, "ms_min": 10.0 * n} for n in (1, 8, 32, 81, 128)]
    assert gpu_check.eagle2_projection(accept, tree, steep, 1, 0.01) == (1.0, 1.0)


BLOCKER = ("import sys, importlib.abc\n"
           "class Block(importlib.abc.MetaPathFinder):\n"
           "    def find_spec(self, name, path, target=None):\n"
           "        if name.split('.')[0] in ('hydra', 'omegaconf', 'fastchat'):\n"
           "            raise ImportError('not on a lent GPU machine: ' + name)\n"
           "sys.meta_path.insert(0, Block())\n"
           "import methods, methods.hub, tests.test_cuda\n"
           "from scripts.gpu_check import main\n")


@pytest.mark.slow  # the whole check, in a subprocess and in-process
def test_gpu_check_dry_run(tmp_path):
    """The check, on the CPU with tiny shapes: every step passes and writes its file; every step but ``decode`` (the
    runner's path, which the carried wheels serve) imports nothing a bare GPU machine lacks (Hydra, OmegaConf,
    fastchat); ``decode`` without them says what to carry."""
    steps = "kernels,cost,batch,lossless,sampling"  # inductor: tests/test_static_engine.py's compiled tests
    code = BLOCKER + f"sys.exit(main(['--cpu', '--out', {str(tmp_path)!r}, '--steps', {steps!r}]))\n"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=480)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    files = sorted(f.name for f in tmp_path.iterdir())
    assert files == ["batch_cost.csv", "cost.csv", "gpu_check.log", "kernels.csv", "methods.csv", "sampling.csv"]
    log = (tmp_path / "gpu_check.log").read_text()
    assert "FAILED" not in log and "expected 100 s on an H200" in log  # each step's estimate before it starts
    for step in steps.split(","):
        assert f"-- {step}: ok" in log, step
    cost = rows(tmp_path / "cost.csv")  # every engine at every context and size, each against the floor
    assert {r["engine"] for r in cost} == {"static", "static-graphs", "hf"}
    assert all(float(r["x_floor"]) > 0 and float(r["floor_kv_ms"]) > float(r["floor_ms"]) > 0 for r in cost)
    assert "goals: vanilla's step" in log and "paper tree costs" in log
    batched = rows(tmp_path / "batch_cost.csv")  # B x N, each B's projection beside its times
    assert [(int(r["batch"]), int(r["nodes"])) for r in batched] == [(b, n) for b in (1, 2) for n in (1, 4, 81)]
    assert all(float(r["ms"]) > 0 and int(r["tokens_per_forward"]) == int(r["batch"]) * int(r["nodes"])
               and float(r["paper_speedup"]) > 0 and float(r["auto_speedup"]) >= 1 for r in batched)
    # budget=auto's projection: never below a plain step's rate in its own model, a row keeping 1 to 81 nodes
    assert all(float(r["budget_speedup"]) >= 1 and 1 <= float(r["budget_nodes_per_row"]) <= 81 for r in batched)
    assert all(float(r["eagle2_budget_speedup"]) >= 1 and 1 <= float(r["eagle2_budget_nodes_per_row"]) <= 60
               and 0 < float(r["eagle2_head_share"]) for r in batched)
    runs = rows(tmp_path / "methods.csv")
    assert {r["method"] for r in runs} == set(known_methods())  # every registered one
    assert {(r["arch"].split()[0], r["dtype"], r["engine"]) for r in runs if "inductor" not in r["engine"]} == \
        {("llama-3-8b-instruct", "float32", e) for e in ("static-graphs", "static", "hf")} | \
        {("gemma3-270m", "float32", "static-graphs"), ("llama-3-8b-instruct", "float16", "static-graphs")}
    assert all(r["reference"] == "cpu greedy" for r in runs)
    sampled = rows(tmp_path / "sampling.csv")
    assert {r["method"] for r in sampled} == set(known_methods()) and all(r["equal"] == "True" for r in sampled)

    code = BLOCKER + f"sys.exit(main(['--cpu', '--out', {str(tmp_path / 'bare')!r}, '--steps', 'decode']))\n"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "decode: skipped: not on a lent GPU machine" in p.stdout and \
        "carry hydra-core, omegaconf" in p.stdout, p.stdout[-2000:]

    p = subprocess.run([sys.executable, "-m", "scripts.gpu_check", "--cpu", "--out", str(tmp_path / "decode"),
                        "--steps", "decode"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    decoded = rows(tmp_path / "decode" / "decode.csv")
    assert [r["run"] for r in decoded] == ["vanilla,engine.compile=false", "tr,engine.compile=false", "vanilla", "tr",
                                           "tr,method.tree=auto", "pld", "eagle2,method.head=random"]
    assert all(float(r["tok_per_s"]) > 0 and r["step"] == "eager" for r in decoded)  # auto: eager on a CPU


def test_a_verdict_that_blames_the_reference_when_every_case_fails_at_token_zero():
    bad = [{"ok": False, "first_divergence": 0}] * 5
    assert "the reference and the device model differ" in gpu_check.verdict(bad, "cpu greedy")
    some = bad[:2] + [{"ok": True, "first_divergence": ""}] + [{"ok": False, "first_divergence": 7}]
    assert gpu_check.verdict(some, "cpu greedy") == "FAILED: 3 of 4 runs differ from cpu greedy"
    assert gpu_check.verdict(some[2:3], "cpu greedy") == "ok: 1 runs as required against cpu greedy"
