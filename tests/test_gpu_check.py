"""scripts/gpu_check.py: the --cpu-smoke run (Triton's interpreter) writes a complete record; goals wait for a GPU.

The smoke run is a subprocess because ``TRITON_INTERPRET`` must be set before
Triton is imported, and the suite's conftest makes whole-model tests skip the
interpreter. No timing is asserted: interpreter times say nothing about speed.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
pytest.importorskip("esm")
pytest.importorskip("triton")
KERNELS = {"int8 acc", "w8a8", "w4a8", "pwlq", "quant", "pwlq enc"}
RECIPES = ("w8a8-uniform", "w8a8-pwlq", "w4a8-pwlq")


def _load(name: str):
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _smoke(out: Path, *extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the script sets it itself
    proc = subprocess.run([sys.executable, str(SCRIPTS / "gpu_check.py"), "--cpu-smoke", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "gpu_check.json").read_text())


def test_cpu_smoke_writes_every_step_exact_and_unjudged(tmp_path):
    data = _smoke(tmp_path)
    assert data["mode"] == "cpu-smoke" and data["finished"] and data["environment"]["TRITON_INTERPRET"] == "1"
    assert data["environment"]["triton"] != "not installed" and data["environment"]["torch"]
    steps = {s["step"]: s["status"] for s in data["steps"]}
    assert not [s for s in steps.values() if s.startswith("failed")], steps
    assert steps["environment"] == "done"
    assert sum(name.startswith("kernels ") and status == "done" for name, status in steps.items()) == 2
    for recipe in RECIPES:
        assert steps[f"e2e tiny ESM-2 {recipe}"] == "done"
        assert f"e2e tiny ESMFold {recipe}" in steps
    assert steps["e2e tiny ESMFold w8a8-uniform"] == "done"
    assert steps["e2e ESM-2 650M"].startswith("skipped") and steps["e2e ESM-2 3B"].startswith("skipped")

    assert len(data["kernels"]) == 2
    for row in data["kernels"]:
        assert set(row["exact"]) == KERNELS and all(v is True for v in row["exact"].values()), row
        assert row["fp8_within_tolerance"] is True, row  # torch._scaled_mm on CPU
        assert all(isinstance(v, float) for v in row["ms"].values()), row["ms"]

    rows = {(r["model"], r["recipe"]): r for r in data["e2e"]}
    for recipe in RECIPES:
        lm = rows["tiny ESM-2", recipe]
        assert lm["engine"] == "reference" and lm["rel_err"] <= 1e-3 and lm["argmax_agreement"] >= 0.99, lm
        assert "int8_ms" not in lm  # nothing is timed in the interpreter
    fold = rows["tiny ESMFold", "w8a8-uniform"]
    assert fold["engine"] == "reference" and fold["tm_vs_fake"] >= 0.9, fold

    assert len(data["goals"]) == 3
    assert all(g["verdict"] == "not judged (no GPU)" and g["measured"] is None for g in data["goals"])
    md = (tmp_path / "gpu_check.md").read_text()
    assert "Interpreter run (TRITON_INTERPRET=1): correctness only" in md
    assert md.count("| not judged (no GPU) |") == 3 and "| NO |" not in md
    for heading in ("## Steps", "## Kernels: exact", "## Kernels: median ms", "## End to end", "## Goals"):
        assert heading in md


def test_spent_budget_skips_every_step_and_says_so(tmp_path):
    data = _smoke(tmp_path, "--budget-s", "0.001")
    steps = [s for s in data["steps"] if s["step"] != "environment"]
    assert steps and all(s["status"].startswith("skipped") for s in steps), steps
    assert data["kernels"] == [] and data["e2e"] == []
    assert "time budget" in " ".join(s["status"] for s in steps)


def test_record_rewrites_after_every_step_and_judges_gpu_numbers(tmp_path):
    report = _load("gpu_check_report")
    record = report.Record(tmp_path, "gpu", "python scripts/gpu_check.py", 420.0)
    record.step("environment", "done")
    assert json.loads((tmp_path / "gpu_check.json").read_text())["steps"][0]["step"] == "environment"
    goals = {g["goal"]: g["verdict"] for g in record.data["goals"]}
    assert all(v.startswith("not judged (") and "no GPU" not in v for v in goals.values()), goals
    # made-up inputs for the judging logic only: one 3B GEMM shape and one 3B end-to-end row
    record.data["kernels"].append({"model": "ESM-2 3B", "layer": "fc1", "m": 8192, "k": 2560, "n": 10240,
                                   "exact": {}, "ms": {"bf16": 2.0, "w8a8": 1.0}})
    record.data["e2e"].append({"model": "ESM-2 3B", "recipe": "w8a8-uniform", "status": "done", "baseline_ms": 10.0,
                               "int8_ms": 8.0, "baseline_weights_gib": 2.0, "int8_weights_gib": 1.0})
    record.step("e2e ESM-2 3B w8a8-uniform", "done")
    verdicts = [g["verdict"] for g in json.loads((tmp_path / "gpu_check.json").read_text())["goals"]]
    assert verdicts == ["met", "not met", "met"]
    assert "| ESM-2 3B | fc1 | 8192 |" in (tmp_path / "gpu_check.md").read_text()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU message")
def test_without_gpu_or_smoke_flag_says_so(tmp_path, capsys):
    assert _load("gpu_check").main(["--out", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_a_failing_step_is_recorded_with_its_traceback_and_the_run_goes_on(tmp_path):
    check, report = _load("gpu_check"), _load("gpu_check_report")
    record = report.Record(tmp_path, "gpu", "python scripts/gpu_check.py", 420.0)
    assert check._guarded(record, "boom", lambda: 1 / 0) is False
    assert check._guarded(record, "fine", lambda: None) is True
    boom, fine = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert boom["status"].startswith("failed: ZeroDivisionError") and "1 / 0" in boom["traceback"]
    assert fine["status"] == "done" and "traceback" not in fine
