"""The runs of a report: finding answer files, reading them with their summaries, and grouping repeats of one
configuration into rows, each with its baseline; the lines that say where and how the runs were timed."""
from __future__ import annotations

import functools
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from evaluation.records.answers import ANSWERS, answer_file, read_answers, read_summary, separate_runs_note
from evaluation.records.consistency import Side, budget_label, check, paradigm_label, sampling_label
from evaluation.records.metrics import load_stats
from methods.common import HarnessError

BASELINE = "vanilla"
# settings a row names whenever they are on: method.reference=true is another method, a budget another policy
ALWAYS_SHOWN = ("reference", "paradigm", "budget")
BATCH = "batch_size"  # the params key of a run's runtime.batch_size: rows and baselines are per batch size


@dataclass
class Run:
    """One answer file and what is known about it."""
    path: Path                     # the answer file
    records: list[dict]
    summary: dict                  # our summary.json; {} for Spec-Bench's own answer files
    model: str
    method: str                    # registry name, or the label of a foreign file
    params: dict = field(default_factory=dict)  # method config (name excluded), engine, sampling, batch size
    label: str = ""                # method plus the parameters that tell it from its siblings
    series: str = ""               # the label without the batch size: one line across batch sizes

    @property
    def questions(self) -> frozenset:
        return frozenset(r["question_id"] for r in self.records)

    @property
    def state(self) -> dict:
        """The method's state at the end (``summary.json``'s ``method_state``); a merged run's (``evaluation.merge``)
        is its first shard's, less the count of answers its memory held (each shard remembered only its own)."""
        if "method_state" in self.summary or not self.summary.get("shards"):
            return self.summary.get("method_state", {})
        state = dict(self.summary["shards"][0].get("method_state") or {})
        state.pop("memory_answers", None)
        return state


@dataclass
class Group:
    """Repeats of one configuration: one row of the main table."""
    model: str
    label: str
    runs: list[Run]
    baseline: list[Run] = field(default_factory=list)
    is_baseline: bool = False      # this row is (one of) the baseline(s)

    @property
    def method(self) -> str:
        return self.runs[0].method

    @property
    def params(self) -> dict:
        return self.runs[0].params

    @property
    def state(self) -> dict:
        return self.runs[0].state

    @property
    def records(self) -> list[dict]:
        return [r for run in self.runs for r in run.records]

    @property
    def series(self) -> str:
        return self.runs[0].series or self.label

    @property
    def batch_size(self) -> int | None:
        """The turns its runs decoded at once (``runtime.batch_size``); None for a foreign file."""
        return self.params.get(BATCH)


# ---------------------------------------------------------------- finding and reading runs

def labelled(arg: str) -> tuple[str | None, str]:
    """(label, path) of a RUN argument: ``LABEL=PATH`` where PATH exists and ARG itself does not, else (None, ARG).
    Run folders are named by their overrides (``bench.question_ids=[81,161],warmup=0``), so an ``=`` alone does not
    make a label: a path that does not exist is reported whole, not cut at its first ``=``."""
    label, _, path = arg.partition("=")
    if "=" in arg and not Path(arg).exists() and Path(path).exists() and "/" not in label:
        return label, path
    return None, arg


def _answer_files(path: Path) -> list[Path]:
    """The answer files a RUN names: itself, its run folder's, every run folder's below it, or else the .jsonl
    files of a folder (Spec-Bench's ``model_answer/``)."""
    if path.is_file():
        return [path]
    if (path / ANSWERS).is_file():
        return [path / ANSWERS]
    if path.is_dir():
        found = sorted(path.rglob(ANSWERS)) or sorted(path.glob("*.jsonl"))
        if found:
            return found
        raise HarnessError(f"no answer files under {path}: give run folders (holding {ANSWERS}) or .jsonl files")
    raise HarnessError(f"{path} does not exist; give run folders, answer files or folders holding them")


