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
from ``evaluation.metrics``.

Every speedup and MAT carries its 95% interval in brackets (paired bootstrap over the
questions). Runs that cannot be compared are refused in one line before anything is
written (``evaluation.consistency``: other questions, new tokens, sampling or batch size than
their baseline's, or unfinished, unless ``--allow-unfinished``). Timings disturbed by a busy
machine are named below the table (``report_runs.disturbance_note``); they stay.

This module is the command; ``evaluation.report_runs`` finds and groups the runs, ``evaluation.tables`` and
``evaluation.figures`` make the outputs.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from evaluation.figures import (plot_ablations, plot_accept_lengths, plot_depth_acceptance, plot_speedup,
                                plot_speedup_vs_batch, plot_start_policies, plot_temperatures)
from evaluation.html import write_html
from evaluation.metrics import RESAMPLES
from evaluation.report_runs import (bench_line, check_machines, check_runs, collect, environment_line, group_runs,
                                    table_disturbance, timing_note)
from evaluation.tables import (batch_markdown, batch_sizes, batch_table, crossovers, depth_markdown, depth_stats,
                               drafter_markdown, drafter_stats, main_table, task_stats, to_latex, to_markdown)
from methods.common import RESULTS, exit_on_error, write_json_atomic, write_text_atomic


def batch_note(batch, figure: bool) -> str | None:
    """What a report of batched runs (``evaluation.tables.batch_table``) adds, for the lines under its main table;
    None for runs at batch size 1 only. ``figure``: whether ``speedup_vs_batch`` is drawn."""
    if not len(batch):
        return None
    sizes, multi = batch_sizes(batch), batch["model"].nunique() > 1
    crossing = "; ".join(f"{method}{f' · {model}' if multi else ''} {text}"
                         for (model, method), (_, text) in crossovers(batch).items())
    return (f"Under load (runtime.batch_size {', '.join(map(str, sizes))}): MAT, throughput, its speedup over vanilla "
            f"at the same batch size, TTFT, TPOT, forward tokens and padding per batch size in "
            + ", ".join(f"batch_size_{b}.md" for b in sizes) + " (and .csv)"
            + (", the speedup against the batch size in speedup_vs_batch" if figure else "")
            + (f" (crossovers: {crossing})" if crossing else "")
            + ". The main table's tokens/s and speedups are per request (each turn's tokens over its own wall time).")


INTERVALS = (f"In brackets: 95% intervals, paired bootstrap over questions ({RESAMPLES} resamples within each task, "
             f"the same questions for method, baseline and every repeat; evaluation.metrics)")


def report(paths: list[str], out: Path, baseline: str | None = None, figures: bool = True,
           mixed_machines: bool = False, allow_unfinished: bool = False) -> dict:
    """Build everything; returns {"table": main table, "stats": per-task table, "groups": the rows' runs,
    "batch": the numbers under load of batched runs (empty at batch size 1), "files": [written paths], "notes": what
    the tables' readers must know}. Runs that cannot be compared (``evaluation.consistency``) are refused before
    anything is written."""
    groups = group_runs(collect(paths), collect([baseline]) if baseline else None)
    unfinished = check_runs(groups, allow_unfinished)
    if not mixed_machines:
        check_machines(groups)
    stats = task_stats(groups)
    table = main_table(stats)
    batch = batch_table(groups, stats)
    env = environment_line(groups)
    caption = f"Speedup over vanilla greedy decoding per Spec-Bench task, mean accepted tokens (MAT) and " \
              f"tokens/s ({bench_line(groups)}; {env}). {INTERVALS}."
    timing, busy = timing_note(groups), table_disturbance(groups, stats)
    notes = [n for n in (unfinished, timing, busy, batch_note(batch, figures and bool(crossovers(batch)))) if n]
    below = "".join(f"\n{n}\n" for n in [INTERVALS + "."] + notes)
    write_text_atomic(out / "main_table.md", to_markdown(table) + "\n" + below)
    write_text_atomic(out / "main_table.tex", to_latex(table, caption) + "\n" + "".join(f"% {n}\n" for n in notes))
    write_text_atomic(out / "main_table.csv", table.to_csv(index=False))
    write_text_atomic(out / "tasks.csv", stats.to_csv(index=False))
    write_json_atomic(out / "environment.json", {
        "environment": env, "bench": bench_line(groups), "side_by_side": timing is None, "notes": notes,
        "runs": [{"model": g.model, "method": g.label, "runs": [str(r.path) for r in g.runs],
                  "baseline": [str(b.path) for b in g.baseline],
                  "environment": [r.summary.get("environment") for r in g.runs]} for g in groups]})
    files = [out / n for n in ("main_table.md", "main_table.csv", "main_table.tex", "tasks.csv", "environment.json")]
    depths, drafters = depth_stats(groups), drafter_stats(groups)
    if len(depths):
        write_text_atomic(out / "acceptance_by_depth.md", depth_markdown(depths) + "\n")
        write_text_atomic(out / "acceptance_by_depth.csv", depths.to_csv(index=False))
        files += [out / "acceptance_by_depth.md", out / "acceptance_by_depth.csv"]
    if len(drafters):
        write_text_atomic(out / "drafters.md", drafter_markdown(drafters) + "\n")
        write_text_atomic(out / "drafters.csv", drafters.to_csv(index=False))
        files += [out / "drafters.md", out / "drafters.csv"]
    for size in batch_sizes(batch):
        write_text_atomic(out / f"batch_size_{size}.md", batch_markdown(batch, size) + "\n")
        write_text_atomic(out / f"batch_size_{size}.csv", batch[batch["batch_size"] == size].to_csv(index=False))
        files += [out / f"batch_size_{size}.md", out / f"batch_size_{size}.csv"]
    if figures:
        files += plot_speedup(stats, groups, out, env)
        files += plot_accept_lengths(groups, out, env)
        files += plot_ablations(stats, groups, out, env)
        files += plot_start_policies(stats, groups, out, env)
        files += plot_depth_acceptance(depths, out, env, bench_line(groups), groups)
        files += plot_temperatures(stats, groups, out, env)
        files += plot_speedup_vs_batch(batch, out, env, bench_line(groups))
    files.append(write_html(out, table, stats, groups, depths, drafters, files, [INTERVALS + "."] + notes, batch))
    return {"table": table, "stats": stats, "groups": groups, "depths": depths, "drafters": drafters,
            "batch": batch, "files": files, "notes": notes}


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
