"""The prepared CUDA check: what a lent GPU must show, within minutes, with only torch and transformers.

    python -m scripts.gpu_check [--out DIR] [--budget SECONDS] [--mat 2.70] [--cpu]

A lent GPU machine is bare (its own torch and transformers; no Hydra, OmegaConf or fastchat; no network)
and gives a session minutes, so this script needs nothing but ``methods/`` and ``evaluation/shapes.py``,
keeps to ``--budget`` (default 420 s), writes six files, and goes on past a failing step. Steps, by
value:

1. ``attention.csv``: which ``scaled_dot_product_attention`` kernel runs, and how fast, for a tree step
   (64 queries, 1536 keys, a bool mask) in fp16, with and without grouped-query attention, ``enable_gqa``
   against K/V heads expanded first (what the static engine does on CUDA), and without a mask.
2. ``methods.csv``: every registered method with its example settings (``Proposer.example``: random heads,
   a one-layer drafter, a datastore of the prompts) and ``VARIANTS``, on the hf and static engines, on tiny
   random models of the Llama-3, Vicuna, Qwen3 and Gemma 3 architectures (2 layers, or a method's
   ``min_layers``: EAGLE-3's 8): fp32 on the device token-identical to CPU greedy; fp16 against it, each first
   divergence classified (``evaluation.equal.classify``: a near-tie of the fp16 model, or a real mismatch).
2b. ``sampling.csv``: the same cases sampling at temperature 1 (top-p 0.95) in fp32 on the static engine, on
   the device: token-identical to vanilla sampling with the same seed there (``methods.sampling``), and how
   often vanilla's samples on the device equal the CPU's.
3. ``methods.csv`` (engine ``static-compiled``): compiled steps with CUDA graphs (``reduce-overhead``) for
   two step sizes, prepared before decoding: equal to CPU greedy, compile seconds, nothing compiled late.
4. ``cost.csv``: the fp16 latency of verifying N = 1..128 tokens after 512 and 1536 cached ones, static
   against hf, on random models of Vicuna-7B's and Llama-3-8B's shapes; the log projects TR's speedup for
   the paper tree (``--mat``, default the paper's Vicuna-7B MAT 2.70) and for tree=auto's choice (the
   acceptance table of our embedded model's probe run, ``data/trees/grown-n80-d6.json``: a stand-in).
5. ``batch_cost.csv``: under load, the fp16 latency of one static-engine forward verifying B = 1, 4, 16, 64 rows of
   N = 1, 8, 32, 81 tokens each, every row after its own 512 cached ones (``measure_cost`` with ``rows=B``), on a
   random Vicuna-7B; per B, the same projection as step 4 from that B's cost curve: the paper tree's speedup
   (``--mat`` x c(B, 1) / c(B, 81)) and tree=auto's choice and expected speedup. A forward's cost rises with N
   sooner as B grows, so this is where TR's gain under batching is decided.

``gpu_check.log`` has everything printed, the environment first. ``--cpu`` is a dry run of every step on
the CPU with tiny shapes (the tests run it: 16 new tokens, an 8192-token vocabulary, step 2's fp16 on the first
architecture only), so that the script is known to work before a GPU is lent.
"""
from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file, too
    sys.path.insert(0, str(ROOT))

from evaluation.equal import classify  # noqa: E402
from evaluation.shapes import random_model  # noqa: E402
from methods.autotree import choose_tree, cost_curve, measure_cost  # noqa: E402
from methods.base import build_proposer, registry  # noqa: E402
from methods.decode import generate  # noqa: E402
from methods.engine import HFEngine, StaticEngine  # noqa: E402
from methods.engine.core import sdpa_backend, sdpa_choice  # noqa: E402
from methods.engine.ops import sync  # noqa: E402
from methods.sampling import Sampler, Sampling  # noqa: E402

