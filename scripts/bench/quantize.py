#!/usr/bin/env python
"""CPU benchmark of ``pp.quantize``: calibration cost, fake-quant forward cost, calibration memory (issue 2).

On a seeded random fair-esm ESM-2 (12 layers x 480, 20 heads, the demo outlier
channels of :mod:`ptq_protein.models.outliers` planted) and random valid
sequences of 256 residues, it measures side by side in one run:

* **calibration / FP**: ``pp.quantize(model, preset, calibration=seqs)`` for
  ``w8a8-uniform`` and ``w8a8-pwlq``, with the API's own ``calibrate`` call timed
  through a wrapper (same sites, specs and batches the API builds), against plain
  FP forwards over the same batches;
* **calibration alone / FP**: the same ``calibrate`` call on prepared copies,
  without pp.quantize's copy and parameter search around it (less noise);
* **fake-quant forward / FP** on one batch (default 4 x 256);
* **peak memory growth** of calibration from 10 to 200 sequences: a fresh
  subprocess per (preset, size) runs ``calibrate`` and reports its peak resident
  set size (``getrusage(RUSAGE_SELF).ru_maxrss``, the kernel's high-water mark of
  the whole process, which includes torch's tensor allocations; ``tracemalloc``
  would only see Python's allocator, not torch's).

Repetitions are interleaved (the order rotates each round) and medians are
reported; the torch thread count is fixed and printed. No number is asserted.

    python -m scripts.bench quantize                # full run (~6 min, one thread)
    python -m scripts.bench quantize --quick        # tiny model, seconds (the smoke test)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import (  # noqa: E402  (sibling module: shared model, sequences, timing and table helpers)
    FULL_SHAPE,
    QUICK_SHAPE,
    ModelShape,
    build_esm2,
    command_line,
    environment_line,
    interleaved,
    markdown_table,
    medians,
    module_child,
    random_sequences,
    seconds,
)

# Goals of issue 2.
GOAL_CALIBRATION = 1.25  # calibration time / FP forward time over the same batches
GOAL_FORWARD = {"w8a8-uniform": 1.3, "w8a8-pwlq": 1.5}  # fake-quant forward / FP forward
GOAL_MEMORY_GROWTH = 0.05  # peak RSS growth from MEMORY_SIZES[0] to MEMORY_SIZES[1] calibration sequences
PRESETS = ("w8a8-uniform", "w8a8-pwlq")
MEMORY_SIZES = (10, 200)


# --- timing --------------------------------------------------------------------


def _fp_forwards(model, adapter, batches) -> None:
    with torch.no_grad():
        for batch in batches:
            adapter.forward(model, batch)


def _quantize_timed(model, preset: str, seqs: Sequence[str], batch_size: int) -> tuple:
    """(qmodel, total seconds, seconds inside the API's calibrate call)."""
    import ptq_protein as pp
    from ptq_protein.passes import forwards

    inner = {"s": 0.0}
    real = forwards.calibrate

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            inner["s"] += time.perf_counter() - start

    with mock.patch.object(forwards, "calibrate", timed):
        start = time.perf_counter()
        qmodel = pp.quantize(model, preset, calibration=list(seqs), batch_size=batch_size)
        total = time.perf_counter() - start
    return qmodel, total, inner["s"]


def bench_calibration(model, seqs: Sequence[str], batch_size: int, reps: int) -> tuple:
    """Interleaved rounds of FP forwards and quantize per preset; (medians dict, qmodels)."""
    from ptq_protein.models.adapters import get_adapter

    adapter = get_adapter(model)
    batches = list(adapter.batches(list(seqs), batch_size))
    _fp_forwards(model, adapter, batches)  # warm-up
    times: Dict[str, List[float]] = {"fp": []}
    qmodels = {}
    for rep in range(reps):
        jobs = ["fp", *PRESETS]
        for job in jobs[rep % len(jobs):] + jobs[:rep % len(jobs)]:
            if job == "fp":
                times["fp"].append(seconds(lambda: _fp_forwards(model, adapter, batches)))
                continue
            qmodels[job], total, calib = _quantize_timed(model, job, seqs, batch_size)
            times.setdefault(f"{job}/total", []).append(total)
            times.setdefault(f"{job}/calibrate", []).append(calib)
    return {key: statistics.median(values) for key, values in times.items()}, qmodels


def bench_forward(model, qmodels: Dict[str, torch.nn.Module], tokens: torch.Tensor, reps: int) -> Dict[str, tuple]:
    """Per model: (seconds of the first forward, which compiles the fused quantizers, median seconds after).

    The models run interleaved.
    """
    models = {"fp": model, **qmodels}
    with torch.no_grad():
        first = {name: seconds(lambda m=m: m(tokens)) for name, m in models.items()}  # warm-up
        times = interleaved({name: lambda m=m: m(tokens) for name, m in models.items()}, reps)
    return {name: (first[name], statistics.median(values)) for name, values in times.items()}


# --- memory (one fresh process per size) -----------------------------------------


def _current_rss_kib() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (Linux >= 4.0), so the model build's transient peak is not counted."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def prepared_calibration(model, preset: str, seqs: Sequence[str], batch_size: int) -> Callable[[], object]:
    """``calibrate`` of ``preset`` on ``model`` (prepared as pp.quantize prepares it), as a no-argument call."""
    from ptq_protein.calibration.calibrate import calibrate
    from ptq_protein.calibration.sites import discover_sites, select_sites
    from ptq_protein.models.adapters import get_adapter
    from ptq_protein.recipes.presets import resolve_config

    adapter = get_adapter(model)
    adapter.prepare(model)
    cfg = resolve_config(preset)
    sites = select_sites(discover_sites(model, adapter), cfg)  # as pp.quantize (every site static here)
    specs = {s.name: cfg.activations for s in sites}
    return lambda: calibrate(model, adapter, sites, specs, list(seqs), batch_size=batch_size)


def bench_calibrate_only(model, seqs: Sequence[str], batch_size: int, reps: int) -> Dict[str, float]:
    """Median seconds of ``calibrate`` alone per preset (no copy or search around it) and of FP forwards.

    Interleaved.
    """
    import copy

    from ptq_protein.models.adapters import get_adapter

    adapter = get_adapter(model)
    batches = list(adapter.batches(list(seqs), batch_size))
    jobs = {"fp": lambda: _fp_forwards(model, adapter, batches)}
    jobs.update({p: prepared_calibration(copy.deepcopy(model), p, seqs, batch_size) for p in PRESETS})
    for job in jobs.values():
        job()  # warm-up
    return medians(interleaved(jobs, reps))


def calibrate_only_rows(t: Dict[str, float]) -> List[list]:
    rows = [["FP forwards (same batches)", t["fp"], "", "", ""]]
    for p in PRESETS:
        ratio = t[p] / t["fp"]
        rows.append([p, t["fp"], t[p], f"{ratio:.2f}x", f"<= {GOAL_CALIBRATION}x: {_met(ratio, GOAL_CALIBRATION)}"])
    return rows


def memory_child(shape: ModelShape, preset: str, count: int, batch_size: int, threads: int) -> Dict[str, int]:
    """Calibrate ``count`` sequences on a fresh model; RSS before and peak RSS during calibration (KiB)."""
    import gc
    import resource

    from ptq_protein.models.adapters import get_adapter

    torch.set_num_threads(threads)
    model, _ = build_esm2(shape)
    seqs = random_sequences(count, shape.seq_len, seed=1)
    if preset == "fp":  # the reference: the same batches through the float model, no hooks
        adapter = get_adapter(model)
        adapter.prepare(model)
        run = lambda: _fp_forwards(model, adapter, list(adapter.batches(seqs, batch_size)))  # noqa: E731
    else:
        run = prepared_calibration(model, preset, seqs, batch_size)
    gc.collect()
    reset = _reset_peak_rss()
    before = _current_rss_kib()
    run()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"rss_before_kib": before, "peak_kib": peak, "peak_reset": reset}


