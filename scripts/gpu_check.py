"""The prepared CUDA check: what a lent GPU must show, within its minutes, steps ordered by value.

    python -m scripts.gpu_check [--out DIR] [--budget SECONDS] [--steps a,b,...] [--mat 2.70] [--cpu]

A lent GPU machine is bare (its own torch and transformers; no network) and gives a session about 15 minutes, its
start included, so this check keeps to ``--budget`` (default 360 s), prints each step's expected seconds on an H200
before it starts, goes on past a failing step, and writes its log and one CSV per step. Steps, by value:

1. ``kernels``: the copy bandwidth (the floor of a step: the weights read once, ``floor_ms``) and which attention
   kernel runs a tree step in fp16 (GQA passed as ``enable_gqa``, expanded, or folded as the static engine does).
2. ``cost`` (``cost.csv``): ms per verification step of N = 1, 8, 32, 81, 128 tokens after 512, 1k, 4k and 16k cached
   ones on random Vicuna-7B (fp16) and Llama-3.1-8B (bf16) models, on the static engine eager and with CUDA
   graphs (``engine.compile``) and on the hf engine; each against the floor, the issue's goals checked (vanilla's
   step within 1.5x the floor, the paper tree's 81 tokens within 1.3x vanilla's step, 16k within 1.3x of 512),
   and TR's projected speedup (``--mat``, default the paper's Vicuna-7B MAT 2.70) per engine.
3. ``batch`` (``batch_cost.csv``): one eager forward verifying B = 1, 4, 16, 64 rows of N = 1, 8, 32, 81 tokens
   after 512 cached ones per row (random Vicuna-7B), and per B the paper tree's, tree=auto's and ``budget=auto``'s
   projections for TR (``methods.budget`` cutting every row's paper tree with this table as its cost and the
   embedded model's acceptance table as its odds: the cost model the controller reads on this device) and for
   EAGLE-2 with ``budget=auto`` (its 60-node tree under odds fitted to its published MAT, the head's forwards
   counted: ``eagle2_odds``, ``eagle2_projection``).
4. ``lossless`` (``methods.csv``): every registered method (its ``example()`` settings: random heads, a one-layer
   drafter) on tiny random models built on the CPU and moved (``tiny``), against transformers' greedy
   ``generate`` on the CPU in fp32: Llama-3 in fp32 on the static engine with CUDA graphs, eager and the hf engine,
   Gemma 3 in fp32 with graphs, Llama-3 in fp16 with graphs (each first divergence classified: a near-tie of the
   fp16 model, or a real mismatch), then Vicuna and Qwen3 in fp32 as time allows.
5. ``sampling`` (``sampling.csv``): every method at temperature 1 (top-p 0.95) with CUDA graphs, token-identical to
   vanilla sampling on the device, and whether vanilla's samples there equal the CPU's.
6. ``decode`` (``decode.csv``): the side-by-side bench (the runner, its answer files and summaries) on a random
   Vicuna-7B-shaped model saved to disk with the embedded model's tokenizer (its vocabulary: 49,152): vanilla,
   TR (paper tree, and tree=auto from this device's cost curve), PLD and EAGLE-2 (random head) with CUDA graphs,
   vanilla and TR also eager, 256 new tokens: tokens/s, ms per step, tokens identical to eager vanilla's. Needs hydra-core, omegaconf
   and fschat (carried as wheels: scripts/README.md).
7. ``inductor`` (``methods.csv``): torch.compile with ``reduce-overhead`` for two step sizes on a tiny Llama-3.

``--cpu`` is a dry run of every step on the CPU with tiny shapes (the tests run it): the CUDA graphs' static-shape
step then runs eagerly (nothing to record).
"""
from __future__ import annotations

import argparse
import csv
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file, too
    sys.path.insert(0, str(ROOT))

from evaluation.records.equality import classify  # noqa: E402
from methods.autotree import choose_tree, cost_curve, measure_cost  # noqa: E402
from methods.base import build_proposer, registry  # noqa: E402
from methods.budget import Cost, Offer, choose  # noqa: E402
from methods.calibrate import SHIPPED, calibration_name  # noqa: E402
from methods.common import CACHE  # noqa: E402
from methods.decode import generate  # noqa: E402
from methods.engine import HFEngine, StaticEngine  # noqa: E402
from methods.engine.core import sdpa_backend, sdpa_choice  # noqa: E402
from methods.engine.ops import sync  # noqa: E402
from methods.sampling import Sampler, Sampling  # noqa: E402
from methods.tree import Tree, grow_tree, load_template  # noqa: E402
from scripts.shapes import random_model  # noqa: E402

