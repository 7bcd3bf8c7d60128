"""The package's import graph: no circle, and the layers import only downward.

Reads every module's imports as text (``ast``), including the ones inside
functions, so a lazy import cannot hide a circle.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path
from typing import Dict, Set

import pytest

import ptq_protein
from ptq_protein import _compat

ROOTS = {  # installed package name -> source folder
    "ptq_protein": Path(ptq_protein.__file__).parent,
}


def _source_root(pkg: str) -> Path:
    return Path(importlib.import_module(pkg).__file__).parent


def _modules() -> Dict[str, Path]:
    found: Dict[str, Path] = {}
    for pkg in ("ptq_protein", "ptq_protein.eval"):
        root = _source_root(pkg)
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([pkg, *parts])
            if pkg == "ptq_protein" and parts[:1] == ["eval"]:
                continue  # not in this folder in a source checkout; installed trees are covered by their own root
            found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Set[str]:
    """Names of ptq_protein modules that ``name`` imports (resolved to a module that exists)."""
    out: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES]
            # `from pkg import submodule` needs the submodule; `from pkg import name` needs pkg itself
            targets = subs if len(subs) == len(node.names) else [node.module] + subs
        for t in targets:
            # a module's own ancestor packages are imported before it by Python itself: not an edge
            if t.startswith("ptq_protein") and t in MODULES and t != name and not name.startswith(t + "."):
                out.add(t)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_every_module_found():
    assert "ptq_protein.nn.modules" in GRAPH and "ptq_protein.eval.bench.runner" in GRAPH
    assert "ptq_protein.kernels.int8_gemm" in GRAPH and "ptq_protein.eval.tmscore" in GRAPH


def test_no_import_circle():
    # Depth-first search for a back edge; a package importing its own submodule is an edge like any other.
    state: Dict[str, int] = {}
    stack: list = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node)


# layer -> prefixes it must never import
_STAGES = ("ptq_protein.models", "ptq_protein.calibration", "ptq_protein.quant", "ptq_protein.nn",
           "ptq_protein.transforms", "ptq_protein.passes", "ptq_protein.recipes", "ptq_protein.search",
           "ptq_protein.workflows", "ptq_protein.workloads", "ptq_protein.interop", "ptq_protein.kernels",
           "ptq_protein.artifact", "ptq_protein.data", "ptq_protein.api", "ptq_protein.cli", "ptq_protein.eval")
_FAMILIES = ("ptq_protein.recipes.presets", "ptq_protein.recipes.study", "ptq_protein.recipes.ours",
             "ptq_protein.recipes.baselines")
FORBIDDEN = {
    "ptq_protein.support": _STAGES,  # plumbing: imports no stage
    "ptq_protein.recipes.config": tuple(s for s in _STAGES if s != "ptq_protein.recipes") + _FAMILIES,
    "ptq_protein.recipes.method_config": tuple(s for s in _STAGES if s != "ptq_protein.recipes") + _FAMILIES,
    "ptq_protein.recipes.site_plan": tuple(s for s in _STAGES if s != "ptq_protein.recipes") + _FAMILIES,
    "ptq_protein.quant": ("ptq_protein.calibration", "ptq_protein.nn", "ptq_protein.models", "ptq_protein.api",
                          "ptq_protein.artifact", "ptq_protein.cli", "ptq_protein.eval", "ptq_protein.data"),
    "ptq_protein.models": ("ptq_protein.calibration", "ptq_protein.nn", "ptq_protein.api", "ptq_protein.artifact",
                           "ptq_protein.cli", "ptq_protein.eval.bench"),
    "ptq_protein.calibration": ("ptq_protein.nn", "ptq_protein.transforms", "ptq_protein.api", "ptq_protein.artifact",
                                "ptq_protein.cli", "ptq_protein.eval"),
    "ptq_protein.nn": ("ptq_protein.api", "ptq_protein.artifact", "ptq_protein.cli", "ptq_protein.eval",
                       "ptq_protein.transforms"),
    "ptq_protein.transforms": ("ptq_protein.nn", "ptq_protein.api", "ptq_protein.artifact", "ptq_protein.cli",
                               "ptq_protein.eval") + _FAMILIES,
    "ptq_protein.kernels": ("ptq_protein.calibration", "ptq_protein.nn", "ptq_protein.models", "ptq_protein.api",
                            "ptq_protein.cli", "ptq_protein.eval", "ptq_protein.quant"),
    "ptq_protein.passes": ("ptq_protein.api", "ptq_protein.artifact", "ptq_protein.cli", "ptq_protein.eval",
                           "ptq_protein.search", "ptq_protein.workflows"),
    "ptq_protein.search": ("ptq_protein.cli",),
    "ptq_protein.workflows": ("ptq_protein.cli", "ptq_protein.workloads"),
    "ptq_protein.workloads": ("ptq_protein.cli",),
    "ptq_protein.interop": ("ptq_protein.cli",),
    "ptq_protein.artifact": ("ptq_protein.cli", "ptq_protein.eval"),
    "ptq_protein.eval": ("ptq_protein.calibration", "ptq_protein.nn", "ptq_protein.models", "ptq_protein.quant",
                         "ptq_protein.api", "ptq_protein.artifact", "ptq_protein.cli", "ptq_protein.kernels"),
}


def test_the_package_root_holds_only_its_face():
    """Every root module is the package face or one stage of its own; the rest lives in a stage's folder."""
    root = Path(ptq_protein.__file__).parent
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py", "_compat.py", "api.py"]


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_downward(layer):
    bad = []
    for name, deps in GRAPH.items():
        if not (name == layer or name.startswith(layer + ".")):
            continue
        if layer == "ptq_protein.eval" and name.startswith("ptq_protein.eval.bench"):
            continue  # benchmark runs sit above the metrics: they build quantized models on purpose
        bad += [f"{name} imports {d}" for d in deps if d.startswith(FORBIDDEN[layer])]
    assert not bad, "; ".join(bad)


