"""Speed report: per Spec-Bench task, mean accepted tokens, tokens/s and speedup against a baseline.

    python -m evaluation.speed RUN [RUN ...] --baseline BASELINE_RUN [--out DIR]

RUN and BASELINE_RUN are run folders or answer files. Questions are paired by id.
Prints a markdown table and saves speed.csv and speed.md (default: beside the
first RUN). Definitions live in evaluation.records.metrics. Runs that sampled (their records'
``sampling`` settings) get a ``sampling`` column, and each must have a baseline with the same
settings: a speedup compares two ways of computing the same sample. Runs decoded under load
(``runtime.batch_size`` above 1) get, on their overall row, their throughput and its speedup over
the baseline's (``evaluation.records.metrics.batch_stats``, ``load_speedup``; the baseline at the same batch size).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evaluation.records.answers import answer_file, read_summary, separate_runs_note
from evaluation.reporting.render import markdown
from evaluation.reporting.speed_table import speed_table
from methods.common import exit_on_error, write_text_atomic


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders or answer files")
    ap.add_argument("--baseline", help="run folder or answer file of the baseline (vanilla)")
    ap.add_argument("--out", help="folder for speed.csv and speed.md (default: beside the first run)")
    ap.add_argument("--allow-unfinished", action="store_true",
                    help="compare unfinished runs on the questions both answered (the table says so)")
    args = ap.parse_args(argv)
    table, notes = speed_table(args.runs, args.baseline, args.allow_unfinished)
    out = Path(args.out) if args.out else answer_file(args.runs[0]).parent
    note = separate_runs_note([read_summary(p) for p in args.runs + ([args.baseline] if args.baseline else [])])
    md = markdown(table) + "".join(f"\n\n{n}" for n in notes + ([note] if note else []))
    write_text_atomic(out / "speed.csv", table.to_csv(index=False))
    write_text_atomic(out / "speed.md", md + "\n")
    print(md)
    print(f"-> {out / 'speed.csv'}, {out / 'speed.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
