"""scripts/bench/kernels.py: the --quick smoke run works end to end on CPU (interpreter)."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "kernels.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_kernels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_quick_run_prints_every_table(capsys):
    pytest.importorskip("esm")
    bench = _load()
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "| model | layer | M | K | N | bf16 ms |" in out
    assert "| w8a8 |" in out and "| goal | target | measured | met |" in out
    assert "error:" not in out, out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_full_run_without_cuda_says_so(capsys):
    assert _load().main([]) == 2
    assert "no CUDA device" in capsys.readouterr().out
