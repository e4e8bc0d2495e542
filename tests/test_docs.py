"""Every command the READMEs show is exercised: ``make`` targets exist, ``python -m evaluation.run`` overrides
compose into a config whose question selection loads, and every other ``python -m MODULE ARGS`` has its
arguments accepted by that module's own parser (the command is stopped there: a benchmark of an hour is not
run, but a renamed module, a removed option or a misspelt override fails here)."""
import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

from evaluation.records.bench import load_bench
from evaluation.running.config import compose_config
from methods.common import ROOT

READMES = ["README.md", "methods/README.md", "evaluation/README.md", "scripts/README.md", "results/README.md",
           "data/README.md"]
# Commands of other programs that the READMEs show, and what of them is checked here: the file they name exists.
OTHER = {"bash": 1, "jupyter": -1, "cat": -1}


def commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every shell command in a ``bash`` code block: continuation lines joined, a line split at
    ``;``, ``&&``, ``|`` and ``&``, a ``for`` loop's variable given its first value, optional arguments given,
    comments and environment assignments dropped."""
    out = []
    for name in READMES:
        text = (ROOT / name).read_text()
        for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
                lexer.whitespace_split, lexer.commenters = True, "#"
                tokens, loop = list(lexer), {}
                parts, part = [], []
                for t in tokens + [";"]:
                    if set(t) <= set(";&|"):
                        parts.append(part)
                        part = []
                    else:
                        part.append(t)
                for argv in parts:
                    if argv[:1] == ["for"]:
                        loop[argv[1]] = argv[3]
                        continue
                    argv = argv[1:] if argv[:1] == ["do"] else argv
                    argv = optional(argv)
                    argv = [re.sub(r"\$\{?(\w+)\}?", lambda m: loop.get(m.group(1), m.group(0)), a) for a in argv]
                    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
                        argv = argv[1:]
                    if argv and argv[0] not in ("done", "wait"):
                        out.append((f"{name}: {' '.join(argv)[:90]}", argv))
    return out


def optional(argv: list[str]) -> list[str]:
    """A usage line's optional arguments (``[--seed N]``) given: the brackets dropped."""
    out, inside = [], False
    for a in argv:
        if a.startswith("[-"):
            inside, a = True, a[1:]
        if inside and a.endswith("]"):
            inside, a = False, a[:-1]
        out.append(a)
    return out


class Parsed(Exception):
    pass


def parsed_by_the_module(module: str, args: list[str], monkeypatch) -> None:
    """Run ``module``'s ``main(args)`` up to its argument parser, which must accept them."""
    real = argparse.ArgumentParser.parse_args

    def parse(self, argv=None, namespace=None):
        real(self, argv, namespace)  # exits 2 on arguments it does not know
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse)
    main = importlib.import_module(module).main
    with pytest.raises(Parsed):
        main(args)


def composes(args: list[str]) -> None:
    """``evaluation.run ARGS``: the overrides compose (a sweep's first value of each list) and select questions."""
    overrides = [a for a in args if not a.startswith("-")]
    first = [re.sub(r"=([^\[\],]+),.*$", r"=\1", o) if "[" not in o else o for o in overrides]
    cfg = compose_config([o for o in first if not o.startswith(("hydra.", "+hydra"))])
    b = cfg.bench
    if re.fullmatch(r"[A-Z_]+|.*\.\.\..*", str(b.path or "")):
        return  # a placeholder path (bench.path=FILE)
    assert load_bench(b.path, b.get("file", "spec_bench"), categories=b.categories, question_ids=b.question_ids,
                      limit_per_category=b.limit_per_category, skip_per_category=b.skip_per_category)


def test_the_readme_is_read_in_five_minutes():
    """README.md: what it is, the two commands, first runs, what to expect, adding a method, the layout; the rest
    lives beside what it documents (the per-folder READMEs)."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    for name in READMES:
        assert (ROOT / name).is_file(), name


def test_the_readmes_show_commands():
    found = commands()
    assert len(found) >= 30, found
    assert sum(argv[:2] == ["make", "test"] for _, argv in found) >= 1


@pytest.mark.parametrize("where,argv", commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_readme_command_is_accepted(where, argv, monkeypatch):
    if argv[0] == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M)
        assert all(t in targets for t in argv[1:] if "=" not in t), f"{where}: no such make target"
        return
    if argv[0] in OTHER:
        assert (ROOT / argv[OTHER[argv[0]]]).exists(), f"{where}: {argv[OTHER[argv[0]]]} is not there"
        return
    assert Path(argv[0]).name.startswith("python") and argv[1] == "-m", f"{where}: a command this test cannot check"
    module, args = argv[2], argv[3:]
    if module == "evaluation.run":
        composes(args)
    elif module in ("methods", "scripts.prepare"):
        assert not args and callable(importlib.import_module(f"{module}.__main__" if module == "methods" else module)
                                     .main), where
    elif module == "pytest":
        assert all((ROOT / a.split("::")[0]).exists() for a in args if a.startswith("tests/")), where
    else:
        parsed_by_the_module(module, args, monkeypatch)
