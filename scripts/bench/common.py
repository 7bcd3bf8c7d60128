"""What the bench scripts share: the seeded ESM-2 shapes, random and bundled sequences, interleaved timing, whole
processes measured (wall clock and the child's own rusage), the environment that holds a child to a thread count or
an older instruction set, and the table and header lines (the CPU's flags among them)."""

from __future__ import annotations

import compileall
import functools
import importlib.util
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

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
    """How the bench module at ``script`` was run: ``python -m scripts.bench NAME ARGS``."""
    return bench_command(Path(script).stem, argv)


def bench_command(name: str, argv: Sequence[str]) -> str:
    """How a bench of this package was run: ``python -m scripts.bench NAME ARGS``."""
    return f"python -m scripts.bench {name}" + "".join(f" {a}" for a in argv)


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


def judge(name: str, value: Optional[float], goal: float, unit: str = "x", at_most: bool = False) -> str:
    """'NAME 2.10x (goal >= 2.0x: met)'; ``unit``: "x" (ratios), "%" (shares) or "" (a plain number, 4 decimals);
    None or NaN is 'not measured'."""
    if value is None or value != value:
        return f"{name}: not measured"
    met = value <= goal if at_most else value >= goal
    shown = {"%": f"{100 * value:.2f}%", "x": f"{value:.2f}x"}.get(unit, f"{value:.4f}")
    limit = {"%": f"{100 * goal:g}%", "x": f"{goal}x"}.get(unit, f"{goal}")
    return f"{name} {shown} (goal {'<=' if at_most else '>='} {limit}: {'met' if met else 'missed'})"


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


# What --isa avx2 sets in every child: oneDNN, ATen and MKL held to AVX2 (on an AVX-512 CPU, an emulation).
AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
ISAS = ("native", "avx2")
SCRIPTS = Path(__file__).resolve().parents[1]  # scripts/: the folder children import the bench package from


def isa_label(isa: str) -> str:
    return "AVX2-held (an emulation on this CPU)" if isa == "avx2" else "native ISA"


@functools.lru_cache(maxsize=None)
def byte_compile_sources() -> None:
    """Byte code for the toolkit's and the bench's own modules, as ``pip install`` writes it for an installed
    package (once per bench process; up-to-date files are skipped). Where the environment sets
    ``PYTHONDONTWRITEBYTECODE`` (this project's machines do), a source tree is otherwise compiled again by every
    child, 0.1-0.3 s of CPU per process that the anchors' installed packages (torch, transformers, OpenVINO)
    never pay."""
    spec = importlib.util.find_spec("ptq_protein")
    folders = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    folders += [f.parent / "eval" for f in folders if (f.parent / "eval" / "__init__.py").is_file()]
    for folder in folders + [SCRIPTS]:
        compileall.compile_dir(str(folder), quiet=2)


def child_env(threads: int, isa: str, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """This process's environment with the children's thread count and instruction sets (``isa``: native or
    avx2), the bench package importable (``python -m bench.X``), and ``extra`` on top."""
    if isa not in ISAS:
        raise ValueError(f"isa={isa!r}: one of {', '.join(ISAS)}")
    byte_compile_sources()
    env = {k: v for k, v in os.environ.items() if k not in ISA_LIMITS}
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                "TORCHINDUCTOR_COMPILE_THREADS": str(threads),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")]))})
    if isa == "avx2":
        env.update(AVX2_ENV)
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class Measured:
    """One child process, whole: wall clock from start to exit, and its own resource use (``os.wait4``)."""

    wall_s: float
    user_s: float
    sys_s: float
    minor_faults: int
    peak_rss_kib: int  # ru_maxrss (KiB on Linux)
    returncode: int
    log: str = ""  # the last lines of its stdout and stderr

    @property
    def rss_gib(self) -> float:
        return self.peak_rss_kib / 2 ** 20

    @property
    def cpu_s(self) -> float:
        """User plus system CPU seconds: what the process cost the machine, whatever its thread count."""
        return self.user_s + self.sys_s

    @property
    def kernel_share(self) -> float:
        """System (kernel) CPU time as a share of wall time."""
        return self.sys_s / self.wall_s if self.wall_s > 0 else float("nan")

    def failure(self) -> str:
        """'' when it exited 0, else one line: the exit code and the last line it wrote."""
        if self.returncode == 0:
            return ""
        last = next((ln.strip() for ln in reversed(self.log.splitlines()) if ln.strip()), "no output")
        return f"exit {self.returncode}: {last[:200]}"


# The child is started by a small launcher (python -S): Linux counts the memory of the process a child was
# forked or vforked from in the child's ru_maxrss, so a child started from this (large) process would report at
# least this process's peak. The launcher's own few MiB are what remains of that; it also times the child.
_LAUNCHER = """import json, os, sys, time
start = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - start
with open(sys.argv[1], "w") as out:
    json.dump([wall, ru.ru_utime, ru.ru_stime, ru.ru_minflt, ru.ru_maxrss, os.waitstatus_to_exitcode(status)], out)
"""


def run_measured(cmd: Sequence[str], env: Optional[Mapping[str, str]] = None, cwd: Optional[Path] = None,
                 log: Optional[Path] = None, tail: int = 4000) -> Measured:
    """Run ``cmd`` to its end and measure it (:class:`Measured`, through the launcher above); its output goes to
    ``log`` (a temp file when None), whose last ``tail`` characters come back."""
    with tempfile.TemporaryDirectory(prefix="bench_log_") as tmp:
        path, usage = Path(log or Path(tmp) / "log.txt"), Path(tmp) / "usage.json"
        with open(path, "wb") as out:
            launched = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, str(usage), *cmd], stdout=out,
                                      stderr=subprocess.STDOUT, env=dict(env or os.environ), cwd=cwd)
        text = path.read_text(errors="replace")[-tail:]
        if not usage.exists():  # the launcher itself failed (e.g. the command is not found)
            return Measured(0.0, 0.0, 0.0, 0, 0, launched.returncode or 127, text)
        wall, user, system, faults, peak, code = json.loads(usage.read_text())
    return Measured(wall, user, system, faults, peak, code, text)


