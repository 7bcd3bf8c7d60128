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
