"""Resident memory of a loaded ``w8a8-pwlq`` int8 artifact against the FP model (``cpu_int8.py``'s last table).

Each side is measured in a fresh process (this file run as a script: ``KIND ARTIFACT THREADS [--quick]``), as
the RSS growth over the process after its imports, after one forward.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import (  # noqa: E402  (sibling module: shared model, sequences, timing and table helpers)
    QUICK_SHAPE,
    ModelShape,
    build_esm2,
    markdown_table,
    module_child,
    random_sequences,
)

GOAL_MEMORY = 0.4
MEMORY_SHAPE = ModelShape(num_layers=30, embed_dim=640, heads=20, seq_len=64)  # ESM-2 150M


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def memory_child(kind: str, shape: ModelShape, artifact: str) -> Dict[str, float]:
    """RSS growth (MiB) of one loaded model after one forward, over the RSS after imports."""
    import esm  # noqa: F401  (everything either side imports comes before the baseline)

    import ptq_protein as pp
    import ptq_protein.api  # noqa: F401
    import ptq_protein.artifact.save_load  # noqa: F401
    from ptq_protein.models.adapters import get_adapter
    from ptq_protein.nn import cpu_int8, int_fast  # noqa: F401

    cpu_int8.available()  # oneDNN's one-off initialisation
    base = _rss_mib()
    if kind == "fp":
        model = build_esm2(shape)[0]
    else:
        model = pp.load(artifact)
    tokens = get_adapter(model).make_batch(random_sequences(1, 32, seed=3)).inputs["tokens"]
    with torch.no_grad():
        model(tokens)
    rss = _rss_mib() - base  # before state_dict(), which unpacks the prepacked weights
    linear_bytes = sum(b.numel() * b.element_size() for n, b in model.state_dict().items() if "weight" in n)
    return {"rss_mib": rss, "state_dict_weight_mib": linear_bytes / 2**20,
            "engine": pp.engine_used(model) if kind != "fp" else None}


def bench_memory(threads: int, quick: bool) -> Dict[str, dict]:
    import ptq_protein as pp

    shape = QUICK_SHAPE if quick else MEMORY_SHAPE
    with tempfile.TemporaryDirectory(prefix="bench_cpu_int8_") as tmp:
        model = build_esm2(shape)[0]
        q = pp.quantize(model, "w8a8-pwlq", calibration=random_sequences(2, 32, seed=4), backend="int8")
        pp.save(q, Path(tmp) / "w8a8-pwlq")
        del model, q
        out = {}
        for kind in ("fp", "int8"):
            cmd = [*module_child(__file__), kind, str(Path(tmp) / "w8a8-pwlq"), str(threads)] + (
                ["--quick"] if quick else [])
            out[kind] = json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                                  text=True).stdout.splitlines()[-1])
    return out


def print_memory(threads: int, quick: bool) -> None:
    mem = bench_memory(threads, quick)
    ratio = mem["int8"]["rss_mib"] / mem["fp"]["rss_mib"]
    label = "2 x 64 tiny" if quick else "ESM-2 150M-sized (30 x 640)"
    print(f"## Resident memory, {label}, loaded w8a8-pwlq artifact vs FP (after one forward)\n")
    print(markdown_table(["model", "RSS growth MiB", "weights in state_dict MiB", "engine"],
                         [[k, round(v["rss_mib"], 1), round(v["state_dict_weight_mib"], 1), v["engine"] or "-"]
                          for k, v in mem.items()]))
    met = "met" if ratio <= GOAL_MEMORY else "NOT met"
    print(f"\nint8 / FP resident: {ratio:.2f}x (goal <= {GOAL_MEMORY}x: {met})")


if __name__ == "__main__":
    kind, artifact, threads = sys.argv[1:4]
    torch.set_num_threads(int(threads))
    shape = QUICK_SHAPE if "--quick" in sys.argv[4:] else MEMORY_SHAPE
    print(json.dumps(memory_child(kind, shape, artifact)))
