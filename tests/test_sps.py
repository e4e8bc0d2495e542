"""SpS (methods.proposers.sps): a draft model's chain, verified by the target; lossless whatever the drafter."""
import pytest
import torch

from methods.base import build_proposer
from methods.common import HarnessError
from methods.decode import generate
from methods.engine import StaticEngine
from methods.proposers.sps import SpS, chain_tree, first_layers
from methods.sampling import Sampler, Sampling
from tests.helpers import generate_greedy, tiny_llama

CPU = torch.device("cpu")
PROMPTS = [[3, 4, 5, 6, 3, 4, 5], [40, 41, 42], [7] * 6]


@pytest.fixture(scope="module")
def deep():
    """A 4-layer tiny Llama, so that self:L has a few L to choose from; logits spread so that rounding decides
    no argmax."""
    torch.manual_seed(1)
    model = tiny_llama(num_hidden_layers=4, max_position_embeddings=512).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    return model


def sps(model, **params) -> SpS:
    return build_proposer("sps", params, vocab_size=96, device=CPU, target=model)


@pytest.mark.parametrize("schedule,expected", [("constant", [1] + [5] * 7 + [4]), ("heuristic", [1, 6, 8, 10, 12, 3])])
def test_the_target_as_its_own_drafter_accepts_every_draft(deep, schedule, expected):
    """self:N with all N layers is the target: each step accepts the whole chain and the bonus token (constant:
    draft_tokens + 1 = 5; heuristic: 5 + 1, then 2 more each step), up to the budget's cut."""
    p = sps(deep, drafter="self:4", draft_tokens=4 if schedule == "constant" else 5, schedule=schedule)
    gen = generate(StaticEngine(deep), p, PROMPTS[0], max_new_tokens=40, stop_ids=set())
    assert gen.accept_lengths == expected
    assert gen.token_ids == generate_greedy(deep, PROMPTS[0], 40)


