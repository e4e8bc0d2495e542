"""The report under load (``runtime.batch_size``): runs of vanilla, TR and PLD at batch sizes 1, 2 and 4 with clocks
chosen so that every throughput, speedup and crossover is known; each run is paired with vanilla at its own batch
size, a baseline of another batch size is refused, a report at batch size 1 alone is as it was, and the batch_sweep
experiment composes."""
import json

import pandas as pd
import pytest

from evaluation import report as rp
from evaluation import speed
from evaluation.records.metrics import crossover, load_interval
from evaluation.reporting.render import markdown
from evaluation.reporting.speed_table import speed_table
from evaluation.reporting.tables import crossovers
from tests.test_configs import _compose
from tests.test_report import rec, write_run
from tests.test_trust import _main

QUESTIONS = 4       # of 10 new tokens each: 40 per run
FIRST = 0.1         # seconds to every turn's first token
# Seconds each run spent decoding, per batch size: throughputs 40 tokens over them.
SPANS = {"vanilla": {1: 8.0, 2: 4.0, 4: 2.0},   # 5, 10, 20 tok/s
         "tr": {1: 4.0, 2: 2.5, 4: 4.0},        # 10, 16, 10 tok/s: 2.0x, 1.6x, 0.5x
         "pld": {1: 4.0, 2: 2.0, 4: 1.0}}       # 10, 20, 40 tok/s: 2.0x at every batch size
ACCEPTS = {"vanilla": [1] * 10, "tr": [1, 3, 3, 3], "pld": [1, 4, 5]}
NODES = {"vanilla": 1, "tr": 4, "pld": 5}  # draft nodes of every step after the prefill (no draft: 0)
WIDEST = {"vanilla": 1, "tr": 5, "pld": 5}  # a row's forward width at batch size > 1: TR's rows padded from 4 to 5


