"""Make the static corpus of SAM-Decoding's methods (``method=sam``, ``sam_tr``, ``sam_eagle2``) for a model.

    python -m scripts.make_sam_corpus [--model smollm2-135m] [--out data/sam/smollm2-135m.npz]
    python -m scripts.make_sam_corpus --model vicuna-7b --texts dialogues.jsonl --out PATH
    python -m scripts.make_sam_corpus --from-corpus data/sam/smollm2-135m.npz --layout reference --out PATH

Without ``--texts``: the target's own greedy answers to our own prompts, EAGLE's first training set
(``evaluation.running.own_prompts.training_prompts()`` and ``more_prompts()``, none a Spec-Bench question) but
the prompts that ``max_draft=auto`` calibrates on (``methods.calibrate.CHAIN_PROMPTS``), each
sequence the prompt in the model's template followed by its answer, as SAM-Decoding builds its
corpus from prompts and responses (its ``tools/gen_sam_alpaca.py``). The answers are generated
as ``scripts.train_eagle`` generates them and share its response store, so either reuses the
other's. With ``--texts``: a JSON-lines file of ``{"prompt": ..., "response": ...}`` (the prompt put in
the model's template) or ``{"text": ...}`` lines, e.g. SAM-Decoding's published dialogues exported
to JSON lines. With ``--from-corpus``: the sequences of a corpus file made before. Writes
``methods.automata.save_corpus``'s ``.npz``: the tokens, the sequences' lengths and where they
come from; the model config's ``artefacts.sam_corpus`` names it.

``--layout``: ``apart`` (the default) keeps the sequences apart, so that no match or chain runs from one
into the next; ``reference`` lays them out as SAM-Decoding's corpus tools do
(``methods.automata.reference_layout``: one text, each sequence and then every vocabulary id
followed by EOS), which ``method.reference=true`` needs to match the reference step for step: there a
match may span two sequences, a chain runs on into the next, every token has a match of at least
itself, and the counts that rank ``sam``'s static tree include the EOS and vocabulary entries. Apart
stays the default: on Spec-Bench's 12 first turns of ``methods/README.md``'s check, ``sam`` gets MAT 1.919
from the embedded model's corpus kept apart and 1.910 from it laid out as the reference's.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from evaluation.running.config import compose_config, model_spec
from evaluation.running.models import load_model
from evaluation.running.own_prompts import calibration_prompts, more_prompts, training_prompts
from evaluation.running.prompts import prompt_ids
from methods.automata import load_corpus, reference_layout, save_corpus
from methods.calibrate import CHAIN_PROMPTS
from methods.common import CACHE, ROOT, HarnessError, exit_on_error, read_jsonl
from methods.heads import eagle_train

MAX_NEW_TOKENS = 160  # scripts.train_eagle's default: the two share one response store


def own_prompts() -> list[str]:
    """EAGLE's first training set without the prompts max_draft=auto calibrates on."""
    held_out = set(calibration_prompts(CHAIN_PROMPTS))
    return [p for p in dict.fromkeys(training_prompts() + more_prompts()) if p not in held_out]


def from_texts(path: Path, spec, tok) -> list[list[int]]:
    sequences = []
    for where, obj in read_jsonl(path, 'one {"prompt", "response"} or {"text"} object a line'):
        if isinstance(obj, dict) and isinstance(obj.get("text"), str):
            sequences.append(tok.encode(obj["text"], add_special_tokens=False))
        elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str) and isinstance(obj.get("response"), str):
            ids = prompt_ids(spec, tok, [obj["prompt"]], []) + tok.encode(obj["response"], add_special_tokens=False)
            sequences.append(ids + ([tok.eos_token_id] if tok.eos_token_id is not None else []))
        else:
            raise HarnessError(f'{where}: expected {{"prompt": ..., "response": ...}} or {{"text": ...}} with strings')
    if not sequences:
        raise HarnessError(f"{path} holds no texts")
    return sequences


@exit_on_error
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model config name (conf/model/)")
    ap.add_argument("--out", help="the corpus file (default: data/sam/<model>.npz)")
    ap.add_argument("--texts", help="a JSON-lines file of prompts and responses, or texts, instead of our answers")
    ap.add_argument("--from-corpus", help="the sequences of this corpus file instead of our answers (to lay them out "
                    "again)")
    ap.add_argument("--layout", choices=("apart", "reference"), default="apart",
                    help="apart: sequences kept apart; reference: SAM-Decoding's one text (method.reference=true)")
    ap.add_argument("--batch", type=int, default=32, help="prompts per generation batch")
    ap.add_argument("--limit", type=int, help="only the first N prompts (a quick check)")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else ROOT / "data" / "sam" / f"{args.model}.npz"
    spec = model_spec(compose_config([f"model={args.model}", "model.dtype=float32"]))
    t0 = time.time()
    if args.texts and args.from_corpus:
        raise HarnessError("give --texts or --from-corpus, not both")
    if args.texts or args.from_corpus:
        from evaluation.running.models import load_tokenizer

        tok = load_tokenizer(spec)
    if args.texts:
        sequences = from_texts(Path(args.texts), spec, tok)
        about = {"model": args.model, "source": f"texts of {Path(args.texts).name}, tokenized for {args.model}"}
    elif args.from_corpus:
        loaded, about = load_corpus(Path(args.from_corpus))
        if about.get("model", args.model) != args.model or "layout" in about:
            why = f"is laid out already ({about['layout']})" if "layout" in about else f"is {about['model']}'s"
            raise HarnessError(f"{args.from_corpus} {why}: give a corpus of sequences kept apart, made for --model")
        sequences = [s.tolist() for s in loaded if len(s)]
        about = {**about, "source": f"{about.get('source', '')} (laid out again from {Path(args.from_corpus).name})"}
    else:
        model, tok, device = load_model(spec)
        prompts = own_prompts()[: args.limit]
        ids = {p: prompt_ids(spec, tok, [p], []) for p in prompts}
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        store = CACHE / "eagle" / args.model / f"responses-n{MAX_NEW_TOKENS}.pt"
        sequences, _ = eagle_train.respond(model, ids, MAX_NEW_TOKENS, args.batch, device, pad_id=pad,
                                           eos_id=tok.eos_token_id, store=store)
        about = {"model": args.model, "prompts": len(prompts), "max_new_tokens": MAX_NEW_TOKENS,
                 "source": "the target's greedy answers to evaluation.running.own_prompts training_prompts() + more_prompts(), "
                           f"without calibration_prompts({CHAIN_PROMPTS}); each sequence the prompt in the model's "
                           "template and its answer (python -m scripts.make_sam_corpus)"}
    if args.layout == "reference":
        if tok.eos_token_id is None:
            raise HarnessError(f"--layout reference ends each sequence with EOS, but {args.model}'s tokenizer has none")
        n = len(sequences)
        sequences = [reference_layout(sequences, tok.eos_token_id, len(tok))]
        about = {**about, "layout": f"reference: {n} sequences and the {len(tok)} vocabulary ids, each followed by "
                                    f"EOS ({tok.eos_token_id}), as one sequence"}
    save_corpus(out, sequences, about)
    tokens = sum(len(s) for s in sequences)
    print(f"{len(sequences)} sequences, {tokens} tokens -> {out} ({out.stat().st_size / 1e6:.2f} MB) in "
          f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