EXAMPLES = ROOT / "data/cache/gpu_check"  # what a method's example needs on disk (REST's datastore of PROMPTS)
# Beyond every registered method with its example settings (methods.base.Proposer.example): settings that take
# another path through the shared code.
VARIANTS = [("sam_tr", {"merge": True, "threshold": 2})]  # chain and tree verified as one tree
PROMPTS = [[5, 900, 17, 33, 4, 900, 17, 33, 4, 900, 17], list(range(1000, 1040)) + [1000, 1001, 1002]]
NEW_TOKENS = 48  # per prompt (--cpu: 16)
VOCAB = None  # the tiny models' vocabulary: their shape's own (--cpu: 8192; Llama-3's 128k took half the dry run)
PAPER_NODES = 81  # the paper tree's 80 drafts and the root
ACCEPT = ROOT / "data" / "trees" / "grown-n80-d6.json"  # its "source" holds the embedded model's acceptance table
# EAGLE-2's mean accepted tokens per step on Vicuna-7B-v1.3, greedy, fp16 (hemingkx/Spec-Bench, Leaderboard.md at
# 09244ff, its RTX 3090 table: 4.36): what the projection's stand-in for a real head's odds is fitted to (eagle2_odds)
EAGLE2_MAT = 4.36
EAGLE2_TREE = dict(total=60, depth=6, topk=10)  # EAGLE-2's reference settings (total_token 60, drafts to depth 6)
TOKENIZER = ROOT / "data/cache/models/smollm2-135m"  # the decode step's tokenizer (set-up makes it; carry it)
ENGINES = {"static-graphs": dict(compile="graphs"), "static": dict(compile=False), "hf": None}
REFERENCE = "transformers' greedy generate on the CPU in fp32"
# Expected seconds on an H200 (the first lent run's figures scaled to this plan); the dry run's are much smaller.
EXPECTED = {"kernels": 5, "cost": 100, "batch": 25, "lossless": 75, "sampling": 20, "decode": 105, "inductor": 30}


class Check:
    """Steps in order, each timed and caught; a step that would start past the budget is skipped."""

    def __init__(self, out: Path, budget: float, device: torch.device):
        self.out, self.deadline, self.device = out, time.monotonic() + budget, device
        self.cpu = device.type == "cpu"
        self.results: dict[str, str] = {}
        self.bandwidth: float | None = None  # bytes/s of a device-to-device copy, read and write counted

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, fn, *args) -> None:
        expected = EXPECTED.get(name, 0)
        if self.left() < 5:
            print(f"\n== {name}: SKIPPED (out of time; expected {expected} s on an H200)")
            self.results[name] = "skipped (out of time)"
            return
        print(f"\n== {name}: expected {expected} s on an H200 ({self.left():.0f} s left)", flush=True)
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


def bandwidth(device, nbytes: int) -> float:
    """Bytes per second of a device-to-device copy of ``nbytes``, the bytes read and written both counted."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    return 2 * nbytes / (timed(lambda: b.copy_(a), device, 10) / 1000)


def kernels(check: Check) -> str:
    import torch.nn.functional as F

    dev, rows = check.device, []
    dtype = torch.float32 if check.cpu else torch.float16
    check.bandwidth = bandwidth(dev, 2 ** 24 if check.cpu else 2 ** 31)
    print(f"copy bandwidth {check.bandwidth / 1e12:.2f} TB/s (read + write)")
    n, span, head_dim = 64, 1536, 128
    for heads, kv_heads in ((32, 32), (32, 8)):
        q = torch.randn(1, heads, n, head_dim, dtype=dtype, device=dev)
        k = torch.randn(1, kv_heads, span, head_dim, dtype=dtype, device=dev)
        mask = torch.ones(n, span, dtype=torch.bool, device=dev).tril(span - n)
        group = heads // kv_heads
        cases = [("none" if group == 1 else "enable_gqa", q, k, mask)]
        if group > 1:
            cases.append(("expanded", q, k.repeat_interleave(group, 1), mask))
            cases.append(("folded", q.reshape(1, kv_heads, group * n, head_dim), k, mask.repeat(group, 1)))
        for gqa, qq, kk, m in cases:
            backend = sdpa_choice(qq, kk, kk, m)
            ms = timed(lambda: F.scaled_dot_product_attention(qq, kk, kk, attn_mask=m, enable_gqa=gqa == "enable_gqa"),
                       dev, 20)
            rows.append({"dtype": str(dtype).removeprefix("torch."), "heads": heads, "kv_heads": kv_heads,
                         "queries": n, "keys": span, "gqa": gqa, "backend": backend, "ms": round(ms, 4)})
            print(f"heads {heads}/{kv_heads}  gqa {gqa:10s}  {backend:20s}  {ms:8.4f} ms")
    for engine in (StaticEngine, HFEngine):
        gqa = "folded" if engine is StaticEngine and not check.cpu else engine.gqa
        print(f"engine {engine.name} on Llama-3's heads: {sdpa_backend(32, 8, 128, dtype, dev, gqa)}")
    check.csv("kernels.csv", rows)
    return "ok"


# ---- losslessness and sampling on tiny random models -------------------------------------------------------------

def cases(only=None) -> list[tuple[str, dict, int]]:
    """(method, parameters, layers of the random model) for every registered method (its example settings, on a
    model of at least its ``min_layers``), then ``VARIANTS``; ``only``: those methods alone."""
    table = registry()
    out = [(name, cls.example(EXAMPLES, PROMPTS), max(2, cls.min_layers)) for name, cls in table.items()]
    out += [(name, params, max(2, table[name].min_layers)) for name, params in VARIANTS]
    return [c for c in out if only is None or c[0] in only]


# Gemma 3 at its tiny size: one sliding-window layer (a window of 16 positions, which the answers outgrow) before a
# global one, and an untied head (tied, its argmax follows the embeddings and would not notice a wrong window).
ARCH_OVERRIDES = {"gemma3-270m": lambda layers: dict(
    sliding_window=16, tie_word_embeddings=False, layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"])}


def tiny(arch: str, layers: int, device="cpu", dtype=torch.float32):
    """The random model of the lossless and sampling steps: ``arch`` at its tiny size with ``layers`` layers, built
    on the CPU in fp32 (whatever torch's default device and dtype) and then moved, so that every device gets the
    same weights: a CUDA generator draws other numbers than the CPU's for the same seed."""
    extra = ARCH_OVERRIDES[arch](layers) if arch in ARCH_OVERRIDES else {}
    model = random_model(arch, small=True, num_hidden_layers=layers, device="cpu", dtype=torch.float32,
                         **({"vocab_size": VOCAB} if VOCAB else {}), **extra)
    return model.to(device=device, dtype=dtype)


def references(arch: str, layers: int) -> list[list[int]]:
    """The reference tokens for every prompt: ``REFERENCE``."""
    cpu = tiny(arch, layers)
    return [cpu.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(p):].tolist()
            for p in PROMPTS]


