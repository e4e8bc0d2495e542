"""One run split into shards and merged equals the single-process run; every refused merge says why."""
import json
import shutil

import pytest
import torch

from evaluation.merge import merge
from evaluation.records.answers import read_answers
from evaluation.records.bench import shard
from methods.common import HarnessError
from tests.helpers import cli, run_here
from tests.test_cli import QIDS

pytestmark = pytest.mark.xdist_group("test_shards")  # on one worker (make test), so that runs is made once


def run(out, *extra):
    return run_here(out, "warmup=1", "runtime.progress=false", "method=tr", "method.tree=grown-n30-d6",
                    f"bench.question_ids=[{','.join(map(str, QIDS))}]", "bench.max_new_tokens=12", *extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, reuse_embedded_in_module):
    root = tmp_path_factory.mktemp("shards")
    single = run(root / "single")
    shards = [run(root / f"shard{i}", f"runtime.shard={i}", "runtime.num_shards=2") for i in range(2)]
    return root, single, shards


def test_shards_are_contiguous_blocks():
    assert shard(QIDS, 0, 2) == [81, 161, 277] and shard(QIDS, 1, 2) == [321, 401]
    assert shard(QIDS, 0, 1) == QIDS
    with pytest.raises(HarnessError, match="runtime.shard must be an integer from 0 to 1"):
        shard(QIDS, 2, 2)
    with pytest.raises(HarnessError, match="runtime.num_shards must be an integer of at least 1"):
        shard(QIDS, 0, 0)


@pytest.mark.slow
def test_merged_shards_equal_the_single_run(runs, tmp_path):
    root, single, shards = runs
    assert [r["question_id"] for r in read_answers(shards[0])] == [81, 161, 277]
    merged = merge(shards[::-1], tmp_path / "merged")  # order of the folders does not matter
    a, b = read_answers(single), read_answers(merged)
    assert [r["question_id"] for r in b] == QIDS
    for x, y in zip(a, b):
        assert x["choices"][0]["token_ids"] == y["choices"][0]["token_ids"]
    summary = json.loads((merged / "summary.json").read_text())
    assert summary["answered"] == len(QIDS) and len(summary["shards"]) == 2
    # it keeps its environment: the report finds the machine its timings come from (it lost it: "foreign file")
    assert summary["environment"] == json.loads((shards[0] / "summary.json").read_text())["environment"]
    from evaluation.reporting.collect import collect, machine

    assert machine(collect([str(merged)])[0]) is not None
    assert collect([str(merged)])[0].state["memory"] == "run"  # TR's hot start, from its shards' states
    # the first shard is the single run's beginning exactly (same warm-up, same order)
    for x, y in zip(a[:3], b[:3]):
        assert x["choices"][0]["accept_lengths"] == y["choices"][0]["accept_lengths"]


@pytest.mark.slow
def test_refused_merges(runs, tmp_path):
    root, single, shards = runs
    with pytest.raises(HarnessError, match=r"shard\(s\) \[1\] of 2 are missing"):
        merge(shards[:1], tmp_path / "m1")
    with pytest.raises(HarnessError, match="shard 0 of 2 is given twice"):
        merge([shards[0], shards[0]], tmp_path / "m2")
    with pytest.raises(HarnessError, match="are shards of different runs: runtime.num_shards is 1 in the first but 2 "
                                           "in the second"):
        merge([shards[0], single], tmp_path / "m3")
    other = tmp_path / "other"
    shutil.copytree(shards[1], other)
    s = json.loads((other / "summary.json").read_text())
    s["config"]["method"]["k"] = 4
    (other / "summary.json").write_text(json.dumps(s))
    with pytest.raises(HarnessError, match="are shards of different runs: method.k is 4 in the first but 8 in "
                                           "the second"):
        merge([shards[0], other], tmp_path / "m4")
    s["config"]["method"]["k"] = 8
    s["environment"]["cpu"]["model"] = "Another CPU"
    (other / "summary.json").write_text(json.dumps(s))
    with pytest.raises(HarnessError, match="ran on .* but .*Another CPU.*--mixed-machines"):
        merge([shards[0], other], tmp_path / "m7")
    merge([shards[0], other], tmp_path / "m8", mixed_machines=True)
    s["environment"] = json.loads((shards[0] / "summary.json").read_text())["environment"]
    s["status"] = "running"
    (other / "summary.json").write_text(json.dumps(s))
    with pytest.raises(HarnessError, match="has not finished"):
        merge([shards[0], other], tmp_path / "m5")
    s["status"] = "finished"
    (other / "summary.json").write_text(json.dumps(s))
    with open(other / "answers.jsonl", "a") as f:  # shard 1 also answers question 81
        f.write(json.dumps(read_answers(shards[0])[0]) + "\n")
    with pytest.raises(HarnessError, match="question 81 is answered by two shards"):
        merge([shards[0], other], tmp_path / "m6")
    for m in ("m1", "m2", "m3", "m4", "m5", "m6"):
        assert not (tmp_path / m / "answers.jsonl").exists()


