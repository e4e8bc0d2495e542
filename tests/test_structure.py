"""The structure the code relies on: ``methods/`` a strict stack under ``evaluation/``, nothing outside a
method's module naming it, and no large file committed."""
import ast
import subprocess
from pathlib import Path

import pytest

from methods.base import known_methods
from methods.common import ROOT

# methods/ from the bottom up: a module imports (at its top level) only modules of lower layers.
LAYERS = [
    {"common"},
    {"params", "machine", "hub", "suffix", "sampling"},
    {"tree", "ops"},
    {"kv", "base"},
    {"engine", "verify"},
    {"decode", "autotree"},
    {"calibrate"},
    {"vanilla", "tr", "pld", "lookahead", "eagle", "medusa", "rest", "sps"},
    {"sam", "eagle_train", "hydra"},
    {"eagle3"},
]


def imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            if node.module == "methods":
                out |= {f"methods.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_methods_is_a_strict_stack():
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    modules = {p.stem for p in (ROOT / "methods").glob("*.py")} - {"__init__"}
    assert modules == set(layer), "a new module in methods/ needs its place in LAYERS"
    for name in modules:
        for imported in imports(ROOT / "methods" / f"{name}.py", top_level_only=True):
            if imported.startswith("methods."):
                other = imported.split(".")[1]
                assert layer[other] < layer[name], f"methods/{name}.py imports methods.{other} (not below it)"
            assert not imported.startswith(("evaluation", "scripts")), f"methods/{name}.py imports {imported}"


def test_no_method_is_named_outside_its_module():
    """The runner, the reports and the checks take methods from the registry: none imports a method's module."""
    method_modules = {f"methods.{m}" for m in ("vanilla", "tr", "pld", "lookahead", "eagle", "sam", "medusa", "rest",
                                               "sps")}
    assert set(known_methods()) >= {"vanilla", "tr", "pld", "lookahead", "eagle", "eagle2", "sam", "sam_tr",
                                    "sam_eagle2"}
    for path in (ROOT / "evaluation").glob("*.py"):
        named = imports(path, top_level_only=False) & method_modules
        assert not named, f"{path.relative_to(ROOT)} imports {sorted(named)}"


def test_no_tracked_file_is_over_12_mb():
    """Large artefacts (model weights, caches) are found or downloaded, not committed: every file git tracks
    stays under 12 MB (the embedded model's shipped heads included)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked files to weigh")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    sizes = {n.decode(): (ROOT / n.decode()).stat().st_size for n in names if n and (ROOT / n.decode()).is_file()}
    assert len(sizes) > 100, "git ls-files listed too few files to be this project"
    assert not {n: s for n, s in sizes.items() if s >= 12_000_000}
