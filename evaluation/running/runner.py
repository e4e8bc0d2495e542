"""The runner: decode a selection of Spec-Bench questions with one method and one model into a run folder.

``run(cfg, out)`` (what ``python -m evaluation.run`` calls) writes ``answers.jsonl`` (one whole line per finished
question, Spec-Bench's format plus token ids and timings), ``config.yaml`` and ``summary.json``. Running it again
resumes: finished questions are skipped, and every setting but ``RESULT_NEUTRAL`` must be as before. A run holds
its folder for itself (``.lock``), and Ctrl-C keeps every finished answer (exit 130, summary ``interrupted``).
``Runner`` answers questions one at a time, or ``runtime.batch_size`` turns at once (``methods.decode.decode_batch``:
a slot whose turn has finished takes the same question's next turn, else the next question), each question written
as soon as its last turn has finished; the side-by-side benchmarks hold several runners.
"""
from __future__ import annotations

import copy
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from textwrap import shorten

import torch
from omegaconf import DictConfig, OmegaConf

from evaluation.records.answers import ANSWERS, AnswerWriter, folder_lock
from evaluation.records.bench import Question, load_bench, shard
from evaluation.records.grading import grade, repetition
from evaluation.running import folder
from evaluation.running.config import (
    ModelSpec,
    batch_size,
    budget_settings,
    config_mismatch,
    int_setting,
    method_params,
    model_spec,
    prefill_chunk,
    sampling_settings,
)
from evaluation.running.models import (
    checkpoint_path,
    claim_device,
    cpu_fallback,
    load_model,
    max_context,
    stop_token_ids,
)
from evaluation.running.paradigms import paradigm
from evaluation.running.prompts import check_template, describe, end_of_thinking_id, prompt_ids, thinking_marker
from methods import machine
from methods.base import Preparation, build_proposer, check_artefacts, check_method
from methods.calibrate import prepare_budget
from methods.common import CACHE, HarnessError, load_torch_safe, save_torch_atomic, write_json_atomic
from methods.decode import Generation, Progress, Request, decode_batch
from methods.engine import build_engine
from methods.sampling import Sampler, Sampling

STATE = "proposer_state.pt"


def start_warnings(runner: "Runner", dtype: torch.dtype) -> list[str]:
    """What a user should know before a run's numbers: said once, at the start."""
    out = []
    if dtype != torch.float32:
        out.append(f"{str(dtype).removeprefix('torch.')}: in reduced precision a method's tokens equal vanilla "
                   f"greedy's only up to near-ties (two logits closer than the arithmetic's noise, which a "
                   f"different kernel or tree order can swap); python -m evaluation.equal VANILLA_RUN THIS_RUN "
                   f"classifies every divergence. Token-identical checks: model.dtype=float32")
    if dtype in (torch.bfloat16, torch.float16) and runner.device.type == "cpu" and not machine.native(dtype):
        out.append(f"{str(dtype).removeprefix('torch.')} on this CPU ({machine.kind()}) has no native instructions "
                   f"for it (AVX512-BF16/FP16 or AMX): a step of many tokens costs several times more than in "
                   f"float32 (results/MEASUREMENTS.md, 'By machine kind'), so trees and drafts pay less than there")
    if runner.max_new_tokens >= runner.context:
        out.append(f"bench.max_new_tokens={runner.max_new_tokens} does not fit {runner.spec.name}'s context of "
                   f"{runner.context} tokens (prompt included): turns stop at the context's end (stop=length)")
    return out


def ungraded(cfg: DictConfig, questions: list[Question]) -> list[str]:
    """The warning for a reasoning bench's questions that carry no ``solution`` (their answers are not graded)."""
    missing = [q.question_id for q in questions if not q.solution]
    if not missing or (cfg.bench.get("file", "spec_bench") != "spec_tts" and len(missing) == len(questions)):
        return []
    where = cfg.bench.get("path") or f"bench.file={cfg.bench.file}"
    return [f"{len(missing)} of {len(questions)} question(s) of {where} have no 'solution' "
            f"({', '.join(map(str, missing[:5]))}{', ...' if len(missing) > 5 else ''}): their answers are not graded "
            f"and the accuracy column covers the rest; add each question's solution to grade them"]