def engine_for(name: str, model, prepare_span: int | None = None):
    """Engine ``name`` of ``ENGINES`` for ``model``; ``prepare_span``: the longest span its graphs are prepared for
    (the tiny models' sequences are short: one bucket, not the eight of a run)."""
    if ENGINES[name] is None:
        return HFEngine(model)
    engine = StaticEngine(model, **ENGINES[name])
    engine.prepare_span = prepare_span or engine.prepare_span
    return engine


def first_divergence(got: list[int], ref: list[int]) -> int | None:
    """The first position where ``got`` and ``ref`` differ (or where the shorter ends); None when equal."""
    return next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b),
                None if len(got) == len(ref) else min(len(got), len(ref)))


def run_row(label: str, model, engine, engine_name: str, name: str, params: dict, i: int, ref: list[int],
            dtype) -> dict:
    """``name`` on prompt ``i`` against ``ref`` (``REFERENCE``): its row of methods.csv (a divergence classified
    as a near-tie of the model or a real mismatch; fp32 must be equal)."""
    prompt, dev = PROMPTS[i], engine.device
    p = build_proposer(name, params, vocab_size=model.config.vocab_size, device=dev, target=model)
    engine.prepare(p.step_sizes())
    gen = generate(engine, p, prompt, max_new_tokens=NEW_TOKENS, stop_ids=set())
    pos = first_divergence(gen.token_ids, ref)
    kind, why = "", ""
    if pos is not None and pos < min(len(gen.token_ids), len(ref)):
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + ref[:pos]], device=dev), logits_to_keep=1).logits[0, -1]
        kind, why = classify(logits, ref[pos], gen.token_ids[pos], dtype)
    ok = pos is None if dtype == torch.float32 else kind != "real mismatch"
    return {"arch": label, "dtype": str(dtype).removeprefix("torch."), "engine": engine_name, "method": name,
            "prompt": i, "reference": "cpu greedy", "equal": pos is None,
            "first_divergence": "" if pos is None else pos, "kind": kind,
            "mat": round(len(gen.token_ids) / len(gen.accept_lengths), 3), "ok": ok, "why": why}


def verdict(rows: list[dict], what: str) -> str:
    """The step's verdict: how many runs are as required; a run in which every case fails at token 0 blames the
    reference and the device model (built differently), not hundreds of methods."""
    bad = [r for r in rows if not r["ok"]]
    if rows and len(bad) == len(rows) and all(str(r["first_divergence"]) == "0" for r in bad):
        return ("FAILED: every run diverges at token 0: the reference and the device model differ (how were they "
                "built?), not the methods")
    return f"FAILED: {len(bad)} of {len(rows)} runs differ from {what}" if bad else \
        f"ok: {len(rows)} runs as required against {what}"


