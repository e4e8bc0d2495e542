"""``method.tree=auto`` for a run: calibrate acceptance (cached), measure cost (every run), choose the tree.

See ``methods.autotree`` for the model. Calibration decodes our own prompts
(``evaluation.own_prompts.calibration_prompts``), never the benchmark's questions,
with Token Recycling's ``probe`` tree and the run's K and start policy (the first three
quarters of the prompts only warm the matrix: a run's hot start drafts from a matrix that
has seen many answers), then with the grown tree of every candidate size, whose MAT scores
it. Both are cached per model, K and start under ``data/cache/autotree/``; the embedded
model's, for the shipped defaults, come with the project (``data/autotree/``), since on a
2-core CPU they take about 15 minutes. The cost is measured through the run's engine when
the run starts, since it belongs to this device, its load and its thread count.
"""
from __future__ import annotations

import json
import sys
import time

import torch

from evaluation.own_prompts import calibration_prompts
from methods.common import CACHE, ROOT
from evaluation.prompts import prompt_ids
from methods.autotree import MAX_DEPTH, acceptance_table, choose_tree, cost_curve, measure_cost
from methods.base import build_proposer
from methods.decode import generate
from methods.tr import TokenRecycling
from methods.tree import grow_tree

PROMPTS = 48  # the first three quarters warm the matrix, the last quarter is counted
TOKENS = 96
CANDIDATES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)  # draft counts whose grown trees are decoded
CANDIDATE_PROMPTS = 24  # each: the first two thirds warm the matrix
CANDIDATE_TOKENS = 64
SHIPPED = ROOT / "data" / "autotree"  # calibrations that come with the project (same file names as the cache's)


def _decode(runner, proposer: TokenRecycling, prompts: int, tokens: int, warm: int) -> tuple[int, int]:
    """Decode ``calibration_prompts(prompts)`` with ``proposer``: (new tokens, steps) of the prompts from
    ``warm`` on, where the proposer's node statistics start."""
    new = steps = 0
    for i, text in enumerate(calibration_prompts(prompts)):
        if i == warm:
            proposer.node_accepts.zero_()
        ids = prompt_ids(runner.spec, runner.tok, [text], [])
        gen = generate(runner.engine, proposer, ids, max_new_tokens=tokens, stop_ids=runner.stop_ids)
        if i >= warm:
            new, steps = new + len(gen.token_ids), steps + len(gen.accept_lengths)
    return new, steps


def calibration(runner) -> dict:
    """The runner's model, K and start policy: the acceptance table ``accept`` (p[depth-1][rank]) from the
    probe tree, the MAT ``measured`` with each candidate's grown tree, and ``source`` (cached)."""
    tr = runner.proposer
    name = (f"{runner.spec.name}-k{tr.k}-{tr.start}-{PROMPTS}x{TOKENS}-"
            f"{len(CANDIDATES)}x{CANDIDATE_PROMPTS}x{CANDIDATE_TOKENS}.json")
    file = CACHE / "autotree" / name
    for known in (file, SHIPPED / name):
        if known.is_file():
            saved = json.loads(known.read_text())
            return {**saved, "measured": {int(n): m for n, m in saved["measured"].items()}}

    def tr_with(tree: str) -> TokenRecycling:
        return build_proposer("tr", {"k": tr.k, "tree": tree, "start": tr.start, "fit_tree_to_k": True},
                              vocab_size=runner.model.config.vocab_size, device=runner.device)

    from tqdm import tqdm

    total, started = 1 + len(CANDIDATES), time.perf_counter()
    print(f"tree=auto: calibrating {runner.spec.name} with K={tr.k}, start={tr.start} (once; cached in {file}): "
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

    probe = tr_with("probe")
    warm = PROMPTS * 3 // 4
    _, steps = _decode(runner, probe, PROMPTS, TOKENS, warm)
    table = acceptance_table(list(probe.tree.parents), probe.node_accepts.tolist(), tr.k)
    done("probe tree")
    measured = {}
    for n in CANDIDATES:
        candidate = tr_with("auto")
        candidate.set_tree(grow_tree(table, n, MAX_DEPTH, tr.k))
        new, cand_steps = _decode(runner, candidate, CANDIDATE_PROMPTS, CANDIDATE_TOKENS, CANDIDATE_PROMPTS * 2 // 3)
        measured[n] = new / cand_steps
        done(f"{n} drafts: MAT {measured[n]:.2f}")
    bar.close()
    source = {"prompts": f"evaluation.own_prompts.calibration_prompts({PROMPTS}), the first {warm} a warm-up",
              "max_new_tokens": TOKENS, "tree": "probe", "k": tr.k, "start": tr.start, "steps": steps,
              "candidates": f"grown trees of {list(CANDIDATES)} drafts, each on calibration_prompts("
                            f"{CANDIDATE_PROMPTS}) (the first {CANDIDATE_PROMPTS * 2 // 3} a warm-up), "
                            f"{CANDIDATE_TOKENS} tokens",
              "measured_on": {"device": str(runner.device), "dtype": str(next(runner.model.parameters()).dtype),
                              "engine": type(runner.engine).__name__, "threads": torch.get_num_threads(),
                              "seconds": round(time.perf_counter() - started)}}
    saved = {"accept": table, "measured": measured, "source": source}
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(saved, indent=1) + "\n")
    tmp.replace(file)
    return saved


def auto_tree(runner) -> dict:
    """Choose and set the runner's TR tree; returns the choice (also in the run's summary)."""
    cal = calibration(runner)
    rows = measure_cost(runner.engine)
    choice = choose_tree(cal["accept"], cost_curve(rows), runner.proposer.k, measured=cal["measured"])
    tree = choice.pop("tree")
    info = {**choice, "accept": [[round(x, 4) for x in row] for row in cal["accept"]], "calibration": cal["source"],
            "cost": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in rows],
            "cpu_threads": torch.get_num_threads()}
    info["scores"] = [{k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()} for s in info["scores"]]
    runner.proposer.set_tree(tree, info)
    return info