def prompt_room(runner: "Runner", questions: list[Question]) -> list[str]:
    """Refuse, before anything is decoded, a question whose prompt leaves no room in the model's context: its first
    turn's, or a later turn's without the answers before it (not known yet: a lower bound of that prompt). Returns
    the warning for first turns that leave less than ``bench.max_new_tokens`` (their answers stop at the end)."""
    def tokens(q: Question, turns: int) -> int:
        return len(prompt_ids(runner.spec, runner.tok, list(q.turns[:turns]), [""] * (turns - 1)))

    fix = "leave it out with bench.question_ids, or raise model.max_context if the model allows it"
    short = []
    for q in questions:
        first = tokens(q, 1)
        if first >= runner.context:
            raise HarnessError(f"question {q.question_id}: its first turn's prompt has {first} tokens, so "
                               f"{runner.spec.name}'s context of {runner.context} tokens leaves no room to answer; "
                               f"{fix}")
        for turn in range(2, len(q.turns) + 1):
            if (least := tokens(q, turn)) >= runner.context:
                raise HarnessError(f"question {q.question_id} turn {turn}: its prompt has at least {least} tokens (the "
                                   f"answers before it left out), so {runner.spec.name}'s context of "
                                   f"{runner.context} tokens leaves no room to answer; {fix}")
        if first + runner.max_new_tokens > runner.context:
            short.append(q.question_id)
    if not short or runner.max_new_tokens >= runner.context:  # the latter: start_warnings says it of every question
        return []
    shown = ", ".join(map(str, short[:5])) + (", ..." if len(short) > 5 else "")
    return [f"{len(short)} question(s) ({shown}) leave(s) less than bench.max_new_tokens={runner.max_new_tokens} of "
            f"{runner.spec.name}'s context of {runner.context} tokens after the first turn's prompt: those answers "
            f"stop at the context's end (stop=length); lower bench.max_new_tokens, or leave them out with "
            f"bench.question_ids"]


def sample_note(bench: DictConfig, selection: list[Question]) -> str | None:
    """The note for a question file (``bench.path``) that the bench samples (``limit_per_category``: the smoke and
    sample benches), which one who names a file may not expect; None when the limit leaves nothing out."""
    if not bench.path or bench.limit_per_category is None:
        return None
    whole = load_bench(bench.path, bench.get("file", "spec_bench"), categories=bench.categories,
                       question_ids=bench.question_ids)
    if len(whole) == len(selection):
        return None
    return (f"note: bench {bench.name} takes {bench.limit_per_category} question(s) per category of {bench.path}: "
            f"{len(selection)} of its {len(whole)}; bench=spec_bench or bench.limit_per_category=null takes them all")


