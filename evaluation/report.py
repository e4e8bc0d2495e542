"""Paper outputs from any set of runs: the main table (markdown, CSV, LaTeX) and the figures (PNG, PDF).

    python -m evaluation.report RUN [RUN ...] [--baseline RUN] [--out DIR] [--allow-unfinished]

A RUN is a run folder, an answer file, a folder holding run folders (a sweep, a
``scripts.bench_methods`` output) or a folder of answer files (Spec-Bench's
``model_answer/``); ``LABEL=PATH`` names it. Our runs carry a ``summary.json``
(model, method, config, environment); answer files from Spec-Bench's own harness
carry none, and are named by LABEL or their file name, with their ``model_id`` as
model. Runs of one model and one method configuration are repeats: the tables give
their mean and spread. Each model's baseline is its vanilla run(s), or ``--baseline``.

Writes to --out (default ``results/reports/<time>``): ``main_table.{md,csv,tex}``
(one row per model and method: speedup per Spec-Bench task, MAT, tokens/s, overall
speedup, the layout of the TR paper's Table 1), ``tasks.csv`` (every number of every
task), ``environment.json``, ``acceptance_by_depth.{md,csv}`` (how often a depth-d draft is
accepted given that its parent was, per method), ``drafters.{md,csv}`` (hybrids: each drafter's
share of the steps and its MAT) and figures as PNG and PDF: ``speedup_per_task``,
``accept_lengths``, ``acceptance_by_depth``, and where the runs form an ablation ``ablation_k``,
``ablation_tree_size``, ``ablation_tree_depth``, ``start_policies`` and ``mat_by_temperature``
(a method at several sampling temperatures). Runs that sampled (``sampling.temperature`` > 0)
are labelled by their sampling settings (``tr (T=0.7 seed=1)``), and each is paired with the
vanilla run of the same settings. Runs decoded under load (``runtime.batch_size``; a report of
several batch sizes, or of any above 1) are labelled by it (``tr (batch_size=4)``) and paired with
vanilla at the same batch size, and add ``batch_size_B.{md,csv}`` per batch size B (MAT,
throughput, speedup in throughput, TTFT, TPOT, forward tokens, padding) and ``speedup_vs_batch``
(each method's speedup against the batch size, and where it falls below 1.0x). All numbers come
from ``evaluation.records.metrics``.

Every speedup and MAT carries its 95% interval in brackets (paired bootstrap over the
questions). Runs that cannot be compared are refused in one line before anything is
written (``evaluation.records.consistency``: other questions, new tokens, sampling or batch size than
their baseline's, or unfinished, unless ``--allow-unfinished``). Timings disturbed by a busy
machine are named below the table (``report_runs.disturbance_note``); they stay.

This module is the command; ``evaluation.reporting.build`` makes everything (``collect`` finds and groups the
runs, ``tables`` and ``figures`` make the outputs, ``html`` the page).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from evaluation.reporting.build import INTERVALS, report
from evaluation.reporting.collect import bench_line, environment_line
from evaluation.reporting.tables import batch_markdown, batch_sizes, drafter_markdown, to_markdown
from methods.common import RESULTS, exit_on_error


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders, answer files, folders of them; LABEL=PATH names them")
    ap.add_argument("--baseline", help="the baseline run for every row (default: each model's vanilla runs)")
    ap.add_argument("--out", help="output folder (default: results/reports/<time>)")
    ap.add_argument("--no-figures", action="store_true", help="tables only")
    ap.add_argument("--mixed-machines", action="store_true",
                    help="allow a speedup whose method and baseline ran on different machines")
    ap.add_argument("--allow-unfinished", action="store_true",
                    help="compare unfinished runs on the questions every run answered (the tables say so)")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else RESULTS / "reports" / time.strftime("%Y-%m-%d_%H-%M-%S")
    result = report(args.runs, out, args.baseline, figures=not args.no_figures, mixed_machines=args.mixed_machines,
                    allow_unfinished=args.allow_unfinished)
    print(to_markdown(result["table"]))
    if len(result["drafters"]):
        print("\n" + drafter_markdown(result["drafters"]))
    for size in batch_sizes(result["batch"]):
        print(f"\nbatch size {size}:\n" + batch_markdown(result["batch"], size))
    print(f"\n{bench_line(result['groups'])}; {environment_line(result['groups'])}")
    print(f"{INTERVALS}.")
    for note in result["notes"]:
        print(note)
    print("-> " + ", ".join(str(f.relative_to(out)) for f in result["files"]) + f" in {out}")
    print(f"the report on one page: {out / 'report.html'} (open it in a browser); the main table: "
          f"{out / 'main_table.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
