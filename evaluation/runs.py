"""Every run folder under some roots at a glance: what ran, the settings it changed, how far it got, its numbers.

    python -m evaluation.runs [ROOT ...] [--csv]

ROOT defaults to ``results/``. A run folder is one holding ``answers.jsonl`` or ``summary.json`` (a run that has
not finished its first question has no answers yet). One row each, sorted by path: the method, model and bench;
the settings that differ from the defaults ``python -m evaluation.run method=M model=X bench=B`` would compose,
written as overrides (settings that cannot change a result, ``RESULT_NEUTRAL``, are left out, and so are settings
the harness gained after the run, which the run did not have); the questions answered of those selected; the
status (``running`` while a live process holds the folder, else the summary's ``finished`` or ``interrupted``,
which a run killed while its summary said ``running`` is too: rerun its command to resume); the overall MAT and
tokens/s (``evaluation.records.metrics``; a batched run's throughput, all its rows' tokens over its decoding time);
``busy`` where its timings show a busy machine (``evaluation.reporting.collect.disturbance_note``). Settings longer
than ``SETTINGS_WIDTH`` characters are cut (``…``). A markdown table, or CSV with ``--csv``. A folder that cannot be read is a row
with status ``unreadable`` and a note on stderr saying why; the rest are listed all the same.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import pandas as pd

from evaluation.records.answers import ANSWERS, SUMMARY, flat_config, folder_in_use, read_answers
from evaluation.records.metrics import OVERALL, batch_stats, task_table
from evaluation.reporting.collect import disturbance_note
from evaluation.reporting.render import markdown
from evaluation.running.config import RESULT_NEUTRAL
from methods.common import RESULTS, HarnessError, exit_on_error, read_json

COLUMNS = ["path", "method", "model", "bench", "settings", "answered", "status", "MAT", "tokens/s", "busy"]
SETTINGS_WIDTH = 60  # a row fits a terminal: longer settings are cut (config.yaml has them all)


def run_folders(roots: list[Path]) -> list[Path]:
    """The run folders under ``roots`` (paths as the roots were given), each once, sorted; a root that is not a
    folder, or holds no run folder, is refused."""
    found = {}
    for root in roots:
        if not root.is_dir():
            raise HarnessError(f"{root} is not a folder; give folders holding run folders (default: {RESULTS})")
        here = {p.parent for name in (ANSWERS, SUMMARY) for p in root.rglob(name)}
        if not here:
            raise HarnessError(f"no run folders (holding {ANSWERS} or {SUMMARY}) under {root}; "
                               f"python -m evaluation.run or make run makes some")
        for folder in here:
            found.setdefault(folder.resolve(), folder)
    return sorted(found.values())


@functools.cache
def _defaults(method: str, model: str, bench: str) -> dict:
    """The flat resolved config ``method=M model=X bench=B`` composes (once per listing and combination; read, never
    changed)."""
    from omegaconf import OmegaConf

    from evaluation.running.config import compose_config

    cfg = compose_config([f"method={method}", f"model={model}", f"bench={bench}"])
    return flat_config(OmegaConf.to_container(cfg, resolve=True))


def _override(value) -> str:
    """A value as a command line would set it (``[qa,rag]``, ``null``, ``true``)."""
    if isinstance(value, list):
        return "[" + ",".join(_override(v) for v in value) + "]"
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def changed_settings(config: dict) -> str:
    """The settings of a run's resolved config that differ from its method's, model's and bench's defaults, as
    overrides (``method.k=4, bench.max_new_tokens=64``); ``?`` where the defaults cannot be composed here (a
    method registered elsewhere, a model config since removed)."""
    try:
        defaults = _defaults(config["method"]["name"], config["model"]["name"], config["bench"]["name"])
    except (HarnessError, KeyError, TypeError):
        return "?"
    neutral = tuple(k + "." for k in RESULT_NEUTRAL)
    return ", ".join(f"{k}={_override(v)}" for k, v in flat_config(config).items()
                     if (k not in defaults or v != defaults[k]) and not (k + ".").startswith(neutral))


def _shown(folder: Path) -> str:
    """The folder as its root was given, but relative to the working directory where it lies below it."""
    try:
        return str(folder.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(folder)


def run_row(folder: Path) -> dict:
    """One row of the listing (``COLUMNS``); HarnessError where the summary or the answers cannot be read."""
    summary = read_json(folder / SUMMARY, "a run summary") if (folder / SUMMARY).is_file() else {}
    config = summary.get("config")
    if config is None and (folder / "config.yaml").is_file():
        from omegaconf import OmegaConf

        try:
            config = OmegaConf.to_container(OmegaConf.load(folder / "config.yaml"), resolve=True)
        except Exception as e:  # noqa: BLE001 - any unreadable YAML: one note
            raise HarnessError(f"{folder / 'config.yaml'} is not a readable config ({type(e).__name__})") from None
    config = config or {}
    records = read_answers(folder / ANSWERS) if (folder / ANSWERS).is_file() else []
    overall = task_table(records).loc[OVERALL] if records else None
    load = batch_stats(records) if records else {}
    batched = (load.get("batch_size") or 1) > 1 and load.get("throughput")
    settings = changed_settings(config) if config else "?"
    if folder_in_use(folder):
        status = "running"
    else:
        status = {"finished": "finished", None: "-"}.get(summary.get("status"), "interrupted")
    return {"path": _shown(folder), "method": summary.get("method") or config.get("method", {}).get("name", "-"),
            "model": summary.get("model") or config.get("model", {}).get("name", "-"),
            "bench": config.get("bench", {}).get("name", "-"),
            "settings": settings if len(settings) <= SETTINGS_WIDTH else settings[:SETTINGS_WIDTH - 1] + "…",
            "answered": f"{len(records)}/{summary.get('questions', '?')}", "status": status,
            "MAT": overall["mat"] if overall is not None else None,
            # at batch B the run's throughput (all rows' tokens over its decoding time), not one request's rate
            "tokens/s": load["throughput"] if batched else overall["tok_per_s"] if overall is not None else None,
            "busy": "yes" if records and disturbance_note({"": records}, [])[0] else ""}


def runs_table(roots: list[Path]) -> tuple[pd.DataFrame, list[str]]:
    """The listing of every run folder under ``roots``, and a note per folder that could not be read (listed with
    status ``unreadable``)."""
    rows, notes = [], []
    for folder in run_folders(roots):
        try:
            rows.append(run_row(folder))
        except HarnessError as e:
            notes.append(f"note: {e}")
            rows.append({"path": _shown(folder), "status": "unreadable"})
    return pd.DataFrame(rows, columns=COLUMNS), notes


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="*", help=f"folders holding run folders (default: {RESULTS})")
    ap.add_argument("--csv", action="store_true", help="CSV instead of a markdown table")
    args = ap.parse_args(argv)
    table, notes = runs_table([Path(r) for r in args.roots] or [RESULTS])
    if args.csv:
        table.to_csv(sys.stdout, index=False)
    else:
        print(markdown(table.astype(object).where(table.notna(), "-"), digits=2))
    for note in notes:
        print(note, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
