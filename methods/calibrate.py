"""``method.tree=auto`` for a run: calibrate acceptance (cached), measure cost (every run), choose the tree; and the
cost grid ``runtime.budget=auto`` reads (``budget_cost``, cached per machine).

See ``methods.autotree`` for the model. Calibration decodes the project's own prompts
(``Preparation.prompts``: ``evaluation.running.own_prompts.calibration_prompts``), never the benchmark's
questions, with Token Recycling's ``probe`` tree and the run's K and start policy (the first three
quarters of the prompts only warm the matrix: a run's hot start drafts from a matrix that has seen
many answers), then with the grown tree of every candidate size, whose MAT scores it. Both are cached
per model, K and start under ``data/cache/autotree/``; the embedded model's, for the shipped defaults,
come with the project (``data/autotree/``), since on a 2-core CPU they take about 15 minutes. The cost
is measured through the run's engine when the run starts, since it belongs to this device, its load
and its thread count.

``method.max_draft=auto`` (SAM-Decoding's methods, ``methods.proposers.sam``) is sized the same way: a
calibration records every retrieved chain of SAM alone (the method's settings, the reference's chain
length) over our own prompts, cached like the trees' (``chain_calibration``), and the run's cost curve,
the same measurement, prices shorter caps (``chain_budget``, ``methods.autotree.choose_chain_caps``).
"""
from __future__ import annotations

import sys
import time
import weakref
from pathlib import Path

import torch

from methods import machine
from methods.autotree import (
    MAX_DEPTH,
    SIZES,
    acceptance_table,
    choose_chain_caps,
    choose_tree,
    cost_curve,
    measure_cost,
)
from methods.base import Preparation
from methods.budget import Budget, Cost
from methods.common import DATA, read_json, write_json_atomic
from methods.decode import generate
from methods.tree import Tree, grow_tree

BUDGET_SIZES = (1, 2, 4, 8, 16, 32, 64, 96)  # runtime.budget=auto: tokens per row whose forward cost is measured
BUDGET_CONTEXT = 256  # cached tokens per row while measuring it
BUDGET_REPEATS = 3
PROMPTS = 48  # the first three quarters warm the matrix, the last quarter is counted
TOKENS = 96
CANDIDATES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)  # draft counts whose grown trees are decoded
CANDIDATE_PROMPTS = 24  # each: the first two thirds warm the matrix
CANDIDATE_TOKENS = 64
SHIPPED = DATA / "autotree"  # calibrations that come with the project (same file names as the cache's)


def _decode(prep: Preparation, proposer, prompts: int, tokens: int, warm: int) -> tuple[int, int]:
    """Decode the first ``prompts`` own prompts with ``proposer``: (new tokens, steps) of the prompts from
    ``warm`` on, where the proposer's node statistics start."""
    new = steps = 0
    for i, ids in enumerate(prep.prompts(prompts)):
        if i == warm:
            proposer.node_accepts.zero_()
        gen = generate(prep.engine, proposer, ids, max_new_tokens=tokens, stop_ids=prep.stop_ids)
        if i >= warm:
            new, steps = new + len(gen.token_ids), steps + len(gen.accept_lengths)
    return new, steps


def calibration_name(model_name: str, k: int, start: str) -> str:
    """The file name of a tree=auto calibration (in ``data/cache/autotree/``, or shipped in ``SHIPPED``)."""
    return f"{model_name}-k{k}-{start}-{PROMPTS}x{TOKENS}-{len(CANDIDATES)}x{CANDIDATE_PROMPTS}x{CANDIDATE_TOKENS}.json"


