"""The structure the code relies on: ``methods/`` a strict stack of layers under ``evaluation/`` (every import
read, those inside functions too), nothing outside a method's module naming it, and no large file committed."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from methods.base import known_methods
from methods.common import ROOT

# methods/ from the bottom up (modules by their path under methods/, a package by its folder): a module imports
# only modules of lower layers. Importing methods.a.b also imports the package methods.a (its __init__), which
# counts for every importer outside that package.
LAYERS = [
    {"common"},
    {"params", "machine", "hub", "sampling"},
    {"tree", "engine.ops", "engine.kv", "engine.arch", "engine.graphs"},
    {"base", "engine.tuning"},
    {"engine.core"},
    {"engine.hf", "engine.static"},
    {"engine", "verify"},
    {"decode", "autotree", "heads", "heads.fit", "heads.eagle"},
    {"calibrate", "heads.eagle_train", "heads.medusa"},
    {"heads.hydra", "heads.eagle3", "proposers", "proposers.suffix"},
    {"proposers.*"},  # every method's module not named elsewhere: a new method needs no entry here
    {"proposers.sam", "proposers.eagle3"},  # methods built on other methods (SAM's hybrids, EAGLE-3 on EAGLE-2)
    {"__main__"},
]


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports, wherever the statement stands (``from methods.engine import kv``:
    methods.engine.kv; ``from methods.engine import build_engine``: methods.engine)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            folder = root.joinpath(*node.module.split("."))
            for a in node.names:
                sub = folder / a.name
                out.add(f"{node.module}.{a.name}" if sub.with_suffix(".py").exists() or sub.is_dir() else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def module_name(path: Path, root: Path) -> str:
    """methods/engine/kv.py -> engine.kv; methods/engine/__init__.py -> engine."""
    parts = path.relative_to(root / "methods").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def violations(root: Path) -> list[str]:
    """Every import in ``root``/methods that breaks the stack, and every module without a layer."""
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    names = [module_name(p, root) for p in sorted((root / "methods").rglob("*.py"))]
    for name in names:
        if name.startswith("proposers.") and name not in layer:
            layer[name] = layer["proposers.*"]
    found = []
    for path in sorted((root / "methods").rglob("*.py")):
        name = module_name(path, root)
        if name == "":
            continue  # methods/__init__.py: a docstring
        if name not in layer:
            found.append(f"methods/{path.relative_to(root / 'methods')} has no place in LAYERS")
            continue
        for imported in imports(path, root):
            if imported.startswith(("evaluation", "scripts", "tests")):
                found.append(f"{name} imports {imported} (methods/ is below evaluation/ and scripts/)")
            if not imported.startswith("methods.") or imported.count(".") == 0:
                continue
            target = imported.removeprefix("methods.")
            needs = {target} | ({target.split(".")[0]} if "." in target and not name.startswith(
                target.split(".")[0] + ".") and name != target.split(".")[0] else set())
            for other in needs:
                if other in layer and layer[other] >= layer[name]:
                    found.append(f"{name} imports methods.{other} (layer {layer[other]}, not below its {layer[name]})")
    return found


def test_methods_is_a_strict_stack():
    assert violations(ROOT) == []


@pytest.mark.parametrize("module,planted", [
    ("tree.py", "    from methods.proposers.tr import TokenRecycling\n"),   # a proposer from below, inside a function
    ("engine/kv.py", "from methods import decode\n"),                   # the loop from the KV cache
    ("heads/eagle.py", "import methods.proposers.eagle\n"),             # a head reading its method
    ("common.py", "from evaluation import report\n"),                   # methods/ reaching evaluation/
])
def test_the_stack_check_catches_a_planted_back_import(tmp_path, module, planted):
    shutil.copytree(ROOT / "methods", tmp_path / "methods", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "methods" / module
    text = path.read_text()
    if planted.startswith("    "):  # inside the first function of the module
        at = text.index("\n", text.index("\ndef ") + 1) + 1
        text = text[:at] + planted + text[at:]
    else:
        text += "\n" + planted
    path.write_text(text)
    found = violations(tmp_path)
    assert found and all(f.startswith(module_name(path, tmp_path) + " imports") for f in found), found


def test_no_method_is_named_outside_its_module():
    """The runner, the reports and the checks take methods from the registry: nothing in evaluation/ imports a
    proposer's module."""
    assert set(known_methods()) >= {"vanilla", "tr", "pld", "lookahead", "eagle", "eagle2", "eagle3", "sam", "sam_tr",
                                    "sam_eagle2", "sps", "medusa", "hydra", "rest"}
    for path in (ROOT / "evaluation").glob("*.py"):
        named = {m for m in imports(path) if m.startswith("methods.proposers")}
        assert not named, f"{path.relative_to(ROOT)} imports {sorted(named)}"
        assert not {m for m in imports(path) if m.startswith(("scripts", "tests"))}, path


def test_no_tracked_file_is_over_12_mb():
    """Large artefacts (model weights, caches) are found or downloaded, not committed: every file git tracks
    stays under 12 MB (the embedded model's shipped heads included)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked files to weigh")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    sizes = {n.decode(): (ROOT / n.decode()).stat().st_size for n in names if n and (ROOT / n.decode()).is_file()}
    assert len(sizes) > 100, "git ls-files listed too few files to be this project"
    assert not {n: s for n, s in sizes.items() if s >= 12_000_000}


def test_config_composition_imports_no_torch():
    """evaluation.config (composing, the model spec, the mismatch check) is importable without torch, and the
    runner's entry point does nothing on import (no resolver, no config store filled)."""
    code = ("import sys\nimport evaluation.config\nassert 'torch' not in sys.modules, 'torch imported'\n"
            "from omegaconf import OmegaConf\nimport evaluation.run\n"
            "assert not OmegaConf.has_resolver('run_folder'), 'a resolver registered on import'\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