def load_run(file: Path, label: str | None = None) -> Run:
    """One answer file as a Run: ours with the model, method and config of its summary; a foreign file (no
    summary) with the one model its records name, and its label or file name as method."""
    records, summary = read_answers(file), read_summary(file)
    if summary:
        params = dict(summary.get("config", {}).get("method", {}))
        params.pop("name", None)
        params["engine"] = engine_name(summary.get("config", {}).get("engine"), summary.get("engine"),
                                       summary.get("environment", {}).get("device", "cpu"))
        sampling = sampling_label(summary.get("config", {}).get("sampling"))
        if sampling:
            params["sampling"] = sampling
        paradigm = paradigm_label(summary.get("config", {}).get("bench"))
        if paradigm:
            params["paradigm"] = paradigm
        budget = budget_label(summary.get("config", {}).get("runtime"))
        if budget and summary["method"] != BASELINE:  # vanilla drafts nothing a budget could cut
            params["budget"] = budget
        params[BATCH] = Side(file.parent, summary, records).setting(BATCH)
        return Run(file, records, summary, summary["model"], label or summary["method"], params)
    models = sorted({str(r.get("model_id")) for r in records})
    if len(models) != 1:
        raise HarnessError(f"{file} answers with several models {models}; give one answer file per model and method")
    return Run(file, records, {}, models[0], label or (file.parent.name if file.name == ANSWERS else file.stem))


def run_tokenizer(file: str | Path) -> tuple[str, object] | None:
    """(key, tokenizer) of the model in the run's ``config.yaml`` beside an answer file (a run's ``answers.jsonl``,
    as ``read_summary`` takes its summary); None where there is no such config or its tokenizer cannot be read
    here. The key names the model: answers of one key share a tokenizer."""
    from omegaconf import OmegaConf

    answers = answer_file(file)
    config = answers.parent / "config.yaml"
    if answers.name != ANSWERS or not config.is_file():
        return None
    model = json.dumps(OmegaConf.to_container(OmegaConf.load(config), resolve=True).get("model") or {},
                       sort_keys=True)
    try:
        return model, _tokenizer(model)
    except (HarnessError, OSError, TypeError, ValueError):
        return None


def spec_bench_tokens_of(file: str | Path, records: list[dict]) -> dict[int, int] | None:
    """The new tokens Spec-Bench's ``evaluation/speed.py`` counts for ``records`` as a baseline
    (``evaluation.records.metrics.spec_bench_tokens``), with the run's tokenizer (``run_tokenizer``); None without one."""
    found = run_tokenizer(file)
    if found is None:
        return None
    from evaluation.records.metrics import spec_bench_tokens

    return spec_bench_tokens(records, found[1])


@functools.cache
def _tokenizer(model: str):
    from evaluation.running.models import ModelSpec, load_tokenizer

    return load_tokenizer(ModelSpec(**json.loads(model)))


def engine_name(engine: dict | None, ran: dict | None = None, device: str = "cpu") -> str:
    """``hf``, ``static``, ``static(pack=false)``, ``static(compiled)``, ``static(compiled:reduce-overhead)``,
    ``static(cuda-graphs)`` or, on a GPU, ``static(eager)`` from a run's engine config and what its summary says ran
    (``ran``: ``Engine.summary()``; runs from before engines: ``hf``). A step's cost on a GPU depends on how it was
    launched, so a GPU run's name always says it; on a CPU eager is the only step that is not named."""
    if not engine:
        return "hf"
    notes = [] if engine.get("pack", "auto") == "auto" else [f"pack={engine['pack']}"]
    step = (ran or {}).get("step") or {True: "inductor", "graphs": "cuda-graphs"}.get(engine.get("compile"), "eager")
    if step.startswith("inductor"):
        notes.append("compiled" + ("" if engine.get("compile_mode", "default") == "default"
                                   else f":{engine['compile_mode']}"))
    elif step != "eager" or device.startswith("cuda"):
        notes.append(step)
    return engine["name"] + (f"({','.join(notes)})" if notes else "")