def test_only_the_cli_prints():
    offenders = []
    for name, path in MODULES.items():
        if name.startswith("ptq_protein.cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                offenders.append(f"{name}:{node.lineno}")
    assert not offenders, offenders


def test_no_file_over_400_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    assert not {n: k for n, k in long.items() if k > 400}


@pytest.mark.parametrize("old", sorted(_compat.MOVED))
def test_old_paths_alias_the_new_modules_with_a_warning(old):
    import sys
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(_compat.MOVED[old])
    assert any(issubclass(w.category, DeprecationWarning) and _compat.MOVED[old] in str(w.message) for w in caught)
    assert module.__spec__.name == module.__name__ == _compat.MOVED[old]  # the alias's spec did not replace it
    sys.modules.pop(old, None)  # keep the alias out of later tests


def test_the_old_path_warning_shows_under_default_filters(tmp_path):
    """It was attributed to no frame (stacklevel 3 past the importer), which Python's default filters ignore."""
    import os
    import subprocess
    import sys

    script = tmp_path / "old.py"
    script.write_text("import ptq_protein.modules\nimport importlib\nimportlib.reload(ptq_protein.nn.modules)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"{script}:1: DeprecationWarning: ptq_protein.modules moved to ptq_protein.nn.modules" in run.stderr


def test_public_names_resolve():
    for name in ptq_protein.__all__:
        assert getattr(ptq_protein, name) is not None


def test_type_checking_imports_name_the_lazy_exports():
    """``ptq_protein/__init__.py`` names each public attribute twice: in ``_EXPORTS`` (what ``__getattr__`` imports)
    and in its ``TYPE_CHECKING`` imports (what type checkers and the API reference read); they must agree."""
    tree = ast.parse(Path(ptq_protein.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING")
    imported = {a.asname or a.name: n.module for n in block.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert imported == ptq_protein._EXPORTS


def test_pyproject_lists_every_package():
    """A package folder missing from pyproject's list installs nowhere outside an editable checkout."""
    import re

    root = Path(__file__).resolve().parents[1]
    listed = set(re.findall(r'^\s+"(ptq_protein[\w.]*)",', (root / "pyproject.toml").read_text(), flags=re.M))
    found = {"ptq_protein." + ".".join(p.parent.relative_to(root / "ptq_protein").parts)
             for p in (root / "ptq_protein").rglob("__init__.py") if p.parent != root / "ptq_protein"}
    assert found - listed == set(), f"add to pyproject.toml packages: {sorted(found - listed)}"


def test_pyproject_lists_every_data_folder():
    """setuptools treats every folder inside a package as an importable package: one not listed is installed
    only through package-data, with a "Package would be ignored" warning per folder (about 150 lines of
    ``pip install``'s output). Listing the bundled data folders keeps the install quiet and their files installed
    (the wheel built from this pyproject holds every file under ptq_protein/data)."""
    import re

    root = Path(__file__).resolve().parents[1]
    listed = set(re.findall(r'^\s+"(ptq_protein[\w.]*)",', (root / "pyproject.toml").read_text(), flags=re.M))
    folders = {"ptq_protein." + ".".join(p.relative_to(root / "ptq_protein").parts)
               for p in (root / "ptq_protein").rglob("*") if p.is_dir() and p.name != "__pycache__"
               and "__pycache__" not in p.parts and any(f.is_file() for f in p.iterdir())}
    assert folders - listed == set(), f"add to pyproject.toml packages: {sorted(folders - listed)}"


def test_only_the_passes_read_the_study_flag():
    """Which pipeline a config runs (ours or the study's) is decided in passes/ (``Recipe``), not re-read by
    each caller: a caller asks the recipe (``not_streamed``, ``saved``, ``as_run``)."""
    import re

    root = Path(__file__).resolve().parents[1] / "ptq_protein"
    reads = re.compile(r"\b(?:cfg|config|recipe|self\.config)\.study\b")
    found = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py")
             if p.parent.name != "passes" and p.parent.name != "recipes"
             for n, line in enumerate(p.read_text().splitlines(), start=1) if reads.search(line)]
    assert not found, f"read the study flag through passes.recipe.Recipe instead: {found}"