def calibration(tr, prep: Preparation) -> dict:
    """For ``tr``'s model, K and start policy: the acceptance table ``accept`` (p[depth-1][rank]) from the
    probe tree, the MAT ``measured`` with each candidate's grown tree, and ``source`` (cached)."""
    name = calibration_name(prep.model_name, tr.k, tr.start)
    file = prep.cache / "autotree" / name
    for known in (file, SHIPPED / name):
        if known.is_file():
            saved = read_json(known, "a tree=auto calibration (delete it to calibrate again)")
            return {**saved, "measured": {int(n): m for n, m in saved["measured"].items()}}

    from tqdm import tqdm

    total, started = 1 + len(CANDIDATES), time.perf_counter()
    print(f"tree=auto: calibrating {prep.model_name} with K={tr.k}, start={tr.start} (once; cached in {file}): "
          f"{total} trees decode {PROMPTS} + {len(CANDIDATES)}x{CANDIDATE_PROMPTS} prompts of our own, about 15 "
          f"minutes for the embedded model on 2 CPU cores", flush=True)
    logged = not sys.stdout.isatty()  # no terminal for a bar (a log file, a job): one line per tree instead
    bar = tqdm(total=total, desc="tree=auto calibration (once)", unit="tree", disable=logged or None)

    finished = []

    def done(what: str) -> None:
        bar.update()
        finished.append(what)
        if logged:
            print(f"tree=auto calibration: {what} ({len(finished)}/{total}, {time.perf_counter() - started:.0f} s)",
                  flush=True)

    probe = tr.sibling("probe")
    warm = PROMPTS * 3 // 4
    _, steps = _decode(prep, probe, PROMPTS, TOKENS, warm)
    table = acceptance_table(list(probe.tree.parents), probe.node_accepts.tolist(), tr.k)
    done("probe tree")
    measured = {}
    for n in CANDIDATES:
        candidate = tr.sibling("auto")  # a root-only tree until the grown one is set
        candidate.set_tree(grow_tree(table, n, MAX_DEPTH, tr.k))
        new, cand_steps = _decode(prep, candidate, CANDIDATE_PROMPTS, CANDIDATE_TOKENS, CANDIDATE_PROMPTS * 2 // 3)
        measured[n] = new / cand_steps
        done(f"{n} drafts: MAT {measured[n]:.2f}")
    bar.close()
    engine = prep.engine
    source = {"prompts": f"evaluation.running.own_prompts.calibration_prompts({PROMPTS}), the first {warm} a warm-up",
              "max_new_tokens": TOKENS, "tree": "probe", "k": tr.k, "start": tr.start, "steps": steps,
              "candidates": f"grown trees of {list(CANDIDATES)} drafts, each on calibration_prompts("
                            f"{CANDIDATE_PROMPTS}) (the first {CANDIDATE_PROMPTS * 2 // 3} a warm-up), "
                            f"{CANDIDATE_TOKENS} tokens",
              "measured_on": {"device": str(engine.device), "dtype": str(engine.dtype),
                              "engine": type(engine).__name__, "threads": torch.get_num_threads(),
                              "seconds": round(time.perf_counter() - started)}}
    saved = {"accept": table, "measured": measured, "source": source}
    write_json_atomic(file, saved, indent=1)
    return saved


def auto_tree(tr, prep: Preparation) -> tuple[Tree, dict]:
    """The tree ``tr`` (a TokenRecycling with tree=auto) should draft with on this engine, and how it was
    chosen (for the run summary)."""
    cal = calibration(tr, prep)
    rows = engine_cost(prep.engine, prep.batch_size)
    choice = choose_tree(cal["accept"], cost_curve(rows), tr.k, measured=cal["measured"])
    tree = choice.pop("tree")
    info = {**choice, "accept": [[round(x, 4) for x in row] for row in cal["accept"]], "calibration": cal["source"],
            "cost": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in rows],
            "cpu_threads": torch.get_num_threads(), "batch_size": prep.batch_size}
    info["scores"] = [{k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()} for s in info["scores"]]
    return tree, info


_COSTS: dict[tuple, tuple[weakref.ref, list[dict]]] = {}


