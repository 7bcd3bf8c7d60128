#!/usr/bin/env python
"""CPU benchmark of the sequential GPTQ pass: its time against FP forwards, and its peak memory (issue 14).

Model and sequences are those of ``quantize.py`` (seeded 12 x 480 fair-esm
ESM-2 with the demo outlier channels, random 256-residue sequences). Measured side
by side in one run, repetitions interleaved, medians reported:

* **GPTQ pass / FP**: ``gptq_model_`` (W4, act-order, block 128, the ``w4-gptq``
  settings) on a prepared copy, against plain FP forwards over the same batches, with the
  finished blocks replayed (the default) and rerun (``replay_blocks=False``);
  plus the whole ``pp.quantize(model, "w4-gptq")`` and ``"w4-only"`` (round to nearest);
* **peak memory**: a fresh subprocess per job reports its peak resident set size
  growth over the loaded model (``ru_maxrss``, high-water mark reset after the build):
  FP forwards, and the GPTQ pass.

No number is asserted.

    python -m scripts.bench gptq               # full run
    python -m scripts.bench gptq --quick       # tiny model, seconds
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import resource
import sys
from pathlib import Path
from typing import Callable, Dict, List, Sequence

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
    random_sequences,
)
from bench.quantize import _current_rss_kib, _fp_forwards, _reset_peak_rss, run_memory_child  # noqa: E402

RECIPE = "w4-gptq"


def _gptq_job(model, seqs: Sequence[str], batch_size: int, replay: bool = True) -> Callable[[], object]:
    """The GPTQ pass of ``w4-gptq`` on a fresh prepared copy of ``model`` per call (``replay``: skipping the
    finished blocks, the default; else rerunning every block before the group, the pass as it was)."""
    import ptq_protein as pp
    from ptq_protein.calibration.sites import discover_sites, select_sites
    from ptq_protein.models.adapters import get_adapter
    from ptq_protein.transforms.gptq_pass import gptq_model_

    cfg = pp.get_preset(RECIPE)

    def run():
        work = copy.deepcopy(model)
        adapter = get_adapter(work)
        adapter.prepare(work)
        names = [s.name for s in select_sites(discover_sites(work, adapter), cfg)]
        return gptq_model_(work, adapter, names, cfg.weights, cfg.gptq, list(seqs), batch_size=batch_size,
                           replay_blocks=replay)

    return run


def _jobs(model, seqs: Sequence[str], batch_size: int) -> Dict[str, Callable[[], object]]:
    import ptq_protein as pp
    from ptq_protein.models.adapters import get_adapter

    adapter = get_adapter(model)
    batches = list(adapter.batches(list(seqs), batch_size))
    return {
        "fp": lambda: _fp_forwards(model, adapter, batches),
        "gptq pass": _gptq_job(model, seqs, batch_size),
        "gptq pass, no block replay": _gptq_job(model, seqs, batch_size, replay=False),
        "quantize w4-gptq": lambda: pp.quantize(model, RECIPE, calibration=list(seqs), batch_size=batch_size),
        "quantize w4-only": lambda: pp.quantize(model, "w4-only"),
    }


def bench_time(model, seqs: Sequence[str], batch_size: int, reps: int) -> Dict[str, float]:
    jobs = _jobs(model, seqs, batch_size)
    jobs["fp"]()  # warm-up
    return medians(interleaved(jobs, reps))


def memory_child(shape: ModelShape, job: str, count: int, batch_size: int, threads: int) -> Dict[str, int]:
    torch.set_num_threads(threads)
    model, _ = build_esm2(shape)
    seqs = random_sequences(count, shape.seq_len, seed=1)
    run = _jobs(model, seqs, batch_size)[job]
    gc.collect()
    reset = _reset_peak_rss()
    before = _current_rss_kib()
    run()
    return {"rss_before_kib": before, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "peak_reset": reset}


def bench_memory(shape_flag: List[str], count: int, batch_size: int, threads: int) -> Dict[str, dict]:
    return {job: run_memory_child(__file__, shape_flag, job, count, batch_size, threads) for job in ("fp", "gptq pass")}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model and short sequences (seconds)")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (default 3)")
    parser.add_argument("--calib-seqs", type=int, default=16, help="calibration sequences (default 16)")
    parser.add_argument("--batch-size", type=int, default=4, help="calibration batch size (default 4)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--memory-child", nargs=2, metavar=("JOB", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("reps", "calib_seqs", "batch_size", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: Sequence[str] = ()) -> int:
    args = parse_args(list(argv))
    shape = QUICK_SHAPE if args.quick else FULL_SHAPE
    shape_flag = ["--quick"] if args.quick else []
    if args.memory_child:
        job, count = args.memory_child
        print(json.dumps(memory_child(shape, job, int(count), args.batch_size, args.threads)))
        return 0
    torch.set_num_threads(args.threads)
    model, _ = build_esm2(shape)
    seqs = random_sequences(args.calib_seqs, shape.seq_len, seed=1)
    t = bench_time(model, seqs, args.batch_size, args.reps)
    mem = bench_memory(shape_flag, args.calib_seqs, args.batch_size, args.threads)
    print(f"## GPTQ calibration cost ({shape.describe()}, {args.calib_seqs} sequences, batch {args.batch_size})\n")
    print(f"`{command_line(argv, __file__)}`; {environment_line(args.threads)}; medians of {args.reps} "
          "interleaved runs\n")
    rows = [[name, seconds, f"{seconds / t['fp']:.1f}x"] for name, seconds in t.items()]
    print(markdown_table(["job", "seconds", "/ FP forwards"], rows) + "\n")
    mrows = [[job, m["rss_before_kib"] / 1024, (m["peak_kib"] - m["rss_before_kib"]) / 1024, m["peak_reset"]]
             for job, m in mem.items()]
    print(markdown_table(["job (fresh process)", "RSS before (MiB)", "peak growth (MiB)", "peak reset"], mrows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
