"""Parameters declared once: a dataclass per method (and engine), one parser that checks them.

A method declares its parameters as a dataclass of ``param`` fields: the type (the annotation), the
default, the range or the choices, and one line of help. That one declaration is

* the Hydra config group option (``method=NAME``: ``config_node`` gives Hydra the defaults, so
  ``method.k=4`` overrides and an unknown key is refused when the config is composed),
* what ``parse`` checks a method's parameters against, whoever builds it (the runner, a script, a test),
* the table of ``describe`` (``python -m methods``).

A default that the run's config fills in differs from the one code gets: ``config=`` (EAGLE's
``head`` is the model config's head, ``artefact("eagle_head")``, in a run, and absent in code).
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import MISSING, field

from methods.common import HarnessError

AUTO = "auto"


def param(default, help: str, *, low: int | None = None, high: int | None = None, choices: tuple | None = None,
          config=MISSING, auto: bool = False):
    """A parameter: its default, one line of help, an integer range or a set of choices, and optionally the
    value the run's config gives it instead of ``default`` (an interpolation such as ``${model.x}``).
    ``auto``: an integer parameter that may also be ``auto`` (chosen by the method for this device; annotate
    it ``int | str``)."""
    return field(default=default, metadata={"help": help, "low": low, "high": high, "choices": choices,
                                            "config": config, "auto": auto})


def artefact(key: str) -> str:
    """The ``config=`` of a parameter that defaults, in a run, to what the model config names under
    ``artefacts.KEY`` (a head, a corpus, a drafter), or null where the model names none."""
    return f"${{oc.select:model.artefacts.{key},null}}"


def artefact_key(f) -> str | None:
    """The ``artefacts`` key a parameter declaration (a dataclass field) reads by default (``artefact``), or None."""
    import re

    config = f.metadata.get("config")
    m = re.fullmatch(r"\$\{oc\.select:model\.artefacts\.(\w+),null\}", config) if isinstance(config, str) else None
    return m.group(1) if m else None


def artefact_keys(declarations) -> set[str]:
    """The ``artefacts`` keys that these parameter declarations read (``artefact``)."""
    return {k for d in declarations for f in dataclasses.fields(d) if (k := artefact_key(f))}


def _show(value) -> str:
    """A value as a user writes it on the command line (true, not True)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def _check(value, kind, meta: dict, key: str) -> None:
    """Raise a HarnessError naming ``key`` when ``value`` is not of ``kind`` or outside the declared range."""
    choices, low, high = meta.get("choices"), meta.get("low"), meta.get("high")
    if choices is not None:
        if not any(value == c and type(value) is type(c) for c in choices):
            raise HarnessError(f"{key} must be one of {', '.join(_show(c) for c in choices)}, got {value!r}")
        return
    optional = isinstance(kind, types.UnionType) and type(None) in typing.get_args(kind)
    if meta.get("auto"):
        if value == AUTO:
            return
        kind = int | None if optional else int
    if optional:
        if value is None:
            return
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    if kind is bool:
        if value not in (True, False) or not isinstance(value, bool):
            raise HarnessError(f"{key} must be true or false, got {value!r}")
    elif kind is int:
        top = f" to {high}" if high is not None else ""
        what = f"an integer from {low}{top}" if low is not None else "an integer"
        what += f" or {AUTO}" if meta.get("auto") else ""
        what += " or null" if optional else ""
        if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low) \
                or (high is not None and value > high):
            raise HarnessError(f"{key} must be {what}, got {value!r}")
    elif kind is float:
        what = "a number" + (f" of at least {low}" if low is not None else "")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (low is not None and value < low) \
                or (high is not None and value > high):
            raise HarnessError(f"{key} must be {what}{f' and at most {high}' if high is not None else ''}, got "
                               f"{value!r}")
    elif kind is str:
        if not isinstance(value, str):
            raise HarnessError(f"{key} must be a string, got {value!r}")


def parse(declaration: type, raw: dict, owner: str, prefix: str = "method"):
    """``raw`` (plain values: a composed config's group, or a dict from code) checked against ``declaration``
    and completed with its defaults; ``owner`` names the method or engine in the messages (``method 'tr'``)."""
    known = [f.name for f in dataclasses.fields(declaration)]
    unknown = sorted(set(raw) - set(known))
    if unknown:  # the configs' words (evaluation.running.config), so that code and configs say it alike
        close = difflib.get_close_matches(unknown[0], known, n=1) if len(unknown) == 1 else []
        hint = f" (did you mean {prefix}.{close[0]}?)" if close else ""
        have = f"known: {', '.join(known)}" if known else "it takes none"
        raise HarnessError(f"{owner} has no parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}{hint}; "
                           f"{have}")
    hints = typing.get_type_hints(declaration)
    values = {}
    for f in dataclasses.fields(declaration):
        value = raw.get(f.name, f.default)
        _check(value, hints[f.name], f.metadata, f"{prefix}.{f.name}")
        values[f.name] = value
    return declaration(**values)


def config_node(name: str, declaration: type) -> dict:
    """The Hydra config of option ``name``: its name and every parameter's default (or its config value)."""
    node = {"name": name}
    for f in dataclasses.fields(declaration):
        config = f.metadata.get("config", MISSING)
        node[f.name] = f.default if config is MISSING else config
    return node


def describe(name: str, declaration: type, seen: dict | None = None, owner: str = "") -> list[str]:
    """One line per parameter: name, default, allowed values, help. A default the run's config fills in from the
    model config's artefacts is named so (``the model's artefacts.eagle_head``); with ``seen`` (help text -> where it
    was first printed; ``owner``: the method's name there), a long help printed before is not printed again."""
    hints = typing.get_type_hints(declaration)
    lines = []
    for f in dataclasses.fields(declaration):
        m = f.metadata
        if m.get("choices") is not None:
            allowed = " | ".join(_show(c) for c in m["choices"])
        elif m.get("low") is not None:
            allowed = f"{m['low']}..{m['high'] if m.get('high') is not None else ''}"
            allowed += f" | {AUTO}" if m.get("auto") else ""
        else:
            kind = hints[f.name]
            allowed = getattr(kind, "__name__", str(kind))
        config = m.get("config", MISSING)
        key = artefact_key(f)
        default = _show(f.default) if config is MISSING else f"(the model's artefacts.{key})" if key else config
        text = m.get("help", "")
        if seen is not None and len(text) > 60:
            where = f"{owner or name}'s {f.name}"
            text, _ = (f"as {seen[text]}", None) if text in seen else (text, seen.setdefault(text, where))
        lines.append(f"  {name}.{f.name}={default}  [{allowed}]  {text}")
    return lines
