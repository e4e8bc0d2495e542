"""Prepare what runs need offline: the embedded models (each converted once) and the question files.

    python -m scripts.prepare
"""
from evaluation.records.bench import QUESTION_FILES, fetch
from evaluation.running.models import EMBEDDED, prepare_embedded
from methods.common import exit_on_error


@exit_on_error
def main() -> None:
    for name in EMBEDDED:
        print(f"embedded model {name}: {prepare_embedded(name)}")
    for name in QUESTION_FILES:
        print(f"{name} questions: {fetch(name)}")


if __name__ == "__main__":
    main()
