"""What the CPU bench scripts share: the seeded ESM-2 shapes, random sequences, interleaved timing, and the table
and header lines (the CPU's flags among them)."""

from __future__ import annotations

import os
import platform
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import torch

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
# The x86 flags that decide which int8 kernels run (VNNI: exact u8 x s8 int32 sums; AMX: tile GEMMs).
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


@dataclass(frozen=True)
class ModelShape:
    """fair-esm ESM2 constructor arguments and the benchmark sequence length."""

    num_layers: int
    embed_dim: int
    heads: int
    seq_len: int

    def __post_init__(self) -> None:
        if self.embed_dim % self.heads:
            raise ValueError(f"embed_dim={self.embed_dim} must be divisible by heads={self.heads}")
        if not 1 <= self.seq_len <= 1022:
            raise ValueError(f"seq_len={self.seq_len} must be in 1..1022 (ESM-2's limit)")

    def describe(self) -> str:
        return f"ESM-2 {self.num_layers} layers x {self.embed_dim}, {self.heads} heads, length {self.seq_len}"


FULL_SHAPE = ModelShape(num_layers=12, embed_dim=480, heads=20, seq_len=256)
QUICK_SHAPE = ModelShape(num_layers=2, embed_dim=64, heads=4, seq_len=32)


def build_esm2(shape: ModelShape, seed: int = 0):
    """Seeded random fair-esm ESM2 with the demo outlier channels, in eval mode; (model, alphabet)."""
    from ptq_protein.models.tiny import tiny_esm2

    return tiny_esm2(seed, num_layers=shape.num_layers, embed_dim=shape.embed_dim, heads=shape.heads)


def random_sequences(count: int, length: int, seed: int) -> List[str]:
    """``count`` random sequences of the 20 standard amino acids, ``length`` residues each."""
    rng = random.Random(seed)
    return ["".join(rng.choice(AMINO_ACIDS) for _ in range(length)) for _ in range(count)]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table; floats get 3 significant digits."""
    def cell(value: object) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def environment_line(threads: int) -> str:
    return (f"torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPUs, "
            f"torch.set_num_threads({threads})")


def command_line(argv: Sequence[str], script: str) -> str:
    return "python scripts/" + Path(script).name + "".join(f" {a}" for a in argv)


def seconds(fn: Callable[[], object]) -> float:
    """Wall seconds of one call of ``fn``."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(jobs: Dict[str, Callable[[], object]], reps: int) -> Dict[str, List[float]]:
    """Seconds of every job over ``reps`` rounds, the order rotating every round (warm-ups are the caller's)."""
    names = list(jobs)
    times: Dict[str, List[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            times[name].append(seconds(jobs[name]))
    return times


def medians(times: Dict[str, List[float]]) -> Dict[str, float]:
    return {name: statistics.median(values) for name, values in times.items()}


# Environment variables that hold oneDNN, ATen and MKL to older instruction sets (emulating e.g. an AVX2-only CPU).
ISA_LIMITS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


def cpu_facts() -> str:
    """One line: the CPU model, torch's CPU capability and which of :data:`CPU_FLAGS` are present (VNNI or not)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    flags = next((set(ln.split(":", 1)[1].split()) for ln in lines if ln.startswith("flags")), set())
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")
    present = [f for f in CPU_FLAGS if f in flags]
    vnni = "VNNI" if {"avx512_vnni", "avx_vnni"} & flags else "no VNNI"
    limits = [f"{k}={os.environ[k]}" for k in ISA_LIMITS if os.environ.get(k)]
    limited = f"; instruction sets limited by {' '.join(limits)} (an emulated older CPU)" if limits else ""
    from ptq_protein.nn import cpu_int8

    return (f"CPU {model}; torch.backends.cpu.get_cpu_capability() = {torch.backends.cpu.get_cpu_capability()}; "
            f"flags: {' '.join(present) or 'none of ' + ' '.join(CPU_FLAGS)} ({vnni}){limited}; "
            f"int8 GEMM: {cpu_int8.reason()}")
