"""What a run is configured with: composing the Hydra config (``conf/``, every registered method and engine),
reading it into checked settings (the model spec, the method and its parameters, sampling), and telling whether
two runs' configs would give the same answers. Importing this module imports no torch; composing imports the
methods' declarations.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from omegaconf import DictConfig, OmegaConf

from evaluation.records.answers import first_difference
from methods.common import ROOT, HarnessError

# Settings that cannot change a run's tokens or timings: a resumed run (or a shard being merged) may differ in
# these only. Everything else in the resolved config, the engine included, must match.
RESULT_NEUTRAL = ("runtime.progress", "runtime.exclusive_device", "report")


@dataclass
class ModelSpec:
    name: str
    checkpoint: str  # a local folder, a hub id (methods.hub decides which), or "embedded:<name>"
    # The prompt format (evaluation.running.prompts): the one behind the published numbers this model is compared with.
    template: str  # a fastchat template name, or "chat_template" for the tokenizer's own
    system_prompt: str | None = None  # None: the template's own; a name in prompts.SYSTEM_PROMPTS, or the text
    prompt_suffix: str = ""  # appended to the prompt text (EAGLE's Llama-2-chat script adds " ")
    prompt_source: str = ""  # where this format comes from (printed in the run summary)
    dtype: str = "auto"  # auto: float16 on CUDA, float32 on CPU
    device: str = "auto"  # auto: CUDA when present, else CPU
    expects_gpu: bool = False  # device=auto falling back to the CPU says so loudly (a 7B model in fp32 on a CPU)
    attn_implementation: str = "sdpa"
    max_context: int | None = None  # default: config.max_position_embeddings
    # What the methods read from this model, by name (a head, a corpus, a drafter: a folder, a hub id or a file);
    # a method's parameter defaults to one of them in a run (methods.params.artefact: method.head is
    # artefacts.eagle_head for EAGLE), null where the model names none.
    artefacts: dict[str, str | None] = field(default_factory=dict)
    # A reasoning model's thinking (evaluation.running.paradigms): ``answer_after``, the text whose last occurrence its
    # final answer follows, and ``forced``, the text SpecTTS-Bench feeds to end the thinking once 80% of the budget
    # is spent (bench.force_end_of_thinking). None: a model that does not think.
    thinking: dict[str, str] | None = None


def folder_name(overrides: str) -> str:
    """The run folder's name from Hydra's ``override_dirname``: ``default`` for none, so that runs with overrides
    are its siblings; one path component always (``/`` in a value, as in ``bench.path=/a/b.jsonl``, is written
    ``%2F``), and a name too long for a file system ends in a hash of the whole.

    >>> folder_name("bench.path=../x.jsonl,method.k=4")
    'bench.path=..%2Fx.jsonl,method.k=4'
    """
    import hashlib

    name = (overrides or "default").replace("%", "%25").replace("/", "%2F").replace("\0", "")
    if len(name.encode()) > 200:
        name = name.encode()[:180].decode(errors="ignore") + "~" + hashlib.sha256(name.encode()).hexdigest()[:16]
    return name


def cuda_devices(least=0) -> int:
    """``${cuda_devices:}`` / ``${cuda_devices:1}``: the CUDA devices this machine shows (at least the argument),
    for conf/cluster/: local jobs see them all and each claims one."""
    import torch

    return max(int(least), torch.cuda.device_count())


def register() -> None:
    """Give OmegaConf the project's resolvers and Hydra every registered method (``method=NAME``) and engine
    (``engine=NAME``), from their parameter declarations (``methods.params``): the defaults live there, not in
    YAML files. Done before each composition, so that a method registered later (from outside ``methods/``) is
    found too."""
    from hydra.core.config_store import ConfigStore

    from methods.base import registry
    from methods.engine import ENGINE_PARAMS
    from methods.params import config_node

    OmegaConf.register_new_resolver("run_folder", folder_name, replace=True)
    OmegaConf.register_new_resolver("cuda_devices", cuda_devices, replace=True)
    store = ConfigStore.instance()
    for group, table in (("method", {n: c.Params for n, c in registry().items()}), ("engine", ENGINE_PARAMS)):
        for name, declaration in table.items():
            store.store(group=group, name=name, node=config_node(name, declaration))


def compose_config(overrides: list[str]) -> DictConfig:
    """The runner's config for these overrides, outside a Hydra app (scripts and tests)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        try:
            return compose(config_name="config", overrides=overrides)
        except HydraException as e:
            raise HarnessError(config_error(e)) from None