def collect(paths: list[str]) -> list[Run]:
    """Every run under the given paths, each answer file once; ``LABEL=PATH`` names the runs found there."""
    runs, seen = [], set()
    for arg in paths:
        label, path = labelled(arg)
        for file in _answer_files(Path(path)):
            if file.resolve() not in seen:
                seen.add(file.resolve())
                runs.append(load_run(file, label or None))
    if not runs:
        raise HarnessError("no runs given")
    return runs


def _bench(run: Run) -> dict:
    """The bench settings a run answered under ({} for a foreign file): repeats share them, captions name them."""
    return run.summary.get("config", {}).get("bench", {})


def machine(run: Run) -> str | None:
    """The machine a run was timed on, as far as its summary says (None: not recorded, a foreign file)."""
    return machine_of(run.summary.get("environment"))


def machine_of(e: dict | None) -> str | None:
    """The machine of a summary's ``environment``: the GPU's name, or the CPU's model, family/model/stepping, ISA
    flags and torch's threads (``methods.machine``); None where none is recorded."""
    if not e:
        return None
    if str(e.get("device", "")).startswith("cuda"):
        return e.get("device_name")
    if e.get("cpu"):
        from methods.machine import describe

        return describe(e["cpu"])
    return f"{e.get('device_name', '?')}, {e.get('cpu_threads', '?')} threads"


def check_machines(groups: list[Group]) -> None:
    """A speedup divides a method's timings by its baseline's: both must come from one kind of machine."""
    for g in groups:
        seen: dict[str, Run] = {}
        for run in g.baseline + g.runs:
            m = machine(run)
            if m is not None:
                seen.setdefault(m, run)
        if len(seen) > 1:
            (m1, r1), (m2, r2) = list(seen.items())[:2]
            raise HarnessError(f"{g.label} on {g.model} mixes machines: {r1.path} ran on {m1} but {r2.path} on "
                               f"{m2}; a speedup across machines measures the machines. Report each machine "
                               f"apart, or pass --mixed-machines to do it anyway")


def side(run: Run) -> Side:
    """The run as ``evaluation.records.consistency`` checks it, named by its folder (ours) or its file."""
    return Side(run.path.parent if run.path.name == ANSWERS else run.path, run.summary, run.records)


def check_runs(groups: list[Group], allow_unfinished: bool = False) -> str | None:
    """The consistency rule (``evaluation.records.consistency``) on a table: every row shares the questions and the new
    tokens of the caption, and each row's model, sampling settings and batch size are its baseline's. Returns the
    note the caption needs for unfinished runs (allowed), else None."""
    runs = list({id(r): r for g in groups for r in g.baseline + g.runs}.values())
    fix = "report runs made with the same settings together (a table has one caption), or each set apart"
    note = check([side(r) for r in runs], ("questions", "max_new_tokens"), allow_unfinished, fix).note
    for g in groups:
        check([side(r) for r in g.baseline + g.runs], ("model", "sampling", BATCH), True,
              f"give {g.label} a baseline of the same model, sampling settings and batch size (--baseline RUN)")
    return note


# ---------------------------------------------------------------- grouping runs into rows

def group_runs(runs: list[Run], baseline: list[Run] | None = None) -> list[Group]:
    """Repeats grouped, each group given its baseline: ``baseline`` for all, else its model's vanilla runs.

    A set that cannot make a table (a model without a baseline, repeats on other questions) is refused, saying why.
    """
    runs = _with_baseline_runs(runs, baseline)
    if baseline:
        _file_foreign_runs_under_baseline_model(runs, baseline)
    _label_runs(runs)
    groups = _repeats(runs)
    if baseline:
        _give_named_baseline(groups, baseline)
    else:
        _give_vanilla_baselines(groups, runs)
    _check_common_questions(groups)
    return _in_table_order(groups, runs)


