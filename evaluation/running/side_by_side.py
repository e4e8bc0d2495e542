"""Methods side by side in one process (``scripts.bench_methods`` is the command; its docstring says what and why),
in the steps a reader can follow: ``compose`` the methods' configs and the questions, ``load`` one runner per
method (one model per model setting), ``warm_up``, ``decode`` the questions (the order of the methods rotating,
chunk by chunk), ``write`` each method's run folder, and ``check`` each method's tokens against the first method of
its model and sampling settings."""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig

from evaluation.records.answers import ANSWERS, to_file
from evaluation.records.bench import Question
from evaluation.records.equality import NEAR_TIE, compare
from evaluation.running import folder
from evaluation.running.config import batch_size, compose_config, method_params, model_spec, sampling_settings
from evaluation.running.explain import explain
from evaluation.running.models import load_model
from evaluation.running.prompts import prompt_ids
from evaluation.running.runner import Runner
from evaluation.running.vllm import make_runner
from methods import machine
from methods.base import check_method
from methods.common import HarnessError, write_jsonl_atomic
from methods.decode import Generation, PhaseTimer

GENERATE = "generate"
CHUNK = 4  # at batch B, by default each method answers CHUNK * B questions in a row: the batch stays full for most of
# the chunk; a smaller chunk (``compose``'s ``chunk``) interleaves the methods more finely where the machine drifts


@dataclass
class Bench:
    """What the steps share: the methods' labels, configs and runners, the questions, and the records decoded."""

    labels: list[str]  # one per method, "tr,method.k=4" for "method=tr method.k=4"
    cfgs: dict[str, DictConfig]
    questions: list[Question]
    batch: int
    chunk: int  # questions each method answers in a row, its turn (decode)
    runners: dict[str, Runner] = field(default_factory=dict)
    groups: dict[tuple, list[str]] = field(default_factory=dict)  # (model, sampling) -> labels; first: reference
    records: dict[str, list[dict]] = field(default_factory=dict)


def sampling_key(cfg) -> str:
    return repr(sampling_settings(cfg))


def compose(methods: list[str], common: list[str], batch: int, generate: bool = False,
            chunk: int | None = None) -> Bench:
    """1. Every method's config (``common`` overrides first) and the questions, and what the settings alone
    refuse, before any model loads. ``chunk``: the questions each method answers in its turn (default one at batch
    size 1, ``CHUNK`` * B at B)."""
    labels = [m.replace("method=", "").replace(" ", ",") for m in methods]
    cfgs = [compose_config(common + m.split()) for m in methods]
    questions = folder.selection(cfgs[0])
    if generate and not all(sampling_settings(c).greedy for c in cfgs):
        raise HarnessError("--generate compares with greedy model.generate: leave it out at sampling.temperature > 0 "
                           "(sampled methods are checked against vanilla sampling with the same seed)")
    for cfg in cfgs:
        check_method(*method_params(cfg))
        if batch_size(cfg) != batch:
            raise HarnessError(f"a method sets runtime.batch_size={batch_size(cfg)}: give the batch size of every "
                               f"method with --batch (here {batch})")
    folder.check_batch(batch, len(questions))
    chunk = chunk or (1 if batch == 1 else CHUNK * batch)
    if chunk < batch:
        raise HarnessError(f"--chunk {chunk} is smaller than the batch ({batch}): a chunk of fewer questions than "
                           f"rows never fills the batch; give --chunk {batch} or more")
    bench = Bench(labels, dict(zip(labels, cfgs)), questions, batch, chunk)
    if generate:
        bench.cfgs[GENERATE] = compose_config(common + ["method=vanilla"])
    return bench


