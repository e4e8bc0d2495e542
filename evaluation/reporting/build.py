"""Everything a report writes, from any set of runs (``python -m evaluation.report`` is the command; its docstring
says what each file holds): ``collect`` finds and groups the runs, ``tables`` and ``figures`` make the outputs,
``html`` the page."""
from __future__ import annotations

from pathlib import Path

from evaluation.records.metrics import RESAMPLES
from evaluation.reporting.collect import (
    bench_line,
    check_machines,
    check_runs,
    collect,
    environment_line,
    group_runs,
    table_disturbance,
    timing_note,
)
from evaluation.reporting.figures import (
    plot_ablations,
    plot_accept_lengths,
    plot_budget_calibration,
    plot_by_position,
    plot_depth_acceptance,
    plot_speedup,
    plot_speedup_vs_batch,
    plot_start_policies,
    plot_temperatures,
)
from evaluation.reporting.html import write_html
from evaluation.reporting.tables import (
    batch_markdown,
    batch_sizes,
    batch_table,
    crossovers,
    depth_markdown,
    depth_stats,
    drafter_markdown,
    drafter_stats,
    main_table,
    position_bucket,
    position_long,
    reasoning,
    reasoning_markdown,
    reasoning_table,
    task_stats,
    to_latex,
    to_markdown,
)
from methods.common import write_json_atomic, write_text_atomic


def batch_note(batch, figure: bool) -> str | None:
    """What a report of batched runs (``evaluation.reporting.tables.batch_table``) adds, for the lines under its main table;
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
             f"the same questions for method, baseline and every repeat; evaluation.records.metrics)")


def report(paths: list[str], out: Path, baseline: str | None = None, figures: bool = True,
           mixed_machines: bool = False, allow_unfinished: bool = False) -> dict:
    """Build everything; returns {"table": main table, "stats": per-task table, "groups": the rows' runs,
    "batch": the numbers under load of batched runs (empty at batch size 1), "files": [written paths], "notes": what
    the tables' readers must know}. Runs that cannot be compared (``evaluation.records.consistency``) are refused before
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
    timing, (busy, disturbed) = timing_note(groups), table_disturbance(groups, stats)
    if disturbed:  # the rows whose timings the note flags: marked in the tables, named in the CSV
        table["disturbed"] = table["method"].isin(disturbed)
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
    if reasoning(groups):  # reasoning workloads: a table per paradigm, and the numbers by output position
        bucket = position_bucket(groups)
        thinking, by_position = reasoning_table(groups), position_long(groups, bucket)
        write_text_atomic(out / "reasoning.md", reasoning_markdown(thinking) + "\n")
        write_text_atomic(out / "reasoning.csv", thinking.to_csv(index=False))
        write_text_atomic(out / "by_position.csv", by_position.to_csv(index=False))
        files += [out / "reasoning.md", out / "reasoning.csv", out / "by_position.csv"]
        if figures:
            files += plot_by_position(by_position, out, env, bench_line(groups), bucket)
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
        files += plot_budget_calibration(groups, out, env)
    files.append(write_html(out, table, stats, groups, depths, drafters, files, [INTERVALS + "."] + notes, batch))
    return {"table": table, "stats": stats, "groups": groups, "depths": depths, "drafters": drafters,
            "batch": batch, "files": files, "notes": notes}
