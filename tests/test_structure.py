"""The structure the code relies on: ``methods/``, ``evaluation/`` and ``scripts/`` each a strict stack of layers,
one package above the other (every import read, those inside functions too), nothing outside a method's module
naming it, and no large file committed."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from methods.base import known_methods
from methods.common import ROOT

# Each package from the bottom up (modules by their path under it, a package by its folder): a module imports only
# modules of lower layers of its own package and the packages below it (``BELOW``). Importing methods.a.b also
# imports the package methods.a (its __init__), which counts for every importer outside that package.
LAYERS = {
    "methods": [
        {"common"},
        {"params", "machine", "hub", "sampling"},
        {"tree", "automata", "suffix_tree", "engine.ops", "engine.kv", "engine.arch", "engine.graphs", "engine.native"},
        {"engine.masks"},
        {"base", "engine.tuning"},
        {"engine.core"},
        {"engine.hf", "engine.static"},
        {"engine", "verify", "budget"},
        {"decode", "autotree", "heads", "heads.fit", "heads.eagle"},
        {"calibrate", "heads.eagle_train", "heads.medusa", "vllm_drafter"},
        {"heads.hydra", "heads.eagle3", "proposers"},
        {"proposers.*"},  # every method's module not named elsewhere: a new method needs no entry here
        {"proposers.sam", "proposers.eagle3"},  # methods built on other methods (SAM's hybrids, EAGLE-3 on EAGLE-2)
        {"__main__"},
    ],
    # what a run leaves behind (below both sides), what runs, what reads runs back, and the commands on top
    "evaluation": [
        {"records", "records.answers", "records.bench", "records.equality"},
        {"records.grading"},
        {"records.consistency", "records.metrics"},
        {"running", "running.config", "running.vllm_worker"},
        {"running.models", "running.prompts", "running.own_prompts", "running.folder"},
        {"running.paradigms"},
        {"running.explain", "running.runner"},
        {"running.vllm"},
        {"running.side_by_side"},
        {"reporting", "reporting.render", "reporting.collect", "reporting.columns"},
        {"reporting.tables", "reporting.speed_table", "reporting.simulate"},
        {"reporting.figures", "reporting.html"},
        {"reporting.build"},
        {"*"},  # the commands (python -m evaluation.run, .report, .equal, .speed, .merge, .runs; sweep's callbacks)
    ],
    # what several scripts share, then the scripts: none imports another
    "scripts": [
        {"shapes", "training"},
        {"*"},
    ],
}
BELOW = {"methods": (), "evaluation": ("methods",), "scripts": ("methods", "evaluation")}
PACKAGES = ("methods", "evaluation", "scripts", "tests")


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


def module_name(path: Path, root: Path, package: str = "methods") -> str:
    """methods/engine/kv.py -> engine.kv; methods/engine/__init__.py -> engine."""
    parts = path.relative_to(root / package).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def violations(root: Path, package: str = "methods") -> list[str]:
    """Every import in ``root``/``package`` that breaks its stack, and every module without a layer."""
    layer = {name: i for i, names in enumerate(LAYERS[package]) for name in names}
    wildcard = next((k for k in layer if k.endswith("*")), None)
    found = []
    for path in sorted((root / package).rglob("*.py")):
        name = module_name(path, root, package)
        if name == "":
            continue  # the package's __init__: a docstring
        if name not in layer and wildcard and name.startswith(wildcard[:-1]):
            layer[name] = layer[wildcard]
        if name not in layer:
            found.append(f"{package}/{path.relative_to(root / package)} has no place in the layers of {package}/")
    for path in sorted((root / package).rglob("*.py")):
        name = module_name(path, root, package)
        if name == "" or name not in layer:
            continue
        for imported in imports(path, root):
            top = imported.split(".")[0]
            if top in PACKAGES and top != package and top not in BELOW[package]:
                found.append(f"{name} imports {imported} ({package}/ is below {top}/)")
            if not imported.startswith(package + ".") or imported.count(".") == 0:
                continue
            target = imported.removeprefix(package + ".")
            needs = {target} | ({target.split(".")[0]} if "." in target and not name.startswith(
                target.split(".")[0] + ".") and name != target.split(".")[0] else set())
            for other in needs:
                if other in layer and layer[other] >= layer[name]:
                    found.append(f"{name} imports {package}.{other} (layer {layer[other]}, not below its "
                                 f"{layer[name]})")
    return found


@pytest.mark.parametrize("package", LAYERS)
def test_each_package_is_a_strict_stack(package):
    """No import runs back up a layer, and so no import circle, in methods/, evaluation/ or scripts/."""
    assert violations(ROOT, package) == []


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


@pytest.mark.parametrize("package,module,planted", [
    ("evaluation", "records/consistency.py", "    from evaluation.reporting.collect import bench_line\n"),  # the old circle
    ("evaluation", "running/runner.py", "from evaluation import report\n"),      # running reaching a command
    ("scripts", "train_hydra.py", "from scripts.train_medusa import main\n"),    # a script importing another
])
def test_the_evaluation_and_scripts_stacks_catch_a_planted_import(tmp_path, package, module, planted):
    shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / package / module
    text = path.read_text()
    if planted.startswith("    "):
        at = text.index("\n", text.index("\ndef ") + 1) + 1
        text = text[:at] + planted + text[at:]
    else:
        text += "\n" + planted
    path.write_text(text)
    found = violations(tmp_path, package)
    assert any(f.startswith(module_name(path, tmp_path, package) + " imports") for f in found), found


def test_no_method_is_named_outside_its_module():
    """The runner, the reports and the checks take methods from the registry: nothing in evaluation/ imports a
    proposer's module."""
    assert set(known_methods()) >= {"vanilla", "tr", "pld", "lookahead", "eagle", "eagle2", "eagle3", "sam", "sam_tr",
                                    "sam_eagle2", "sps", "medusa", "hydra", "rest"}
    for path in (ROOT / "evaluation").rglob("*.py"):
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
    """evaluation.running.config (composing, the model spec, the mismatch check) is importable without torch, and the
    runner's entry point does nothing on import (no resolver, no config store filled)."""
    code = ("import sys\nimport evaluation.running.config\nassert 'torch' not in sys.modules, 'torch imported'\n"
            "from omegaconf import OmegaConf\nimport evaluation.run\n"
            "assert not OmegaConf.has_resolver('run_folder'), 'a resolver registered on import'\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