def _with_baseline_runs(runs: list[Run], baseline: list[Run] | None) -> list[Run]:
    """A named baseline is a row of the table too, once even when it was also given among the runs."""
    given = {r.path.resolve() for r in runs}
    return runs + [b for b in baseline or [] if b.path.resolve() not in given]


def _file_foreign_runs_under_baseline_model(runs: list[Run], baseline: list[Run]) -> None:
    """Spec-Bench's files name the method in model_id: a baseline of one model says which model they ran."""
    if len({b.model for b in baseline}) == 1:
        for run in runs:
            if not run.summary:
                run.model = baseline[0].model


def _label_runs(runs: list[Run]) -> None:
    """Name each run by its method and the parameters that differ between runs of that method and model."""
    siblings = defaultdict(list)
    for run in runs:
        if run.summary:  # a foreign file's label is its name
            siblings[run.model, run.method].append(run)
        else:
            run.label = run.method
    for group in siblings.values():
        keys = sorted({k for r in group for k in r.params}, key=lambda k: (k == BATCH, k))  # the batch size last
        differ = [k for k in keys if len({json.dumps(r.params.get(k), sort_keys=True) for r in group}) > 1
                  or (k in ALWAYS_SHOWN and any(r.params.get(k) for r in group))]
        for r in group:
            shown = {k: str(r.params.get(k)) if k in ("sampling", "paradigm") else f"{k}={r.params.get(k)}"
                     for k in differ if not (k in ("sampling", "paradigm", "budget") and r.params.get(k) is None)}
            r.label = r.method + (" (" + ", ".join(shown.values()) + ")" if shown else "")
            shown.pop(BATCH, None)
            r.series = r.method + (" (" + ", ".join(shown.values()) + ")" if shown else "")


def _repeats(runs: list[Run]) -> list[Group]:
    """Runs of one model and label, in the order first met; their mean and spread only mean something when they
    answer the same questions under the same bench settings, so other sets are refused."""
    groups: dict[tuple, Group] = {}
    for run in runs:
        g = groups.setdefault((run.model, run.label), Group(run.model, run.label, []))
        first = g.runs[0] if g.runs else run
        if run.questions != first.questions or _bench(run) != _bench(first):
            raise HarnessError(
                f"{run.path} and {first.path} are both {run.label} on {run.model} but answer different "
                f"questions or bench settings, so they are not repeats: report them separately")
        g.runs.append(run)
    return list(groups.values())


def _give_named_baseline(groups: list[Group], baseline: list[Run]) -> None:
    """``--baseline`` serves every row; a row of another model than the baseline's would be a speedup across
    models, so it is refused (where either side is a foreign file, its model_id names no model to check)."""
    models = {b.model for b in baseline if b.summary}
    for g in groups:
        if g.runs[0].summary and models and g.model not in models:
            raise HarnessError(f"the baseline ({baseline[0].path}) is a run of {sorted(models)} but {g.label} "
                               f"runs {g.model}; give a baseline of the same model, or report each model apart")
    files = {b.path.resolve() for b in baseline}
    for g in groups:  # baselines at several batch sizes: each row's own (else all, which check_runs refuses)
        g.baseline = [b for b in baseline if b.params.get(BATCH) == g.batch_size] or baseline
        g.is_baseline = all(r.path.resolve() in files for r in g.runs)


def _give_vanilla_baselines(groups: list[Group], runs: list[Run]) -> None:
    """Without ``--baseline`` a row's baseline is the vanilla runs of its model on its engine, under its sampling
    settings and paradigm, at its batch size: an engine changes the speed of vanilla decoding as much as that of the method, a
    temperature the tokens (a sampled run is compared with vanilla sampling of the same settings and seed), and a
    batch size the load (a speedup under load is against vanilla at the same batch size)."""
    for g in groups:
        g.baseline = [r for r in runs if r.model == g.model and r.method == BASELINE
                      and all(r.params.get(k) == g.params.get(k) for k in ("engine", "sampling", "paradigm", BATCH))]
        g.is_baseline = g.method == BASELINE
    _refuse_missing_baselines(groups)


