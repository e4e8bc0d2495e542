"""The registry is the only list of methods: a method registered in a module of its own, with no other file
edited, is composed by Hydra and run by the lossless tests, the sampling tests and the GPU check."""
import csv
import os
import subprocess
import sys

import pytest

from methods.common import ROOT
from scripts import gpu_check

# A method nobody has heard of: the token that followed the root's last earlier occurrence, then the token after
# that one, up to n drafts (a bigram lookup chain). Written to a folder outside the project.
THROWAWAY = '''
from dataclasses import dataclass

import torch

from methods.base import Draft, Proposer, register
from methods.params import param
from methods.tree import Tree


@register
class Bigram(Proposer):
    name = "throwaway"

    @dataclass
    class Params:
        n: int = param(4, "drafts per step", low=1, high=16)

    def __init__(self, n):
        self.n = n

    @classmethod
    def build(cls, params, *, vocab_size, device):
        return cls(params.n)

    def propose(self, context):
        drafts, token, seq = [], int(context[-1]), context[:-1].tolist()
        for _ in range(self.n):
            at = max((i for i, t in enumerate(seq) if t == token and i + 1 < len(seq)), default=None)
            if at is None:
                break
            token = seq[at + 1]
            drafts.append(token)
        tokens = torch.tensor([int(context[-1]), *drafts], dtype=torch.long, device=context.device)
        return Draft(tokens, Tree.chain(len(tokens)).to(context.device))
'''
PLUGIN = "import throwaway_method  # noqa: F401  (registers method=throwaway before the tests are collected)\n"
GPU_CHECK = '''
import sys
from pathlib import Path

import throwaway_method  # noqa: F401
import torch
from scripts import gpu_check

gpu_check.NEW_TOKENS, gpu_check.VOCAB = 16, 8192  # as the dry run (--cpu)
out = Path(sys.argv[1])
check = gpu_check.Check(out, 300, torch.device("cpu"))
print("VERDICT", gpu_check.lossless(check, [("llama-3-8b-instruct", torch.float32, ["hf", "static"], 2)],
                                    only=("throwaway",)))
print("VERDICT", gpu_check.sampled(check, "llama-3-8b-instruct", only=("throwaway",)))
'''


@pytest.fixture(scope="module")
def throwaway(tmp_path_factory):
    """A folder with the method's module and a pytest plugin that imports it, and the environment to find them."""
    folder = tmp_path_factory.mktemp("throwaway")
    (folder / "throwaway_method.py").write_text(THROWAWAY)
    (folder / "throwaway_plugin.py").write_text(PLUGIN)
    (folder / "gpu_check_it.py").write_text(GPU_CHECK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])}
    return folder, env


@pytest.mark.slow  # subprocesses; one decodes the embedded model
@pytest.mark.long  # the registry as the tests' list: the GPU check's case below, on its subprocess, in make test
def test_a_new_method_is_run_by_the_lossless_and_sampling_tests(throwaway):
    folder, env = throwaway
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "throwaway_plugin", "-p", "no:cacheprovider",
                        "tests/test_sampling.py", "tests/test_lossless.py", "-k", "throwaway and not full", "-rA"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    said = p.stdout + p.stderr
    assert p.returncode == 0, said[-4000:]
    passed = [line for line in said.splitlines() if line.startswith("PASSED")]
    # the tiny-model sampling test at its three settings, and the embedded model's greedy and sampled lossless tests
    assert len(passed) == 5 and all("throwaway" in line for line in passed), said[-4000:]
    assert sum("test_every_method_samples_exactly_vanillas_tokens[throwaway" in line for line in passed) == 3
    assert sum("test_method_is_lossless[method=throwaway]" in line for line in passed) == 1
    assert sum("test_method_samples_exactly_vanillas_tokens[method=throwaway]" in line for line in passed) == 1


@pytest.mark.slow  # a subprocess
def test_a_new_method_is_run_by_the_gpu_check(throwaway, tmp_path):
    folder, env = throwaway
    p = subprocess.run([sys.executable, str(folder / "gpu_check_it.py"), str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    verdicts = [line for line in p.stdout.splitlines() if line.startswith("VERDICT ")]
    assert len(verdicts) == 2 and all(v.startswith("VERDICT ok") for v in verdicts), p.stdout[-3000:]
    with open(tmp_path / "methods.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["method"] for r in rows} == {"throwaway"} and {r["engine"] for r in rows} == {"hf", "static"}
    assert all(r["equal"] == "True" for r in rows) and len(rows) == 2 * len(gpu_check.PROMPTS)  # fp32 only


def test_the_throwaway_method_stays_in_its_subprocesses():
    """The subprocesses above register it; this process's registry (every other test's) never sees it."""
    from methods.base import known_methods

    assert "throwaway" not in known_methods()
