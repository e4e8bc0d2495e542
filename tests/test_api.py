"""Every method from Python (``evaluation.api``) and from transformers' own ``generate`` (``custom_generate``, the
callable and the folder form): token for token ``model.generate(do_sample=False)``'s output, at batch 1 and at batch
3 left-padded; sampled, vanilla's samples; what it cannot honour refused in one line before any decoding."""
import pytest
import torch

from evaluation.api import Decoder, SpeculativeOutput, load, speculative
from methods.base import registry
from methods.common import ROOT, HarnessError
from tests.helpers import tiny_llama

METHODS = sorted(registry())
PROMPTS = [[5, 9, 17, 33, 4, 9, 17, 33, 4, 9, 17], [40, 41, 42, 43, 44, 40, 41, 42], [7, 8, 7, 8, 7]]
MAX_NEW = 24


def left_padded(prompts: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.fixture(scope="module")
def models():
    """A tiny random Llama per depth a method needs (EAGLE-3 reads three layers), eos id 2 (so rows end apart)."""
    built = {}

    def make(layers: int):
        layers = max(layers, 2)
        if layers not in built:
            built[layers] = tiny_llama(seed=0, num_hidden_layers=layers, vocab_size=96).eval()
        return built[layers]

    return make


@pytest.mark.parametrize("method", METHODS)
def test_custom_generate_is_generate_greedy_at_batch_1_and_3(models, method, tmp_path):
    cls = registry()[method]
    model = models(cls.min_layers)
    gen = speculative(method, **cls.example(tmp_path, PROMPTS))
    for p in PROMPTS[:1]:  # batch 1, no padding (generate passes no attention mask then)
        ids = torch.tensor([p])
        want = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
        got = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0, custom_generate=gen)
        assert got.tolist() == want.tolist(), method
    ids, mask = left_padded(PROMPTS)
    want = model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
    got = model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0,
                         custom_generate=gen, return_dict_in_generate=True)
    assert isinstance(got, SpeculativeOutput) and got.sequences.tolist() == want.tolist(), method
    width = got.sequences.shape[1] - ids.shape[1]  # the longest row's new tokens; the others padded after their end
    assert all(sum(a) <= width for a in got.accept_lengths) and max(sum(a) for a in got.accept_lengths) == width


@pytest.mark.parametrize("shape", ["qwen3-8b", "gemma3-270m"])
def test_other_architectures_through_custom_generate(shape):
    model = tiny_llama(shape, **({"vocab_size": 8192, "num_hidden_layers": 6, "sliding_window": 16,
                                  "tie_word_embeddings": False} if shape == "gemma3-270m" else {})).eval()
    ids, mask = left_padded([[5 + i for i in range(30)], [900, 17, 33, 4, 900, 17, 33]])
    want = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    for method in ("tr", "pld"):
        got = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0,
                             custom_generate=speculative(method))
        assert got.tolist() == want.tolist(), (shape, method)


def test_sampled_through_generate_is_vanillas_sample(models):
    model = models(2)
    ids, mask = left_padded(PROMPTS)
    kw = dict(attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=True, temperature=0.8, top_k=0, pad_token_id=0)
    vanilla = model.generate(ids, custom_generate=speculative("vanilla"), seed=3, **kw)
    assert model.generate(ids, custom_generate=speculative("tr"), seed=3, **kw).tolist() == vanilla.tolist()
    assert model.generate(ids, custom_generate=speculative("pld"), seed=3, **kw).tolist() == vanilla.tolist()
    assert model.generate(ids, custom_generate=speculative("vanilla"), seed=4, **kw).tolist() != vanilla.tolist()
    # the same draws as the Python API's (prompt i keyed by its row)
    results = Decoder(model, None, "tr").generate(PROMPTS, MAX_NEW, temperature=0.8, seed=3)
    for row, r in zip(vanilla[:, ids.shape[1]:].tolist(), results):
        assert row[:len(r.tokens)] == r.tokens


def test_the_python_api_is_the_loop(models):
    model = models(2)
    want = model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=MAX_NEW, do_sample=False)[0, 11:].tolist()
    decoder = Decoder(model, None, "pld", max_ngram=2)
    one = decoder.generate(PROMPTS[0], max_new_tokens=MAX_NEW)
    assert one.tokens == want and sum(one.accept_lengths) == len(one.tokens) and one.mat > 1 and one.text is None
    batch = Decoder(model, None, "tr", batch_size=2).generate(PROMPTS, max_new_tokens=MAX_NEW)
    assert [r.tokens for r in batch] == [Decoder(model, None, "vanilla").generate(p, MAX_NEW).tokens for p in PROMPTS]