@pytest.mark.slow
def test_merge_cli_message(runs, tmp_path):
    """On the command line (evaluation.merge's own test of it)."""
    _, _, shards = runs
    p = cli("evaluation.merge", str(shards[0]), "--out", str(tmp_path / "m"), check=False)
    assert p.returncode == 2 and "are missing" in p.stderr and "Traceback" not in p.stderr
    # a folder holding the shards (whatever their names hold, [81,161] included): every one of them
    holder = tmp_path / "holder"
    for i, d in enumerate(shards):
        shutil.copytree(d, holder / f"bench.question_ids=[81,161],runtime.shard={i}")
    p = cli("evaluation.merge", str(holder), "--out", str(tmp_path / "m2"))
    assert "merged 2 shards" in p.stdout and [r["question_id"] for r in read_answers(tmp_path / "m2")] == QIDS


@pytest.mark.slow
def test_sweep_through_the_joblib_launcher(tmp_path):
    """Two jobs of a sweep in parallel local processes, collected into the sweep table."""
    cli("evaluation.run", "-m", "cluster=joblib", "method=tr", "method.start=hot,cold", f"hydra.sweep.dir={tmp_path}",
        "warmup=0", "runtime.progress=false", "bench.question_ids=[161]", "bench.max_new_tokens=4")
    table = (tmp_path / "sweep.md").read_text().splitlines()
    assert len(table) == 4 and {line.split("|")[7].strip() for line in table[2:]} == {"hot", "cold"}


def test_a_claimed_device_is_held_until_released():
    from evaluation.running.models import ModelSpec, claim_device, release_devices
    from methods.common import HarnessError

    spec = ModelSpec(name="m", checkpoint="x", template="vicuna_v1.1", device="auto")
    try:
        claimed, info = claim_device(spec)
        assert info["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu") and info["waited_s"] < 1
        assert claimed.device == ("cuda:0" if torch.cuda.is_available() else "auto")  # auto still warns on a CPU
        if not torch.cuda.is_available():
            with pytest.raises(HarnessError, match="no free device among cpu after 1 s"):
                claim_device(spec, wait_s=1)
    finally:
        release_devices()
    assert claim_device(spec)[1]["waited_s"] < 1
    release_devices()


@pytest.mark.slow
@pytest.mark.parametrize("cluster", ["local", "joblib"])
def test_local_cluster_jobs_never_share_a_device(tmp_path, cluster):
    """cluster=local starts every job at once (submitit), cluster=joblib one per device: either way each job
    claims a device of its own, so on this GPU-less machine the two runs take the CPU one after the other."""
    from datetime import datetime

    cli("evaluation.run", "-m", f"cluster={cluster}", "method=vanilla,pld", f"hydra.sweep.dir={tmp_path}",
        "warmup=0", "runtime.progress=false", "bench.question_ids=[161]", "bench.max_new_tokens=4")
    summaries = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*/*/summary.json"))]
    assert len(summaries) == 2 and all(s["status"] == "finished" for s in summaries)
    assert {s["device_claim"]["device"] for s in summaries} == {"cuda:0" if torch.cuda.is_available() else "cpu"}
    spans = sorted((datetime.strptime(s["started"], "%Y-%m-%dT%H:%M:%S%z"),
                    datetime.strptime(s["finished"], "%Y-%m-%dT%H:%M:%S%z")) for s in summaries)
    assert spans[0][1] <= spans[1][0], "the two jobs ran on the CPU at the same time"
    if cluster == "local" and not torch.cuda.is_available():  # started together: one waited for the other
        assert max(s["device_claim"]["waited_s"] for s in summaries) > 0
