"""Sampling at temperature > 0 (methods.sampling): the warpers against transformers', the position-keyed draws,
every method token-identical to vanilla sampling on the tiny model, and the distribution of the first tokens
against the exact one and against transformers' generate(do_sample=True), with a check that has teeth."""
import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from methods.base import build_proposer, registry
from methods.common import HarnessError
from methods.decode import generate
from methods.engine import StaticEngine
from methods.sampling import Sampler, Sampling, key, process

CPU = torch.device("cpu")
ALPHA = 1e-3  # false-alarm rate of each distribution test: a correct sampler fails it with this probability


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 20, 1.0), (0.8, 0, 0.9),
                                                     (1.0, 50, 0.95), (0.5, 3, 0.5), (2.0, 1, 1.0)])
def test_processing_equals_transformers_warpers(temperature, top_k, top_p):
    """generate's order: temperature, top-k, top-p (transformers.generation.utils._get_logits_processor)."""
    torch.manual_seed(0)
    logits = torch.randn(64, 500) * 3
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)]
                                  + ([TopKLogitsWarper(top_k)] if top_k else [])
                                  + ([TopPLogitsWarper(top_p)] if top_p < 1 else []))
    expected = warpers(None, logits.clone()).softmax(dim=-1)
    got = process(logits, Sampling(temperature=temperature, top_k=top_k, top_p=top_p))
    assert torch.equal(got > 0, expected > 0)  # the same tokens kept
    assert torch.allclose(got, expected, atol=1e-6)


def test_draws_are_keyed_by_position_and_follow_the_distribution():
    assert key(1, 81, 0, 3) == key(1, 81, 0, 3)
    assert len({key(1, 81, 0, p) for p in range(100)} | {key(2, 81, 0, 3), key(1, 82, 0, 3), key(1, 81, 1, 3)}) == 103
    s = Sampler(Sampling(temperature=1.0, seed=3), question=5, turn=1)
    assert torch.equal(s.noise(7, 3), Sampler(Sampling(temperature=0.5, seed=3), 5, 1).noise(7, 3))
    assert not torch.equal(s.noise(7, 3), s.noise(8, 3))
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]])).repeat(4, 1)
    got = s.draw(logits, torch.tensor([0, 1, 2, 3]), 7, 3).tolist()
    for i, token in enumerate(got):  # Gumbel-max: the largest logit plus the position's noise
        assert token == int((logits[0] + s.noise(7 + i, 3)).argmax())
    assert s.draw(logits[:2], torch.tensor([1, 1]), 7, 1).tolist() == [got[1]] * 2  # same position, same draw
    # one draw per position over many positions: the frequencies are the distribution's (chi-square, 2 d.o.f.)
    n = 6000
    draws = s.draw(logits[:1].repeat(n, 1), torch.arange(n), 0, n - 1)
    counts = torch.bincount(draws, minlength=3).double()
    chi2 = float(((counts - n * torch.tensor([0.2, 0.5, 0.3])) ** 2 / (n * torch.tensor([0.2, 0.5, 0.3]))).sum())
    assert chi2 < 13.8  # the 0.999 quantile of chi-square with 2 degrees of freedom
    top_k = Sampler(Sampling(temperature=1.0, top_k=1, seed=3), 5, 1)
    assert set(top_k.draw(logits[:1].repeat(50, 1), torch.arange(50), 0, 49).tolist()) == {1}  # filters apply


def test_a_top_p_draw_is_the_argmax_of_the_ranked_nucleus():
    """``Sampler.draw`` finds the nucleus without ranking the rows: its tokens are the argmax of ``scores`` (the
    nucleus by a full sort), also where the best perturbed logit lies outside the nucleus and is passed over, and
    where every logit ties (trial 0: the whole vocabulary is the nucleus)."""
    torch.manual_seed(0)
    passed_over = 0
    for trial in range(60):
        settings = Sampling(temperature=0.3 + trial / 40, top_p=0.05 + 0.9 * (trial % 7) / 6, top_k=50 * (trial % 2),
                            seed=trial)
        s, logits, depth = Sampler(settings, 3, 0), torch.randn(40, 500) * (trial % 5), torch.randint(0, 5, (40,))
        plain = (logits / settings.temperature + s._noise_rows(depth, 7, 4, logits)).argmax(dim=-1)
        scores = s.scores(logits, depth, 7, 4)
        passed_over += int((scores.gather(-1, plain[:, None]) == float("-inf")).sum())
        assert torch.equal(s.draw(logits, depth, 7, 4), scores.argmax(dim=-1)), settings
    assert passed_over > 100  # the rounds that remove a drawn token outside the nucleus were taken


