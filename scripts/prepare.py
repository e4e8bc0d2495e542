"""Prepare what runs need offline: the embedded models (each converted once) and the Spec-Bench questions.

    python -m scripts.prepare
"""
from evaluation.records.bench import fetch_spec_bench
from evaluation.running.models import EMBEDDED, prepare_embedded
from methods.common import exit_on_error


@exit_on_error
def main() -> None:
    for name in EMBEDDED:
        print(f"embedded model {name}: {prepare_embedded(name)}")
    print(f"spec-bench questions: {fetch_spec_bench()}")


if __name__ == "__main__":
    main()