def lossless(check: Check, plan: list[tuple[str, torch.dtype, list[str], int]], only=None) -> str:
    """Every case (``cases``) for each (architecture, dtype, engines, prompts) of ``plan``, against ``REFERENCE``;
    fp32 must be equal, a reduced-precision divergence a near-tie."""
    rows, todo, shown = [], cases(only), 0
    print(f"reference: {REFERENCE}; every model built on the CPU and moved to {check.device}")
    for arch, dtype, engines, prompts in plan:
        for layers in sorted({c[2] for c in todo}):
            label = arch if layers == 2 else f"{arch} ({layers} layers)"
            refs = references(arch, layers)[:prompts]
            model = tiny(arch, layers, check.device, dtype)
            group = [c for c in todo if c[2] == layers]
            for engine_name in engines:
                if check.left() < 10:
                    check.csv("methods.csv", rows)
                    return verdict(rows, REFERENCE) + f" (out of time after {len(rows)} runs)"
                engine = engine_for(engine_name, model, prepare_span=256)
                done = []
                for name, params, _ in group:
                    for i, ref in enumerate(refs):
                        done.append(run_row(label, model, engine, engine_name, name, params, i, ref, dtype))
                        r = done[-1]
                        if not r["equal"] and shown < 10:
                            shown += 1
                            print(f"{label} {r['dtype']} {engine_name} {name} prompt {i}: diverges at "
                                  f"{r['first_divergence']}: {r['kind'] or 'fp32 mismatch'} ({r['why']})")
                rows += done
                mats = ", ".join(f"{r['method']} {r['mat']}" for r in done[::len(refs)])
                print(f"{label} {str(dtype).removeprefix('torch.')} {engine_name}: "
                      f"{sum(r['equal'] for r in done)}/{len(done)} identical to the reference; MAT (prompt 0): {mats}")
    check.csv("methods.csv", rows)
    return verdict(rows, REFERENCE)


def sampled(check: Check, arch: str, engine_name: str = "static-graphs", only=None) -> str:
    """Every case at temperature 1 on the device equals vanilla sampling there, token for token."""
    settings, dev, rows, todo = Sampling(temperature=1.0, top_p=0.95, seed=1), check.device, [], cases(only)

    def run(m, engine, name, params, i, prompt):
        p = build_proposer(name, params, vocab_size=m.config.vocab_size, device=engine.device, target=m)
        engine.prepare(p.step_sizes())
        return generate(engine, p, prompt, max_new_tokens=NEW_TOKENS, stop_ids=set(),
                        sampler=Sampler(settings, i, 0)).token_ids

    for layers in sorted({c[2] for c in todo}):
        cpu_model, model = tiny(arch, layers), tiny(arch, layers, dev)
        engine, cpu_engine = engine_for(engine_name, model, prepare_span=256), StaticEngine(cpu_model)
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
                rows.append({"arch": arch, "layers": layers, "engine": engine_name, "method": name, "prompt": i,
                             "reference": "vanilla sampling on the device", "equal": pos is None,
                             "first_divergence": "" if pos is None else pos, "vanilla_equals_cpu": same_cpu})
                if pos is not None:
                    print(f"{arch} sampled {name} prompt {i}: diverges from vanilla sampling at {pos}")
    check.csv("sampling.csv", rows)
    bad = sum(not r["equal"] for r in rows)
    print(f"{arch} sampled on {engine_name}: {len(rows) - bad}/{len(rows)} equal to vanilla sampling on {dev}; "
          f"vanilla's samples equal the CPU's for {sum(r['vanilla_equals_cpu'] for r in rows)}/{len(rows)} runs")
    return f"FAILED: {bad} of {len(rows)} runs" if bad else f"ok: {len(rows)} runs as required"


def inductor(check: Check, arch: str) -> str:
    """torch.compile (reduce-overhead on CUDA): vanilla (1 node) and TR with a 6-node tree, compiled before
    decoding, then decoded against ``REFERENCE``."""
    refs = references(arch, 2)
    model = tiny(arch, 2, check.device)
    mode = "default" if check.cpu else "reduce-overhead"
    engine = StaticEngine(model, compile=True, mode=mode)
    tree = check.out / "six-node-tree.json"
    tree.write_text(json.dumps({"parents": [-1, 0, 0, 1, 1, 2]}))
    rows = []
    try:
        for name, params in (("vanilla", {}), ("tr", {"tree": str(tree)})):
            for i, ref in enumerate(refs):
                rows.append(run_row(arch, model, engine, f"static-inductor ({mode})", name, params, i, ref,
                                    torch.float32))
    finally:
        tree.unlink()
    info = engine.summary()["compiled"]
    print(f"{arch}: graphs {info['graphs']} compiled in {info['seconds']} s before decoding; compiled while "
          f"decoding: {info['compiled_while_timed'] or 'none'}; {sum(r['equal'] for r in rows)}/{len(rows)} "
          f"identical to the reference")
    check.csv("methods.csv", rows)
    if info["compiled_while_timed"]:
        return f"FAILED: compiled while decoding: {info['compiled_while_timed']}"
    return verdict(rows, REFERENCE)


# ---- what a step costs ---------------------------------------------------------------------------------------------

def weight_bytes(model) -> int:
    """Bytes a step reads of the weights: all but the input embeddings (a step reads a few rows of those), unless
    they are the output head too."""
    embed = model.get_input_embeddings().weight
    tied = embed is model.get_output_embeddings().weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if tied or p is not embed)


def kv_bytes(model) -> int:
    """Bytes of K and V per cached token, all layers."""
    cfg, p = model.config, next(model.parameters())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * p.element_size()


