"""Decode Spec-Bench questions with one method and one model, and write an answer file.

    python -m evaluation.run method=vanilla model=smollm2-135m bench=spec_bench_smoke

The command line of ``evaluation.runner.run`` (what it writes, how it resumes: there); the config is composed by
Hydra from ``conf/`` and the registered methods and engines (``evaluation.config``). A launcher (``hydra/launcher``,
``--multirun``) may run several jobs in this one process.
"""
from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from evaluation.config import register
from evaluation.models import release_devices
from evaluation.runner import run
from methods.common import exit_on_error


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
@exit_on_error
def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    out = Path(HydraConfig.get().runtime.output_dir)
    try:
        run(cfg, out)
    finally:
        release_devices()  # a launcher may run the next job in this same process (joblib with one worker)


def main() -> None:
    register()  # the methods, engines and resolvers Hydra composes with
    _main()


if __name__ == "__main__":
    main()
