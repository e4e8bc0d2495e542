"""The batch-1 record: every method's tokens and per-step counts on the lossless test's questions, as decoded one
request at a time by the loop before batched decoding existed (commit 7db5178), so that ``runtime.batch_size=1``
can be held to them exactly (tests/test_lossless.py).

    python -m tests.golden          # rewrite tests/data/batch1.json (only where a change is meant to move them)
"""
import json
from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "batch1.json"
KEPT = ("token_ids", "accept_lengths", "draft_nodes", "draft_depths")


def key(overrides) -> str:
    return ",".join(overrides)


def record(choice: dict) -> dict:
    return {k: choice[k] for k in KEPT if k in choice}


def load() -> dict:
    return json.loads(GOLDEN.read_text())


def main():
    import torch

    from evaluation.running.models import load_model
    from tests.helpers import shipped_spec
    from tests.test_lossless import DEFAULTS, VARIANTS, WARM_UP, answers, runner, stateful

    spec = shipped_spec("smollm2-135m", device="cpu", dtype="float32")
    model, tok, _ = load_model(spec)
    loaded = (model, tok, torch.device("cpu"))
    out = {}
    for overrides in [["method=vanilla"], *DEFAULTS, *VARIANTS]:
        r = runner(loaded, *overrides)
        if stateful(r.method):
            r.answer(WARM_UP)
        out[key(overrides)] = {str(q): record(c) for q, c in answers(r).items()}
        print(key(overrides), flush=True)
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
