"""A method added from outside ``methods/``: its module, its declaration and the registry are all it takes.

The toy method learns successor pairs in its preparation hook (decoding a few of the project's own
prompts through the run's engine, as TR's tree=auto calibration does), drafts a chain from them,
and leaves a file beside the answers through its artefacts hook. The runner, which names no
method, runs it like any built-in one, and it stays lossless.
"""
import json
from dataclasses import dataclass

import pytest
import torch

from evaluation.records.answers import read_answers
from evaluation.records.equality import compare
from evaluation.running.config import compose_config
from evaluation.running.runner import run
from methods import base
from methods.base import Draft, Preparation, Proposer, register
from methods.common import HarnessError
from methods.decode import generate
from methods.params import param
from methods.tree import Tree

COMMON = ["bench.question_ids=[81,161]", "bench.max_new_tokens=16", "warmup=0", "runtime.progress=false"]


class Successors(Proposer):
    """Drafts the chain of remembered successors of the root (most recent pair wins)."""

    name = "toy_successors"

    @dataclass
    class Params:
        length: int = param(3, "draft at most this many tokens", low=1, high=16)
        prompts: int = param(2, "own prompts decoded by prepare() to learn pairs from", low=0, high=8)

    prepared: list = []  # every Preparation this class was given (the test reads it)
    drafted = 0  # draft tokens proposed by every instance

    def __init__(self, length: int, prompts: int):
        self.length, self.prompts, self.next = length, prompts, {}

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device) -> "Successors":
        return cls(params.length, params.prompts)

    def prepare(self, preparation: Preparation) -> None:
        self.prepared.append(preparation)
        for ids in preparation.prompts(self.prompts):
            greedy = base.build_proposer("vanilla", {}, vocab_size=0, device=preparation.engine.device)
            gen = generate(preparation.engine, greedy, ids, max_new_tokens=8, stop_ids=preparation.stop_ids)
            self._learn(ids + gen.token_ids)

    def artefacts(self) -> dict[str, object]:
        return {"successors.json": {"pairs": len(self.next)}}

    def _learn(self, tokens: list[int]) -> None:
        self.next.update(zip(tokens, tokens[1:]))

    def propose(self, context: torch.Tensor) -> Draft:
        chain = [int(context[-1])]
        while len(chain) <= self.length and chain[-1] in self.next:
            chain.append(self.next[chain[-1]])
        Successors.drafted += len(chain) - 1
        return Draft(torch.tensor(chain, device=context.device), Tree.chain(len(chain)).to(context.device))

    def update(self, draft, result) -> None:
        self._learn([int(draft.tokens[0])] + result.new_tokens)


@pytest.fixture
def toy():
    register(Successors)
    Successors.prepared.clear()
    Successors.drafted = 0
    yield Successors
    del base._REGISTRY[Successors.name]


@pytest.mark.slow  # two runs on the embedded model
def test_a_method_registered_from_outside_runs_through_the_runner(toy, tmp_path):
    out = run(compose_config([f"method={toy.name}", "method.length=4", *COMMON]), tmp_path / "toy")
    (prep,) = toy.prepared
    prompts = prep.prompts(2)
    assert len(prompts) == 2 and all(isinstance(t, int) for t in prompts[0])
    assert prep.model_name == "smollm2-135m" and prep.engine.name == "static" and prep.stop_ids
    vanilla = run(compose_config(["method=vanilla", *COMMON]), tmp_path / "vanilla")
    records = read_answers(out)
    assert compare(read_answers(vanilla), records)[2] == []  # token-identical to greedy
    assert records[0]["method"] == toy.name
    assert json.loads((out / "successors.json").read_text())["pairs"] > 0  # learned by prepare()
    assert toy.drafted > 0  # and its drafts went through the verifier


def test_its_parameters_are_checked_by_its_declaration(toy, tmp_path):
    cfg = compose_config([f"method={toy.name}", "method.length=0", *COMMON])
    with pytest.raises(HarnessError, match="method.length must be an integer from 1 to 16, got 0"):
        run(cfg, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # refused before anything was written
    with pytest.raises(HarnessError, match=f"method '{toy.name}' has no parameter width; known: length, prompts"):
        base.build_proposer(toy.name, {"width": 2}, vocab_size=10, device=None)