def versions(packages: Sequence[str] = ("torch", "transformers", "fair-esm", "onnxruntime", "torchao",
                                         "ptq-protein")) -> str:
    """One line: python and each package's installed version (or 'not installed'), read from package metadata."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"python {platform.python_version()}, " + ", ".join(f"{p} {version(p)}" for p in packages)


def child_cpu_facts(env: Mapping[str, str]) -> str:
    """:func:`cpu_facts` as a child with ``env`` sees it (held instruction sets, thread counts)."""
    done = run_measured([sys.executable, "-c", "from bench.common import cpu_facts; print(cpu_facts())"], env)
    lines = [ln for ln in done.log.splitlines() if ln.startswith("CPU ")]
    return lines[-1] if lines else f"(CPU facts unavailable: {done.failure()})"


def run_timed(cmd: Sequence[str], env: Optional[Mapping[str, str]] = None) -> dict:
    """Run ``cmd`` (it must succeed); peak RSS (GiB), wall, user and system seconds."""
    done = run_measured(cmd, env)
    if done.returncode != 0:
        raise RuntimeError(f"{list(cmd)[:3]} failed ({done.returncode}): {done.log[-2000:]}")
    return {"rss_gib": done.rss_gib, "wall_s": done.wall_s, "sys_s": done.sys_s, "user_s": done.user_s}


def bundled_records(count: int, sets: Sequence[str] = ("cameo139", "casp14", "cameo2022")) -> List[Tuple[str, str]]:
    """(label, sequence) of the first ``count`` bundled sequences, the sets in this order (deterministic)."""
    from ptq_protein.data.sets import load_set

    return [(t.id, t.sequence) for name in sets for t in load_set(name)][:count]


def write_fasta(path: Path, records: Sequence[Tuple[str, str]]) -> Path:
    path.write_text("".join(f">{label}\n{seq}\n" for label, seq in records))
    return path


def best_rates(rows: Dict[str, Callable[[], int]], threads: int, reps: int) -> Dict[str, Tuple[float, float]]:
    """{row: (residues/s, padding share or nan)}, best of ``reps`` passes; each row's callable returns residues."""
    torch.set_num_threads(threads)
    best: Dict[str, float] = {}
    for _ in range(reps):
        for name, run in rows.items():
            start = time.perf_counter()
            residues = run()
            best[name] = max(best.get(name, 0.0), residues / (time.perf_counter() - start))
    return {name: (rate, getattr(rows[name], "padding", float("nan"))) for name, rate in best.items()}


def module_child(path: str) -> List[str]:
    """The command that runs the bench module at ``path`` as a child process: by module name, ``scripts/`` on the
    path (run as a file, its own folder would come first on ``sys.path``, and ``bench/onnx.py`` or
    ``bench/kernels.py`` would shadow the installed packages of those names)."""
    module = f"bench.{Path(path).stem}"
    return [sys.executable, "-c", f"import runpy, sys; sys.path.insert(0, {str(SCRIPTS)!r}); "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"]