def goals(rows: list[dict], contexts: list[int]) -> list[str]:
    """The issue's three goals for a step near the floor, each with its measured figure."""
    ms = {(r["context"], r["tokens"]): r for r in rows}
    c0, n0 = contexts[0], min(r["tokens"] for r in rows)
    plain = ms[c0, n0]
    out = [f"vanilla's step {plain['ms']:.2f} ms = {plain['x_floor']:.2f}x the floor (goal <= 1.5)"]
    if (c0, PAPER_NODES) in ms:
        out.append(f"paper tree {ms[c0, PAPER_NODES]['ms'] / plain['ms']:.2f}x vanilla's step (goal <= 1.3)")
    worst = max(ms[c, n0]["ms"] for c in contexts) / plain["ms"]
    out.append(f"vanilla's step at {contexts[-1]} cached {ms[contexts[-1], n0]['ms'] / plain['ms']:.2f}x at {c0}, "
               f"the worst context {worst:.2f}x (goal <= 1.3; the KV read alone adds "
               f"{ms[contexts[-1], n0]['floor_kv_ms'] / plain['floor_ms']:.2f}x the weights' floor there)")
    return out


def cost(check: Check, shapes, sizes, contexts, repeats: int, mat: float) -> str:
    """Per shape: ms per step of N tokens after C cached ones on each engine, against the floor."""
    dev = check.device
    if check.bandwidth is None:
        check.bandwidth = bandwidth(dev, 2 ** 24 if check.cpu else 2 ** 31)
    for shape, dtype in shapes:
        if check.left() < 30:
            print(f"{shape}: skipped (out of time)")
            continue
        t = time.monotonic()
        model = random_model(shape, small=check.cpu, dtype=dtype, device=dev)
        floor_s, kv = weight_bytes(model) / check.bandwidth, kv_bytes(model)
        print(f"{shape} {str(dtype).removeprefix('torch.')}: random model built in {time.monotonic() - t:.1f} s; "
              f"floor {1000 * floor_s:.2f} ms (weights {weight_bytes(model) / 1e9:.2f} GB at "
              f"{check.bandwidth / 1e12:.2f} TB/s), KV {kv / 1e3:.0f} kB per cached token")
        for name in ENGINES:
            if check.left() < 20:
                print(f"{shape} {name}: skipped (out of time)")
                continue
            engine = engine_for(name, model)
            rows = measure_cost(engine, sizes, contexts, repeats)
            for r in rows:
                r.update(shape=shape, dtype=str(dtype).removeprefix("torch."), engine=name,
                         floor_ms=1000 * floor_s, floor_kv_ms=1000 * (floor_s + kv * r["context"] / check.bandwidth),
                         x_floor=r["ms"] / (1000 * floor_s))
            check.csv("cost.csv", [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                                   for r in rows])
            for c in contexts:
                line = "  ".join(f"{r['tokens']}:{r['ms']:.2f}" for r in rows if r["context"] == c)
                print(f"{shape} {name} after {c} cached, ms per step by tokens: {line}  "
                      f"(N=1: {next(r['x_floor'] for r in rows if r['context'] == c):.2f}x the floor)")
            curve = cost_curve([r for r in rows if r["context"] == contexts[0]])
            if max(curve) >= PAPER_NODES:
                paper = curve[PAPER_NODES] / curve[1]
                print(f"{shape} {name}: paper tree costs {paper:.2f} plain steps -> projected TR speedup "
                      f"{mat / paper:.2f}x at MAT {mat}")
            if name == "static-graphs":
                summary = engine.summary()
                print(f"{shape} {name}: {summary['step']}, {json.dumps(summary.get('cuda_graphs'))}"
                      + (f"; RECORDING FAILED: {summary['graphs_error']}" if "graphs_error" in summary else ""))
                print("\n".join(f"{shape} goals: {g}" for g in goals(rows, contexts)))
            del engine
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return "ok"


class TableOdds:
    """A draft node's odds from an acceptance table (``p[depth - 1][rank]``), for ``methods.budget.choose``."""

    def __init__(self, accept: list[list[float]]):
        self.accept = accept

    def p(self, depth: int, key: int) -> float:
        row = self.accept[min(depth, len(self.accept)) - 1]
        return row[key] if key < len(row) else 0.0


def tree_offer(tree: Tree) -> Offer:
    """A static tree as the budget sees it (``methods.budget.Offer``): every node acceptable, keyed by its rank."""
    return Offer(tree.parents, tree.depth.tolist(), tree.ranks, [True] * tree.size)


