"""Every config composes, and every model config describes a loadable ModelSpec."""

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from evaluation.running.models import ModelSpec
from methods.base import known_methods
from methods.common import ROOT

CONF = ROOT / "conf"


def names(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(*overrides, return_hydra_config: bool = False):
    """Hydra's own compose, after the registered methods, engines and resolvers are given to it."""
    from evaluation.running.config import register

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=return_hydra_config)


def test_method_and_engine_options_come_from_their_declarations():
    """method=NAME and engine=NAME are the registered declarations (methods.params), defaults written once: no
    YAML repeats them, every default composes and passes the method's own checks."""
    from evaluation.running.config import register
    from methods.base import registry
    from methods.engine import ENGINE_PARAMS
    from methods.params import config_node, parse

    register()
    assert not (CONF / "method").exists() and not (CONF / "engine").exists()
    for group, table in (("method", {n: c.Params for n, c in registry().items()}), ("engine", ENGINE_PARAMS)):
        for name, declaration in table.items():
            composed = OmegaConf.to_container(_compose(f"{group}={name}")[group])
            assert composed == config_node(name, declaration)
            values = {k: v for k, v in composed.items() if k != "name" and not str(v).startswith("${")}
            parse(declaration, values, f"{group} '{name}'", prefix=group)
    assert set(known_methods()) >= {"eagle", "eagle2", "eagle3", "hydra", "lookahead", "medusa", "pld", "rest", "sam",
                                    "sam_eagle2", "sam_tr", "sps", "tr", "vanilla"}  # the built-in ones, at least
    assert _compose("method=eagle", "model=vicuna-7b").method.head == "yuhuili/EAGLE-Vicuna-7B-v1.3"
    assert _compose("method=sam_tr").method.corpus == "data/sam/smollm2-135m.npz"  # the model config's corpus
    assert _compose("method=sam", "model=vicuna-7b").method.corpus == "data/sam/vicuna-7b.npz"  # one the user makes
    assert _compose("method=sps", "model=vicuna-7b").method.drafter == "double7/vicuna-68m"  # Spec-Bench's drafter
    assert _compose("method=sps").method.drafter == "self:8"


def test_a_bad_method_value_is_named_with_its_range():
    from methods.base import build_proposer
    from methods.common import HarnessError

    cfg = _compose("method=tr", "method.k=abc")
    method = OmegaConf.to_container(cfg.method, resolve=True)
    with pytest.raises(HarnessError, match="method.k must be an integer from 1 to 1024, got 'abc'"):
        build_proposer(method.pop("name"), method, vocab_size=100, device=None)


@pytest.mark.parametrize("model", names("model"))
def test_model_configs(model):
    cfg = _compose(f"model={model}")
    spec = ModelSpec(**OmegaConf.to_container(cfg.model, resolve=True))
    assert spec.name == model
    assert spec.device == "auto" and spec.dtype == "auto"


@pytest.mark.parametrize("bench", names("bench"))
def test_bench_configs(bench):
    cfg = _compose(f"bench={bench}")
    assert cfg.bench.name == bench and cfg.bench.max_new_tokens >= 1


def test_defaults():
    cfg = _compose()
    assert (cfg.model.name, cfg.method.name, cfg.bench.name) == ("smollm2-135m", "vanilla", "spec_bench_smoke")
    assert _compose("bench=spec_bench").bench.max_new_tokens == 1024  # Spec-Bench's default
    vicuna = _compose("model=vicuna-7b").model
    assert vicuna.template == "vicuna_v1.1" and vicuna.checkpoint == "lmsys/vicuna-7b-v1.3"


def test_missing_question_file_offline_says_where_to_put_it(monkeypatch, tmp_path):
    from evaluation.records import bench as data
    from methods.common import HarnessError

    monkeypatch.setattr(data, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(data, "SHARED", tmp_path / "no-shared")
    pinned = data.QUESTION_FILES["spec_tts"]  # nothing listens on port 9
    monkeypatch.setitem(data.QUESTION_FILES, "spec_tts", dataclasses.replace(pinned, url="http://127.0.0.1:9/q.jsonl"))
    with pytest.raises(HarnessError, match=rf"put question_cot.jsonl at {tmp_path}.*bench.path=FILE"):
        data.fetch("spec_tts")
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()], "no partial file left behind"


def sweep(key: str, values: str) -> list[str]:
    """A sweeper parameter's values as Hydra expands them (``glob(*)``: every option of the config group)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    override = OverridesParser.create().parse_override(f"{key}={values}")
    if isinstance(override.value(), Glob):
        from hydra.core.global_hydra import GlobalHydra

        from evaluation.running.config import register

        register()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            options = GlobalHydra.instance().config_loader().get_group_options(key)
        return override.value().filter(options)
    return list(override.sweep_string_iterator())


def test_the_paper_table_sweeps_every_registered_method():
    """The paper table's methods are the registry's, not a list kept by hand."""
    full = _compose("experiment=paper_table", return_hydra_config=True)
    assert sorted(sweep("method", str(full.hydra.sweeper.params.method))) == sorted(known_methods())


@pytest.mark.parametrize("experiment", names("experiment"))
def test_every_experiment_point_composes_and_builds(experiment, embedded):
    """Dry run: every point of every sweep composes and its method accepts its parameters."""
    import torch

    from methods.base import build_proposer

    full = _compose(f"experiment={experiment}", return_hydra_config=True)
    assert full.hydra.mode.name == "MULTIRUN"
    params = full.hydra.sweeper.params
    assert params, f"experiment {experiment} sweeps nothing"
    points = [[]]
    for key, values in params.items():
        points = [p + [f"{key}={v}"] for p in points for v in sweep(key, str(values))]
    for point in points:
        cfg = _compose(f"experiment={experiment}", *point)
        method = OmegaConf.to_container(cfg.method, resolve=True)
        name = method.pop("name")
        build_proposer(name, method, vocab_size=49152, device=torch.device("cpu"), target=embedded[0])


def test_python_m_methods_lists_every_method_and_engine(capsys):
    from methods.__main__ import main

    main()
    out = capsys.readouterr().out
    for name in known_methods():
        assert f"\nmethod={name}\n" in out, name
    assert "\nengine=static\n" in out and "  engine.threads=auto" in out and "  method.head=" in out


def test_every_artefact_a_method_reads_comes_from_the_model_config_and_a_misspelt_one_is_refused():
    """A method parameter that defaults to the model's artefact reads model.artefacts.KEY (null where the model
    names none), and an artefact no method reads is a typo, refused with the keys that are read."""
    from evaluation.running.config import compose_config, model_spec
    from methods.common import HarnessError

    cfg = compose_config(["method=eagle2"])
    assert cfg.method.head == cfg.model.artefacts.eagle_head == "data/eagle/smollm2-135m"
    assert compose_config(["method=eagle3", "model=llama-2-7b-chat"]).method.head is None
    assert model_spec(cfg).artefacts["sam_corpus"] == "data/sam/smollm2-135m.npz"
    with pytest.raises(HarnessError, match=r"no method reads artefacts \['eagel_head'\]; the methods read .*eagle_head"):
        model_spec(compose_config(["+model.artefacts.eagel_head=x"]))
