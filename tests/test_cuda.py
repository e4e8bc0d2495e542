"""On a CUDA device (skipped elsewhere, and reported as skipped): the GPU check's steps as tests.

``scripts/gpu_check.py`` holds the steps (every registered method on both engines equal to CPU greedy in
fp32, fp16 divergences only near-ties; compiled steps with CUDA graphs; the attention kernel the engine picks);
here each must pass. No weights travel: the models are tiny random ones of the shipped architectures.
``test_gpu_check_dry_run`` runs the whole check on the CPU, so that it is known to work before a GPU is lent.
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
    verdict = gpu_check.methods(gpu_check.Check(tmp_path, 900, CUDA), ["llama-3-8b-instruct", "vicuna-7b"])
    runs = rows(tmp_path / "methods.csv")
    assert {r["method"] for r in runs} == set(known_methods()) and {r["engine"] for r in runs} == {"hf", "static"}
    assert all(r["equal"] == "True" for r in runs if r["dtype"] == "float32"), [r for r in runs if r["equal"] != "True"]
    assert not [r for r in runs if r["kind"] == "real mismatch"], "an fp16 divergence that is not a near-tie"
    assert verdict.startswith("ok")


@cuda
def test_every_method_samples_vanillas_tokens_on_cuda(tmp_path):
    verdict = gpu_check.sampled(gpu_check.Check(tmp_path, 900, CUDA), "llama-3-8b-instruct")
    assert verdict.startswith("ok"), verdict


@cuda
def test_compiled_steps_with_cuda_graphs(tmp_path):
    verdict = gpu_check.compiled(gpu_check.Check(tmp_path, 900, CUDA), "llama-3-8b-instruct")
    assert verdict.startswith("ok"), verdict


@cuda
def test_the_static_engine_avoids_the_math_kernel_with_gqa():
    from methods.engine import sdpa_backend

    assert sdpa_backend(32, 8, 128, torch.float16, CUDA, expand_kv=True)["backend"] != "MATH"


@cuda
def test_eagle_head_on_an_fp16_cuda_target_keeps_fp32_rotary():
    from evaluation.shapes import random_model
    from methods.base import build_proposer

    model = random_model("llama-3-8b-instruct", small=True, dtype=torch.float16, device=CUDA)
    p = build_proposer("eagle2", {"head": "random"}, vocab_size=model.config.vocab_size, device=CUDA, target=model)
    assert p.head.rotary.inv_freq.dtype == torch.float32 and p.head.fc.weight.dtype == torch.float16


@pytest.mark.slow  # the whole check in a subprocess
def test_gpu_check_dry_run(tmp_path):
    """The check, on the CPU with tiny shapes: every step passes, its six files come back, and nothing it
    imports needs Hydra, OmegaConf or fastchat (a lent GPU machine has none of them)."""
    blocker = ("import sys, importlib.abc\n"
               "class Block(importlib.abc.MetaPathFinder):\n"
               "    def find_spec(self, name, path, target=None):\n"
               "        if name.split('.')[0] in ('hydra', 'omegaconf', 'fastchat'):\n"
               "            raise ImportError('not on a lent GPU machine: ' + name)\n"
               "sys.meta_path.insert(0, Block())\n"
               "import methods, methods.hub, tests.test_cuda\n"
               "from scripts.gpu_check import main\n"
               f"sys.exit(main(['--cpu', '--out', {str(tmp_path)!r}]))\n")
    p = subprocess.run([sys.executable, "-c", blocker], cwd=ROOT, capture_output=True, text=True, timeout=480)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    files = sorted(f.name for f in tmp_path.iterdir())
    assert files == ["attention.csv", "batch_cost.csv", "cost.csv", "gpu_check.log", "methods.csv", "sampling.csv"]
    log = (tmp_path / "gpu_check.log").read_text()
    assert "FAILED" not in log and "4 cost curves (tiny shapes): ok" in log
    assert "5 batched cost (tiny shapes): ok" in log
    batched = rows(tmp_path / "batch_cost.csv")  # B x N, each B's projection beside its times
    assert [(int(r["batch"]), int(r["nodes"])) for r in batched] == [(b, n) for b in (1, 2) for n in (1, 4, 81)]
    assert all(float(r["ms"]) > 0 and int(r["tokens_per_forward"]) == int(r["batch"]) * int(r["nodes"])
               and float(r["paper_speedup"]) > 0 and float(r["auto_speedup"]) >= 1 for r in batched)
    runs = rows(tmp_path / "methods.csv")
    assert {r["method"] for r in runs} == set(known_methods())  # every registered one
    assert {r["arch"].split()[0] for r in runs if r["dtype"] == "float32"} == \
        {"llama-3-8b-instruct", "vicuna-7b", "qwen3-8b", "gemma3-270m"}  # fp16: the first one, in a dry run
    assert {r["arch"].split()[0] for r in runs if r["dtype"] == "float16"} == {"llama-3-8b-instruct"}
    sampled = rows(tmp_path / "sampling.csv")
    assert {r["method"] for r in sampled} == set(known_methods()) and all(r["equal"] == "True" for r in sampled)
    assert "2b sampling at T=1" in log
