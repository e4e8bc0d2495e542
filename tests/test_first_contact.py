"""First contact with real checkpoints: what a user meets the first time a shipped model config runs.

The checkpoints are built here in the layouts the real ones come in (a SentencePiece ``tokenizer.model``
only, as Vicuna and Llama-2 ship; an EAGLE head in SafeAILab/EAGLE's layout) and placed in a Hugging Face
hub cache, so the shipped configs' hub ids resolve exactly as on a user's machine, offline.
"""
import json

import pytest
import torch

from evaluation.running.models import ModelSpec, cpu_fallback, load_model
from methods import hub
from methods.common import ROOT, HarnessError
from tests.checkpoints import hub_snapshot, save_eagle_head, save_hydra_heads, save_medusa_heads, save_model
from tests.helpers import cli


def spec(checkpoint, **kw):
    return ModelSpec(**{"name": "test", "checkpoint": str(checkpoint), "template": "vicuna_v1.1", "device": "cpu",
                        **kw})


def test_local_or_hub_is_decided_by_the_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.locate("lmsys/vicuna-7b-v1.3", "model.checkpoint") == "lmsys/vicuna-7b-v1.3"
    assert hub.locate("yuhuili/EAGLE-Vicuna-7B-v1.3", "method.head") == "yuhuili/EAGLE-Vicuna-7B-v1.3"
    (tmp_path / "lmsys" / "vicuna-7b-v1.3").mkdir(parents=True)  # a local copy under the same name wins
    assert hub.locate("lmsys/vicuna-7b-v1.3", "model.checkpoint") == tmp_path / "lmsys" / "vicuna-7b-v1.3"
    assert hub.locate("data/eagle/smollm2-135m", "method.head") == ROOT / "data/eagle/smollm2-135m"  # project-relative
    for bad in ("/nowhere/vicuna", "./vicuna", "a/b/c", "vicuna"):
        with pytest.raises(HarnessError, match=f"model.checkpoint={bad}: no such folder here, and not a hub id"):
            hub.locate(bad, "model.checkpoint")


def test_a_sentencepiece_only_checkpoint_loads(tmp_path):
    """Vicuna's and Llama-2's tokenizers are a ``tokenizer.model`` only; transformers converts it, which needs
    sentencepiece and protobuf (pinned in pyproject.toml)."""
    model = save_model(tmp_path / "vicuna", "vicuna-7b")
    loaded, tok, device = load_model(spec(tmp_path / "vicuna"))
    assert type(tok).__name__ == "LlamaTokenizer" and tok("Hello world").input_ids[0] == 1  # BOS first
    assert tok.decode(tok("What is the capital of France?").input_ids, skip_special_tokens=True) == \
        "What is the capital of France?"
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)


def test_a_broken_checkpoint_names_its_cause_not_a_download(tmp_path):
    save_model(tmp_path / "broken", "vicuna-7b")
    (tmp_path / "broken" / "tokenizer.model").write_bytes(b"not a sentencepiece model")
    with pytest.raises(HarnessError) as e:
        load_model(spec(tmp_path / "broken"))
    assert "cannot load model 'test'" in str(e.value) and "download" not in str(e.value).lower()


def test_a_hub_id_loads_from_the_hub_cache_and_a_missing_one_says_download(tmp_path, hub_cache):
    repo = "lmsys/vicuna-7b-v1.3"
    with pytest.raises(HarnessError) as e:
        load_model(spec(repo))
    assert str(e.value).startswith(f"the checkpoint is not in the local cache: download {repo} or set "
                                   f"model.checkpoint=PATH")
    save_model(hub_snapshot(hub_cache, repo), "vicuna-7b")
    model, tok, _ = load_model(spec(repo))
    assert model.config.vocab_size == 32000


