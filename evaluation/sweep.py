"""One table for a sweep: a row per run folder, overall MAT, tokens/s and speedup.

    python -m evaluation.sweep SWEEP_DIR [--baseline RUN]

A multirun (``python -m evaluation.run experiment=tr_k``) writes this table by
itself when it ends (the ``SweepTable`` Hydra callback), as ``sweep.csv`` and
``sweep.md`` in the sweep folder, and, given a baseline, the ``evaluation.report``
tables and figures in ``report/`` beside them. Numbers come from ``evaluation.metrics``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
from hydra.experimental.callback import Callback

from evaluation.answers import ANSWERS, SUMMARY, read_answers
from evaluation.metrics import OVERALL, task_table
from evaluation.speed import markdown
from methods.common import HarnessError, exit_on_error

# Method facts from a run's summary worth a column, when the method reports them.
STATE_COLUMNS = ("k", "tree", "tree_nodes", "tree_depth", "start")


def find_runs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob(ANSWERS))


def _summary(run: Path) -> dict:
    return json.loads((run / SUMMARY).read_text()) if (run / SUMMARY).exists() else {}


def sweep_table(root: Path, baseline: str | None) -> pd.DataFrame:
    runs = find_runs(root)
    if not runs:
        raise HarnessError(f"no run folders (with {ANSWERS}) under {root}")
    base = read_answers(baseline) if baseline else None
    rows = []
    for run in runs:
        summary = _summary(run)
        state = summary.get("method_state", {})
        overall = task_table(read_answers(run), base).loc[OVERALL]
        row = {"run": str(run.relative_to(root)) or ".", "method": summary.get("method", "?")}
        row.update({c: state[c] for c in STATE_COLUMNS if c in state})
        row.update(questions=int(overall["questions"]), MAT=overall["mat"],
                   **{"MAT (Spec-Bench)": overall["mat_specbench"], "tokens/s": overall["tok_per_s"]})
        if base is not None:
            row["speedup"] = overall["speedup"]
        rows.append(row)
    state = [c for c in STATE_COLUMNS if any(c in r for r in rows)]
    columns = ["run", "method", *state, "questions", "MAT", "MAT (Spec-Bench)", "tokens/s"] + (
        ["speedup"] if base is not None else [])
    return pd.DataFrame([{c: r.get(c, "") for c in columns} for r in rows], columns=columns)


def write_table(root: Path, baseline: str | None) -> pd.DataFrame:
    """The table of the runs under ``root``; the baseline is ``baseline``, else the sweep's one vanilla run."""
    if baseline and not (Path(baseline).is_file() or (Path(baseline) / ANSWERS).is_file()):
        print(f"note: baseline {baseline} not found, so no speedup column; run vanilla on the same bench first")
        baseline = None
    if not baseline:
        vanilla = [run for run in find_runs(root) if _summary(run).get("method") == "vanilla"]
        baseline = str(vanilla[0]) if len(vanilla) == 1 else None
    table = sweep_table(root, baseline)
    md = markdown(table)
    table.to_csv(root / "sweep.csv", index=False)
    (root / "sweep.md").write_text(md + "\n")
    print(md)
    print(f"-> {root / 'sweep.csv'}, {root / 'sweep.md'}")
    if baseline:  # the paper outputs too: main table and figures (the ablation curves among them)
        from evaluation.report import report

        try:
            files = report([str(root)], root / "report", baseline)["files"]
            print(f"-> {root / 'report'}: {', '.join(f.name for f in files)}")
        except HarnessError as e:
            print(f"note: no report for this sweep: {e}")
    return table


class RunFolder(Callback):
    """Hydra callback: a single run's folder that cannot be made is one line and exit 2 (Hydra would make it
    itself a moment later and report the failure as a traceback)."""

    def on_run_start(self, config, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.instance().set_config(config)  # what Hydra does next, so that ${hydra:...} resolves
        folder = Path(str(config.hydra.run.dir))
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            print(f"error: cannot make the run folder {folder} ({e.strerror}); choose a writable place with "
                  f"hydra.run.dir=DIR", file=sys.stderr)
            sys.exit(2)


class SweepTable(Callback):
    """Hydra callback: when a multirun ends, tabulate its runs (baseline: ``report.baseline``)."""

    def on_multirun_end(self, config, **kwargs) -> None:
        try:
            write_table(Path(config.hydra.sweep.dir), config.get("report", {}).get("baseline"))
        except HarnessError as e:
            print(f"error: {e}", file=sys.stderr)


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep", help="a sweep folder (any folder holding run folders)")
    ap.add_argument("--baseline", help="run folder or answer file of the baseline (vanilla)")
    args = ap.parse_args(argv)
    write_table(Path(args.sweep), args.baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
