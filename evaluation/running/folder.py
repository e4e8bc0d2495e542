"""The one writer of a run folder's settings and summary (``config.yaml``, ``summary.json``; the answers are
``evaluation.records.answers.AnswerWriter``'s), for the runner and the side-by-side bench alike, what both record of
the machine (``environment``), and the checks both make of a selection of questions before anything loads."""
from __future__ import annotations

import platform
import subprocess
import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from evaluation.records.answers import SUMMARY
from evaluation.records.bench import Question, load_bench
from methods import machine
from methods.common import ROOT, HarnessError, atomic, write_json_atomic


def selection(cfg: DictConfig) -> list[Question]:
    """The questions ``cfg.bench`` selects (``bench.path``, ``categories``, ``question_ids``, ``limit_per_category``,
    ``skip_per_category``)."""
    b = cfg.bench
    return load_bench(b.path, b.get("file", "spec_bench"), categories=b.categories, question_ids=b.question_ids,
                      limit_per_category=b.limit_per_category, skip_per_category=b.skip_per_category)


def check_batch(size: int, questions: int) -> None:
    """Refuse a batch that could never be full: more rows than questions."""
    if size > questions:
        raise HarnessError(f"runtime.batch_size={size} but the run has {questions} question(s), so the batch could "
                           f"never be full; give a batch size of at most {questions} or more questions")


def write_config(out: Path, cfg: DictConfig) -> None:
    """``config.yaml``: the run's whole config, resolved (``evaluation.equal`` rebuilds the model from it)."""
    with atomic(out / "config.yaml") as tmp:
        OmegaConf.save(cfg, tmp, resolve=True)


def summary(runner, cfg: DictConfig, status: str, questions: int, method: str | None = None, **more) -> dict:
    """``summary.json``'s keys: status, model, method (``runner.method`` unless given), bench, questions, then
    ``more`` (a shard, the side-by-side session, the prompt format...), the resolved config, the environment, the
    engine and the method's state."""
    return {"status": status, "model": runner.spec.name, "method": method or runner.method, "bench": cfg.bench.name,
            "questions": questions, **more, "config": OmegaConf.to_container(cfg, resolve=True),
            "environment": environment(runner.device, runner.dtype),
            "engine": runner.engine.summary(), "method_state": runner.method_state(),
            **({"budget": runner.budget.summary()} if runner.budget.active else {})}


def write_summary(out: Path, data: dict) -> None:
    write_json_atomic(out / SUMMARY, data)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def environment(device: torch.device, dtype: torch.dtype) -> dict:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return ""

    import fastchat
    import transformers

    return {
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "fschat": fastchat.__version__,
        "hydra": hydra.__version__,
        "device": str(device),
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else platform.processor() or platform.machine()),
        "cpu_threads": torch.get_num_threads(),
        "cpu": machine.cpu(),  # model, ISA flags, cores: which kernels win depends on them
        "dtype": str(dtype).removeprefix("torch."),
        "host": platform.node(),
    }