def load(bench: Bench) -> None:
    """2. A runner per method, one model per distinct model setting ("method=vanilla model.dtype=bfloat16" loads
    another); each method joins the group of its model and sampling settings."""
    models: dict[str, tuple] = {}
    for label, cfg in bench.cfgs.items():
        first = label == GENERATE  # generate: with the first method's model, checked against it
        key = repr(model_spec(bench.cfgs[bench.labels[0]] if first else cfg))
        if cfg.engine.name == "vllm":  # vLLM's worker loads its own weights
            bench.runners[label] = make_runner(cfg)
        else:
            if key not in models:
                models[key] = load_model(model_spec(cfg))
            bench.runners[label] = (GenerateRunner if first else Runner)(cfg, models[key])
        group = (key, sampling_key(bench.cfgs[bench.labels[0]] if first else cfg))
        bench.groups.setdefault(group, []).append(label)


def warm_up(bench: Bench, passes: int, phases: bool = False) -> None:
    """3. ``passes`` over the first question per method; with ``phases`` each step's time is split from then on."""
    for r in bench.runners.values():
        r.warm_up(bench.questions[0], passes)
        if phases and not isinstance(r, GenerateRunner):
            r.timer = PhaseTimer(r.device)


def decode(bench: Bench, progress: bool = True) -> None:
    """4. Every question by every method, chunk by chunk (``bench.chunk`` questions: one at batch size 1), the
    order of the methods rotating from one chunk to the next so that a busy machine slows all alike; each chunk is
    its method's own clock segment, so that its throughput counts its own decoding alone (and the chunks pair the
    methods' throughputs: ``evaluation.records.metrics.load_interval``). The phase timers start afresh: each call's
    records and phases are its own (``scripts.bench_methods --passes``)."""
    from tqdm import tqdm

    bench.records = {label: [] for label in bench.runners}
    for r in bench.runners.values():
        if isinstance(getattr(r, "timer", None), PhaseTimer):
            r.timer.calls.clear()
    order = list(bench.runners)
    chunk = bench.chunk
    with tqdm(total=len(bench.questions), desc="questions", unit="q", disable=not progress) as bar:
        for i, at in enumerate(range(0, len(bench.questions), chunk)):
            part = bench.questions[at: at + chunk]
            for label in order[i % len(order):] + order[: i % len(order)]:
                r = bench.runners[label]
                r.segment, r.clock0 = uuid.uuid4().hex[:12], time.perf_counter()
                r.answer_all(part, lambda rec, label=label: bench.records[label].append({**rec, "method": label}))
            bar.update(len(part))


def write(bench: Bench, out: Path) -> None:
    """5. Each method's run folder: its answers, config and summary (one session: ``evaluation.report`` knows these
    runs were timed side by side)."""
    session = uuid.uuid4().hex
    for label, recs in bench.records.items():
        write_jsonl_atomic(out / label / ANSWERS, [to_file(r) for r in recs])
        r = bench.runners[label]
        r.engine.use_threads()  # the environment records the thread count this method ran with
        folder.write_config(out / label, bench.cfgs[label])
        folder.write_summary(out / label, folder.summary(
            r, bench.cfgs[label], "finished", len(bench.questions), method=GENERATE if label == GENERATE else None,
            side_by_side=list(bench.runners), session=session, chunk=bench.chunk))