@pytest.mark.parametrize("bad,message", [
    ({"temperature": -1}, "sampling.temperature must be a number from 0"),
    ({"top_k": -2}, "sampling.top_k must be an integer of at least 0"),
    ({"top_p": 0}, "sampling.top_p must be a number above 0 and at most 1"),
    ({"seed": 1.5}, "sampling.seed must be an integer"),
])
def test_bad_settings_are_one_clear_error(bad, message):
    with pytest.raises(HarnessError, match=message):
        Sampling(**{"temperature": 1.0, **bad})


# --- every method reproduces vanilla sampling ----------------------------------------------------------------

# Every registered method with its example settings (Proposer.example: random heads, a one-layer drafter, a
# datastore of the prompts), on a tiny model of at least its min_layers; then settings that take other paths.
VARIANTS = [("tr", {"tree": "grown-n30-d6", "start": "cold"}), ("sam_tr", {"merge": True, "threshold": 2}),
            ("sps", {"drafter": "self:2", "topk": 3})]
CASES = [(name, None) for name in registry()] + VARIANTS
PROMPTS = [[3, 4, 5, 6, 3, 4, 5], [40, 41, 42], [7] * 6]


def decode_all(model, method, params, settings, engine=None, max_new=40):
    proposer = build_proposer(method, params, vocab_size=96, device=CPU, target=model)
    engine = engine or StaticEngine(model)
    out = []
    for q, prompt in enumerate(PROMPTS):
        for turn in range(2):
            gen = generate(engine, proposer, prompt, max_new_tokens=max_new, stop_ids=set(), turn=turn,
                           sampler=Sampler(settings, q, turn))
            out.append((gen.token_ids, gen.accept_lengths, gen.draft_nodes))
    return out


@pytest.mark.parametrize("settings", [Sampling(temperature=1.0, seed=1), Sampling(temperature=0.7, top_k=20, seed=2),
                                      Sampling(temperature=1.2, top_p=0.9, seed=3)], ids=lambda s: s.label())
@pytest.mark.parametrize("method,params", CASES, ids=lambda x: x if isinstance(x, str) else "")
def test_every_method_samples_exactly_vanillas_tokens(tiny_models, tmp_path, method, params, settings):
    cls = registry()[method]
    params = cls.example(tmp_path, PROMPTS) if params is None else params
    model = tiny_models(max(2, cls.min_layers))
    reference = decode_all(model, "vanilla", {}, settings)
    got = decode_all(model, method, params, settings)
    assert [t for t, *_ in got] == [t for t, *_ in reference]
    if cls.drafts:  # drafts were verified: accepted or not (a random head, a retrieval that a random model's
        #              samples defeat); the embedded model's sampled test (tests/test_lossless.py) asserts acceptance
        assert max(n for *_, nodes in got for n in nodes) > 1, "nothing drafted"


def test_seeds_and_turns_give_different_samples_and_greedy_is_unchanged(tiny_model):
    a = decode_all(tiny_model, "vanilla", {}, Sampling(temperature=1.0, seed=1))
    b = decode_all(tiny_model, "vanilla", {}, Sampling(temperature=1.0, seed=2))
    assert [t for t, *_ in a] != [t for t, *_ in b]
    assert a[0][0] != a[1][0]  # a question's two turns draw differently
    greedy = decode_all(tiny_model, "tr", {}, Sampling())
    engine = StaticEngine(tiny_model)
    proposer = build_proposer("tr", {}, vocab_size=96, device=CPU)
    plain = [generate(engine, proposer, p, max_new_tokens=40, stop_ids=set(), turn=t) for p in PROMPTS for t in (0, 1)]
    assert [t for t, *_ in greedy] == [g.token_ids for g in plain]  # temperature 0 is the greedy path itself


# --- the distribution of the first tokens --------------------------------------------------------------------

SETTINGS = Sampling(temperature=0.9, top_k=12, top_p=0.95)
PROMPT = [5, 17, 33, 2, 71, 9]
N = 2000


