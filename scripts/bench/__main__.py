"""One entry point for the benchmarks: ``python -m scripts.bench NAME [args...]`` runs that bench's ``main``.

    python -m scripts.bench --list                  # every name and what it measures
    python -m scripts.bench onnx --quick            # same as: python -m scripts.bench onnx --quick
    python -m scripts.bench embed --quick           # the bench package's own benches: scripts/bench/embed.py

Run it from the repository root. Older benches are still files of their own (``scripts/bench_X.py``, runnable
alone); the bench package (``scripts/bench/``) holds the shared helpers (``common.py``) and the benches that time
whole processes. The descriptions are the modules' docstring first lines, read without importing them.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

SCRIPTS = Path(__file__).resolve().parents[1]

BENCHES: Dict[str, str] = {  # name -> module (importable with scripts/ on sys.path) with main(argv) -> exit code
    "quantize": "bench.quantize",
    "artifact_size": "bench.artifact_size",
    "gptq": "bench.gptq",
    "special_tokens": "bench.special_tokens",
    "fidelity_pwlq_int": "bench.fidelity_pwlq_int",
    "study_vs_ours": "bench.study_vs_ours",
    "study_pass": "bench.study_pass",
    "search": "bench.search",
    "memory": "bench.memory",
    "cpu_int8": "bench.cpu_int8",
    "onnx": "bench.onnx",
    "long_fold": "bench.long_fold",
    "fold": "bench.fold",
    "small_commands": "bench.small_commands",
    "tmscore": "bench.tmscore",
    "embed": "bench.embed",
    "score": "bench.score",
    "embed_memory": "bench.embed_memory",
    "onednn_reorders": "bench.onednn_reorders",
    "esmc_embed": "bench.esmc_embed",
    "esmc_study": "bench.esmc_study",
    "kernels": "bench.kernels",
    "gpu_check": "gpu_check",
}


def module_file(module: str) -> Path:
    """The source file of a :data:`BENCHES` module."""
    return SCRIPTS / (module.replace(".", "/") + ".py")


def describe(module: str) -> str:
    """The first line of the module's docstring."""
    doc = ast.get_docstring(ast.parse(module_file(module).read_text())) or ""
    return doc.splitlines()[0] if doc else ""


def listing() -> str:
    width = max(map(len, BENCHES))
    return "\n".join(f"{name:<{width}}  {describe(module)}" for name, module in BENCHES.items())


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + listing())
        return 0
    if argv[0] == "--list":
        print(listing())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHES:
        print(f"unknown bench {name!r}; one of: {', '.join(BENCHES)} (python -m scripts.bench --list)",
              file=sys.stderr)
        return 2
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))  # the benches import each other as top-level modules (bench.common, ...)
    module = importlib.import_module(BENCHES[name])
    saved, sys.argv = sys.argv, [str(module_file(BENCHES[name])), *rest]  # what the script sees run directly
    try:
        return int(module.main(rest) or 0)
    finally:
        sys.argv = saved


if __name__ == "__main__":
    sys.exit(main())