def run_memory_child(script: str, shape_flag: List[str], job: str, count: int, batch_size: int,
                     threads: int) -> dict:
    """``script --memory-child JOB COUNT`` in a fresh interpreter; the JSON dict it prints last."""
    cmd = [*module_child(script), *shape_flag, "--threads", str(threads), "--batch-size", str(batch_size),
           "--memory-child", job, str(count)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory child {job} x {count} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_memory(shape_flag: List[str], preset: str, sizes: Sequence[int], batch_size: int,
                 threads: int) -> Dict[int, dict]:
    """Run :func:`memory_child` in a fresh interpreter per size."""
    return {count: run_memory_child(__file__, shape_flag, preset, count, batch_size, threads) for count in sizes}


# --- report ----------------------------------------------------------------------


def _met(value: float, goal: float) -> str:
    return "yes" if value <= goal else f"no (+{100 * (value / goal - 1):.0f}% over)"


def calibration_rows(t: Dict[str, float]) -> List[list]:
    rows = [["FP forwards (same batches)", t["fp"], "", "", "", ""]]
    for p in PRESETS:
        cal, total = t[f"{p}/calibrate"], t[f"{p}/total"]
        ratio = cal / t["fp"]
        goal = f"<= {GOAL_CALIBRATION}x: {_met(ratio, GOAL_CALIBRATION)}"
        rows.append([p, t["fp"], cal, total - cal, f"{ratio:.2f}x", goal])
    return rows


def forward_rows(t: Dict[str, tuple]) -> List[list]:
    fp_first, fp = t["fp"]
    rows = [["fp", f"{1000 * fp:.1f}", "1.00x", f"{1000 * fp_first:.0f}", ""]]
    for p in PRESETS:
        first, median = t[p]
        ratio = median / fp
        rows.append([p, f"{1000 * median:.1f}", f"{ratio:.2f}x", f"{1000 * first:.0f}",
                     f"<= {GOAL_FORWARD[p]}x: {_met(ratio, GOAL_FORWARD[p])}"])
    return rows


def memory_rows(preset: str, mem: Dict[int, dict]) -> list:
    """One row; ``preset`` "fp" is the reference (FP forwards over the same batches, no hooks)."""
    small, large = (mem[n] for n in MEMORY_SIZES)
    growth = large["peak_kib"] / small["peak_kib"] - 1
    inc = [(m["peak_kib"] - m["rss_before_kib"]) / 1024 for m in (small, large)]
    goal = ("(reference)" if preset == "fp"
            else f"<= {100 * GOAL_MEMORY_GROWTH:.0f}%: {_met(growth, GOAL_MEMORY_GROWTH)}")
    label = "fp forwards (no hooks)" if preset == "fp" else preset
    mib = [f"{v:.0f}" for v in (small["peak_kib"] / 1024, large["peak_kib"] / 1024, *inc)]
    return [label, mib[0], mib[1], f"{100 * growth:+.1f}%", mib[2], mib[3], goal]


def print_memory_table(shape_flag: List[str], batch_size: int, threads: int) -> None:
    """Fresh-process peaks for FP forwards (reference) and each preset, at each calibration size."""
    mems = {p: bench_memory(shape_flag, p, MEMORY_SIZES, batch_size, threads) for p in ("fp", *PRESETS)}
    reset = all(m.get("peak_reset") for runs in mems.values() for m in runs.values())
    print(f"## Calibration memory ({MEMORY_SIZES[0]} vs {MEMORY_SIZES[1]} sequences, batch {batch_size}, fresh process "
          "each; peak = ru_maxrss of the whole process, its high-water mark reset after the model build"
          + ("" if reset else " -- RESET UNAVAILABLE here: peaks include the model build") + ")\n")
    print(markdown_table(["recipe", f"peak MiB @{MEMORY_SIZES[0]}", f"peak MiB @{MEMORY_SIZES[1]}", "growth",
                          f"peak - RSS before, MiB @{MEMORY_SIZES[0]}", f"@{MEMORY_SIZES[1]}", "goal"],
                         [memory_rows(p, m) for p, m in mems.items()]))


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny 2 x 64 model, length 32, few reps (smoke test)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads (default 1: on a shared machine a busy core stalls every "
                             "multi-threaded op, which makes ratios meaningless)")
    parser.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default 5; quick 2)")
    parser.add_argument("--calib-seqs", type=int, default=8, help="sequences timed for calibration (default 8)")
    parser.add_argument("--batch-size", type=int, default=4, help="calibration and forward batch size (default 4)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--memory-child", nargs=2, metavar=("PRESET", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads < 1 or args.batch_size < 1 or args.calib_seqs < 1:
        parser.error("--threads, --batch-size and --calib-seqs must be >= 1")
    args.reps = args.reps or (2 if args.quick else 5)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    shape = QUICK_SHAPE if args.quick else FULL_SHAPE
    if args.memory_child:
        preset, count = args.memory_child
        print(json.dumps(memory_child(shape, preset, int(count), args.batch_size, args.threads)))
        return 0
    from ptq_protein.nn import fused

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, _ = build_esm2(shape)
    seqs = random_sequences(args.calib_seqs, shape.seq_len, seed=1)
    print(f"# pp.quantize CPU benchmark: {shape.describe()}\n\n`{command_line(argv, __file__)}`\n\n"
          f"{environment_line(args.threads)}, fused fake quantizers `{fused.settings().mode}`; "
          f"{args.reps} interleaved reps, medians\n")
    cal, qmodels = bench_calibration(model, seqs, args.batch_size, args.reps)
    print(f"## Calibration ({len(seqs)} sequences, batch {args.batch_size})\n")
    print(markdown_table(["recipe", "FP s", "calibrate s", "rest of quantize s", "calibrate / FP", "goal"],
                         calibration_rows(cal)) + "\n")
    alone = bench_calibrate_only(model, seqs, args.batch_size, args.reps)
    print(f"## Calibration alone (`calibrate` on prepared copies, no pp.quantize around it; {len(seqs)} sequences, "
          f"batch {args.batch_size})\n")
    print(markdown_table(["recipe", "FP s", "calibrate s", "calibrate / FP", "goal"],
                         calibrate_only_rows(alone)) + "\n")
    from ptq_protein.models.adapters import get_adapter

    batch = get_adapter(model).make_batch(random_sequences(args.batch_size, shape.seq_len, seed=2))
    fwd = bench_forward(model, qmodels, batch.inputs["tokens"], max(args.reps, 3 if args.quick else 7))
    print(f"## Fake-quant forward (batch {args.batch_size} x {shape.seq_len})\n")
    print(markdown_table(["model", "forward ms (median)", "vs FP", "first forward ms (compiles)", "goal"],
                         forward_rows(fwd)) + "\n")
    if not args.no_memory:
        print_memory_table(["--quick"] if args.quick else [], args.batch_size, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