def check(bench: Bench, out: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """6. Each method's tokens against the first method of its own model (dtype) and sampling settings: the lines
    to print, and the (reference, method) pairs that are not lossless."""
    lines, unequal = [], []
    for group in bench.groups.values():
        ref = group[0]
        for label in group:
            if not bench.runners[label].proposer.samples_like_vanilla \
                    and not sampling_settings(bench.cfgs[label]).greedy:
                same, total, _, _ = compare(bench.records[ref], bench.records[label])
                lines.append(f"{label}: {same}/{total} turns token-identical to {ref}; its rule keeps the target's "
                             f"distribution, not vanilla's draws (not checked token by token)")
                continue
            mismatches, fails, verdict = lossless(out, ref, label, bench.records)
            if fails:
                unequal.append((ref, label))
            lines.append(f"{label}: {verdict}")
            lines += ["    " + m.describe() for m in mismatches]
    return lines, unequal


def lossless(out: Path, ref: str, label: str, records: dict) -> tuple[list, bool, str]:
    """(the divergences, whether they break losslessness, a one-line verdict) for ``label`` against ``ref`` (same
    model, same dtype). Each divergence is classified by re-running the model (``evaluation.running.explain``); in
    fp32 every one counts, in reduced precision only those that are not near-ties."""
    same, total, mismatches, _ = compare(records[ref], records[label])
    verdict = f"{same}/{total} turns token-identical to {ref}"
    if not mismatches:
        return [], False, verdict
    dtype = explain(out / ref, records[ref], mismatches)
    first = [m for m in mismatches if not (m.kind or "").startswith("follows")]
    ties = sum(m.kind == NEAR_TIE for m in first)
    verdict += f"; {len(first)} divergence(s) in {dtype}, {ties} of them near-ties"
    return mismatches, dtype == "float32" or ties < len(first), verdict


class GenerateRunner(Runner):
    """Hugging Face generate in the runner's shoes: same prompts, same record format, the same batch size.

    ``answer_all`` answers ``batch`` questions at a time: one ``model.generate`` for the group's first turns (left
    padded, with their attention mask), then one for the second turns of those that have one, each prompt holding
    the answers before it. Every turn of a call gets the call's time as its ``wall_time`` and clock, no
    ``first_token_time`` (generate does not tell), and accept lengths of 1. With one slot: one turn at a time."""

    def answer_all(self, questions: list[Question], done: Callable[[dict], None], batch: int | None = None) -> None:
        self.engine.use_threads()
        size = batch or self.batch_size
        for at in range(0, len(questions), size):
            group = questions[at: at + size]
            answers, turns, loads = ([[] for _ in group] for _ in range(3))
            for i in range(max(len(q.turns) for q in group)):
                rows = [j for j, q in enumerate(group) if i < len(q.turns)]
                prompts = [prompt_ids(self.spec, self.tok, list(group[j].turns[: i + 1]), answers[j]) for j in rows]
                for j, ids in zip(rows, prompts):
                    if len(ids) >= self.context:
                        raise HarnessError(f"question {group[j].question_id} turn {i + 1}: the prompt has {len(ids)} "
                                           f"tokens but {self.spec.name} takes {self.context}; leave it out with "
                                           f"bench.question_ids or raise model.max_context if the model allows it")
                with machine.Load() as load:  # how busy the machine was while this call was timed
                    gens = self.generate(prompts, [min(self.max_new_tokens, self.context - len(ids))
                                                   for ids in prompts])
                for j, gen in zip(rows, gens):
                    text_ids = gen.token_ids[:-1] if gen.stop == "eos" else gen.token_ids
                    answers[j].append(self.tok.decode(text_ids, skip_special_tokens=True).strip())
                    turns[j].append(gen)
                    loads[j].append(load)
            for j, q in enumerate(group):
                done(self._record(q, answers[j], turns[j], loads[j], size))

    def generate(self, prompts: list[list[int]], limits: list[int]) -> list[Generation]:
        """One greedy ``model.generate`` of ``prompts`` (left padded), each row cut at its own limit and first stop
        token (a row generates on, padded, until the batch's last one stops)."""
        longest = max(map(len, prompts))
        pad = next(t for t in (self.tok.pad_token_id, self.tok.eos_token_id, min(self.stop_ids)) if t is not None)
        ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        t = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=mask, max_new_tokens=max(limits), do_sample=False,
                                      eos_token_id=sorted(self.stop_ids), pad_token_id=pad)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        end = time.perf_counter()
        gens = []
        for row, limit in zip(out[:, longest:].tolist(), limits):
            new = row[:limit]
            new = new[: next((k + 1 for k, token in enumerate(new) if token in self.stop_ids), len(new))]
            stop = "eos" if new and new[-1] in self.stop_ids else "length"
            gens.append(Generation(new, [1] * len(new), 0.0, end - t, stop, clock=(t, end)))
        return gens
