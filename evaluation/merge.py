"""Join the shards of one run into one answer file, as a single process would have written it.

    python -m evaluation.run runtime.num_shards=2 runtime.shard=0 ...   # on one GPU or job
    python -m evaluation.run runtime.num_shards=2 runtime.shard=1 ...   # on another
    python -m evaluation.merge SHARD_DIR SHARD_DIR --out DIR
    python -m evaluation.merge FOLDER --out DIR        # every shard below FOLDER (the method's folder, say)

The merged ``answers.jsonl`` holds every question of the selection once, in the
selection's order, and the summary of the first shard with its environment (where the
report looks for the machine the timings come from; each shard's stays under
``shards``). Refused, with the reason: shards of different configurations or models,
shards timed on different kinds of machine (unless ``--mixed-machines``), a shard
missing or given twice, a shard that has not finished, two shards answering the same
question.

Token Recycling's hot start within shards: every shard warms up on the selection's
first question and carries its matrix through its own block in file order, so the
first questions of shard k>0 are decoded with a matrix that has not seen the
earlier blocks. Tokens are unaffected (lossless); MAT can be slightly lower than a
single run's: ``evaluation.speed`` on the merged and a single run shows by how much.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evaluation.records.answers import ANSWERS, SUMMARY, folder_lock, read_answers, to_file
from methods.common import HarnessError, exit_on_error, read_json, write_json_atomic, write_jsonl_atomic


def merge(shard_dirs: list[Path], out: Path, mixed_machines: bool = False) -> Path:
    """Check the shards, then write the merged folder; ``out`` is held for this process alone meanwhile."""
    with folder_lock(out, fix="wait for it to finish, or choose another --out"):
        return _merge(shard_dirs, out, mixed_machines)


def _merge(shard_dirs: list[Path], out: Path, mixed_machines: bool) -> Path:
    from evaluation.running.config import RESULT_NEUTRAL, config_mismatch

    summaries = []
    for d in shard_dirs:
        f = d / SUMMARY
        if not f.is_file():
            raise HarnessError(f"{d} is not a run folder (no {SUMMARY})")
        summaries.append(read_json(f, "a run summary"))
    first = summaries[0]
    for d, s in zip(shard_dirs, summaries):
        mismatch = config_mismatch(s["config"], first["config"], RESULT_NEUTRAL + ("runtime.shard",),
                                   where=("in the first", "in the second"))
        if mismatch:
            raise HarnessError(f"{d} and {shard_dirs[0]} are shards of different runs: {mismatch}")
        if s["shard"]["selection"] != first["shard"]["selection"] or s["shard"]["count"] != first["shard"]["count"]:
            raise HarnessError(f"{d} splits another selection of questions or into another number of shards")
        if s.get("status") != "finished":
            raise HarnessError(f"{d} has not finished (status {s.get('status')!r}); resume it with the same command")
    from evaluation.reporting.collect import machine_of

    kinds = {machine_of(s.get("environment")): d for d, s in zip(shard_dirs, summaries)}
    if len(kinds) > 1 and not mixed_machines:  # the merged run's timings would mix machines under one environment
        (m1, d1), (m2, d2) = list(kinds.items())[:2]
        raise HarnessError(f"{d1} ran on {m1} but {d2} on {m2}; merge shards of one kind of machine, or pass "
                           f"--mixed-machines (the merged run then keeps the first shard's environment)")
    count = first["shard"]["count"]
    index: dict[int, tuple[Path, dict]] = {}
    for d, s in zip(shard_dirs, summaries):
        i = s["shard"]["index"]
        if i in index:
            raise HarnessError(f"shard {i} of {count} is given twice: {index[i][0]} and {d}")
        index[i] = d, s
    missing = sorted(set(range(count)) - set(index))
    if missing:
        raise HarnessError(f"shard(s) {missing} of {count} are missing; give all {count} shard folders")
    by_id, where = {}, {}
    for d in shard_dirs:
        for rec in read_answers(d):
            qid = rec["question_id"]
            if qid in by_id:
                raise HarnessError(f"question {qid} is answered by two shards: {where[qid]} and {d}")
            by_id[qid], where[qid] = rec, d
    selection = first["shard"]["selection"]
    unanswered = [q for q in selection if q not in by_id]
    if unanswered:
        raise HarnessError(f"questions {unanswered[:10]} of the selection have no answer in any shard")
    write_jsonl_atomic(out / ANSWERS, [to_file(by_id[q]) for q in selection], ensure_ascii=False)
    merged = {k: v for k, v in first.items() if k not in ("shard", "method_state")}
    merged.update(status="finished", questions=len(selection), answered=len(selection),
                  shards=[{"folder": str(d), "environment": s["environment"], "method_state": s.get("method_state")}
                          for _, (d, s) in sorted(index.items())])
    write_json_atomic(out / SUMMARY, merged)
    return out


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shards", nargs="+", help="the shard run folders, or a folder holding them")
    ap.add_argument("--out", required=True, help="folder for the merged answers.jsonl and summary.json")
    ap.add_argument("--mixed-machines", action="store_true", help="merge shards timed on different machines")
    args = ap.parse_args(argv)
    shards = shard_folders([Path(s) for s in args.shards])
    out = merge(shards, Path(args.out), args.mixed_machines)
    print(f"merged {len(shards)} shards -> {out / ANSWERS}")
    return 0


def shard_folders(paths: list[Path]) -> list[Path]:
    """The shard run folders ``paths`` name: each a run folder, or a folder holding the shards of one run (found by
    their summaries, whatever their folders' names hold: ``[81,161]`` in a name defeats a shell's glob)."""
    out = []
    for p in paths:
        if (p / SUMMARY).is_file() or not p.is_dir():
            out.append(p)
            continue
        found = sorted(f.parent for f in p.rglob(SUMMARY)
                       if (read_json(f, "a run summary").get("shard") or {}).get("count", 1) > 1)
        if not found:
            raise HarnessError(f"{p} holds no shard of a run (no summary.json of a run with runtime.num_shards > 1); "
                               f"give the shards' folders")
        out += found
    return out


if __name__ == "__main__":
    sys.exit(main())