def exact_pairs(model, prompt: list[int], settings: Sampling) -> dict:
    """The exact probability of every pair of first two tokens after ``prompt``: {(t1, t2): p}."""
    with torch.no_grad():
        p1 = process(model(torch.tensor([prompt])).logits[0, -1:], settings)[0]
        pairs = {}
        for t1 in torch.nonzero(p1)[:, 0].tolist():
            p2 = process(model(torch.tensor([prompt + [t1]])).logits[0, -1:], settings)[0]
            for t2 in torch.nonzero(p2)[:, 0].tolist():
                pairs[(t1, t2)] = float(p1[t1] * p2[t2])
    return pairs


@pytest.fixture(scope="module")
def exact(tiny_model):
    return exact_pairs(tiny_model, PROMPT, SETTINGS)


def chi_square_p(samples: list[tuple[int, int]], exact: dict) -> float:
    """The p-value of Pearson's goodness-of-fit test of ``samples`` against ``exact`` (cells expecting fewer
    than 5 pooled into one; a sample outside the support fails at once)."""
    counts: dict = {}
    for s in samples:
        if s not in exact:
            return 0.0
        counts[s] = counts.get(s, 0) + 1
    n = len(samples)
    big = [c for c, p in exact.items() if n * p >= 5]
    observed = [counts.get(c, 0) for c in big] + [n - sum(counts.get(c, 0) for c in big)]
    expected = [n * exact[c] for c in big] + [n * (1 - sum(exact[c] for c in big))]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    df = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def first_pairs(model, method, params=None, warm=True):
    """The first two tokens of PROMPT with ``method`` for seeds 0..N-1 (question 0, turn 0)."""
    proposer = build_proposer(method, params or {}, vocab_size=96, device=CPU, target=model)
    engine = StaticEngine(model)
    if warm:  # TR's hot matrix holds this prompt's successors: its drafts are tried and often accepted
        generate(engine, proposer, PROMPT, max_new_tokens=8, stop_ids=set())
    out = []
    for seed in range(N):
        s = Sampling(temperature=SETTINGS.temperature, top_k=SETTINGS.top_k, top_p=SETTINGS.top_p, seed=seed)
        gen = generate(engine, proposer, PROMPT, max_new_tokens=2, stop_ids=set(), sampler=Sampler(s, 0, 0))
        out.append(tuple(gen.token_ids))
    return out


@pytest.fixture(scope="module")
def vanilla_pairs(tiny_model):
    """Vanilla's first pairs (nothing to warm: ``first_pairs``' warm-up leaves vanilla as it was)."""
    return first_pairs(tiny_model, "vanilla", warm=False)


@pytest.mark.xdist_group("vanilla_pairs")  # one worker computes them once (make test)
@pytest.mark.slow
def test_first_tokens_follow_the_exact_distribution_as_generate_does(tiny_model, exact, vanilla_pairs):
    assert abs(sum(exact.values()) - 1) < 1e-4
    ours = vanilla_pairs
    assert chi_square_p(ours, exact) > ALPHA
    assert first_pairs(tiny_model, "tr") == ours  # a speculative method: the very same samples
    theirs = []
    for seed in range(N):
        torch.manual_seed(seed)
        out = tiny_model.generate(torch.tensor([PROMPT]), do_sample=True, max_new_tokens=2,
                                  temperature=SETTINGS.temperature, top_k=SETTINGS.top_k, top_p=SETTINGS.top_p)
        theirs.append(tuple(out[0, len(PROMPT):].tolist()))
    assert chi_square_p(theirs, exact) > ALPHA  # the outside reference passes the same test


@pytest.mark.slow
def test_the_distribution_check_catches_a_broken_verifier(tiny_model, exact, monkeypatch):
    """Break the verifier as a plausible bug would (every node of a tree drawn with its root's noise, not its own
    position's): vanilla is untouched, but TR's accepted drafts make the second token depend on the first's
    draw, and the test must fail."""
    real = Sampler.draw

    def same_number_for_every_depth(self, logits, depth, start, max_depth):
        return real(self, logits, torch.zeros_like(depth), start, 0)

    monkeypatch.setattr(Sampler, "draw", same_number_for_every_depth)
    assert chi_square_p(first_pairs(tiny_model, "vanilla"), exact) > ALPHA
    assert chi_square_p(first_pairs(tiny_model, "tr"), exact) < ALPHA