def test_loads_straight_into_the_target_dtype_with_fp32_rotary(tmp_path):
    save_model(tmp_path / "m", "llama-3-8b-instruct")
    model, _, _ = load_model(spec(tmp_path / "m", dtype="bfloat16"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32


def test_a_model_that_cannot_fit_is_refused_before_any_weight_is_read(tmp_path):
    """A 1.7T-parameter config and no weight file at all: refused from the config alone, naming the sizes."""
    folder = tmp_path / "huge"
    save_model(folder, "vicuna-7b")
    for f in folder.glob("*.safetensors"):
        f.unlink()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 32768, "intermediate_size": 131072,
                                                    "num_attention_heads": 256, "num_key_value_heads": 256,
                                                    "head_dim": 128, "num_hidden_layers": 128}))
    with pytest.raises(HarnessError, match=r"model 'test' needs about \d+\.\d GiB on cpu in float32 .* GiB of "
                                           r"weights .* but \d+\.\d GiB is free there: use a device with more memory"):
        load_model(spec(folder))


def test_device_auto_on_a_cpu_says_loudly_that_a_gpu_model_falls_back(tmp_path, capsys):
    save_model(tmp_path / "m", "vicuna-7b")
    load_model(spec(tmp_path / "m", device="auto", expects_gpu=True))
    err = capsys.readouterr().err
    assert "WARNING: model test is meant for a GPU, but no CUDA device is visible" in err
    assert cpu_fallback(spec(tmp_path, device="auto", expects_gpu=False), torch.device("cpu")) is None


@pytest.mark.parametrize("model, repo, method", [
    ("vicuna-7b", "lmsys/vicuna-7b-v1.3", "eagle2"),
    ("llama-3-8b-instruct", "meta-llama/Meta-Llama-3-8B-Instruct", "eagle2"),
    ("llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct", "eagle3"),
    ("deepseek-r1-distill-llama-8b", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "eagle3"),
    ("qwen3-8b", "Qwen/Qwen3-8B", "tr"),
    ("qwen2.5-7b-instruct", "Qwen/Qwen2.5-7B-Instruct", "tr")])
def test_offline_first_run_fails_only_for_the_missing_download(model, repo, method, hub_cache, tmp_path, run_error):
    said = run_error(f"model={model}", f"method={method}", f"hydra.run.dir={tmp_path / 'run'}", base=())
    assert said.err.strip().splitlines()[-1] == (
        f"error: the checkpoint is not in the local cache: download {repo} or set model.checkpoint=PATH (no network "
        f"here: run `hf download {repo}` where there is one and bring the folder (or the hub cache, HF_HUB_CACHE))")
    assert not (tmp_path / "run").exists()


VICUNA_RUN = ["model=vicuna-7b", "bench.question_ids=[81]", "bench.max_new_tokens=12", "warmup=0",
              "runtime.progress=false"]


def vicuna_run(tmp_path, method: str):
    """``evaluation.run`` of the Vicuna config with ``method`` on one question, into ``tmp_path / method``."""
    return cli("evaluation.run", *VICUNA_RUN, f"method={method}", f"hydra.run.dir={tmp_path / method}", check=False)


def missing(run_error, tmp_path, method: str) -> str:
    """The run of ``vicuna_run`` in this process (``run_error``), refused for a missing download: its error line."""
    said = run_error(*VICUNA_RUN, f"method={method}", f"hydra.run.dir={tmp_path / method}", base=())
    return said.err.strip().splitlines()[-1]


def runs_equal_to_vanilla(tmp_path, method: str):
    """Vanilla and ``method`` both run and ``evaluation.equal`` says EQUAL: (the method's run, its summary)."""
    for m in ("vanilla", method):
        p = vicuna_run(tmp_path, m)
        assert p.returncode == 0, p.stderr
    equal = cli("evaluation.equal", str(tmp_path / "vanilla"), str(tmp_path / method), check=False)
    assert equal.returncode == 0 and "EQUAL" in equal.stdout, equal.stdout
    return p, json.loads((tmp_path / method / "summary.json").read_text())


