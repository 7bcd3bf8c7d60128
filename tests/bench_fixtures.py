"""What the bench tests share: the scripts folder, loading a script by path, reading a printed table, and the
bench package on ``sys.path`` (as ``python -m scripts.bench`` and its children have it)."""

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load_path(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _load(name: str):
    """A script of ``scripts/`` (``NAME.py``) as a module."""
    return _load_path(name, SCRIPTS / f"{name}.py")


def _bench(name: str):
    """A module of the bench package (``scripts/bench/NAME.py``), imported as ``bench.NAME``."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module(f"bench.{name}")


def _table_rows(out: str, first_cell: str) -> list:
    return [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith(f"| {first_cell}")]


@pytest.fixture(scope="module")
def bench_package():
    """scripts/ on sys.path, as ``python -m scripts.bench`` and the bench's children have it."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    import bench.common

    return bench


@pytest.fixture(scope="module")
def quick_dir(tmp_path_factory, bench_package):
    """The quick bench model (2 x 64, planted outliers) written once: fair-esm layout and HF folder, checked equal."""
    from bench import prepare

    folder = tmp_path_factory.mktemp("bench_models")
    prepare.bench_model(folder, "quick", "outliers")
    return folder