EXAMPLES = ROOT / "data/cache/gpu_check"  # what a method's example needs on disk (REST's datastore of PROMPTS)
# Beyond every registered method with its example settings (methods.base.Proposer.example): settings that take
# another path through the shared code.
VARIANTS = [("sam_tr", {"merge": True, "threshold": 2})]  # chain and tree verified as one tree
PROMPTS = [[5, 900, 17, 33, 4, 900, 17, 33, 4, 900, 17], list(range(1000, 1040)) + [1000, 1001, 1002]]
NEW_TOKENS = 48  # per prompt (--cpu: 16)
VOCAB = None  # the random models' vocabulary: their shape's own (--cpu: 8192; Llama-3's 128k took half the dry run)
PAPER_NODES = 81  # the paper tree's 80 drafts and the root
ACCEPT = ROOT / "data" / "trees" / "grown-n80-d6.json"  # its "source" holds the embedded model's acceptance table


class Check:
    """Steps in order, each timed and caught; a step that would start past the budget is skipped."""

    def __init__(self, out: Path, budget: float, device: torch.device):
        self.out, self.deadline, self.device = out, time.monotonic() + budget, device
        self.results: dict[str, str] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, fn, *args) -> None:
        if self.left() < 5:
            print(f"\n== {name}: SKIPPED (out of time)")
            self.results[name] = "skipped"
            return
        print(f"\n== {name} ({self.left():.0f} s left)", flush=True)
        t = time.monotonic()
        try:
            verdict = fn(self, *args) or "ok"
        except Exception:
            traceback.print_exc(file=sys.stdout)
            verdict = "FAILED (exception)"
        self.results[name] = f"{verdict} in {time.monotonic() - t:.0f} s"
        print(f"-- {name}: {self.results[name]}", flush=True)

    def csv(self, name: str, rows: list[dict]) -> None:
        if not rows:
            return
        path = self.out / name
        new = not path.exists()
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            if new:
                w.writeheader()
            w.writerows(rows)