def test_the_budget_from_python_and_generate(models, tmp_path, monkeypatch):
    """``budget="auto"`` (the engine's cost grid measured once, here into a test cache) and ``spec_off_above``: the
    steps cut and recorded, the tokens generate's."""
    import evaluation.api

    monkeypatch.setattr(evaluation.api, "CACHE", tmp_path)
    model = models(2)
    ids, mask = left_padded(PROMPTS)
    want = model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
    for kw in ({"budget": "auto"}, {"spec_off_above": 1}):
        got = model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0,
                             custom_generate=speculative("tr", **kw))
        assert got.tolist() == want.tolist(), kw
    assert len(list((tmp_path / "budget").glob("*.json"))) == 1
    gens = Decoder(model, None, "tr", batch_size=3, budget="auto").decode(PROMPTS, MAX_NEW)
    assert all(e is not None for g in gens for e in g.expected_lengths)
    assert any(n < o for g in gens for n, o in zip(g.draft_nodes, g.offered_nodes)), "nothing was cut"
    with pytest.raises(HarnessError, match="^runtime.budget=sometimes is not a budget"):
        speculative("tr", budget="sometimes")


@pytest.mark.parametrize("call, message", [
    (lambda m, ids: speculative("trr"), "unknown method 'trr'; known: "),
    (lambda m, ids: speculative("tr", kk=3), "method 'tr' has no parameter kk (did you mean method.k?)"),
    (lambda m, ids: m.generate(ids, max_new_tokens=4, num_beams=2, custom_generate=speculative("tr")),
     "num_beams=2: beam search is not what speculative decoding reproduces"),
    (lambda m, ids: m.generate(ids, max_new_tokens=4, repetition_penalty=1.3, custom_generate=speculative("tr")),
     "custom_generate cannot honour the logits processor RepetitionPenaltyLogitsProcessor"),
    (lambda m, ids: m.generate(ids, max_new_tokens=4, output_scores=True, return_dict_in_generate=True,
                               custom_generate=speculative("tr")), "output_scores=True: custom_generate returns"),
    (lambda m, ids: m.generate(torch.tensor([[5, 6, 0]]), attention_mask=torch.tensor([[1, 1, 0]]), pad_token_id=0,
                               max_new_tokens=4, custom_generate=speculative("tr")), "row 0 of the batch is padded on "
                                                                                     "the right"),
])
def test_what_it_cannot_honour_is_one_line(models, call, message):
    model = models(2)
    with pytest.raises(HarnessError, match="^" + message.replace("(", r"\(").replace(")", r"\)")
                       .replace("?", r"\?")):
        call(model, torch.tensor([PROMPTS[0]]))


def test_the_folder_form_loads_from_the_project(models, monkeypatch):
    from evaluation.api import CustomGenerate

    model, methods = models(2), []
    call = CustomGenerate.__call__
    monkeypatch.setattr(CustomGenerate, "__call__", lambda self, *a, **kw: methods.append(self.method) or
                        call(self, *a, **kw))
    ids = torch.tensor([PROMPTS[0]])
    want = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
    got = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0, custom_generate=str(ROOT),
                         trust_remote_code=True, method="pld", method_params={"max_ngram": 2})
    assert got.tolist() == want.tolist() and methods == ["pld"]  # custom_generate/generate.py, then our callable


@pytest.mark.slow  # the embedded model, loaded by name
def test_the_readmes_example_runs_verbatim(capsys):
    import re

    block = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)[0]
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    result, out, ids = scope["result"], scope["out"], scope["ids"]
    assert result.text and sum(result.accept_lengths) == len(result.tokens) and result.mat > 1
    model = scope["decoder"].model
    assert out.tolist() == model.generate(ids, max_new_tokens=16, do_sample=False).tolist()
    assert "MAT" in capsys.readouterr().out


def test_load_takes_the_runtime_settings_as_keywords(embedded, monkeypatch):
    """``load(..., batch_size=, budget=, spec_off_above=)`` as ``Decoder``'s keywords (not the method's parameters),
    a bad budget refused in the configs' words."""
    import evaluation.running.models

    model, tokenizer, _ = embedded
    monkeypatch.setattr(evaluation.running.models, "load_model", lambda spec: (model, tokenizer, torch.device("cpu")))
    decoder = load("smollm2-135m", "pld", batch_size=2, budget="auto", spec_off_above=4, max_ngram=3)
    assert (decoder.batch_size, decoder.budget_settings, decoder.params["max_ngram"]) == (2, ("auto", 4), 3)
    assert load("smollm2-135m", "pld").budget_settings == ("off", None)  # the config's
    with pytest.raises(HarnessError, match="runtime.budget=sometimes is not a budget"):
        load("smollm2-135m", "pld", budget="sometimes")
