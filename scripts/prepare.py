"""Prepare what runs need offline: the embedded model (converted once) and the Spec-Bench questions.

    python -m scripts.prepare
"""
from evaluation.data import fetch_spec_bench
from evaluation.models import prepare_embedded
from methods.common import exit_on_error


@exit_on_error
def main() -> None:
    print(f"embedded model: {prepare_embedded()}")
    print(f"spec-bench questions: {fetch_spec_bench()}")


if __name__ == "__main__":
    main()