# --- the equality checker and the reports at temperature > 0 -------------------------------------------------

def test_a_sampled_divergence_is_a_near_tie_only_when_the_perturbed_logits_tie():
    from evaluation.records.equality import NEAR_TIE, REAL, classify_draw

    s = Sampler(Sampling(temperature=0.5, seed=4), question=7, turn=0)
    g = s.noise(3, 4)
    # logits chosen so that tokens 1 and 2 have equal perturbed logits (logits / T + noise), above tokens 0 and 3
    logits = 0.5 * (torch.tensor([0.0, 10.0, 10.0, 0.0]) - g)
    kind, why = classify_draw(logits, 1, 2, torch.float32, s, 3)
    assert kind == NEAR_TIE and "perturbed logits" in why
    logits[2] -= 0.01  # a hundredth below, far beyond float noise: a real mismatch
    assert classify_draw(logits, 1, 2, torch.float32, s, 3)[0] == REAL
    removed = Sampler(Sampling(temperature=0.5, top_k=1, seed=4), question=7, turn=0)
    assert classify_draw(logits, 1, 2, torch.float32, removed, 3)[0] == REAL  # token 2 is filtered out


def test_reports_pair_a_sampled_run_with_vanilla_sampling_of_its_settings(tmp_path):
    import json

    from evaluation import report as rp

    def write(folder, method, seconds, sampling=None):
        folder.mkdir(parents=True)
        rec = {"question_id": 1, "category": "qa", "answer_id": "a", "model_id": "tiny", "tstamp": 0.0,
               "choices": [{"index": 0, "turns": ["x"], "decoding_steps": [2], "new_tokens": [4],
                            "wall_time": [seconds], "accept_lengths": [1, 3]}],
               **({"sampling": sampling} if sampling else {})}  # as the runner writes a sampled record
        (folder / "answers.jsonl").write_text(json.dumps(rec) + "\n")
        config = {"method": {"name": method}, "bench": {"name": "tiny", "max_new_tokens": 4},
                  **({"sampling": sampling} if sampling else {})}
        (folder / "summary.json").write_text(json.dumps({"model": "tiny", "method": method, "config": config}))

    hot = {"temperature": 0.7, "top_k": 0, "top_p": 1.0, "seed": 1}
    write(tmp_path / "v0", "vanilla", 4.0)
    write(tmp_path / "v7", "vanilla", 2.0, hot)
    write(tmp_path / "tr0", "tr", 1.0)
    write(tmp_path / "tr7", "tr", 1.0, hot)
    t = rp.report([str(tmp_path)], tmp_path / "out", figures=False)["table"].set_index("method")
    assert t.loc["tr", "speedup"] == pytest.approx(4.0)  # greedy against greedy vanilla
    assert t.loc["tr (T=0.7 seed=1)", "speedup"] == pytest.approx(2.0)  # sampled against sampled vanilla
    assert "vanilla (T=0.7 seed=1)" in t.index
    from evaluation.reporting.speed_table import speed_table

    s = speed_table([str(tmp_path / "tr7")], str(tmp_path / "v7"))[0].set_index("task")
    assert s.loc["overall", "sampling"] == "T=0.7 seed=1" and s.loc["overall", "speedup"] == pytest.approx(2.0)
    assert "sampling" not in speed_table([str(tmp_path / "tr0")], str(tmp_path / "v0"))[0].columns
    with pytest.raises(HarnessError, match=r"tr7 and .*v0 differ in sampling.\* \(T=0.7 seed=1 vs greedy\)"):
        speed_table([str(tmp_path / "tr7")], str(tmp_path / "v0"))
    (tmp_path / "v7" / "answers.jsonl").unlink()
    (tmp_path / "v7" / "summary.json").unlink()
    (tmp_path / "v7").rmdir()
    with pytest.raises(HarnessError, match=r"no vanilla run of model tiny on engine hf sampling at T=0.7 seed=1 \(runs: tr .*same sampling"):
        rp.report([str(tmp_path)], tmp_path / "out2", figures=False)


