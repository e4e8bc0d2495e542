"""The benchmarks' questions: find the pinned file, check it, read it, select a sample.

Two question files, each copied from ``../shared`` when present or downloaded from its pinned commit, sha256 checked,
never committed (``QUESTION_FILES``, ``bench.file``): Spec-Bench's (Xia et al., ACL 2024 Findings: six tasks, the
eight MT-Bench categories reported together as ``mt_bench``) and SpecTTS-Bench's (arXiv 2509.04474: reasoning
questions of AIME 2024, AIME 2025, MATH-500 and GPQA, each with its ``solution``, each category its own task).
"""
from __future__ import annotations

import hashlib
import shutil
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from methods.common import CACHE, SHARED, HarnessError, atomic, read_jsonl


@dataclass(frozen=True)
class QuestionFile:
    name: str  # bench.file
    url: str  # its pinned commit's raw file
    sha256: str
    file: str  # its name under data/cache/<name>/ and ../shared/<name>/

    @property
    def cached(self) -> Path:
        return CACHE / self.name / self.file

    @property
    def shared(self) -> Path:
        return SHARED / self.name / self.file


QUESTION_FILES = {f.name: f for f in (
    QuestionFile("spec_bench", "https://raw.githubusercontent.com/hemingkx/Spec-Bench/"
                 "fd2c1cd7d2201ef71db4c5f4e455008f017967bf/data/spec_bench/question.jsonl",
                 "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04", "question.jsonl"),
    QuestionFile("spec_tts", "https://raw.githubusercontent.com/sunshy-1/SpecTTS-Bench/"
                 "6b33e4a780740b91249162a8f11202819bd7c852/code/data/SpecTTS_Bench/question_cot.jsonl",
                 "5e1b69271d7f429668a29147b7eb5e83a42e4bd11ab5a96065792ec04fff9700", "question_cot.jsonl"),
)}

# Spec-Bench reports the 8 MT-Bench categories together as one task.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag",  # Spec-Bench's, in its order
         "aime24", "aime25", "math500", "gpqa")  # SpecTTS-Bench's


def task_of(category: str) -> str:
    return "mt_bench" if category in MT_BENCH_CATEGORIES else category


@dataclass(frozen=True)
class Question:
    question_id: int
    category: str
    turns: tuple[str, ...]
    solution: str | None = None  # SpecTTS-Bench's reference answer (a boxed one, or a bare integer for AIME 2025)
    answer: str | None = None  # MATH-500's final answer, where the file gives it apart from the solution

    @property
    def task(self) -> str:
        return task_of(self.category)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(name: str = "spec_bench") -> Path:
    """The pinned question file ``name`` (``QUESTION_FILES``) in the project cache: copied from ../shared when
    present, else downloaded; its sha256 checked."""
    if name not in QUESTION_FILES:
        raise HarnessError(f"unknown bench.file '{name}'; known: {', '.join(QUESTION_FILES)}")
    f = QUESTION_FILES[name]
    if f.cached.exists():
        return f.cached
    with atomic(f.cached) as tmp:
        if f.shared.exists():
            shutil.copyfile(f.shared, tmp)
        else:
            try:
                with urllib.request.urlopen(f.url, timeout=60) as r:
                    tmp.write_bytes(r.read())
            except OSError as e:
                raise HarnessError(
                    f"the {name} questions are not cached and the download failed ({e}); put {f.file} at "
                    f"{f.cached} (its address: {f.url}) or pass bench.path=FILE") from None
        if sha256(tmp) != f.sha256:
            raise HarnessError(f"the {name} file fetched for {f.cached} has the wrong sha256; expected {f.sha256}")
    return f.cached


def read_questions(path: Path) -> list[Question]:
    """Parse a question file; a malformed line is reported with its file and line number."""
    if not path.is_file():
        raise HarnessError(f"question file {path} does not exist; pass bench.path=FILE, or drop it to use the bench's "
                           f"own (bench.file)")
    questions, seen = [], set()
    for where, obj in read_jsonl(path, "one question object a line"):
        if not isinstance(obj, dict):
            raise HarnessError(f"{where}: expected a JSON object with question_id, category and turns")
        qid, cat, turns = obj.get("question_id"), obj.get("category"), obj.get("turns")
        if not isinstance(qid, int) or isinstance(qid, bool):
            raise HarnessError(f"{where}: 'question_id' must be an integer")
        if not isinstance(cat, str) or not cat:
            raise HarnessError(f"{where}: 'category' must be a non-empty string")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise HarnessError(f"{where}: 'turns' must be a non-empty list of strings")
        empty = next((i for i, t in enumerate(turns, start=1) if not t.strip()), None)
        if empty is not None:  # the model would answer a prompt holding no question
            raise HarnessError(f"{where}: question {qid} turn {empty} is empty; write its text or remove it (a "
                               f"question without turns: the whole line)")
        if qid in seen:
            raise HarnessError(f"{where}: question_id {qid} appears twice")
        seen.add(qid)
        solution, answer = obj.get("solution"), obj.get("answer")
        questions.append(Question(qid, cat, tuple(turns), solution if isinstance(solution, str) else None,
                                  answer if isinstance(answer, str) else None))
    if not questions:
        raise HarnessError(f"question file {path} holds no questions")
    return questions