def budget_projection(accept: list[list[float]], measured: list[dict], rows: int, tree: Tree | None = None,
                      drafting: float = 0.0, width: int = 1) -> tuple[float, float]:
    """``runtime.budget=auto`` on ``rows`` rows each drafting ``tree`` (default TR's paper tree), with ``measured``
    (``measure_cost`` at that many rows) as its cost and ``accept`` as its odds, the drafting's time counted:
    ``drafting`` target forwards' worth of ``width`` tokens a row (0: free, TR's). Where the drafts do not pay for it,
    the budget's pause rests the drafting (plain steps: 1.0). (The tokens per second it expects over a plain step's,
    the nodes a row keeps.)"""
    cost = Cost({rows: {r["tokens"]: r["ms_min"] for r in measured}})
    chosen, _ = choose([tree_offer(tree or load_template("paper"))] * rows, TableOdds(accept), cost)
    kept = sum(len(k) for k, _ in chosen)
    drafting_ms = drafting * cost(rows, rows * width) if drafting else 0.0
    speedup = sum(e for _, e in chosen) / (cost(rows, kept) + drafting_ms) / (rows / cost(rows, rows))
    return (speedup, kept / rows) if speedup > 1.0 else (1.0, 1.0)


def eagle2_odds(mat: float = EAGLE2_MAT, total: int = EAGLE2_TREE["total"], depth: int = EAGLE2_TREE["depth"],
                topk: int = EAGLE2_TREE["topk"]) -> tuple[list[list[float]], Tree]:
    """A stand-in for a real EAGLE-2 head's odds, where the check has none (its heads are random): the rank-r node
    accepted given its parent with odds ``a * 2**-r`` at every depth (an assumed fall-off), ``a`` fitted by bisection
    so that EAGLE-2's draft under these odds (the ``total - 1`` nodes of best joint odds, ``grow_tree``, as EAGLE-2
    ranks its dynamic tree's nodes) expects ``mat`` tokens per step. (The table, the tree.)

    >>> accept, tree = eagle2_odds(3.0)
    >>> tree.size, round(1 + sum(tree_offer(tree).values(TableOdds(accept))[1:]), 2)
    (60, 3.0)
    """
    def fit(a: float):
        accept = [[a * 2.0 ** -r for r in range(topk)]] * depth
        tree = grow_tree(accept, total - 1, depth, topk)
        return accept, tree, 1 + sum(tree_offer(tree).values(TableOdds(accept))[1:])

    lo, hi = 0.0, 1.0
    for _ in range(40):
        lo, hi = ((lo + hi) / 2, hi) if fit((lo + hi) / 2)[2] < mat else (lo, (lo + hi) / 2)
    return fit((lo + hi) / 2)[:2]


def head_share(model) -> float:
    """What one forward of an EAGLE head (one decoder layer, its fc and the lm_head) costs against one of ``model``,
    by the weights each reads (a step on a GPU at small batches reads its weights once)."""
    def size(module) -> int:
        return sum(p.numel() for p in module.parameters())

    layer, hidden = model.model.layers[0], model.config.hidden_size
    return (size(layer) + 2 * hidden * hidden + size(model.lm_head)) / size(model)


def eagle2_projection(accept, tree, measured: list[dict], rows: int, share: float) -> tuple[float, float]:
    """``budget_projection`` of EAGLE-2's tree (``eagle2_odds``), its head's ``depth`` forwards of ``topk`` nodes a
    row counted, each ``share`` of a target forward of that size (``head_share``)."""
    return budget_projection(accept, measured, rows, tree, EAGLE2_TREE["depth"] * share, EAGLE2_TREE["topk"])


def batch_cost(check: Check, shape: str, batches, sizes, context: int, repeats: int, mat: float) -> str:
    """One eager static-engine forward verifying B rows of N tokens each (a star tree per row, each row after its
    own ``context`` cached tokens), and per B the paper tree's projection at ``mat`` and tree=auto's choice."""
    dev = check.device
    accept = json.loads(ACCEPT.read_text())["source"]["accept"]
    model = random_model(shape, small=check.cpu, dtype=torch.float32 if check.cpu else torch.float16, device=dev)
    engine = StaticEngine(model, compile=False)
    e2_accept, e2_tree = eagle2_odds()
    share = head_share(model)
    print(f"{shape}: ms per eager forward of B rows x N tokens after {context} cached per row, and projected "
          f"speedups: TR (paper tree at MAT {mat}; tree=auto; budget=auto on the paper tree with the embedded model's "
          f"acceptance), EAGLE-2 + budget=auto (odds fitted to MAT {EAGLE2_MAT}, its head at {share:.3f} of a forward)")
    print(f"{'B':>4} " + "".join(f"{n:>9}" for n in sizes) + f"{'paper':>8}{'auto':>7}{'budget':>8}{'eagle2':>8}  "
          f"auto drafts, budget nodes per row (TR, EAGLE-2)")
    rows = []
    for b in batches:
        if check.left() < 20:
            print(f"B = {b} and larger: skipped (out of time)")
            break
        measured = measure_cost(engine, sizes, [context], repeats, rows=b)
        curve = cost_curve(measured)
        paper = round(mat * curve[1] / curve[PAPER_NODES], 3) if max(curve) >= PAPER_NODES else ""
        auto = choose_tree(accept, curve, 8)
        budget, kept = budget_projection(accept, measured, b)
        e2, e2_kept = eagle2_projection(e2_accept, e2_tree, measured, b, share)
        rows += [{"batch": b, "nodes": r["tokens"], "tokens_per_forward": b * r["tokens"], "ms": round(r["ms"], 4),
                  "ms_min": round(r["ms_min"], 4), "paper_speedup": paper, "auto_drafts": auto["drafts"],
                  "auto_speedup": round(auto["expected_speedup"], 3), "budget_speedup": round(budget, 3),
                  "budget_nodes_per_row": round(kept, 2), "eagle2_budget_speedup": round(e2, 3),
                  "eagle2_budget_nodes_per_row": round(e2_kept, 2), "eagle2_head_share": round(share, 4)}
                 for r in measured]
        print(f"{b:>4} " + "".join(f"{r['ms']:>9.2f}" for r in measured) + (f"{paper:>8.2f}" if paper else f"{'-':>8}")
              + f"{auto['expected_speedup']:>7.2f}{budget:>8.2f}{e2:>8.2f}  {auto['drafts']}, {kept:.1f}, "
              f"{e2_kept:.1f}", flush=True)
    check.csv("batch_cost.csv", rows)
    del engine, model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    done = len({r["batch"] for r in rows})
    return "ok" if done == len(batches) else f"ok ({done} of {len(batches)} batch sizes: out of time)"