@pytest.mark.slow
@pytest.mark.long  # the tiny model's test above proves the rule; this one the embedded model's numbers
def test_the_embedded_models_first_tokens_follow_the_exact_distribution(embedded):
    """200 seeds on the real model: the first two tokens of a prompt under T=0.8, top-k 10, against the exact
    distribution, for our sampler; TR agrees with vanilla token for token on the first 50 (every method does on
    the tiny model and on three questions of this model: test_every_method_samples_exactly_vanillas_tokens, and
    test_method_samples_exactly_vanillas_tokens in tests/test_lossless.py). That the exact distribution is computed
    right, generate's samples show on the tiny model (test_first_tokens_follow_the_exact_distribution_as_generate_
    does: the same ``exact_pairs``)."""
    model, tok, spec = embedded
    from evaluation.running.prompts import prompt_ids

    settings = Sampling(temperature=0.8, top_k=10)
    prompt = prompt_ids(spec, tok, ["Write a short poem about the sea."], [])
    exact = exact_pairs(model, prompt, settings)
    engine = StaticEngine(model)
    samples = {}
    for method, n in (("vanilla", 200), ("tr", 50)):
        proposer = build_proposer(method, {}, vocab_size=model.config.vocab_size, device=CPU)
        samples[method] = [tuple(generate(engine, proposer, prompt, max_new_tokens=2, stop_ids=set(),
                                          sampler=Sampler(Sampling(temperature=0.8, top_k=10, seed=s), 0, 0)).token_ids)
                           for s in range(n)]
    assert samples["tr"] == samples["vanilla"][:50]
    assert chi_square_p(samples["vanilla"], exact) > ALPHA


@pytest.mark.slow
@pytest.mark.long  # five processes; the runner's sampling: tests/test_lossless.py, a seed's settings difference:
#                   tests/test_trust.py and the speed table above
def test_the_command_lines_sample_the_same_tokens_and_the_checker_says_equal(tmp_path):
    """``evaluation.run method=tr sampling.temperature=1.0 sampling.seed=1`` and the same with vanilla:
    ``evaluation.equal`` finds every turn identical, and a different seed is not."""
    from tests.helpers import cli

    common = ["bench.question_ids=[81,161]", "bench.max_new_tokens=16", "warmup=0", "runtime.progress=false",
              "sampling.temperature=1.0"]
    runs = {}
    for name, extra in (("vanilla", ["sampling.seed=1"]), ("tr", ["sampling.seed=1"]),
                        ("vanilla2", ["sampling.seed=2"])):
        method = name.rstrip("2")
        runs[name] = tmp_path / name
        cli("evaluation.run", f"method={method}", *common, *extra, f"hydra.run.dir={runs[name]}")
    same = cli("evaluation.equal", str(runs["vanilla"]), str(runs["tr"]))
    assert "identical turns (tokens): 3/3" in same.stdout and "EQUAL" in same.stdout
    other = cli("evaluation.equal", str(runs["vanilla"]), str(runs["vanilla2"]), "--no-explain", check=False)
    assert other.returncode == 2 and "differ in sampling.* (T=1 seed=1 vs T=1 seed=2): a settings difference" in \
        other.stderr  # another seed draws other tokens by design: not a mismatch
    import json

    rec = json.loads((runs["tr"] / "answers.jsonl").read_text().splitlines()[0])
    assert rec["sampling"] == {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 1}


@pytest.mark.xdist_group("vanilla_pairs")  # one worker computes them once (make test)
@pytest.mark.slow
def test_eagles_specinfer_rule_keeps_the_distribution_and_the_check_catches_a_missing_residual(tiny_model, exact,
                                                                                            vanilla_pairs, monkeypatch):
    """verify=specinfer (children sampled from the head, recursive rejection sampling): the first tokens follow the
    exact distribution though they are not vanilla's draws; without the residual after a rejection (p left as the
    target's own) the bonus token over-represents the rejected drafts, and the test fails."""
    import methods.sampling as sampling

    params = {"head": "random", "verify": "specinfer", "seed": 3}
    pairs = first_pairs(tiny_model, "eagle", params, warm=False)
    assert chi_square_p(pairs, exact) > ALPHA
    assert pairs != vanilla_pairs  # another coupling: other samples
    monkeypatch.setattr(sampling, "residual", lambda p, q: p)
    assert chi_square_p(first_pairs(tiny_model, "eagle", params, warm=False), exact) < ALPHA
