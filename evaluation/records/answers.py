"""Answer files: Spec-Bench's JSONL format plus our extra fields, written one whole line at a time.

Each line is one question::

    {"question_id": 81, "category": "writing", "answer_id": "...", "model_id": "smollm2-135m",
     "tstamp": 1764430000.0, "method": "tr",
     "choices": [{"index": 0,
                  "turns": ["text of turn 1", "text of turn 2"],      # Spec-Bench
                  "decoding_steps": [39, 36],                          # Spec-Bench: steps per turn, as its scripts
                                                                       # count them (evaluation/records/metrics.py)
                  "new_tokens": [128, 128],                            # Spec-Bench: tokens generated per turn
                  "wall_time": [2.91, 2.75],                           # Spec-Bench: seconds per turn, prefill included
                  "accept_lengths": [4, 2, ...],                       # Spec-Bench: tokens per step, all turns, the
                                                                       # first token in the first step where its
                                                                       # scripts put it there
                  "our_decoding_steps": [40, 37],                      # ours: target forwards per turn
                  "our_accept_lengths": [1, 3, 2, ...],                # ours: tokens per target forward, all turns
                                                                       # (the prefill's one token its own step)
                  "token_ids": [[...], [...]],                         # ours: generated ids per turn
                  "prefill_time": [0.05, 0.07], "decode_time": [2.86, 2.68],
                  "stop": ["length", "eos"],
                  "prefill_step": [true, true],                        # ours: the turn's first step is the
                                                                       # prefill's one token
                  "draft_nodes": [0, 81, 81, ...],                     # ours, per step as our_accept_lengths: nodes
                                                                       # verified (the prefill step: 0)
                  "draft_depths": [0, 6, 6, ...],                      # ours, per step: deepest acceptable draft
                  "step_info": [null, {"drafter": "tr"}, ...],         # ours, where the method says something of
                                                                       # its steps (a hybrid: which drafter)
                  "offered_nodes": [0, 81, 1, ...],                    # ours, per step, with a per-step budget
                                                                       # (runtime.budget): nodes drafted before its
                                                                       # cut (1: drafting not asked for)
                  "expected_lengths": [null, 1.6, 1.0, ...],           # ours, per step, runtime.budget=auto: the
                                                                       # accept length its odds predicted
                  "cpu_wait": [0.002, 0.001],                          # ours, per turn: seconds its threads waited
                                                                       # for a CPU (methods.machine.Load)
                  "cpu_others": [0.9, 1.0],                            # ours, per turn: cores other processes used
                  "load_avg": [1.1, 1.2],                              # ours, per turn: 1-minute load average
                  "extra_forwards": [[1, 3], [2]],                     # ours, per turn, where the method's reference
                  "extra_time": [0.06, 0.03]}]}                        # mode forwards past the answer: the tokens
                                                                       # each produced, their seconds (not in
                                                                       # wall_time nor in any step count)

So Spec-Bench's ``evaluation/speed.py`` reads its own convention from our files. In this process a record is
seen per target forward (``from_file``): ``accept_lengths`` and ``decoding_steps`` are ours, and
``spec_bench_steps`` holds Spec-Bench's steps per turn; ``to_file`` writes it back. Files written before
``our_accept_lengths`` existed held our steps under Spec-Bench's keys and ``spec_bench_steps`` beside them: they
read as before.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

from methods.common import RESULTS, HarnessError, read_json, read_jsonl

ANSWERS = "answers.jsonl"
SUMMARY = "summary.json"
LOCK = ".lock"  # held by the process writing the folder (folder_lock)
SPEC_BENCH_FIELDS = ("turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths")


def answer_file(path: str | Path) -> Path:
    """A run folder or an answer file -> the answer file."""
    p = Path(path)
    if p.is_dir():
        p = p / ANSWERS
    if not p.is_file():
        raise HarnessError(f"no answer file at {path}; give a run folder holding {ANSWERS} or a .jsonl file")
    return p


def _check(obj, where: str) -> dict:
    if not isinstance(obj, dict):
        raise HarnessError(f"{where}: not an answer record (expected a JSON object)")
    for key in ("question_id", "choices"):
        if key not in obj:
            raise HarnessError(f"{where}: not a Spec-Bench answer record: missing '{key}'")
    choices = obj["choices"]
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise HarnessError(f"{where}: 'choices' must be a non-empty list of objects")
    missing = [k for k in SPEC_BENCH_FIELDS if k not in choices[0]]
    if missing:
        raise HarnessError(f"{where}: not a Spec-Bench answer record: choices[0] lacks {', '.join(missing)}")
    return obj


def read_summary(path: str | Path) -> dict:
    """The run summary beside an answer file (``{}`` for a file without one, e.g. Spec-Bench's own)."""
    p = answer_file(path)
    f = p.parent / SUMMARY
    return read_json(f, "a run summary") if p.name == ANSWERS and f.is_file() else {}


def separate_runs_note(summaries: list[dict]) -> str | None:
    """None when every run was decoded side by side in one process (``scripts.bench_methods`` gives them one
    ``session``); else the warning that a speed table of separately made runs needs."""
    sessions = {s.get("session") for s in summaries}
    if len(sessions) == 1 and None not in sessions:
        return None
    return ("note: these runs were made at different times, in separate processes; their speedups include whatever "
            "else the machine did meanwhile. Decode the methods side by side (python -m scripts.bench_methods) for "
            "speedups a paper can use")


def to_file(rec: dict) -> dict:
    """The record as its line says it: Spec-Bench's steps under Spec-Bench's keys, ours under ``our_*``. Each turn
    whose first step Spec-Bench's scripts fold into the next (``decoding_steps`` one more than
    ``spec_bench_steps``) has its first two accept lengths added into one. A record without ``spec_bench_steps``
    (HF generate's, a foreign one) is written as it is."""
    c = rec["choices"][0]
    if "spec_bench_steps" not in c:
        return rec
    theirs, at = [], 0
    for ours, steps in zip(c["decoding_steps"], c["spec_bench_steps"]):
        turn = c["accept_lengths"][at:at + ours]
        at += ours
        theirs += [turn[0] + turn[1], *turn[2:]] if ours - steps == 1 else turn
    choice = {k: v for k, v in c.items() if k not in ("decoding_steps", "accept_lengths", "spec_bench_steps")}
    choice.update(decoding_steps=c["spec_bench_steps"], accept_lengths=theirs, our_decoding_steps=c["decoding_steps"],
                  our_accept_lengths=c["accept_lengths"])
    order = ["index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"]
    return {**rec, "choices": [{k: choice[k] for k in [*order, *(k for k in choice if k not in order)] if k in choice},
                               *rec["choices"][1:]]}


def from_file(rec: dict) -> dict:
    """The record per target forward (``to_file``'s inverse): ``accept_lengths`` and ``decoding_steps`` ours,
    ``spec_bench_steps`` Spec-Bench's. A line without ``our_accept_lengths`` is read as it is."""
    c = rec["choices"][0]
    if "our_accept_lengths" not in c:
        return rec
    choice = {k: v for k, v in c.items() if k not in ("our_decoding_steps", "our_accept_lengths")}
    choice.update(decoding_steps=c["our_decoding_steps"], accept_lengths=c["our_accept_lengths"],
                  spec_bench_steps=c["decoding_steps"])
    return {**rec, "choices": [choice, *rec["choices"][1:]]}


def read_answers(path: str | Path) -> list[dict]:
    p = answer_file(path)
    records, seen = [], set()
    for where, obj in read_jsonl(p, "one answer record a line (is this an answer file?)"):
        rec = _check(obj, where)
        if rec["question_id"] in seen:
            raise HarnessError(f"{where}: question {rec['question_id']} is answered twice")
        seen.add(rec["question_id"])
        records.append(from_file(rec))
    if not records:
        raise HarnessError(f"answer file {p} holds no answers")
    return records


class AnswerWriter:
    """Appends whole lines. A line cut short by a killed process is removed when the file is reopened; any
    other bad line (not JSON, not an answer, a question answered twice) is refused with its ``file:line``."""

    def __init__(self, path: Path):
        self.path = path
        self.done: set[int] = set()
        self.cut_short = False  # whether a half-written last line was dropped (a resumed run says so)
        if path.exists():
            data = path.read_bytes()
            whole = data[: data.rfind(b"\n") + 1]
            if len(whole) != len(data):
                self.cut_short = True
                with open(path, "r+b") as f:
                    f.truncate(len(whole))
            for where, obj in read_jsonl(path, "one answer record a line; move the file away to start over"):
                qid = _check(obj, where)["question_id"]
                if qid in self.done:
                    raise HarnessError(f"{where}: question {qid} is answered twice; keep one of its lines")
                self.done.add(qid)

    def append(self, record: dict) -> None:
        """Write one line and count it as done, with SIGINT held back in between: a Ctrl-C lands before the line
        or after it is counted, never between (the message "N answer(s) kept" then matches the file)."""
        line = json.dumps(to_file(record), ensure_ascii=False) + "\n"
        with _sigint_held():
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self.done.add(record["question_id"])


@contextmanager
def _sigint_held():
    """Hold SIGINT back in the block; one that came meanwhile is delivered just after, with the handler that was
    in place (a KeyboardInterrupt, from a terminal). The handler is swapped rather than the signal blocked: a
    blocked signal sent to the process is taken by any other thread that does not block it (tqdm's monitor, a
    hub download), and Python then raises it in the main thread at once, inside the block."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    came: list[int] = []
    old = signal.signal(signal.SIGINT, lambda number, frame: came.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if came:
            signal.raise_signal(signal.SIGINT)


ABSENT = type("Absent", (), {"__repr__": lambda self: "absent"})()  # a key one config does not have


def flat_config(d: dict, prefix: str = "") -> dict:
    """A nested config as {dotted key: value} (``{"bench": {"limit_per_category": 2}}`` ->
    ``{"bench.limit_per_category": 2}``); an empty group is a value of its own."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def first_difference(a: dict, b: dict, ignore: tuple[str, ...] = ()) -> tuple[str, object, object] | None:
    """The first (dotted key, value in ``a``, value in ``b``) where two configs differ, skipping keys in or under
    ``ignore``; None when they agree. A group's ``name`` is named before its other keys (``engine.name``, not
    the first of the keys that differ with it); a key missing on one side is ``ABSENT`` there."""
    fa, fb = flat_config(a), flat_config(b)
    for key in sorted(fa.keys() | fb.keys(), key=lambda k: (not k.endswith(".name"), k)):
        if any(key == i or key.startswith(i + ".") for i in ignore):
            continue
        va, vb = fa.get(key, ABSENT), fb.get(key, ABSENT)
        if va != vb:
            return key, va, vb
    return None


@contextmanager
def folder_lock(folder: Path, fix: str = "wait for it to finish, or choose another folder"):
    """Hold ``folder`` for this process alone while the block runs (``fcntl.flock`` on ``folder/.lock``: the
    OS releases it when the process ends, however it ends, so a killed run leaves no stale lock). A folder
    another process holds, or one this process cannot write to, is refused in one line. A block that fails
    in a folder that was empty leaves nothing behind unless it wrote an answer file."""
    import fcntl

    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise HarnessError(f"cannot write to {folder} ({e.strerror}); make it writable, or choose another "
                           f"folder") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise HarnessError(f"{folder} is in use by another process (PID {holder}); {fix}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:  # the lock alone does not prove the folder takes new files (a read-only mount lets flock pass)
            probe = folder / f".write-test-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as e:
            raise HarnessError(f"cannot write to {folder} ({e.strerror}); make it writable, or choose another "
                               f"folder") from None
        new = not any(p.name != LOCK for p in folder.iterdir())
        try:
            yield
        except BaseException:
            if new and not (folder / ANSWERS).exists():
                _remove_new_folder(folder)
            raise
    finally:
        os.close(fd)


def folder_in_use(folder: Path) -> bool:
    """Whether a live process holds ``folder`` (``folder_lock``). The lock file outlives its process, so the PID in
    it is asked first: only a living one is checked against the lock itself (a PID the system gave to another
    process since), and a probe never touches the lock of a folder whose writer has ended."""
    import fcntl

    try:
        fd = os.open(folder / LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        try:
            os.kill(int(os.pread(fd, 32, 0).decode(errors="replace").strip()), 0)
        except ProcessLookupError:
            return False
        except (ValueError, OverflowError, PermissionError):  # no PID written yet, or another user's process
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _remove_new_folder(folder: Path) -> None:
    """Remove a folder this process made, and the empty folders above it inside the project's results/ (Hydra
    makes a run's folder, and its parents, before the config can be checked)."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    results = RESULTS.resolve()
    for parent in folder.resolve().parents:
        if parent == results or results not in parent.parents:
            break
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break