@pytest.mark.slow
def test_vicuna_with_its_published_eagle_head_runs_end_to_end(hub_cache, tmp_path, run_error):
    """`evaluation.run model=vicuna-7b method=eagle2` as a user with the hub cache filled runs it: the model and
    the head resolve as hub ids, the Vicuna prompt and the device fall-back are recorded, tokens equal vanilla's."""
    model = save_model(hub_snapshot(hub_cache, "lmsys/vicuna-7b-v1.3"), "vicuna-7b")
    assert "download yuhuili/EAGLE-Vicuna-7B-v1.3 or set method.head=PATH" in missing(run_error, tmp_path, "eagle2")
    save_eagle_head(hub_snapshot(hub_cache, "yuhuili/EAGLE-Vicuna-7B-v1.3"), model.config)
    p, summary = runs_equal_to_vanilla(tmp_path, "eagle2")
    assert "WARNING: model vicuna-7b is meant for a GPU" in p.stderr
    assert summary["prompt"]["template"] == "fastchat vicuna_v1.1" and "Spec-Bench" in summary["prompt"]["source"]
    assert "device_fallback" in summary and summary["method_state"]["head"] == "yuhuili/EAGLE-Vicuna-7B-v1.3"


@pytest.mark.slow
def test_vicuna_with_spec_benchs_68m_drafter_runs_end_to_end(hub_cache, tmp_path, run_error):
    """`evaluation.run model=vicuna-7b method=sps` drafts with the config's double7/vicuna-68m, a hub id like
    the target's: missing, one clear line naming it; in the cache (a 2-layer Llama with the target's 32000-token
    vocabulary, as a pytorch_model.bin, the layout that repository ships), tokens equal vanilla's."""
    from tests.helpers import tiny_llama

    save_model(hub_snapshot(hub_cache, "lmsys/vicuna-7b-v1.3"), "vicuna-7b")
    assert "download double7/vicuna-68m or set method.drafter=PATH" in missing(run_error, tmp_path, "sps")
    assert not (tmp_path / "sps").exists()
    torch.manual_seed(0)
    tiny_llama(vocab_size=32000, num_hidden_layers=2).save_pretrained(hub_snapshot(hub_cache, "double7/vicuna-68m"),
                                                                  safe_serialization=False)
    _, summary = runs_equal_to_vanilla(tmp_path, "sps")
    assert summary["method_state"]["drafter"] == "double7/vicuna-68m"
    assert summary["method_state"]["drafter_layers"] == 2


@pytest.mark.slow
@pytest.mark.long  # their published layouts: tests/test_medusa.py, test_hydra.py; the hub path: the cases above
@pytest.mark.parametrize("method, repo", [("medusa", "FasterDecoding/medusa-vicuna-7b-v1.3"),
                                          ("hydra", "ankner/hydra-vicuna-7b-v1.3")])
def test_vicuna_with_its_published_draft_heads_runs_end_to_end(hub_cache, tmp_path, method, repo, run_error):
    """`evaluation.run model=vicuna-7b method=medusa` (or hydra) reads the config's published heads from the hub
    cache: FasterDecoding's Medusa-1 (5 heads with their own lm_heads, medusa_lm_head.pt), zankner/Hydra's
    heads in the Hydra++ shape its README trains (prefix-mlp, 4 heads of 4 layers, hydra_lm_head.pt); missing,
    one line naming them; tokens = vanilla's."""
    model = save_model(hub_snapshot(hub_cache, "lmsys/vicuna-7b-v1.3"), "vicuna-7b")
    assert f"download {repo} or set method.head=PATH" in missing(run_error, tmp_path, method)
    if method == "medusa":
        save_medusa_heads(hub_snapshot(hub_cache, repo), model.config)
    else:
        save_hydra_heads(hub_snapshot(hub_cache, repo), model.config, arch="prefix-mlp", layers=4)
    _, summary = runs_equal_to_vanilla(tmp_path, method)
    state = summary["method_state"]
    assert state["head"] == repo and state["heads"] == (5 if method == "medusa" else 4) and state["own_lm_heads"]