def records(method: str, size: int) -> list[dict]:
    """The answers of ``method`` at batch size ``size``: questions in rounds of ``size`` at once, each round taking
    the same share of the run's span, so that its decoding lasts exactly ``SPANS[method][size]`` seconds."""
    turn = SPANS[method][size] / (QUESTIONS // size)
    out = []
    for q in range(QUESTIONS):
        r = rec(q + 1, "qa" if q % 2 else "rag", 10, turn, ACCEPTS[method])
        steps = len(ACCEPTS[method])
        r["choices"][0].update(first_token_time=[FIRST], draft_nodes=[0] + [NODES[method]] * (steps - 1))
        if size > 1:
            r["choices"][0].update(batch_rows=[0] + [size] * (steps - 1),
                                   forward_slots=[0] + [size * WIDEST[method]] * (steps - 1))
        start = (q // size) * turn
        r["clock"] = {"segment": f"{method}-{size}", "turns": [[start, start + turn]], "batch_size": size}
        out.append(r)
    return out


def batch_run(folder, method: str, size: int):
    """A run folder of ``method`` at batch size ``size`` (its config's runtime.batch_size)."""
    write_run(folder, method, records(method, size))
    summary = json.loads((folder / "summary.json").read_text())
    summary["config"]["runtime"] = {"batch_size": size}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


@pytest.fixture
def sweep(tmp_path):
    for method in SPANS:
        for size in (1, 2, 4):
            batch_run(tmp_path / "runs" / method / f"runtime.batch_size={size}", method, size)
    return tmp_path / "runs"


def test_per_batch_tables_pair_each_run_with_vanilla_at_its_batch_size(sweep, tmp_path):
    out = tmp_path / "out"
    result = rp.report([str(sweep)], out)
    batch = result["batch"].set_index(["method", "batch_size"])
    for method, spans in SPANS.items():
        for size, span in spans.items():
            row = batch.loc[(method, size)]
            assert row["throughput"] == pytest.approx(40 / span), (method, size)
            assert row["speedup"] == pytest.approx(SPANS["vanilla"][size] / span), (method, size)
            turn = span / (QUESTIONS // size)
            assert row["ttft_mean"] == pytest.approx(FIRST) and row["tpot_p50"] == pytest.approx((turn - FIRST) / 9)
    assert batch.loc[("tr", 2), "mat"] == pytest.approx(2.5)
    # TR's rows of 4 drafts padded to 5: 4 rows of 5 token positions per forward, a fifth of them padding
    assert batch.loc[("tr", 4), "forward_tokens"] == 20 and batch.loc[("tr", 4), "padding"] == pytest.approx(0.2)
    assert batch.loc[("tr", 1), "forward_tokens"] == 4 and batch.loc[("tr", 1), "padding"] == 0
    assert list(result["table"]["method"][:3]) == [f"vanilla (batch_size={b})" for b in (1, 2, 4)]
    for size in (1, 2, 4):
        assert (out / f"batch_size_{size}.md").is_file() and (out / f"batch_size_{size}.csv").is_file()
    md = (out / "batch_size_2.md").read_text()
    assert "| Model | Method | MAT | Throughput (tok/s) | Speedup | TTFT mean (ms) |" in md
    # TTFT 100 ms, TPOT (1.25 s - 0.1 s) / 9 tokens, 2 rows of 5 token positions per forward
    tr = "| tiny-llama | tr | 2.50 | 16.00 | 1.60× | 100.0 | 100.0 | 100.0 | 127.8 | 127.8 | 127.8 | 10.0 | 20.0% |"
    assert tr in md
    assert "| tiny-llama | vanilla | 1.00 | 10.00 | 1.00× |" in md
    csv = (out / "batch_size_4.csv").read_text().splitlines()
    assert csv[0].startswith("model,method,batch_size,baseline,mat,speedup,speedup_lo,speedup_hi,throughput,ttft_mean")
    assert str(batch.loc[("tr", 2), "speedup_lo"]) == "nan"  # one timed part per run: nothing to pair an interval over
    assert all((out / f"speedup_vs_batch.{ext}").stat().st_size > 1000 for ext in ("png", "pdf"))
    main = (out / "main_table.md").read_text()
    assert "batch_size_1.md, batch_size_2.md, batch_size_4.md (and .csv)" in main and "speedup_vs_batch" in main
    assert "crossovers: pld above 1.0× up to B=4; tr below 1.0× from B≈2.92" in main
    page = (out / "report.html").read_text()
    assert "Under load" in page and "Batch size 4" in page and "speedup_vs_batch" in page


def test_the_crossover_is_interpolated_on_log2_of_the_batch_size(sweep, tmp_path):
    assert crossover([(2, 1.5), (8, 0.5)]) == pytest.approx(4.0)  # the worked example of evaluation.records.metrics
    assert crossover([(4, 0.8), (1, 0.9), (2, 1.2)]) == 1.0  # below at the smallest batch size: there
    assert crossover([(1, 2.0), (16, 1.0)]) is None  # 1.0x is not below it
    # with 95% intervals: a point below 1.0 whose interval reaches 1.0 is not a crossing; the next point clearly
    # below is, at its own batch size (no interpolation from a point under 1.0)
    assert crossover([(1, 0.99, 1.01), (2, 1.01, 1.03)]) is None
    assert crossover([(1, 1.2, 1.3), (2, 0.99, 1.0), (4, 0.9, 0.95)]) == 4.0
    assert crossover([(2, 1.5, 1.6), (8, 0.5, 0.6)]) == pytest.approx(4.0)
    assert crossover([(2, 1.5, float("nan")), (8, 0.5, float("nan"))]) == pytest.approx(4.0)  # no interval: as before
    near = pd.DataFrame({"model": "m", "method": ["x", "x", "y", "y"], "baseline": False, "batch_size": [1, 2, 1, 2],
                         "speedup": [0.99, 1.01, 1.1, 0.9], "speedup_hi": [1.01, 1.03, 1.2, 0.95]})
    assert crossovers(near) == {("m", "x"): (None, "not below 1.0× within its 95% interval up to B=2"),
                                ("m", "y"): (pytest.approx(2 ** (0.1 / 0.2)), "below 1.0× from B≈1.41")}
    batch = rp.report([str(sweep)], tmp_path / "out", figures=False)["batch"]
    found = crossovers(batch)
    # tr: 1.6x at B=2, 0.5x at B=4: 0.6 of the 1.1 it falls lies above 1.0, so log2 B = 1 + 0.6 / 1.1.
    assert found["tiny-llama", "tr"][0] == pytest.approx(2 ** (1 + 0.6 / 1.1))
    assert found["tiny-llama", "pld"] == (None, "above 1.0× up to B=4")
    assert ("tiny-llama", "vanilla") not in found


def test_the_speedup_under_load_has_its_interval_over_the_parts_timed_side_by_side(tmp_path):
    """Parts of the same questions, timed in turn (scripts.bench_methods' chunks), pair a method with its baseline:
    TR's two chunks of two questions took 1 s and 2 s, vanilla's 2 s each, so a resample gives 2.0x, 4/3x or
    1.0x (the worked example of evaluation.records.metrics.load_interval)."""
    def chunked(method: str, seconds: list[float]) -> list[dict]:
        out = []
        for q in range(QUESTIONS):
            r = rec(q + 1, "qa" if q % 2 else "rag", 10, seconds[q // 2], [1] * 10)
            r["clock"] = {"segment": f"{method}-{q // 2}", "turns": [[0.0, seconds[q // 2]]], "batch_size": 2}
            out.append(r)
        return out

    tr, vanilla = chunked("tr", [1.0, 2.0]), chunked("vanilla", [2.0, 2.0])
    assert load_interval(tr, vanilla) == (1.0, 2.0)
    assert load_interval(tr[:2], vanilla[:2]) is None  # one part: no interval
    alone = [{**r, "clock": {**r["clock"], "segment": f"v{r['question_id']}"}} for r in vanilla]
    assert load_interval(tr, alone) is None  # a baseline timed question by question: no part pairs with TR's
    for method, recs in (("tr", tr), ("vanilla", vanilla)):
        batch_run(tmp_path / "runs" / method, method, 2)
        (tmp_path / "runs" / method / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    result = rp.report([str(tmp_path / "runs")], tmp_path / "out")
    row = result["batch"].set_index("method").loc["tr"]
    assert (row["speedup"], row["speedup_lo"], row["speedup_hi"]) == (pytest.approx(4 / 3), 1.0, 2.0)
    assert "| 1.33× [1.00, 2.00] |" in (tmp_path / "out" / "batch_size_2.md").read_text()
    assert "speedup_lo,speedup_hi" in (tmp_path / "out" / "batch_size_2.csv").read_text().splitlines()[0]


def test_a_baseline_of_another_batch_size_is_refused(tmp_path, capsys):
    tr = batch_run(tmp_path / "tr", "tr", 2)
    vanilla = batch_run(tmp_path / "vanilla", "vanilla", 4)
    err = _main(rp.main, [str(tr), "--baseline", str(vanilla), "--out", str(tmp_path / "out")], capsys)
    assert "differ in runtime.batch_size (4 vs 2): a settings difference" in err
    assert not (tmp_path / "out").exists()
    err = _main(rp.main, [str(tmp_path), "--out", str(tmp_path / "out")], capsys)  # no vanilla at B=2 to pair with
    assert "no vanilla run of model tiny-llama on engine hf at runtime.batch_size=2 (runs: tr)" in err
    assert "runtime.batch_size (2 vs 4)" in _main(speed.main, [str(tr), "--baseline", str(vanilla)], capsys)


def test_runs_at_batch_size_one_report_as_before(tmp_path):
    for method in ("vanilla", "tr"):
        batch_run(tmp_path / "runs" / method, method, 1)
    result = rp.report([str(tmp_path / "runs")], tmp_path / "out")
    assert list(result["table"]["method"]) == ["vanilla", "tr"] and not len(result["batch"])
    assert not list((tmp_path / "out").glob("batch_size_*")) and not list((tmp_path / "out").glob("speedup_vs_batch*"))
    assert "Under load" not in (tmp_path / "out" / "main_table.md").read_text()
    table, _ = speed_table([str(tmp_path / "runs" / "tr")], str(tmp_path / "runs" / "vanilla"))
    assert "throughput (tokens/s)" not in table


def test_speed_shows_throughput_when_batched(sweep):
    table, _ = speed_table([str(sweep / "tr" / "runtime.batch_size=2")],
                                 str(sweep / "vanilla" / "runtime.batch_size=2"))
    overall = table.set_index("task").loc["overall"]
    assert overall["throughput (tokens/s)"] == pytest.approx(16.0) and overall["speedup in throughput"] == 1.6
    assert set(table.set_index("task").loc[["qa", "rag"], "throughput (tokens/s)"]) == {""}  # a whole run's number
    assert "| speedup in throughput |" in markdown(table)


def test_batch_sweep_experiment_sweeps_five_batch_sizes_into_their_own_folders():
    full = _compose("experiment=batch_sweep", return_hydra_config=True)
    assert full.hydra.mode.name == "MULTIRUN" and full.bench.name == "spec_bench_sample"
    params = full.hydra.sweeper.params
    assert str(params["runtime.batch_size"]).split(",") == ["1", "2", "4", "8", "16"]
    assert str(params["method"]).split(",") == ["vanilla", "tr"]
    folders = {_compose("experiment=batch_sweep", "method=tr", f"runtime.batch_size={b}",
                        return_hydra_config=True).hydra.job.override_dirname for b in (1, 2, 4, 8, 16)}
    assert folders == {f"runtime.batch_size={b}" for b in (1, 2, 4, 8, 16)}


def budget_run(folder, size: int):
    """PLD at batch size ``size`` under ``runtime.budget=auto``: 8 nodes drafted a step, its 5 verified, 3.5 tokens
    predicted a step (it reached 4.5)."""
    recs = records("pld", size)
    for r in recs:
        steps = len(r["choices"][0]["accept_lengths"])
        r["choices"][0].update(offered_nodes=[0] + [8] * (steps - 1), expected_lengths=[None] + [3.5] * (steps - 1))
        r["clock"]["segment"] += "-budget"
    write_run(folder, "pld", recs)
    summary = json.loads((folder / "summary.json").read_text())
    summary["config"]["runtime"] = {"batch_size": size, "budget": "auto"}
    (folder / "summary.json").write_text(json.dumps(summary))


def test_a_budget_is_its_own_line_with_its_drafts_and_its_odds(tmp_path):
    """Runs of a method with and without a per-step budget: labelled apart, the budget's rows give the nodes drafted
    and verified and the accept length predicted and reached, and budget_calibration is drawn; a run without one
    shows none of it."""
    for size in (1, 2):
        for method in ("vanilla", "pld"):
            batch_run(tmp_path / "runs" / method / f"b{size}", method, size)
        budget_run(tmp_path / "runs" / "pld-budget" / f"b{size}", size)
    out = tmp_path / "out"
    batch = rp.report([str(tmp_path / "runs")], out)["batch"].set_index(["method", "batch_size"])
    row, plain = batch.loc[("pld (budget=auto)", 2)], batch.loc[("pld", 2)]
    assert (row["offered_nodes"], row["kept_nodes"]) == (8, 5)
    assert (plain["offered_nodes"], plain["kept_nodes"]) == (5, 5)
    assert row["expected_mat"] == 3.5 and row["realised_mat"] == 4.5  # PLD's steps after the prefill: 4 and 5
    assert plain[["expected_mat", "realised_mat"]].isna().all()
    md = (out / "batch_size_2.md").read_text()
    assert "| Drafted | Verified | Predicted | Reached |" in md and "| 8.0 | 5.0 | 3.50 | 4.50 |" in md
    assert all((out / f"budget_calibration.{ext}").stat().st_size > 1000 for ext in ("png", "pdf"))
    assert "pld (budget=auto) above 1.0× up to B=2" in (out / "main_table.md").read_text()


def test_the_budget_sweep_runs_each_method_with_and_without_it():
    full = _compose("experiment=budget_sweep", return_hydra_config=True)
    params = full.hydra.sweeper.params
    assert str(params["runtime.budget"]).split(",") == ["off", "auto"] and full.bench.name == "spec_bench_sample"
    folders = {_compose("experiment=budget_sweep", "method=pld", f"runtime.budget={p}", "runtime.batch_size=4",
                        return_hydra_config=True).hydra.job.override_dirname for p in ("off", "auto")}
    assert folders == {"runtime.batch_size=4,runtime.budget=off", "runtime.batch_size=4,runtime.budget=auto"}