def engine_cost(engine, rows: int = 1) -> list[dict]:
    """``measure_cost`` of this engine with ``rows`` rows per forward (the run's batch size: a tree is chosen for
    what verifying rows x N tokens costs), measured once per process for the engines whose forwards cost the same:
    one model (the same weights), engine kind, step mode, packing and thread count. The methods side by side in one
    run (``scripts.bench_methods``: TR ``tree=auto`` with and without a budget) and a hybrid's two drafters so size
    their drafts from one measurement, and differ only in what they were set to differ in."""
    threads = engine.threads or torch.get_num_threads()
    key = (id(engine.model), type(engine).__name__, engine.step_mode, getattr(engine, "pack", None), threads, rows)
    if key not in _COSTS or _COSTS[key][0]() is not engine.model:  # a model freed since: its id may be another's
        print(f"auto: timing this engine's verification of {len(SIZES)} step sizes ({min(SIZES)} to {max(SIZES)} "
              f"tokens{f', {rows} rows' if rows > 1 else ''}) to size the drafts for this machine (once per process)",
              flush=True)
        t = time.perf_counter()
        _COSTS[key] = (weakref.ref(engine.model), measure_cost(engine, rows=rows))  # keeps no model alive
        print(f"auto: timed in {time.perf_counter() - t:.0f} s", flush=True)
    return _COSTS[key][1]


# max_draft=auto (methods.proposers.sam) and max_spec_tokens=auto (methods.proposers.suffix): the method's drafts with
# their longest length (the probe), on own prompts that the embedded model's corpus leaves out
# (scripts/make_sam_corpus.py), counted per match score.
CHAIN_PROMPTS = 48
CHAIN_TOKENS = 128


def chain_calibration(proposer, prep: Preparation) -> dict:
    """The drafting steps (match score, drafted, accepted[, the accepted nodes' places]) and the number of other
    steps of ``proposer.probe()`` (the proposer's settings with the reference's longest draft, logging its steps)
    over our own prompts; cached per model and the settings ``proposer.chain_settings()`` names (the embedded model's
    defaults come with the project)."""
    key, settings = proposer.chain_settings()
    name = f"{prep.model_name}-{key}-{CHAIN_PROMPTS}x{CHAIN_TOKENS}.json"
    file = prep.cache / "autotree" / name
    for known in (file, SHIPPED / name):
        if known.is_file():
            return read_json(known, f"{proposer.name}'s auto calibration (delete it to calibrate again)")
    print(f"auto: calibrating {proposer.name}'s drafts for {prep.model_name} (once; cached in {file}): "
          f"{CHAIN_PROMPTS} prompts of our own, {CHAIN_TOKENS} tokens each", flush=True)
    probe, started, others = proposer.probe(), time.perf_counter(), 0
    for ids in prep.prompts(CHAIN_PROMPTS):
        gen = generate(prep.engine, probe, ids, max_new_tokens=CHAIN_TOKENS, stop_ids=prep.stop_ids)
        others += len(gen.accept_lengths) - int(gen.prefill_step)
    others -= len(probe.log)
    engine = prep.engine
    saved = {"chains": probe.log, "other_steps": others,
             "source": {"prompts": f"evaluation.running.own_prompts.calibration_prompts({CHAIN_PROMPTS})",
                        "max_new_tokens": CHAIN_TOKENS, **settings,
                        "measured_on": {"device": str(engine.device), "dtype": str(engine.dtype),
                                        "engine": type(engine).__name__, "threads": torch.get_num_threads(),
                                        "seconds": round(time.perf_counter() - started)}}}
    write_json_atomic(file, saved, indent=1)
    return saved