@pytest.mark.parametrize("params", [{"drafter": "self:1"}, {"drafter": "self:2", "schedule": "constant"},
                                    {"drafter": "self:1", "topk": 3}, {"drafter": "self:3", "draft_tokens": 1}],
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_lossless_with_a_partial_drafter(deep, params):
    p = sps(deep, **params)
    engine = StaticEngine(deep)
    accepted = []
    for prompt in PROMPTS:
        gen = generate(engine, p, prompt, max_new_tokens=40, stop_ids={17})
        assert gen.token_ids == generate_greedy(deep, prompt, 40, eos_token_id=17)
        accepted += gen.accept_lengths[1:]
    assert max(accepted) > 1, "no draft was ever accepted"


def test_drafts_are_the_drafters_own_greedy_chain_from_scratch(deep):
    """The drafter's cache (the committed tokens it saw, the accepted drafts it forwarded) gives the chain a
    drafter run from scratch on the whole context gives, at every step."""
    p = sps(deep, drafter="self:2", topk=2)
    shell = first_layers(deep, 2)
    seen = []
    propose = p.propose

    def recording(context):
        draft = propose(context)
        seen.append((context.clone(), draft.tokens.clone(), p.gamma))
        return draft

    p.propose = recording
    generate(StaticEngine(deep), p, PROMPTS[1], max_new_tokens=30, stop_ids=set())
    assert len(seen) > 3
    for context, tokens, gamma in seen:
        chain = generate_greedy(shell, context.tolist(), gamma)
        assert tokens[1::2].tolist() == chain  # topk=2: the chain's nodes are 1, 3, 5, ...


def test_an_alternative_leaf_is_accepted_where_the_chain_token_is_not(deep):
    p = sps(deep, drafter="self:1", topk=4, schedule="constant", draft_tokens=3)
    ends = []
    update = p.update

    def recording(draft, result):
        ends.append(result.path[-1])
        update(draft, result)

    p.update = recording
    for prompt in PROMPTS:
        gen = generate(StaticEngine(deep), p, prompt, max_new_tokens=40, stop_ids=set())
        assert gen.token_ids == generate_greedy(deep, prompt, 40)
    assert any((node - 1) % 4 for node in ends if node), "no step ended at an alternative"


def test_a_drafter_checkpoint_is_loaded_and_its_own_cache_used(deep, tmp_path):
    torch.manual_seed(2)
    small = tiny_llama(num_hidden_layers=1, hidden_size=32, intermediate_size=64, max_position_embeddings=512)
    small.save_pretrained(tmp_path / "drafter")
    p = sps(deep, drafter=str(tmp_path / "drafter"))
    assert p.drafter.config.num_hidden_layers == 1 and p.summary()["drafter_parameters"] < 20_000
    for prompt in PROMPTS:
        assert generate(StaticEngine(deep), p, prompt, max_new_tokens=30, stop_ids=set()).token_ids == \
            generate_greedy(deep, prompt, 30)


def test_self_layers_share_the_targets_weights(deep):
    shell = first_layers(deep, 2)
    assert len(shell.model.layers) == 2 and shell.config.num_hidden_layers == 2
    assert shell.model.layers[1].mlp.up_proj.weight is deep.model.layers[1].mlp.up_proj.weight
    assert shell.lm_head.weight is deep.lm_head.weight and shell.model.norm is deep.model.norm
    assert deep.config.num_hidden_layers == 4  # the target's config untouched


def test_sampled_tokens_are_vanilla_samplings(deep):
    settings = Sampling(temperature=1.0, seed=5)
    for q, prompt in enumerate(PROMPTS):
        ref = generate(StaticEngine(deep), build_proposer("vanilla", {}, vocab_size=96, device=CPU), prompt,
                       max_new_tokens=30, stop_ids=set(), sampler=Sampler(settings, q, 0))
        got = generate(StaticEngine(deep), sps(deep, drafter="self:4"), prompt, max_new_tokens=30, stop_ids=set(),
                       sampler=Sampler(settings, q, 0))
        assert got.token_ids == ref.token_ids
        # The full drafter drafts with the target's own noise: it drafts the sampled tokens, all accepted.
        assert got.accept_lengths[1] == 6


def test_the_schedule_outlives_a_request_and_a_resume(deep):
    p = sps(deep, drafter="self:4")
    generate(StaticEngine(deep), p, PROMPTS[0], max_new_tokens=20, stop_ids=set())
    assert p.gamma > 5
    fresh = sps(deep, drafter="self:4")
    fresh.load_state_dict(p.state_dict())
    assert fresh.gamma == p.gamma


def test_chain_tree_is_breadth_first():
    assert chain_tree(3, 1).parents == (-1, 0, 1, 2)
    assert chain_tree(3, 3).parents == (-1, 0, 0, 0, 1, 1, 1, 4, 4, 4)


@pytest.mark.parametrize("params,message", [
    ({}, "needs a drafter.*method.drafter=self:L"),
    ({"drafter": "self:0"}, "has 4 layers; give self:1 to self:4"),
    ({"drafter": "self:9"}, "has 4 layers; give self:1 to self:4"),
    ({"drafter": "no/such-drafter-anywhere"}, "not in the local cache"),
    ({"drafter": "self:2", "topk": 0}, "method.topk must be an integer from 1 to 64"),
    ({"drafter": "self:2", "schedule": "fast"}, "method.schedule must be one of heuristic, constant"),
])
def test_bad_parameters(deep, params, message, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from methods import hub
    hub.offline.cache_clear()
    with pytest.raises(HarnessError, match=message):
        sps(deep, **params)
    hub.offline.cache_clear()


def test_a_drafter_of_another_vocabulary_is_refused(deep, tmp_path):
    tiny_llama(vocab_size=128, num_hidden_layers=1).save_pretrained(tmp_path / "other")
    with pytest.raises(HarnessError, match="vocabulary of 128 tokens and the target 96"):
        sps(deep, drafter=str(tmp_path / "other"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(HarnessError, match="has no config.json"):
        sps(deep, drafter=str(tmp_path / "empty"))


def test_a_drafter_of_another_architecture_runs_on_the_reference_engine(deep, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(3)
    GPT2LMHeadModel(GPT2Config(vocab_size=96, n_layer=1, n_embd=32, n_head=2, n_positions=512)).save_pretrained(
        tmp_path / "gpt2")
    p = sps(deep, drafter=str(tmp_path / "gpt2"))
    assert p.summary()["engine"] == "hf"
    for prompt in PROMPTS:
        assert generate(StaticEngine(deep), p, prompt, max_new_tokens=30, stop_ids=set()).token_ids == \
            generate_greedy(deep, prompt, 30)