def _refuse_missing_baselines(groups: list[Group]) -> None:
    """Every model and engine lacking a vanilla run in one message, with the runs that need it and the two fixes."""
    def where(g: Group) -> tuple:
        return g.model, g.params.get("engine"), g.params.get("sampling"), g.params.get("paradigm"), g.batch_size

    missing = sorted({where(g) for g in groups if not g.baseline}, key=str)
    if missing:
        have = {m: [g.label for g in groups if where(g) == m] for m in missing}
        raise HarnessError("; ".join(f"no {BASELINE} run of model {m}" + (f" on engine {e}" if e else "")
                                     + (f" sampling at {s}" if s else "") + (f" in paradigm {p}" if p else "")
                                     + (f" at runtime.{BATCH}={b}" if b not in (None, 1) else "")
                                     + f" (runs: {', '.join(have[m, e, s, p, b])})" for m, e, s, p, b in missing)
                           + f"; add that model's {BASELINE} run (python -m evaluation.run method={BASELINE}"
                           + (", with the same sampling.* settings" if any(s for _, _, s, _, _ in missing) else "")
                           + (", with the same bench.rounds, num_choices, ..." if any(p for *_, p, _ in missing)
                              else "")
                           + (f", with the same runtime.{BATCH}" if any(b not in (None, 1) for *_, b in missing)
                              else "")
                           + ") or name a baseline with --baseline RUN")


def _check_common_questions(groups: list[Group]) -> None:
    """A speedup compares the same questions: a row sharing none with its baseline has no speedup at all."""
    for g in groups:
        theirs = frozenset().union(*(b.questions for b in g.baseline))
        if not g.runs[0].questions & theirs:
            raise HarnessError(f"{g.label} on {g.model} and its baseline ({g.baseline[0].path}) answer no question "
                               f"in common; give a baseline run on the same questions")


def _in_table_order(groups: list[Group], runs: list[Run]) -> list[Group]:
    """Per model: baselines first, then methods in the order given, a method's settings in natural order, so that a
    table reads like the command that made it and an ablation reads in order (k=2 before k=16)."""
    first: dict[str, int] = {}
    for run in runs:
        first.setdefault(run.method, len(first))
    return sorted(groups, key=lambda g: (g.model, not g.is_baseline, first[g.method],
                                         [_natural(g.params[k]) for k in sorted(g.params)]))


def _natural(value) -> tuple:
    """Numbers before text, numbers by value: a key that sorts any mix of parameter values."""
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


# ---------------------------------------------------------------- where and how the runs were timed

def environment_line(groups: list[Group]) -> str:
    """Where the numbers came from, one line; differing environments are all listed (and are a warning sign)."""
    seen = []
    for g in groups:
        for run in g.runs + g.baseline:
            e = run.summary.get("environment")
            if not e:
                line = "environment not recorded (foreign answer file)"
            else:
                where = machine(run) if e.get("cpu") or e.get("device", "").startswith("cuda") else \
                    f"{e.get('device', '?')} {e.get('device_name', '')}, {e.get('cpu_threads', '?')} threads"
                line = (f"{where}, {e.get('dtype', '?')}, torch {e.get('torch', '?')}, "
                        f"transformers {e.get('transformers', '?')}")
            if line not in seen:
                seen.append(line)
    return ("mixed environments: " if len(seen) > 1 else "") + " | ".join(seen)


def timing_note(groups: list[Group]) -> str | None:
    """The warning a table of runs not decoded side by side needs (``answers.separate_runs_note``), or None."""
    return separate_runs_note([run.summary for g in groups for run in g.runs + g.baseline])