def chain_budget(proposer, prep: Preparation, other: tuple[float, int] | None = None) -> dict:
    """max_draft=auto (and SuffixDecoding's max_spec_tokens=auto): the draft's caps by match score for this engine
    (``methods.autotree.choose_chain_caps``),
    from the cached chain statistics and this run's cost curve; ``other`` the (tokens, nodes) of a step without
    a chain, where the tree drafter knows them."""
    cal = chain_calibration(proposer, prep)
    rows = engine_cost(prep.engine, prep.batch_size)
    chains = [(*c[:3], tuple(c[3])) if len(c) > 3 else tuple(c) for c in cal["chains"]]
    choice = choose_chain_caps(chains, cal["other_steps"], cost_curve(rows), proposer.threshold,
                               cal["source"]["max_draft"], other)
    return {**choice, "calibration": cal["source"],
            "cost": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in rows]}


def row_counts(batch_size: int, ragged: bool) -> list[int]:
    """The row counts whose cost is measured: powers of two up to the batch size and itself (a padded engine
    always forwards all its rows: the batch size alone)."""
    if not ragged:
        return [batch_size]
    return sorted({2 ** i for i in range(batch_size.bit_length()) if 2 ** i <= batch_size} | {batch_size})


def device_key(engine) -> str:
    """The machine a cost belongs to: a GPU's name, or the CPU's kind and thread count (``methods.machine``)."""
    if engine.device.type == "cuda":
        return torch.cuda.get_device_name(engine.device).replace(" ", "_")
    return machine.machine_key()


def budget_cost(engine, batch_size: int, model_name: str, cache: Path) -> tuple[Cost, Path]:
    """``runtime.budget=auto``'s cost grid of ``engine`` for batches of up to ``batch_size`` rows (``methods.budget``:
    R rows of N tokens at ``BUDGET_CONTEXT`` cached tokens, each point's fastest of ``BUDGET_REPEATS``): read from
    ``cache`` (``budget/``) where this model, engine, dtype and machine were measured before, else measured (seconds
    to a minute) and written there. Returns it and its file."""
    counts = row_counts(batch_size, engine.ragged)
    dtype = str(engine.dtype).removeprefix("torch.")
    file = cache / "budget" / (f"{model_name}-{engine.name}-{dtype}-{device_key(engine)}-rows"
                               f"{'_'.join(map(str, counts))}.json")
    if file.is_file():
        saved = read_json(file, "a runtime.budget cost grid (delete it to measure again)")
        return Cost({int(r): p for r, p in saved["ms"].items()}), file
    print(f"budget=auto: timing this engine's forwards of {counts} rows x {len(BUDGET_SIZES)} sizes (once per machine; "
          f"cached in {file})", flush=True)
    t = time.perf_counter()
    table = {}
    for r in counts:
        rows = measure_cost(engine, BUDGET_SIZES, contexts=(BUDGET_CONTEXT,), repeats=BUDGET_REPEATS, rows=r)
        table[r] = {p["tokens"]: p["ms_min"] for p in rows}
    seconds = time.perf_counter() - t
    print(f"budget=auto: timed in {seconds:.0f} s", flush=True)
    write_json_atomic(file, {"ms": {str(r): {str(n): ms for n, ms in p.items()} for r, p in table.items()},
                             "context": BUDGET_CONTEXT, "repeats": BUDGET_REPEATS, "statistic": "fastest repeat",
                             "engine": engine.name, "device": str(engine.device), "dtype": dtype,
                             "machine": device_key(engine), "seconds": round(seconds, 1)}, indent=1)
    return Cost(table), file


def prepare_budget(engine, proposer, policy: str, off_above: int | None, batch_size: int, model_name: str,
                   cache: Path) -> Budget:
    """A run's ``Budget`` (``runtime.budget``, ``runtime.spec_off_above``; auto: with ``budget_cost``'s grid), and
    ``engine`` prepared for the sizes ``proposer``'s steps verify (``Engine.prepare``; under a budget's cut, any size
    up to its largest)."""
    budget = Budget(policy, off_above, budget_cost(engine, batch_size, model_name, cache)[0] if policy == "auto"
                    else None, engine.ragged)
    steps = proposer.step_sizes()
    if steps and budget.active:
        steps = list(range(1, max(steps) + 1))
    engine.prepare(steps)
    return budget
