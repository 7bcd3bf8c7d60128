#!/usr/bin/env python
"""One GPU check of the Triton kernels and the int8 backend, ready before a GPU is lent (issue 38).

Steps, each written to ``--out`` (``gpu_check.json`` and ``gpu_check.md``) as soon as it ends:

1. environment: device, driver, torch / Triton versions (and the CPU flags on CPU);
2. kernels, per GEMM shape of ESM-2 650M, ESM-2 3B and ESMFold's trunk (``bench_kernels.cases``) and
   one ragged shape: exact against the integer reference (``gpu_check_kernels``), then timed against
   cuBLAS bf16 / fp16 (``bench_kernels.gemm_row``);
3. end to end (``gpu_check_e2e``): tiny ESM-2, tiny ESMFold and a 650M-sized ESM-2 (3B with ``--e2e-3b``),
   random weights, each recipe with ``backend="int8"`` against ``"fake"``, timed against bf16.

Goals (W8A8 GEMM >= 1.6x cuBLAS bf16 at the 3B shapes; int8 ESM-2 3B <= 0.7x bf16 time and <= 0.55x its
weight memory) are judged only from GPU measurements. A time budget skips what no longer fits, and says so.

    bash scripts/gpu_check.sh                          # on a CUDA machine: installs ".[triton]", then runs this
    python scripts/gpu_check.py --e2e-3b --budget-s 420
    python scripts/gpu_check.py --cpu-smoke            # no GPU: tiny shapes in Triton's interpreter
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, List

# Default budgets (s): an H200 run must end within 8 minutes, start-up and imports included.
GPU_BUDGET_S = 420.0
SMOKE_BUDGET_S = 240.0
KERNEL_SHARE = 0.5  # of the budget, for step 2; step 3 has the rest
# Rough seconds a model's end-to-end steps need on an H200 (build, baseline and three recipes).
E2E_NEEDS_S = {"tiny ESM-2": 15.0, "tiny ESMFold": 30.0, "ESM-2 650M": 90.0, "ESM-2 3B": 180.0}
SMOKE_ESMFOLD_RECIPES = ("w8a8-uniform",)
_SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
               "amx_tile", "amx_int8", "amx_bf16")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check_out"), help="folder for the JSON and markdown")
    parser.add_argument("--cpu-smoke", action="store_true", help="no GPU: tiny shapes under TRITON_INTERPRET=1")
    parser.add_argument("--budget-s", type=float, default=None,
                        help=f"time budget in seconds (default {GPU_BUDGET_S:.0f} on GPU, {SMOKE_BUDGET_S:.0f} smoke)")
    parser.add_argument("--e2e-3b", action="store_true", help="also run a 3B-sized ESM-2 end to end (the goals)")
    args = parser.parse_args(argv)
    if args.budget_s is not None and args.budget_s <= 0:
        parser.error(f"--budget-s must be positive, got {args.budget_s}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: triton.jit reads it when it decorates
    elif os.environ.pop("TRITON_INTERPRET", ""):
        print("gpu_check: TRITON_INTERPRET unset: a GPU run checks the compiled kernels")
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device found; run it on a GPU machine, or pass --cpu-smoke")
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_check_report import Record

    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    if args.cpu_smoke:
        torch.set_num_threads(1)  # tiny shapes: threads cost more than they save (and the test shares the CPU)
    budget = args.budget_s or (SMOKE_BUDGET_S if args.cpu_smoke else GPU_BUDGET_S)
    command = "python scripts/gpu_check.py" + "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv))
    record = Record(args.out, "cpu-smoke" if args.cpu_smoke else "gpu", command, budget)
    record.data["environment"] = environment(device)
    for key, value in record.data["environment"].items():
        print(f"{key}: {value}")
    record.step("environment", "done")
    deadline = record.start + budget
    check_kernels(record, device, record.start + KERNEL_SHARE * budget)
    check_e2e(record, device, args, deadline)
    record.data["finished"] = True  # absent or false: the run was cut short
    record.save()
    print("\n" + (args.out / "gpu_check.md").read_text(encoding="utf-8"))
    failed = [s["step"] for s in record.data["steps"] if s["status"].startswith("failed")]
    inexact = [r for r in record.data["kernels"] if not all(r["exact"].values())]
    print(f"gpu_check: {len(failed)} failed steps, {len(inexact)} shapes not exact; wrote {args.out}")
    return 1 if failed or inexact else 0


def environment(device) -> dict:
    """Device, driver and library versions; the CPU's SIMD flags when running on the CPU."""
    import torch

    env = {"device": str(device), "python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = "not installed"
    env["TRITON_INTERPRET"] = os.environ.get("TRITON_INTERPRET", "")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, capability=".".join(map(str, torch.cuda.get_device_capability(device))),
                   gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda_runtime=torch.version.cuda,
                   driver=_run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]))
    else:
        flags = cpu_flags()
        env.update(cpu=platform.processor() or _cpu_model(), cpus=os.cpu_count(),
                   simd=" ".join(f for f in _SIMD_FLAGS if f in flags) or "none found", cpu_flags=" ".join(flags))
    return env