# ---- decoding end to end -------------------------------------------------------------------------------------------

DECODE_METHODS = ["method=vanilla", "method=tr", "method=tr method.tree=auto", "method=pld",
                  "method=eagle2 method.head=random"]
EAGER = 2  # the first two also eagerly (vanilla and TR's paper tree: Spec-Bench's way of measuring)


def decode(check: Check, shape: str, new_tokens: int, question: int) -> str:
    """``evaluation.running.side_by_side`` (the runner, its answer files and summaries, as ``scripts.bench_methods``
    runs it) on a random ``shape`` model saved with the embedded model's tokenizer: every ``DECODE_METHODS`` as
    ``engine.compile=auto`` runs it here, the first ``EAGER`` also eagerly, side by side; per method its tokens/s, ms
    per step and MAT, and its tokens against eager vanilla's."""
    try:
        from evaluation.running import side_by_side as sbs
    except ImportError as e:
        return f"skipped: {e} (carry hydra-core, omegaconf, antlr4-python3-runtime and fschat as wheels)"
    from transformers import AutoTokenizer

    if not TOKENIZER.is_dir():
        return f"skipped: no tokenizer at {TOKENIZER} (make setup converts the embedded model; carry that folder)"
    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    dtype = torch.float32 if check.cpu else torch.float16
    with tempfile.TemporaryDirectory() as tmp:
        t = time.monotonic()
        model = random_model(shape, small=check.cpu, dtype=dtype, device=check.device, vocab_size=len(tok),
                             bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        model.save_pretrained(f"{tmp}/model")
        tok.save_pretrained(f"{tmp}/model")
        del model
        print(f"random {shape} (vocabulary {len(tok)}) saved in {time.monotonic() - t:.1f} s")
        # tree=auto: this device's cost curve (measured when the run starts) with the embedded model's acceptance
        # as a stand-in (a random model has none worth calibrating, and calibrating decodes 23k tokens)
        name = f"{shape}-random"
        stand_in = CACHE / "autotree" / calibration_name(name, 8, "hot")
        stand_in.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SHIPPED / calibration_name("smollm2-135m", 8, "hot"), stand_in)
        runs = [f"{m} engine.compile=false" for m in DECODE_METHODS[:EAGER]] + DECODE_METHODS
        common = ["bench=spec_bench_smoke", "warmup=1", "model=vicuna-7b", f"model.name={name}",
                  f"model.checkpoint={tmp}/model", f"bench.max_new_tokens={new_tokens}",
                  f"bench.question_ids=[{question}]"]
        try:
            b = sbs.compose(runs, common, 1)
            sbs.load(b)
            sbs.warm_up(b, 1)
            sbs.decode(b, progress=False)
            sbs.write(b, Path(tmp) / "runs")
            lines, unequal = sbs.check(b, Path(tmp) / "runs")
        finally:
            stand_in.unlink(missing_ok=True)
    print("\n".join(lines))
    rows = []
    for label, recs in b.records.items():
        c = [r["choices"][0] for r in recs]
        tokens, seconds = sum(sum(x["new_tokens"]) for x in c), sum(sum(x["wall_time"]) for x in c)
        steps = sum(sum(x["decoding_steps"]) for x in c)
        after_prefill = steps - sum(sum(x["prefill_step"]) for x in c)
        engine = b.runners[label].engine.summary()
        rows.append({"run": label, "step": engine["step"], "tokens": tokens, "tok_per_s": round(tokens / seconds, 2),
                     "ms_per_step": round(1000 * sum(sum(x["decode_time"]) for x in c) / max(after_prefill, 1), 3),
                     "mat": round(tokens / steps, 3), "graphs": json.dumps(engine.get("cuda_graphs", ""))})
    base = {}
    for r in rows:
        if r["run"].split(",")[0] == "vanilla":
            base.setdefault(r["step"], r["tok_per_s"])
    for r in rows:
        r["speedup_vs_vanilla_same_step"] = round(r["tok_per_s"] / base[r["step"]], 3)
        print(f"{r['run']:45s} {r['step']:12s} {r['tok_per_s']:9.1f} tok/s {r['ms_per_step']:8.2f} ms/step "
              f"MAT {r['mat']:.2f}  {r['speedup_vs_vanilla_same_step']:.2f}x vanilla ({r['step']})")
    check.csv("decode.csv", rows)
    return "ok" if not unequal else f"FAILED: not token-identical to eager vanilla: {unequal}"


