"""Decode Spec-Bench questions with one method and one model, and write an answer file.

    python -m evaluation.run method=vanilla model=smollm2-135m bench=spec_bench_smoke

The command line of ``evaluation.running.runner.run`` (what it writes, how it resumes: there); the config is composed by
Hydra from ``conf/`` and the registered methods and engines (``evaluation.running.config``). A launcher (``hydra/launcher``,
``--multirun``) may run several jobs in this one process.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import hydra
from omegaconf import DictConfig

from evaluation.records.answers import read_answers
from evaluation.reporting.collect import disturbance_note
from evaluation.running.config import config_error, register
from evaluation.running.models import release_devices
from evaluation.running.runner import run
from evaluation.running.vllm import make_runner
from methods.common import ROOT, HarnessError, exit_on_error


@hydra.main(version_base="1.3", config_path=str(ROOT / "conf"), config_name="config")
@exit_on_error
def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    out = Path(HydraConfig.get().runtime.output_dir)
    try:
        run(cfg, out, make_runner)
    finally:
        release_devices()  # a launcher may run the next job in this same process (joblib with one worker)
    note, _ = disturbance_note({str(cfg.method.name): read_answers(out)}, [])
    if note:  # a run's own signs of a busy machine (no speedup here to hold against its MAT)
        print(note, file=sys.stderr)


@contextmanager
def _config_errors_in_one_line():
    """Hydra prints an error in composing the config (a misspelt key, an unknown ``model=`` option) over many lines
    and exits 1, from ``run_and_report``, which has no hook: while this holds, such an error is a HarnessError
    (``evaluation.running.config.config_error``), and anything else goes to Hydra's report as before."""
    from hydra._internal import utils
    from hydra.errors import HydraException

    report = utils.run_and_report

    def reraise(e: Exception):
        raise e

    def run_and_report(func):
        try:
            return func()
        except HydraException as e:
            raise HarnessError(config_error(e)) from None
        except Exception as e:  # noqa: BLE001 - reported by Hydra, as without this
            return report(partial(reraise, e))

    utils.run_and_report = run_and_report
    try:
        yield
    finally:
        utils.run_and_report = report


@exit_on_error
def main() -> None:
    register()  # the methods, engines and resolvers Hydra composes with
    with _config_errors_in_one_line():
        _main()


if __name__ == "__main__":
    main()