# When a table's timings count as disturbed (``disturbance_note``): a run whose threads waited for a CPU more than
# WAIT_SHARE seconds per second timed (summed over its threads: two threads beside one busy process on two cores
# wait about 0.67), a turn slower per step than STEP_SPREAD times its run's median, or a speedup above OVER_MAT
# times its MAT (a method whose forwards verify more tokens than vanilla's cannot gain more than its MAT unless the
# baseline was slowed). Quiet runs of the smoke sample stay well below each: waits under 0.01, spreads up to 1.8
# (PLD, whose drafts vary most), speedups at most 0.9 of MAT.
WAIT_SHARE, STEP_SPREAD, OVER_MAT = 0.2, 3.0, 1.1


def disturbance_note(runs: dict[str, list[dict]], rows: list[tuple[str, str, float, float]]
                     ) -> tuple[str | None, set[str]]:
    """(None, {}) for quiet timings; else one line naming every sign of a busy machine, and the labels it flags:
    ``runs`` maps a run's label to its records (``evaluation.records.metrics.load_stats``), ``rows`` are (label, task,
    speedup, MAT) of a table. The numbers stay as they are: the line (and a table's mark on a row) says so."""
    signs, flagged = [], set()
    for label, records in runs.items():
        load = load_stats(records)
        if load["wait_share"] is not None and load["wait_share"] > WAIT_SHARE:
            signs.append(f"{label} waited for a CPU {load['wait_share']:.2f} s per second timed (other processes "
                         f"used {load['others']:.1f} cores)")
            flagged.add(label)
        if load["step_spread"] is not None and load["step_spread"] > STEP_SPREAD:
            signs.append(f"{label}'s slowest turn took {load['step_spread']:.1f}x its median time per step")
            flagged.add(label)
    for label, task, speedup, mat in rows:
        if speedup == speedup and mat == mat and speedup > OVER_MAT * mat:
            signs.append(f"{label}'s speedup on {task} ({speedup:.2f}x) is above its MAT ({mat:.2f})")
            flagged.add(label)
    if not signs:
        return None, flagged
    return (f"WARNING: timings disturbed by a busy machine: {'; '.join(signs)}. The numbers stay, marked; rerun "
            f"on a quiet machine (flagged: a run whose threads waited for a CPU over {WAIT_SHARE:g} s per second, a turn "
            f"over {STEP_SPREAD:g}x its run's median time per step, a speedup over {OVER_MAT:g}x its MAT)"), flagged


def table_disturbance(groups: list[Group], stats) -> tuple[str | None, set[str]]:
    """``disturbance_note`` for a report: every run of its rows and baselines, and every row's speedup per task; the
    rows (labels) it flags, its baselines' flags passed on to the rows measured against them."""
    runs, owner = {}, {}
    for g in groups:
        for run in g.baseline + g.runs:
            name = run.label or run.method
            key = f"{name} ({side(run).path})" if name in runs and runs[name] is not run.records else name
            runs[key] = run.records
            owner.setdefault(key, set()).add(g.label)
    rows = [(r["method"], r["task"], r["speedup"], r["mat"]) for _, r in stats.iterrows()
            if not r["baseline"] and "speedup" in r]
    note, flagged = disturbance_note(runs, rows)
    return note, {label for key in flagged for label in owner.get(key, {key})}


def bench_line(groups: list[Group]) -> str:
    """The bench behind the numbers, for captions and titles: name, questions and new tokens of the first of our
    runs (foreign files record no bench settings)."""
    first = next((r for g in groups for r in g.runs if r.summary), groups[0].runs[0])
    b = _bench(first)
    n = len(frozenset.intersection(*(r.questions for g in groups for r in g.runs + g.baseline)))
    return f"{b.get('name', 'Spec-Bench answers')}, {n} questions" + (
        f", {b['max_new_tokens']} new tokens" if b.get("max_new_tokens") else "")