# ---- the check -----------------------------------------------------------------------------------------------------

def environment(device: torch.device) -> dict:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": str(device), "cpu": platform.processor() or platform.machine(),
           "cpu_threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, memory_gib=round(props.total_memory / 2 ** 30, 1),
                   capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda)
    return env


def plan(cpu: bool, mat: float) -> list[tuple]:
    """(step, function, arguments) in order of value; the dry run (``cpu``) at tiny sizes."""
    fp32, fp16 = torch.float32, torch.float16
    if cpu:
        shapes, sizes, contexts, repeats = [("vicuna-7b", fp32), ("llama-3.1-8b-instruct", fp32)], [1, 8, 81], \
            [64, 256], 2
        batch = ("vicuna-7b", [1, 2], [1, 4, PAPER_NODES], 64, 2, mat)
        checks = [("llama-3-8b-instruct", fp32, ["static-graphs", "static", "hf"], 1),
                  ("gemma3-270m", fp32, ["static-graphs"], 1), ("llama-3-8b-instruct", fp16, ["static-graphs"], 1)]
        decoding = ("vicuna-7b", 16, 401)
    else:
        shapes, sizes, contexts, repeats = [("vicuna-7b", fp16), ("llama-3.1-8b-instruct", torch.bfloat16)], \
            [1, 8, 32, PAPER_NODES, 128], [512, 1024, 4096, 16384], 8
        batch = ("vicuna-7b", [1, 4, 16, 64], [1, 8, 32, PAPER_NODES], 512, 10, mat)
        checks = [("llama-3-8b-instruct", fp32, ["static-graphs", "static", "hf"], 2),
                  ("gemma3-270m", fp32, ["static-graphs"], 2), ("llama-3-8b-instruct", fp16, ["static-graphs"], 1),
                  ("vicuna-7b", fp32, ["static-graphs"], 1), ("qwen3-8b", fp32, ["static-graphs"], 1)]
        decoding = ("vicuna-7b", 256, 401)
    return [("kernels", kernels, ()), ("cost", cost, (shapes, sizes, contexts, repeats, mat)),
            ("batch", batch_cost, batch), ("lossless", lossless, (checks,)),
            ("sampling", sampled, ("llama-3-8b-instruct",)), ("decode", decode, decoding),
            ("inductor", inductor, ("llama-3-8b-instruct",))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/gpu", help="folder for the log and the CSVs")
    ap.add_argument("--budget", type=float, default=360.0, help="seconds for all steps together")
    ap.add_argument("--steps", default=",".join(EXPECTED), help=f"a subset of {','.join(EXPECTED)}, in that order")
    ap.add_argument("--mat", type=float, default=2.70, help="TR's MAT with the paper tree, for the projection")
    ap.add_argument("--cpu", action="store_true", help="a dry run on the CPU with tiny shapes")
    args = ap.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    if unknown := [s for s in steps if s not in EXPECTED]:
        print(f"unknown step(s) {', '.join(unknown)}; known: {', '.join(EXPECTED)}")
        return 2
    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device here: run with --cpu for a dry run")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for f in ("gpu_check.log", "kernels.csv", "cost.csv", "batch_cost.csv", "methods.csv", "sampling.csv",
              "decode.csv"):
        (out / f).unlink(missing_ok=True)
    log = open(out / "gpu_check.log", "w", buffering=1)  # line by line: a hard timeout keeps what was said
    sys.stdout = Tee(sys.__stdout__, log)
    device = torch.device("cpu" if args.cpu else "cuda")
    if args.cpu:
        global NEW_TOKENS, VOCAB
        NEW_TOKENS, VOCAB = 16, 8192
    print(f"gpu_check {'(dry run on the CPU) ' if args.cpu else ''}{json.dumps(environment(device))}")
    print(f"steps: {', '.join(f'{s} ~{EXPECTED[s]} s' for s in steps)} (on an H200); budget {args.budget:.0f} s")
    check = Check(out, args.budget, device)
    for name, fn, fn_args in plan(args.cpu, args.mat):
        if name in steps:
            check.run(name, fn, *fn_args)
    print("\n== summary")
    for name, result in check.results.items():
        print(f"{name}: {result}")
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

    def isatty(self):  # a log: no progress bars
        return False


if __name__ == "__main__":
    sys.exit(main())