def config_error(e: Exception) -> str:
    """One line for an error Hydra raised composing the config: an unknown option of a group (``model=NAME``) or
    an unknown key (``bench.KEY=VALUE``) is named with the known ones and the nearest of them (Hydra's own message
    spans lines and proposes ``+KEY=VALUE``, which only adds a key nothing reads); anything else as Hydra says it."""
    import difflib

    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    def nearest(name: str, known, prefix: str = "") -> str:
        close = difflib.get_close_matches(name, known, n=1)
        return f" (did you mean {prefix}{close[0]}?)" if close else ""

    if isinstance(e, MissingConfigException) and e.options and "/" in (e.missing_cfg_file or ""):
        group, _, name = e.missing_cfg_file.rpartition("/")
        return f"{group}={name}: no such {group}{nearest(name, e.options)}; known: {', '.join(e.options)}"
    cause = e.__cause__
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key and cause.parent_node is not None:
        group, _, name = cause.full_key.rpartition(".")
        if group in ("method", "engine"):  # a registered method's or engine's parameters (methods.params)
            known = [k for k in cause.parent_node if k != "name"]
            have = f"known: {', '.join(known)}" if known else "it takes none"
            return (f"{group} '{cause.parent_node.get('name')}' has no parameter {name}"
                    f"{nearest(name, known, group + '.')}; {have}")
        known = list(cause.parent_node)
        return (f"unknown setting {cause.full_key}{nearest(name, known, group + '.' if group else '')}; the keys of "
                f"{group or 'the config'}: {', '.join(known) or 'none'}")
    return " ".join(str(e).split())


def model_spec(cfg: DictConfig) -> ModelSpec:
    """The run's model config, checked: every key known, and every artefact one that some method reads."""
    from methods.base import registry
    from methods.params import artefact_keys

    raw = OmegaConf.to_container(cfg.model, resolve=True)
    known = {f.name for f in fields(ModelSpec)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise HarnessError(f"unknown model config keys {unknown}; known: {', '.join(sorted(known))}")
    read = artefact_keys(c.Params for c in registry().values())
    unread = sorted(set(raw.get("artefacts") or {}) - read)
    if unread:
        raise HarnessError(f"model config {raw.get('name')!r}: no method reads artefacts {unread}; the methods read "
                           f"{', '.join(sorted(read))}")
    return ModelSpec(**raw)


def batch_size(cfg: DictConfig) -> int:
    """``runtime.batch_size``, checked (absent: 1)."""
    runtime = cfg.get("runtime") or {}
    value = runtime.get("batch_size", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HarnessError(f"runtime.batch_size must be an integer of at least 1 (the turns decoded at once), got "
                           f"{value!r}; runtime.batch_size=1 decodes one at a time")
    return value


def prefill_chunk(cfg: DictConfig) -> int:
    """``runtime.prefill_chunk``, checked (absent: 0, a prompt prefilled whole)."""
    return int_setting((cfg.get("runtime") or {}).get("prefill_chunk", 0), "runtime.prefill_chunk", 0)


def budget_settings(cfg: DictConfig) -> tuple[str, int | None]:
    """``runtime.budget`` and ``runtime.spec_off_above``, checked (absent: off, null): ``methods.budget``."""
    from methods.budget import check_settings

    runtime = cfg.get("runtime") or {}
    policy, off_above = runtime.get("budget", "off"), runtime.get("spec_off_above")
    policy = "off" if policy is False else policy  # YAML 1.1 reads an unquoted off as false
    check_settings(policy, off_above)
    return policy, off_above


def sampling_settings(cfg: DictConfig):
    """The run's ``sampling.*`` (absent: greedy), checked: a ``methods.sampling.Sampling``."""
    from methods.sampling import Sampling

    raw = OmegaConf.to_container(cfg.sampling, resolve=True) if cfg.get("sampling") is not None else {}
    known = [f.name for f in fields(Sampling)]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise HarnessError(f"unknown sampling setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return Sampling(**raw)


def method_params(cfg: DictConfig) -> tuple[str, dict]:
    """The method's name and its parameters (plain values; checked when the proposer is built)."""
    params = OmegaConf.to_container(cfg.method, resolve=True)
    return params.pop("name"), params


def int_setting(value, key: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise HarnessError(f"{key} must be an integer of at least {least}, got {value!r}")
    return value


def config_mismatch(before: dict, now: dict, ignore: tuple[str, ...] = RESULT_NEUTRAL,
                    where: tuple[str, str] = ("there", "here")) -> str | None:
    """None when two resolved run configs would give the same answers, else the first setting that differs
    ("KEY is A there but B here"; ``where`` names the two sides)."""
    diff = first_difference(before, now, ignore)
    return None if diff is None else f"{diff[0]} is {diff[1]!r} {where[0]} but {diff[2]!r} {where[1]}"
