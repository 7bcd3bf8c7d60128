"""Test-wide settings: CPU-only, offline, Triton in interpreter mode when no GPU."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Fake quantizers run eagerly in the suite (no per-process compile); tests/core/test_fused.py
# switches the compiled path on and checks it equals the eager one.
os.environ.setdefault("PTQ_PROTEIN_FUSED", "off")

try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    torch.set_num_threads(1)  # tiny models: thread start-up costs more than it saves
except ImportError:  # pragma: no cover
    pass

import pytest
from bench_fixtures import bench_package, quick_dir  # noqa: F401 (the bench tests' fixtures)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_gpu = False
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _torch_reference_in_model_tests(request, monkeypatch):
    """Whole-model ``backend="int8"`` tests compute the reference engine in torch, not Triton's interpreter.

    The interpreter runs a tiny ESM forward 100x slower; the Triton kernels
    themselves are checked against the torch reference in tests/kernels, and
    tests/core/test_int8_backend.py still runs whole models through them.
    """
    path = str(request.node.fspath)
    if "/kernels/" in path or path.endswith("test_int8_backend.py"):
        return
    from ptq_protein.kernels import dispatch

    monkeypatch.setattr(dispatch, "interpreting", lambda: False)


@pytest.fixture
def int_engine() -> str:
    """An integer engine for tests comparing backend="int8" with fake: under ``auto`` a CPU may take the float
    path where its exact engine is slower than fake (PWLQ on AVX2 without VNNI)."""
    from ptq_protein.nn import cpu_int8

    return "onednn" if cpu_int8.available() else "reference"