def _stratified(questions: list[Question]) -> dict[str, list[Question]]:
    """Per task, its questions round-robin over its categories (file order within each category)."""
    by_task: dict[str, dict[str, list[Question]]] = defaultdict(lambda: defaultdict(list))
    for q in questions:
        by_task[q.task][q.category].append(q)
    out = {}
    for task, cats in by_task.items():
        queues = list(cats.values())
        out[task] = [qs[i] for i in range(max(map(len, queues))) for qs in queues if i < len(qs)]
    return out


def _listed(value, key: str, kind: type, what: str, one: bool = False):
    """A selection setting as a list of ``kind`` (a single value is a list of one: ``bench.categories=qa``), or
    with ``one`` a single value; None when unset."""
    if value is None:
        return None
    items = [value] if one or isinstance(value, (str, int)) else list(value) if hasattr(value, "__iter__") else [value]
    for v in items:
        if not isinstance(v, kind) or isinstance(v, bool):
            example = "[81,82]" if kind is int and not one else "[qa,rag]" if kind is str else "10"
            raise HarnessError(f"{key} must be {what}, got {v!r}; e.g. {key}={example}")
    return items[0] if one else items


def select(questions: list[Question], categories=None, question_ids=None, limit_per_category=None,
           skip_per_category: int = 0) -> list[Question]:
    """Pick a sample, keeping file order.

    ``categories`` may name tasks (``mt_bench``) or categories (``writing``).
    ``limit_per_category`` keeps N questions per Spec-Bench task; inside ``mt_bench``
    they are taken round-robin over its 8 categories, so that a small sample still
    covers every kind of question (N=10: one of each, then writing and roleplay).
    ``skip_per_category`` skips the first M of that order: ``skip=10, limit=10``
    gives a second sample disjoint from the first (e.g. for calibration).
    """
    categories = _listed(categories, "bench.categories", str, "task or category names")
    question_ids = _listed(question_ids, "bench.question_ids", int, "question ids (integers)")
    for key, value in (("bench.categories", categories), ("bench.question_ids", question_ids)):
        if value == []:  # an empty list would select nothing, and falsy, everything: neither is what was meant
            raise HarnessError(f"{key}=[] selects no question; leave {key} out (or =null) to take every question "
                               f"of the bench, or list what to take")
    limit_per_category = _listed(limit_per_category, "bench.limit_per_category", int, "an integer", one=True)
    skip_per_category = _listed(skip_per_category, "bench.skip_per_category", int, "an integer", one=True) or 0
    if categories:
        wanted = set(categories)
        known = {q.category for q in questions} | {q.task for q in questions}
        unknown = sorted(wanted - known)
        if unknown:
            raise HarnessError(f"unknown bench.categories {unknown}; known: {', '.join(sorted(known))}")
        questions = [q for q in questions if q.category in wanted or q.task in wanted]
    if question_ids:
        ids = set(question_ids)
        missing = sorted(ids - {q.question_id for q in questions})
        if missing:
            raise HarnessError(f"bench.question_ids {missing} are not in the selected questions")
        questions = [q for q in questions if q.question_id in ids]
    if limit_per_category is not None or skip_per_category:
        if limit_per_category is not None and limit_per_category < 1:
            raise HarnessError(f"bench.limit_per_category must be at least 1, got {limit_per_category}")
        if skip_per_category < 0:
            raise HarnessError(f"bench.skip_per_category must be 0 or more, got {skip_per_category}")
        stop = None if limit_per_category is None else skip_per_category + limit_per_category
        keep = {q.question_id for order in _stratified(questions).values() for q in order[skip_per_category:stop]}
        questions = [q for q in questions if q.question_id in keep]
    if not questions:
        raise HarnessError("the bench selection is empty; check bench.categories and bench.question_ids")
    return questions


def shard(questions: list[Question], index: int, count: int) -> list[Question]:
    """The ``index``-th of ``count`` contiguous blocks (sizes differ by at most one, larger blocks first).

    >>> [len(shard(list(range(10)), i, 3)) for i in range(3)]
    [4, 3, 3]
    """
    if not isinstance(count, int) or count < 1:
        raise HarnessError(f"runtime.num_shards must be an integer of at least 1, got {count!r}")
    if not isinstance(index, int) or not 0 <= index < count:
        raise HarnessError(f"runtime.shard must be an integer from 0 to {count - 1}, got {index!r}")
    size, extra = divmod(len(questions), count)
    start = index * size + min(index, extra)
    return questions[start: start + size + (index < extra)]


def load_bench(path: str | None, file: str = "spec_bench", **selection) -> list[Question]:
    """The questions of ``path`` (a question file), else of the pinned file ``file``, that ``selection`` picks."""
    return select(read_questions(Path(path).expanduser() if path else fetch(file)), **selection)
