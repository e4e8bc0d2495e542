"""One table for a sweep: a row per run folder, overall MAT, tokens/s and speedup.

    python -m evaluation.sweep SWEEP_DIR [--baseline RUN]

A multirun (``python -m evaluation.run experiment=tr_k``) writes this table by
itself when it ends (the ``SweepTable`` Hydra callback), as ``sweep.csv`` and
``sweep.md`` in the sweep folder, and, given a baseline or when the sweep holds
vanilla runs, the ``evaluation.report`` tables and figures in ``report/`` beside them
(a sweep of several vanilla runs, as ``experiment=batch_sweep``'s one per batch size:
the report pairs each run with its own). Numbers come from ``evaluation.records.metrics``.
Every sweep writes a new folder (its time in the name; a killed sweep resumes with
``hydra.sweep.dir=THAT_FOLDER``), each job starts with the line ``sweep job I of N``,
and a folder whose runs differ in model, questions or new tokens, or are unfinished, is
refused (``evaluation.records.consistency``; ``--allow-unfinished`` tabulates what has finished).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
from hydra.experimental.callback import Callback

from evaluation.records.answers import ANSWERS, SUMMARY, answer_file, read_answers, read_summary
from evaluation.records.consistency import Side, check
from evaluation.records.metrics import OVERALL, task_table
from evaluation.reporting.columns import names
from evaluation.reporting.render import markdown
from methods.common import HarnessError, exit_on_error, write_text_atomic

# Method facts from a run's summary worth a column, when the method reports them.
STATE_COLUMNS = ("k", "tree", "tree_nodes", "tree_depth", "start")
NAMES = names("speed")  # the overall row's numbers under their names (evaluation.reporting.columns)
SHOWN = ["questions", "mat", "mat_specbench", "tok_per_s"]
WITH_BASELINE = ["speedup", "speedup_lo", "speedup_hi"]


def find_runs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob(ANSWERS))


def _summary(run: Path) -> dict:
    return json.loads((run / SUMMARY).read_text()) if (run / SUMMARY).exists() else {}


def sweep_table(root: Path, baseline: str | None, allow_unfinished: bool = False) -> tuple[pd.DataFrame, str | None]:
    """The table, and the note it needs for unfinished runs (``allow_unfinished``). The runs of one table must
    share model, questions and new tokens, and each must have the baseline's sampling settings and batch size
    (``evaluation.records.consistency``): a sweep folder reused with other settings is refused, not mixed."""
    runs = find_runs(root)
    if not runs:
        raise HarnessError(f"no run folders (with {ANSWERS}) under {root}")
    records = {run: read_answers(run) for run in runs}
    sides = [Side(run, _summary(run), recs) for run, recs in records.items()]
    base = read_answers(baseline) if baseline else None
    base_side = [Side(answer_file(baseline).parent, read_summary(baseline), base)] if baseline else []
    fix = "tabulate each sweep in its own folder (every sweep writes a new one)"
    note = check(sides + base_side, ("model", "questions", "max_new_tokens"), allow_unfinished, fix).note
    for side in sides if baseline else []:
        check([side] + base_side, ("sampling", "batch_size"), True,
              "give as report.baseline a vanilla run of its sampling settings and batch size")
    rows = []
    for run, side in zip(runs, sides):
        summary = side.summary
        state = summary.get("method_state", {})
        overall = task_table(records[run], base).loc[OVERALL]
        row = {"run": str(run.relative_to(root)) or ".", "method": summary.get("method", "?")}
        row.update({c: state[c] for c in STATE_COLUMNS if c in state})
        row.update({NAMES[k]: overall[k] for k in SHOWN})
        row["questions"] = int(row["questions"])
        if base is not None:
            row.update({NAMES[k]: overall[k] for k in WITH_BASELINE})
        rows.append(row)
    state = [c for c in STATE_COLUMNS if any(c in r for r in rows)]
    columns = ["run", "method", *state] + [NAMES[k] for k in SHOWN + (WITH_BASELINE if base is not None else [])]
    return pd.DataFrame([{c: r.get(c, "") for c in columns} for r in rows], columns=columns), note


def write_table(root: Path, baseline: str | None, allow_unfinished: bool = False) -> pd.DataFrame:
    """The table of the runs under ``root``; the baseline is ``baseline``, else the sweep's one vanilla run."""
    if baseline and not (Path(baseline).is_file() or (Path(baseline) / ANSWERS).is_file()):
        print(f"note: baseline {baseline} not found, so no speedup column; run vanilla on the same bench first")
        baseline = None
    vanilla = [] if baseline else [run for run in find_runs(root) if _summary(run).get("method") == "vanilla"]
    if len(vanilla) == 1:
        baseline = str(vanilla[0])
    table, note = sweep_table(root, baseline, allow_unfinished)
    md = markdown(table) + (f"\n\n{note}" if note else "")
    write_text_atomic(root / "sweep.csv", table.to_csv(index=False))
    write_text_atomic(root / "sweep.md", md + "\n")
    print(md)
    print(f"-> {root / 'sweep.csv'}, {root / 'sweep.md'}")
    if baseline or vanilla:  # the paper outputs too: main table and figures (the ablation curves among them)
        from evaluation.reporting.build import report

        try:  # several vanilla runs: the report gives each run its own (model, engine, sampling, batch size)
            files = report([str(root)], root / "report", baseline, allow_unfinished=allow_unfinished)["files"]
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


class SweepProgress(Callback):
    """Hydra callback: each job of a multirun starts with the line ``sweep job I of N: OVERRIDES`` (N where the
    launcher runs the jobs in this process, as the basic one does)."""

    total: int | None = None

    def on_multirun_start(self, config, **kwargs) -> None:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
        try:
            overrides = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
            self.total = sum(len(batch) for batch in BasicSweeper.split_arguments(overrides, None))
        except Exception:  # noqa: BLE001 - a sweeper of another kind: the lines go without N
            self.total = None

    def on_job_start(self, config, **kwargs) -> None:
        from hydra.types import RunMode

        if config.hydra.mode != RunMode.MULTIRUN:
            return
        job = config.hydra.job
        of = f" of {self.total}" if self.total else ""
        print(f"sweep job {job.num + 1}{of}: {', '.join(config.hydra.overrides.task) or 'defaults'}", flush=True)


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
    ap.add_argument("--allow-unfinished", action="store_true",
                    help="tabulate unfinished runs on the questions every run answered (the table says so)")
    args = ap.parse_args(argv)
    write_table(Path(args.sweep), args.baseline, args.allow_unfinished)
    return 0


if __name__ == "__main__":
    sys.exit(main())