def timed(fn, device, repeats: int) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` runs after one untimed run."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times)


def attention(check: Check, dtype) -> str:
    import torch.nn.functional as F

    dev, rows = check.device, []
    n, span, head_dim = 64, 1536, 128
    for heads, kv_heads in ((32, 32), (32, 8)):
        q = torch.randn(1, heads, n, head_dim, dtype=dtype, device=dev)
        k = torch.randn(1, kv_heads, span, head_dim, dtype=dtype, device=dev)
        v = torch.randn_like(k)
        mask = torch.ones(n, span, dtype=torch.bool, device=dev).tril(span - n)
        group = heads // kv_heads
        cases = [("bool mask", "none" if group == 1 else "enable_gqa", k, v, mask)]
        if group > 1:
            cases.append(("bool mask", "expanded", k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), mask))
            cases.append(("no mask", "enable_gqa", k, v, None))
        for mask_kind, gqa, kk, vv, m in cases:
            use_gqa = kk.shape[1] != heads
            backend = sdpa_choice(q, kk, vv, m)
            ms = timed(lambda: F.scaled_dot_product_attention(q, kk, vv, attn_mask=m, enable_gqa=use_gqa), dev, 20)
            rows.append({"dtype": str(dtype).removeprefix("torch."), "heads": heads, "kv_heads": kv_heads,
                         "queries": n, "keys": span, "mask": mask_kind, "gqa": gqa, "backend": backend,
                         "ms": round(ms, 4)})
            print(f"heads {heads}/{kv_heads}  {mask_kind:9s}  gqa {gqa:10s}  {backend:20s}  {ms:8.4f} ms")
    for kind in ("llama-3 (GQA)", "vicuna (MHA)"):
        kv_heads = 8 if kind.startswith("llama") else 32
        for expand in (False, True):
            print(f"engine choice for {kind}, expand_kv={expand}: {sdpa_backend(32, kv_heads, 128, dtype, dev, expand)}")
    check.csv("attention.csv", rows)
    math_with_gqa = [r for r in rows if r["gqa"] == "enable_gqa" and r["mask"] == "bool mask" and r["backend"] == "MATH"]
    return "ok" + (" (enable_gqa with a mask takes MATH here: the engine expands)" if math_with_gqa else "")


def first_divergence(got: list[int], ref: list[int]) -> int | None:
    """The first position where ``got`` and ``ref`` differ (or where the shorter ends); None when equal."""
    return next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b),
                None if len(got) == len(ref) else min(len(got), len(ref)))


def cases(only=None) -> list[tuple[str, dict, int]]:
    """(method, parameters, layers of the random model) for every registered method (its example settings, on a
    model of at least its ``min_layers``), then ``VARIANTS``; ``only``: those methods alone."""
    table = registry()
    out = [(name, cls.example(EXAMPLES, PROMPTS), max(2, cls.min_layers)) for name, cls in table.items()]
    out += [(name, params, max(2, table[name].min_layers)) for name, params in VARIANTS]
    return [c for c in out if only is None or c[0] in only]


def references(arch: str, device, layers: int = 2) -> tuple:
    """A tiny random model of ``arch`` on ``device`` (fp32) and CPU greedy's tokens for every prompt."""
    cpu = tiny(arch, layers)
    refs = [cpu.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(p):].tolist()
            for p in PROMPTS]
    return tiny(arch, layers, device), refs


# Gemma 3 at its tiny size: one sliding-window layer (a window of 16 positions, which the answers outgrow) before a
# global one, and an untied head (tied, its argmax follows the embeddings and would not notice a wrong window).
ARCH_OVERRIDES = {"gemma3-270m": lambda layers: dict(
    sliding_window=16, tie_word_embeddings=False, layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"])}


def tiny(arch: str, layers: int, device="cpu"):
    """The random model of steps 2, 2b and 3: ``arch`` at its tiny size with ``layers`` layers, in fp32, the same
    weights on every device (one seed)."""
    extra = ARCH_OVERRIDES[arch](layers) if arch in ARCH_OVERRIDES else {}
    return random_model(arch, small=True, num_hidden_layers=layers, device=device,
                        **({"vocab_size": VOCAB} if VOCAB else {}), **extra)


def run_row(arch: str, model, engine, name: str, params: dict, i: int, ref: list[int], dtype, dev) -> dict:
    """``name`` on prompt ``i`` against CPU greedy's ``ref``: its row of methods.csv (a divergence classified
    as a near-tie of the model or a real mismatch; fp32 must be equal)."""
    prompt = PROMPTS[i]
    p = build_proposer(name, params, vocab_size=model.config.vocab_size, device=dev, target=model)
    gen = generate(engine, p, prompt, max_new_tokens=NEW_TOKENS, stop_ids=set())
    pos = first_divergence(gen.token_ids, ref)
    kind, why = "", ""
    if pos is not None and pos < min(len(gen.token_ids), len(ref)):
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + ref[:pos]], device=dev), logits_to_keep=1).logits[0, -1]
        kind, why = classify(logits, ref[pos], gen.token_ids[pos], dtype)
    ok = pos is None if dtype == torch.float32 else kind != "real mismatch"
    return {"arch": arch, "dtype": str(dtype).removeprefix("torch."), "engine": engine.name, "method": name,
            "prompt": i, "equal": pos is None, "first_divergence": "" if pos is None else pos, "kind": kind,
            "mat": round(len(gen.token_ids) / len(gen.accept_lengths), 3), "ok": ok, "why": why}


def methods(check: Check, archs, half_archs=None, only=None) -> str:
    """Every case (``cases``) on both engines, in fp32 (equal to CPU greedy) and fp16 (divergences classified) on
    ``archs`` (fp16: on ``half_archs`` only, when given)."""
    dev, rows, todo = check.device, [], cases(only)
    for arch in archs:
        for layers in sorted({c[2] for c in todo}):
            model, refs = references(arch, dev, layers)
            group = [c for c in todo if c[2] == layers]
            label = arch if layers == 2 else f"{arch} ({layers} layers)"
            for dtype in (torch.float32, torch.float16):
                if dtype == torch.float16 and half_archs is not None and arch not in half_archs:
                    continue
                model = model.to(dtype)
                for engine in (HFEngine(model), StaticEngine(model)):
                    for name, params, _ in group:
                        for i, ref in enumerate(refs):
                            if check.left() < 10:
                                check.csv("methods.csv", rows)
                                return f"FAILED: out of time after {len(rows)} runs"
                            rows.append(run_row(label, model, engine, name, params, i, ref, dtype, dev))
                            if not rows[-1]["equal"]:
                                r = rows[-1]
                                print(f"{label} {r['dtype']} {engine.name} {name} prompt {i}: diverges at "
                                      f"{r['first_divergence']}: {r['kind'] or 'fp32 mismatch'} ({r['why']})")
                    done = rows[-len(group) * len(PROMPTS):]
                    mats = ", ".join(f"{r['method']} {r['mat']}" for r in done[::len(PROMPTS)])
                    print(f"{label} {done[0]['dtype']} {engine.name}: {sum(r['equal'] for r in done)}/{len(done)} "
                          f"identical to CPU greedy; MAT (prompt 0): {mats}")
    check.csv("methods.csv", rows)
    bad = sum(not r["ok"] for r in rows)
    return f"FAILED: {bad} of {len(rows)} runs" if bad else f"ok: {len(rows)} runs as required"


def sampled(check: Check, arch: str, only=None) -> str:
    """Every case at temperature 1 on the device equals vanilla sampling there, token for token."""
    settings, dev, rows, todo = Sampling(temperature=1.0, top_p=0.95, seed=1), check.device, [], cases(only)

    def run(m, engine, name, params, i, prompt):
        p = build_proposer(name, params, vocab_size=m.config.vocab_size, device=engine.device, target=m)
        return generate(engine, p, prompt, max_new_tokens=NEW_TOKENS, stop_ids=set(),
                        sampler=Sampler(settings, i, 0)).token_ids

    for layers in sorted({c[2] for c in todo}):
        cpu_model, model = tiny(arch, layers), tiny(arch, layers, dev)
        engine, cpu_engine = StaticEngine(model), StaticEngine(cpu_model)
        group = [c for c in todo if c[2] == layers]
        for i, prompt in enumerate(PROMPTS):
            ref = run(model, engine, "vanilla", {}, i, prompt)
            same_cpu = first_divergence(ref, run(cpu_model, cpu_engine, "vanilla", {}, i, prompt)) is None
            for name, params, _ in group:
                if check.left() < 10:
                    check.csv("sampling.csv", rows)
                    return f"FAILED: out of time after {len(rows)} runs"
                got = run(model, engine, name, params, i, prompt)
                pos = first_divergence(got, ref)
                rows.append({"arch": arch, "layers": layers, "method": name, "prompt": i, "equal": pos is None,
                             "first_divergence": "" if pos is None else pos, "vanilla_equals_cpu": same_cpu})
                if pos is not None:
                    print(f"{arch} sampled {name} prompt {i}: diverges from vanilla sampling at {pos}")
    check.csv("sampling.csv", rows)
    bad = sum(not r["equal"] for r in rows)
    print(f"{arch} sampled: {len(rows) - bad}/{len(rows)} equal to vanilla sampling on {dev}; vanilla's samples "
          f"equal the CPU's for {sum(r['vanilla_equals_cpu'] for r in rows)}/{len(rows)} runs")
    return f"FAILED: {bad} of {len(rows)} runs" if bad else f"ok: {len(rows)} runs as required"


def compiled(check: Check, arch: str) -> str:
    """Vanilla (1 node) and TR with a 6-node tree: two step sizes, compiled before decoding, then decoded."""
    model, refs = references(arch, check.device)
    mode = "reduce-overhead" if check.device.type == "cuda" else "default"
    engine = StaticEngine(model, compile=True, mode=mode)
    tree = check.out / "six-node-tree.json"
    tree.write_text(json.dumps({"parents": [-1, 0, 0, 1, 1, 2]}))
    rows = []
    try:
        for name, params in (("vanilla", {}), ("tr", {"tree": str(tree)})):
            p = build_proposer(name, params, vocab_size=model.config.vocab_size, device=check.device, target=model)
            engine.prepare(p.step_sizes())
            for i, (prompt, ref) in enumerate(zip(PROMPTS, refs)):
                gen = generate(engine, p, prompt, max_new_tokens=NEW_TOKENS, stop_ids=set())
                pos = first_divergence(gen.token_ids, ref)
                rows.append({"arch": arch, "dtype": "float32", "engine": f"static-compiled ({mode})", "method": name,
                             "prompt": i, "equal": pos is None, "first_divergence": "" if pos is None else pos,
                             "kind": "", "mat": round(len(gen.token_ids) / len(gen.accept_lengths), 3),
                             "ok": pos is None, "why": ""})
    finally:
        tree.unlink()
    info = engine.summary()["compiled"]
    print(f"{arch}: graphs {info['graphs']} compiled in {info['seconds']} s before decoding; compiled while "
          f"decoding: {info['compiled_while_timed'] or 'none'}; {sum(r['equal'] for r in rows)}/{len(rows)} "
          f"identical to CPU greedy")
    check.csv("methods.csv", rows)
    bad = sum(not r["ok"] for r in rows)
    if bad or info["compiled_while_timed"]:
        return f"FAILED: {bad} of {len(rows)} runs differ; compiled while decoding: {info['compiled_while_timed']}"
    return f"ok: {len(rows)} runs as required"


def cost(check: Check, shapes, small: bool, sizes, contexts, repeats: int, mat: float) -> str:
    dev, dtype = check.device, torch.float16
    accept = json.loads(ACCEPT.read_text())["source"]["accept"]  # the embedded model's: a stand-in for Vicuna's
    for shape in shapes:
        if check.left() < 30:
            print(f"{shape}: skipped (out of time)")
            continue
        t = time.monotonic()
        model = random_model(shape, small=small, dtype=dtype, device=dev)
        print(f"{shape}: random fp16 model built in {time.monotonic() - t:.1f} s")
        for engine in (StaticEngine(model), HFEngine(model)):
            if check.left() < 20:
                print(f"{shape} {engine.name}: skipped (out of time)")
                continue
            rows = measure_cost(engine, sizes, contexts, repeats)
            for r in rows:
                r.update(shape=shape, engine=engine.name, dtype="float16")
            check.csv("cost.csv", [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                                   for r in rows])
            for c in contexts:
                line = "  ".join(f"{r['tokens']}:{r['ms']:.2f}" for r in rows if r["context"] == c)
                print(f"{shape} {engine.name} after {c} cached, ms per step by tokens: {line}")
            curve = cost_curve([r for r in rows if r["context"] == contexts[0]])
            if max(curve) >= PAPER_NODES:
                paper = curve[PAPER_NODES] / curve[1]
                auto = choose_tree(accept, curve, 8)
                print(f"{shape} {engine.name}: paper tree costs {paper:.2f} plain steps -> projected TR speedup "
                      f"{mat / paper:.2f}x at MAT {mat}; tree=auto would take {auto['drafts']} drafts, expected "
                      f"{auto['expected_speedup']:.2f}x (embedded model's acceptance)")
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return "ok"


def batch_cost(check: Check, shape: str, small: bool, batches, sizes, context: int, repeats: int, mat: float) -> str:
    """Step 5: one static-engine forward verifying B rows of N tokens each (a star tree per row, each row after its
    own ``context`` cached tokens), and per B the projection of step 4 from that B's cost curve: the paper tree at
    ``mat`` and tree=auto's choice (each row gains E(n) tokens per forward, vanilla's one token at c(B, 1))."""
    dev = check.device
    if check.left() < 30:  # as step 4: not enough left to build the model and measure
        return "skipped (out of time)"
    accept = json.loads(ACCEPT.read_text())["source"]["accept"]
    t = time.monotonic()
    model = random_model(shape, small=small, dtype=torch.float16, device=dev)
    engine = StaticEngine(model)
    print(f"{shape}: random fp16 model built in {time.monotonic() - t:.1f} s; ms per forward of B rows x N tokens "
          f"after {context} cached per row, and TR's projected speedup (paper tree at MAT {mat}; tree=auto)")
    print(f"{'B':>4} " + "".join(f"{n:>9}" for n in sizes) + f"{'paper':>8}{'auto':>7}  auto drafts")
    rows = []
    for b in batches:
        if check.left() < 20:
            print(f"B = {b} and larger: skipped (out of time)")
            break
        measured = measure_cost(engine, sizes, [context], repeats, rows=b)
        curve = cost_curve(measured)
        paper = round(mat * curve[1] / curve[PAPER_NODES], 3) if max(curve) >= PAPER_NODES else ""
        auto = choose_tree(accept, curve, 8)
        rows += [{"batch": b, "nodes": r["tokens"], "tokens_per_forward": b * r["tokens"], "ms": round(r["ms"], 4),
                  "ms_min": round(r["ms_min"], 4), "paper_speedup": paper, "auto_drafts": auto["drafts"],
                  "auto_speedup": round(auto["expected_speedup"], 3)} for r in measured]
        print(f"{b:>4} " + "".join(f"{r['ms']:>9.2f}" for r in measured) + (f"{paper:>8.2f}" if paper else f"{'-':>8}")
              + f"{auto['expected_speedup']:>7.2f}  {auto['drafts']}", flush=True)
    check.csv("batch_cost.csv", rows)
    del engine, model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    done = len({r["batch"] for r in rows})
    return "ok" if done == len(batches) else f"ok ({done} of {len(batches)} batch sizes: out of time)"


def environment(device: torch.device) -> dict:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": str(device), "cpu": platform.processor() or platform.machine(),
           "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, memory_gib=round(props.total_memory / 2 ** 30, 1),
                   capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda)
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/gpu", help="folder for the log and the CSVs")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for all steps together")
    ap.add_argument("--mat", type=float, default=2.70, help="TR's MAT with the paper tree, for the projection")
    ap.add_argument("--cpu", action="store_true", help="a dry run on the CPU with tiny shapes")
    args = ap.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device here: run with --cpu for a dry run")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for f in ("gpu_check.log", "attention.csv", "methods.csv", "sampling.csv", "cost.csv", "batch_cost.csv"):
        (out / f).unlink(missing_ok=True)
    log = open(out / "gpu_check.log", "w", buffering=1)  # line by line: a hard timeout keeps what was said
    sys.stdout = Tee(sys.__stdout__, log)
    device = torch.device("cpu" if args.cpu else "cuda")
    if args.cpu:
        global NEW_TOKENS, VOCAB
        NEW_TOKENS, VOCAB = 16, 8192
    print(f"gpu_check {'(dry run on the CPU) ' if args.cpu else ''}{json.dumps(environment(device))}")
    check = Check(out, args.budget, device)
    archs = ["llama-3-8b-instruct", "vicuna-7b", "qwen3-8b", "gemma3-270m"]  # step 2: Llama, Qwen3, Gemma 3
    check.run("1 attention kernels (fp16)", attention, torch.float16 if not args.cpu else torch.float32)
    # the dry run takes fp16's path (emulated on a CPU, and slow) on the first architecture only
    check.run("2 methods, fp32 = CPU greedy; fp16 divergences classified", methods, archs,
              archs[:1] if args.cpu else None)
    check.run("2b sampling at T=1: every method = vanilla sampling", sampled, archs[0])
    check.run("3 compiled steps" + (" with CUDA graphs" if device.type == "cuda" else ""), compiled, archs[0])
    if args.cpu:
        check.run("4 cost curves (tiny shapes)", cost, ["vicuna-7b", "llama-3-8b-instruct"], True,
                  [1, 4, 16, 81], [64, 128], 2, args.mat)
    else:
        check.run("4 cost curves (fp16, random Vicuna-7B and Llama-3-8B)", cost, ["vicuna-7b", "llama-3-8b-instruct"],
                  False, [1, 2, 4, 8, 16, 32, 48, 64, 81, 96, 128], [512, 1536], 10, args.mat)
    if args.cpu:
        check.run("5 batched cost (tiny shapes)", batch_cost, "vicuna-7b", True, [1, 2], [1, 4, PAPER_NODES], 64, 2,
                  args.mat)
    else:
        check.run("5 batched cost (fp16, random Vicuna-7B, B rows x N tokens)", batch_cost, "vicuna-7b", False,
                  [1, 4, 16, 64], [1, 8, 32, PAPER_NODES], 512, 10, args.mat)
    print("\n== summary")
    for name, verdict in check.results.items():
        print(f"{name}: {verdict}")
    sys.stdout = sys.__stdout__
    log.close()
    return 0 if all(v.startswith("ok") for v in check.results.values()) else 1


class Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)

    def flush(self):
        for s in self.streams:
            s.flush()


if __name__ == "__main__":
    sys.exit(main())