def cpu_flags() -> List[str]:
    """The CPU's feature flags, from /proc/cpuinfo or lscpu (empty where neither says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].split()
    except OSError:
        pass
    for line in _run(["lscpu"]).splitlines():
        if line.startswith("Flags:"):
            return line.split(":", 1)[1].split()
    return []


def _cpu_model() -> str:
    for line in _run(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _run(cmd: List[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({type(e).__name__})"


def check_kernels(record, device, deadline: float) -> None:
    """Step 2: every shape (3B first: the goal's shapes), until the kernels' share of the budget is spent."""
    import torch
    from bench.kernels import Case, cases
    from gpu_check_kernels import check_case

    smoke = device.type == "cpu"
    shapes = cases(quick=smoke) + [Case("ragged", "odd sizes", *((5, 100, 24) if smoke else (1000, 1283, 517)))]
    shapes.sort(key=lambda c: c.model != "ESM-2 3B")
    for case in shapes:
        name = f"kernels {case.model} {case.layer} M={case.m} K={case.k} N={case.n}"
        if time.perf_counter() > deadline:
            record.step(name, "skipped: the kernels' share of the time budget is spent")
            continue
        _guarded(record, name, lambda c=case: record.data["kernels"].append(check_case(c, device, timed=True)))
        if device.type == "cuda":
            torch.cuda.empty_cache()  # each shape's operands go before the next, larger one


def check_e2e(record, device, args, deadline: float) -> None:
    """Step 3: each model's baseline, then each recipe, while the budget lasts."""
    import gpu_check_e2e as e2e
    from bench.common import ModelShape

    if device.type == "cpu":
        models = [e2e.esm2_model("tiny ESM-2", ModelShape(1, 32, 4, 10), batch=1),
                  e2e.esmfold_model(length=8, recipes=SMOKE_ESMFOLD_RECIPES)]
        skipped = ["ESM-2 650M", "ESM-2 3B"]
    else:
        models = [e2e.esm2_model("tiny ESM-2", ModelShape(2, 64, 4, 32), batch=2), e2e.esmfold_model(length=48)]
        if args.e2e_3b:
            models.append(e2e.esm2_model("ESM-2 3B", ModelShape(36, 2560, 40, 510), batch=8))
        models.append(e2e.esm2_model("ESM-2 650M", ModelShape(33, 1280, 20, 510), batch=8))
        skipped = [] if args.e2e_3b else ["ESM-2 3B"]
    for name in skipped:
        why = "--cpu-smoke runs the tiny models only" if device.type == "cpu" else "pass --e2e-3b"
        record.step(f"e2e {name}", f"skipped: {why}")
    for spec in models:
        need = E2E_NEEDS_S[spec.name] * (0.2 if device.type == "cpu" else 1.0)
        left = deadline - time.perf_counter()
        if left < need:
            record.step(f"e2e {spec.name}", f"skipped: time budget ({left:.0f} s left, needs ~{need:.0f} s)")
            continue
        _run_model(record, spec, device, deadline)


def _run_model(record, spec, device, deadline: float) -> None:
    import gpu_check_e2e as e2e

    runs = []

    def build() -> None:
        runs.append(e2e.ModelRun(spec, device))
        runs[0].measure_baseline()

    built = _guarded(record, f"e2e {spec.name} baseline", build)
    for recipe in e2e.RECIPES:
        name = f"e2e {spec.name} {recipe}"
        if not built:
            record.step(name, "skipped: the model's baseline step failed")
        elif recipe not in spec.recipes:
            record.step(name, "skipped: --cpu-smoke folds with w8a8-uniform only (a PWLQ fold takes the "
                              "interpreter 40-50 s on 2 CPU cores)")
        elif time.perf_counter() > deadline:
            record.step(name, "skipped: time budget spent")
        elif not _guarded(record, name, lambda r=recipe: record.data["e2e"].append(
                {**runs[0].measure_recipe(r), "status": "done"})):
            record.data["e2e"].append({"model": spec.name, "recipe": recipe, "status": "failed"})
            record.save()
    if runs:
        runs[0].close()


def _guarded(record, name: str, fn: Callable[[], object]) -> bool:
    """Run one step; record it as done or failed (with the error's last line), never raising."""
    print(f"[{time.perf_counter() - record.start:6.1f} s] {name} ...", flush=True)
    start = time.perf_counter()
    try:
        fn()
    except Exception as e:  # one failing step must not cost the others
        trace = traceback.format_exc()
        print(trace, flush=True)
        record.step(name, f"failed: {type(e).__name__}: {str(e)[:200]}", time.perf_counter() - start,
                    detail=trace[-4000:])
        return False
    record.step(name, "done", time.perf_counter() - start)
    return True


if __name__ == "__main__":
    sys.exit(main())