class Runner:
    """Holds the loaded model and proposer; answers one question at a time."""

    def __init__(self, cfg: DictConfig, loaded: tuple | None = None, spec: ModelSpec | None = None):
        """``loaded``: a (model, tokenizer, device) already loaded for ``cfg.model``, to share between runners;
        ``spec``: the model spec to use instead of ``cfg.model``'s (a claimed device)."""
        params, policy, off_above = self._settings(cfg, spec)
        if loaded is None:
            checkpoint_path(self.spec)  # then a checkpoint that cannot be had,
        check_artefacts(self.method, params)  # and a head or drafter that cannot: before any weight loads
        self.model, self.tok, self.device = loaded or load_model(self.spec)
        self.timer = nullcontext  # a methods.decode.PhaseTimer to split each step's time (benchmarks)
        self.engine = build_engine(self.model, OmegaConf.to_container(cfg.engine, resolve=True))
        check_template(self.spec, self.tok)
        self.proposer = build_proposer(self.method, params, vocab_size=self.model.config.vocab_size, target=self.model,
                                       device=self.device)
        self.stop_ids = stop_token_ids(self.model, self.tok)
        self.context = max_context(self.model, self.spec)
        self.marker = thinking_marker(self.spec, self.tok)  # where a reasoning model's final answer starts
        self.end_of_thinking = end_of_thinking_id(self.tok)  # the token that closes its thinking, if it has one
        forced = (self.spec.thinking or {}).get("forced") if self.paradigm.force_end_of_thinking else None
        self.forced = self.tok(forced, add_special_tokens=False).input_ids if forced else None
        self.proposer.prepare(Preparation(engine=self.engine, model_name=self.spec.name, stop_ids=self.stop_ids,
                                          prompts=self.own_prompts, cache=CACHE, batch_size=self.batch_size))
        # the budget, and every step size prepared before any timing (engine.compile)
        self.budget = prepare_budget(self.engine, self.proposer, policy, off_above, self.batch_size, self.spec.name,
                                     CACHE)
        # one proposer per slot (Proposer.fork: what the batch shares, what each slot keeps for itself)
        self.proposers = [self.proposer] + [self.proposer.fork() for _ in range(self.batch_size - 1)]
        self.segment = uuid.uuid4().hex[:12]  # this process's part of the run (throughput: evaluation.records.metrics)
        self.clock0 = time.perf_counter()

    def _settings(self, cfg: DictConfig, spec: ModelSpec | None) -> tuple[dict, str, int | None]:
        """The run's settings read and checked before anything loads (what the settings alone refuse): the model,
        the bench's limits, batch, sampling, method and paradigm; returns the method's parameters and the budget's
        policy and ``spec_off_above``."""
        self.spec = spec or model_spec(cfg)
        self.max_new_tokens = int_setting(cfg.bench.max_new_tokens, "bench.max_new_tokens", 1)
        self.batch_size, self.prefill_chunk = batch_size(cfg), prefill_chunk(cfg)
        policy, off_above = budget_settings(cfg)
        self.sampling = sampling_settings(cfg)
        self.method, params = method_params(cfg)
        self.paradigm = paradigm(cfg.bench, self.sampling, [], self.spec.thinking)
        check_method(self.method, params)
        return params, policy, off_above

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def close(self) -> None:
        """Release what the runner holds outside this process (``evaluation.running.vllm``'s worker)."""

    def method_state(self) -> dict:
        """The method's state for the run summary: what it remembers across requests (``Proposer.memory``), then its
        own summary."""
        return {"memory": self.proposer.memory, **self.proposer.summary()}

    def own_prompts(self, n: int) -> list[list[int]]:
        """The first ``n`` of the project's own prompts (never the benchmark's) in this model's template."""
        from evaluation.running.own_prompts import calibration_prompts

        return [prompt_ids(self.spec, self.tok, [text], []) for text in calibration_prompts(n)]

    def _request(self, ids: list[int], max_new_tokens: int, turn: int, question: int, tag=None,
                 key: int | None = None) -> Request:
        """One turn to decode (``turn``: its conversation's); at temperature > 0 its draws are keyed by (seed,
        question, ``key``: the turn's index among its question's, position). With ``bench.force_end_of_thinking``,
        the model's end-of-thinking text is fed once 80% of the budget is spent (``Request.force``)."""
        sampler = None if self.sampling.greedy else Sampler(self.sampling, question, turn if key is None else key)
        force = (int(0.8 * max_new_tokens), self.forced) if self.forced else None
        return Request(ids, max_new_tokens, turn, sampler, tag, force=force)

    def _folded(self, gen: Generation) -> int:
        """1 when Spec-Bench's scripts count one step fewer for this turn (``evaluation.records.metrics``): its drafting
        references verify their first drafts in the prompt's own forward, so our prefill step joins the next."""
        return int(self.proposer.drafts and gen.prefill_step and len(gen.accept_lengths) > 1)

    @staticmethod
    def _per_step(turns: list[Generation]) -> dict:
        """The loop's per-step records, all turns in a row as ``accept_lengths`` (a decoder that keeps none,
        like HF generate in benchmarks, writes none)."""
        out = {}
        if all(g.draft_nodes is not None for g in turns):
            out["draft_nodes"] = [n for g in turns for n in g.draft_nodes]
            out["draft_depths"] = [d for g in turns for d in g.draft_depths]
        if all(g.step_times for g in turns):  # seconds from each turn's start to each step's commit
            out["step_times"] = [round(t, 6) for g in turns for t in g.step_times]
        if any(g.step_info for g in turns):
            out["step_info"] = [i for g in turns for i in (g.step_info or [None] * len(g.accept_lengths))]
        if any(g.batch_rows for g in turns):  # batched: per step, the rows and token positions of its forward
            out["batch_rows"] = [r for g in turns for r in (g.batch_rows or [1] * len(g.accept_lengths))]
            out["forward_slots"] = [s for g in turns for s in (g.forward_slots or g.draft_nodes)]
        if any(g.expected_lengths or g.offered_nodes for g in turns):  # a budget: nodes drafted, tokens expected
            out["offered_nodes"] = [n for g in turns for n in (g.offered_nodes or g.draft_nodes)]
            out["expected_lengths"] = [e for g in turns for e in (g.expected_lengths or [None] * len(g.draft_nodes))]
        if any(g.extra_forwards for g in turns):  # method.reference=true: forwards past the answer, counted apart
            out["extra_forwards"] = [g.extra_forwards or [] for g in turns]
            out["extra_time"] = [g.extra_time for g in turns]
        return out

    def _quality(self, q: Question, answers: list[str], turns: list[Generation]) -> dict:
        """Per turn: how much the answer repeats itself (``grading.repetition``), where a reasoning model's thinking
        ended (the index of its end-of-thinking token; None: it never did), and against a solution, whether it is
        right (``grading.grade``)."""
        out = {"repetition": [repetition(g.token_ids) for g in turns]}
        if self.end_of_thinking is not None:
            out["thinking_end"] = [g.token_ids.index(self.end_of_thinking) if self.end_of_thinking in g.token_ids
                                   else None for g in turns]
        if q.solution:
            out["correct"] = [grade(q, a) for a in answers]
        return out

    @staticmethod
    def _load(loads: list[machine.Load]) -> dict:
        """Per turn, how busy the machine was while it was timed (``methods.machine.Load``; where /proc tells):
        ``cpu_wait`` (s), ``cpu_others`` (cores) and the one-minute load average at its end."""
        if any(x.cpu_wait is None for x in loads):
            return {}
        return {"cpu_wait": [round(x.cpu_wait, 6) for x in loads], "cpu_others": [round(x.others, 3) for x in loads],
                "load_avg": [round(x.load_avg, 2) for x in loads]}

    def answer(self, q: Question) -> dict:
        """Question ``q``'s record, its turns decoded one after another, alone."""
        out = []
        self.answer_all([q], out.append, batch=1)
        return out[0]

    def warm_up(self, q: Question, passes: int) -> None:
        """``passes`` answers to ``q`` before anything is timed (Spec-Bench's warm-up), after which the method forgets
        what it must not carry into the timed answers (``Proposer.after_warmup``)."""
        for _ in range(passes):
            self.answer(q)
        self.proposer.after_warmup()

    def answer_all(self, questions: list[Question], done: Callable[[dict], None], batch: int | None = None, *,
                   checkpoint: Callable[[dict], None] | None = None, resume: dict | None = None) -> None:
        """Answer ``questions`` in ``batch`` slots (default ``runtime.batch_size``), calling ``done(record)`` as each
        question's last turn finishes (in question order with one slot).

        A question is one conversation, or with Best-of-N (``bench.num_choices``) several independent ones
        (``evaluation.running.paradigms``): a slot takes a conversation and asks its turns one after another (each
        prompt holding the answers before it, or for a round of thinking twice the one before), then the next
        conversation, of the same question or the next.

        ``checkpoint(snapshot)`` is called just before each ``done``, with what a resumed run needs to go on exactly
        as this one will (``snapshot``): every slot's proposer state, the conversations finished of questions not
        yet written, and each conversation still in flight, its turns so far and how far its current turn got.
        ``resume`` is such a snapshot from an earlier process: its conversations in flight go on in their slots
        (from where they were, ``methods.decode.Progress``, where the method can: ``Proposer.resumes_mid_request``;
        else from their start, with the slot's state as it was then), and the rest follow in order."""
        self.engine.use_threads()  # its own thread count, whatever another runner in this process set
        slots = self.proposers[: batch or self.batch_size]
        par = self.paradigm
        conv: dict[int, dict] = {}  # per slot: its conversation (question, choice) and its answers, turns and loads
        finished: dict[int, dict] = {}  # per question not yet written: its conversations' (answers, turns, loads)
        rows: list = [None] * len(slots)  # decode_batch's rows: each slot's request in flight
        mid = slots[0].resumes_mid_request
        flight = self._restore(resume, slots, questions, finished) if resume else {}
        busy = {(f["q"].question_id, f["choice"]) for f in flight.values()}
        work = iter([(q, c) for q in questions for c in range(par.threads())
                     if (q.question_id, c) not in busy and c not in finished.get(q.question_id, {}).get("choices", {})])

        def turn_request(slot: int, progress: Progress | None = None) -> Request:
            st = conv[slot]
            q, c, i = st["q"], st["choice"], len(st["turns"])
            ids = par.prompt(self.spec, self.tok, q, i, st["answers"], self.marker)
            room = self.context - len(ids)
            if room < 1:
                raise HarnessError(
                    f"question {q.question_id} turn {par.key(q, c, i) + 1}: the prompt has {len(ids)} tokens but "
                    f"{self.spec.name} takes {self.context}; leave it out with bench.question_ids or "
                    f"raise model.max_context if the model allows it")
            st["load"] = machine.Load().__enter__()  # how busy the machine was while this turn was timed
            request = self._request(ids, min(self.max_new_tokens, room), i, q.question_id, key=par.key(q, c, i))
            request.resume = progress
            return request

        def snapshot(writing: int) -> dict:  # ``writing``: the question whose record is written next
            out = {"slots": [p.state_dict() for p in slots], "finished": {}, "flight": {},
                   "budget": self.budget.odds.state_dict()}  # the odds a budget has learned (methods.budget)
            for qid, f in finished.items():
                if qid != writing:
                    out["finished"][qid] = {c: _plain(t) for c, t in f["choices"].items()}
            for other, st in conv.items():
                if rows[other] is None:
                    continue
                entry = {"question": st["q"].question_id, "choice": st["choice"], **_plain(st)}
                entry.update({"progress": asdict(rows[other].progress())} if mid else {"start": st["start"]})
                out["flight"][other] = entry
            return out

        def feed(slot: int, ended) -> Request | None:
            if ended is None and slot in flight:  # a conversation an earlier process had in flight here
                f = flight.pop(slot)
                conv[slot] = {"q": f["q"], "choice": f["choice"], "answers": f["answers"], "turns": f["turns"],
                              "loads": f["loads"], "start": f.get("start")}
                return turn_request(slot, f.get("progress"))
            if ended is not None:
                st, gen = conv[slot], ended[1]
                st["load"].__exit__(None, None, None)
                st["loads"].append(st["load"])
                text_ids = gen.token_ids[:-1] if gen.stop == "eos" else gen.token_ids
                st["answers"].append(self.tok.decode(text_ids, skip_special_tokens=True).strip())
                st["turns"].append(gen)
                q = st["q"]
                if len(st["turns"]) < par.turns(q):
                    return turn_request(slot)
                f = finished.setdefault(q.question_id, {"q": q, "choices": {}})
                f["choices"][st["choice"]] = {k: st[k] for k in ("answers", "turns", "loads")}
                del conv[slot]
                if len(f["choices"]) == par.threads():
                    if checkpoint is not None:
                        checkpoint(snapshot(q.question_id))
                    del finished[q.question_id]
                    parts = [f["choices"][c] for c in range(par.threads())]
                    done(self._record(q, *([x for p in parts for x in p[k]] for k in ("answers", "turns", "loads")),
                                      len(slots)))
            unit = next(work, None)
            if unit is None:
                return None
            # a method whose requests cannot go on part-way restarts one from here: the slot's state is kept
            start = None if mid or checkpoint is None else copy.deepcopy(slots[slot].state_dict())
            conv[slot] = {"q": unit[0], "choice": unit[1], "answers": [], "turns": [], "loads": [], "start": start}
            return turn_request(slot)

        self._decode(slots, feed, rows)

    def _decode(self, slots: list, feed, rows: list) -> None:
        """Every slot's requests, as ``feed`` hands them, decoded by our loop (``methods.decode.decode_batch``)."""
        decode_batch(self.engine, slots, feed, stop_ids=self.stop_ids, timer=self.timer,
                     prefill_chunk=self.prefill_chunk, rows=rows, budget=self.budget)

    def _restore(self, resume: dict, slots: list, questions: list[Question], finished: dict) -> dict[int, dict]:
        """Every slot's proposer state as ``resume`` saved it, the conversations finished of questions not yet
        written (into ``finished``), and the conversations in flight (``answer_all``): slot -> question, choice,
        answers, generations and loads of its turns so far, and how far its current turn got (``progress``: the
        slot's state goes with it) or the slot's state at the conversation's start (``start``)."""
        by_id = {q.question_id: q for q in questions}
        self.budget.odds.load_state_dict(resume.get("budget", {}))
        for p, saved in zip(slots, resume["slots"]):
            p.load_state_dict(saved)
        for qid, choices in resume.get("finished", {}).items():
            finished[int(qid)] = {"q": by_id[int(qid)], "choices": {int(c): _unplain(t) for c, t in choices.items()}}
        flight = {}
        for slot, f in resume.get("flight", {}).items():
            slot = int(slot)
            out = {"q": by_id[f["question"]], "choice": f.get("choice", 0), **_unplain(f)}
            if f.get("progress") is not None:
                out["progress"] = Progress(**{**f["progress"], "state": resume["slots"][slot]})
            else:
                slots[slot].load_state_dict(f["start"])
                out.update(answers=[], turns=[], loads=[], start=f["start"])
            flight[slot] = out
        return flight

    def _record(self, q: Question, answers: list[str], turns: list[Generation], loads: list[machine.Load],
                batch: int) -> dict:
        per = self.paradigm.turns(q)
        clock = [[round(g.clock[0] - self.clock0, 6), round(g.clock[1] - self.clock0, 6)] for g in turns]
        return {
            "question_id": q.question_id,
            "category": q.category,
            "answer_id": uuid.uuid4().hex,
            "model_id": self.spec.name,
            "method": self.method,
            "choices": [{
                "index": 0,
                "turns": answers,
                "decoding_steps": [len(g.accept_lengths) for g in turns],
                "new_tokens": [len(g.token_ids) for g in turns],
                "wall_time": [g.wall_time for g in turns],
                "accept_lengths": [a for g in turns for a in g.accept_lengths],
                "token_ids": [g.token_ids for g in turns],
                "prefill_time": [g.prefill_time for g in turns],
                "decode_time": [g.decode_time for g in turns],
                "first_token_time": [g.first_token_time for g in turns],
                "stop": [g.stop for g in turns],
                "prefill_step": [g.prefill_step for g in turns],
                "spec_bench_steps": [len(g.accept_lengths) - self._folded(g) for g in turns],
                **self._per_step(turns),
                **self._load(loads),
                **self._quality(q, answers, turns),
            }],
            # when each turn started and ended (s) in this process's part of the run, and the batch it decoded in
            "clock": {"segment": self.segment, "turns": clock, "batch_size": batch},
            "tstamp": time.time(),
            # Spec-Bench names the temperature in its model ids (-temp-0.7); ours say it here (sampled runs only)
            **({"sampling": asdict(self.sampling)} if not self.sampling.greedy else {}),
            # thinking twice, Best-of-N: which conversation (choice) and round each turn is
            **({"paradigm": {**self.paradigm.summary(), "choice": [t // per for t in range(len(turns))],
                             "round": [t % per for t in range(len(turns))]}}
               if not self.paradigm.single else {}),
        }


def run(cfg: DictConfig, out: Path, make: Callable[..., Runner] = Runner) -> Path:
    """Decode the selection into ``out``, resuming what is there; ``out`` is held for this process alone, and
    left as it was found (nothing, if it was new) when the run fails before its first answer. ``make(cfg, spec=)``
    builds the runner (``evaluation.running.vllm.make_runner``: vLLM's for engine=vllm)."""
    with folder_lock(out, fix="wait for it to finish (rerun the same command then to resume), or choose "
                              "another folder with hydra.run.dir=DIR"):
        return _run(cfg, out, make)


def _run(cfg: DictConfig, out: Path, make: Callable[..., Runner]) -> Path:
    int_setting(cfg.warmup, "warmup", 0)
    int_setting(cfg.bench.max_new_tokens, "bench.max_new_tokens", 1)
    selected = folder.selection(cfg)
    if note := sample_note(cfg.bench, selected):
        print(note)
    paradigm(cfg.bench, sampling_settings(cfg), selected, model_spec(cfg).thinking)  # before anything loads
    questions = shard(selected, cfg.runtime.shard, cfg.runtime.num_shards)
    folder.check_batch(batch_size(cfg), len(questions))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    config_file = out / "config.yaml"
    if config_file.exists():
        try:
            before = OmegaConf.to_container(OmegaConf.load(config_file), resolve=True)
        except Exception as e:  # noqa: BLE001 - any unreadable YAML: one line
            raise HarnessError(f"{config_file} is not a readable config ({type(e).__name__}); move the folder "
                               f"away to start over") from None
        if "sampling" not in before:  # a run from before sampling settings existed was greedy
            before["sampling"] = asdict(Sampling())
        mismatch = config_mismatch(before, resolved)
        if mismatch:
            raise HarnessError(
                f"{out} holds a run with another configuration ({mismatch}); rerun with its settings to resume "
                f"it, choose another folder with hydra.run.dir=DIR, or delete it to start over")
    writer = AnswerWriter(out / ANSWERS)  # a bad line is refused here, before the model loads
    if writer.done or writer.cut_short:
        kept = sum(q.question_id in writer.done for q in questions)
        print(f"resuming: {kept} of {len(questions)} answers kept in {out / ANSWERS}"
              f"{'; a half-written last line dropped' if writer.cut_short else ''}")
    folder.write_config(out, cfg)
    spec, claim = model_spec(cfg), None
    if cfg.runtime.get("exclusive_device", False):  # parallel local jobs: one device each (conf/cluster/)
        spec, claim = claim_device(spec)
    runner = make(cfg, spec=spec)
    try:
        return _decode_run(cfg, runner, out, writer, selected, questions, claim)
    finally:
        runner.close()


def _decode_run(cfg: DictConfig, runner: Runner, out: Path, writer: AnswerWriter, selected: list[Question],
                questions: list[Question], claim) -> Path:
    compiled = runner.engine.summary().get("compiled")
    if compiled:
        print(f"compiled {len(compiled['graphs'])} step graph(s) (sizes {compiled['graphs']}) in "
              f"{compiled['seconds']:.1f} s, before timing")
    prompt = describe(runner.spec)
    print(f"prompt format: {prompt['template']}; system prompt: {shorten(prompt['system_prompt'], 50)}; "
          f"suffix {prompt['suffix']!r}; from {prompt['source']}")
    dtype = runner.dtype
    todo = [q for q in questions if q.question_id not in writer.done]
    warm = [selected[0]] if todo and cfg.warmup and selected[0] not in todo else []
    for warning in [*start_warnings(runner, dtype), *ungraded(cfg, questions), *prompt_room(runner, warm + todo)]:
        print(f"WARNING: {warning}", file=sys.stderr, flush=True)
    summary = folder.summary(
        runner, cfg, "running", len(questions),
        shard={"index": cfg.runtime.shard, "count": cfg.runtime.num_shards,
               "selection": [q.question_id for q in selected], "questions": [q.question_id for q in questions]},
        prompt=prompt, **({"device_claim": claim} if claim else {}),
        **({"device_fallback": warning} if (warning := cpu_fallback(runner.spec, runner.device)) else {}),
        started=folder.now())
    folder.write_summary(out, summary)
    try:
        _answer_all(cfg, runner, out, writer, selected, todo)
    except KeyboardInterrupt:
        summary.update(status="interrupted", interrupted=folder.now(), answered=len(writer.done))
        folder.write_summary(out, summary)
        kept = (f"{len(writer.done)} answer(s) kept in {out / ANSWERS}" if writer.done else "no answer had finished")
        raise KeyboardInterrupt(f"{kept}; rerun the same command to resume") from None
    summary.update(status="finished", finished=folder.now(), answered=len(writer.done),
                   method_state=runner.method_state(), engine=runner.engine.summary(),
                   **({"budget": runner.budget.summary()} if runner.budget.active else {}))
    folder.write_summary(out, summary)
    print(f"{len(writer.done)}/{len(questions)} questions answered -> {out / ANSWERS}")
    return out


def _plain(turns: dict) -> dict:
    """A conversation's answers, generations and loads so far, in plain values (a snapshot's)."""
    return {"answers": list(turns["answers"]), "turns": [asdict(g) for g in turns["turns"]],
            "loads": [{k: getattr(x, k) for k in ("cpu_wait", "others", "load_avg")} for x in turns["loads"]]}


def _unplain(saved: dict) -> dict:
    return {"answers": saved["answers"], "turns": [Generation(**g) for g in saved["turns"]],
            "loads": [_load(x) for x in saved["loads"]]}


def _load(saved: dict) -> machine.Load:
    """A turn's ``machine.Load`` as a snapshot saved it."""
    load = machine.Load()
    for k in ("cpu_wait", "others", "load_avg"):
        setattr(load, k, saved.get(k))
    return load


def _answer_all(cfg: DictConfig, runner: Runner, out: Path, writer: AnswerWriter, selection: list[Question],
                todo: list[Question]) -> None:
    """Restore the method's state (a resumed run) or warm up, then answer ``todo`` one whole line at a time."""
    state_file = out / STATE
    resume = None
    if writer.done and state_file.exists():
        saved = load_torch_safe(state_file, map_location=runner.device)
        if "snapshot" in saved:  # every slot's state and the questions in flight (Runner.answer_all)
            resume = saved["snapshot"]
        else:  # a run from before batched resumes: one proposer's state
            runner.proposer.load_state_dict(saved["state"])
        if saved["answered"] != len(writer.done):
            print(f"note: the run was killed between saving the {runner.method} state and its answer; the "
                  f"resumed part's accept lengths may differ slightly from an unbroken run (its tokens cannot)")
    elif todo:
        # Spec-Bench warms up on the first question; resumed runs restore the proposer state instead.
        # Every shard warms up on the selection's first question, so each starts as a single run does.
        runner.warm_up(selection[0], int(cfg.warmup))

    for name, content in runner.proposer.artefacts().items():  # e.g. tree=auto's tree.json
        write_json_atomic(out / name, content)

    from tqdm import tqdm

    tokens = steps = 0
    with tqdm(total=len(todo), desc=f"{runner.method}/{runner.spec.name}", unit="q", disable=not cfg.runtime.progress,
              file=sys.stdout, dynamic_ncols=True) as bar:
        def checkpoint(snapshot: dict) -> None:
            """Saved before each answer, where the method keeps state: a resumed run goes on from this point as this
            one does, its questions in flight too (``Runner.answer_all``)."""
            if any(snapshot["slots"]) or snapshot["budget"]["tries"]:  # state, or a budget's learned odds
                save_torch_atomic(state_file, {"answered": len(writer.done) + 1, "snapshot": snapshot})

        def done(rec: dict) -> None:
            nonlocal tokens, steps
            writer.append(rec)
            c = rec["choices"][0]
            tokens += sum(c["new_tokens"])
            steps += len(c["accept_lengths"])
            bar.update()
            seconds = max(end for _, end in rec["clock"]["turns"])  # since the decoding started
            # batched: the finished answers' tokens over the time since decoding started (every row's), a throughput
            rate = {"tok_s" if runner.batch_size == 1 else "tok_s_all_rows": f"{tokens / seconds:.1f}"}
            bar.set_postfix(q=rec["question_id"], **rate, mat=f"{tokens / steps:.2f}")

        runner.clock0 = time.perf_counter()
        runner.answer_all(todo, done, checkpoint=checkpoint, resume=resume)
