"""One entry point for the benchmarks: ``python -m scripts.bench NAME [args...]`` runs ``scripts/bench_NAME.py``'s main.

    python -m scripts.bench --list                  # every name and what it measures
    python -m scripts.bench onnx --quick            # same as: python scripts/bench_onnx.py --quick

Each script still runs on its own (``python scripts/bench_X.py``); this file only maps names to them. Run it from
the repository root. The descriptions are the scripts' docstring first lines, read without importing them.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

HERE = Path(__file__).resolve().parent

BENCHES: Dict[str, str] = {  # name -> module in scripts/ with main(argv) -> exit code
    "quantize": "bench_quantize",
    "artifact_size": "bench_artifact_size",
    "gptq": "bench_gptq",
    "special_tokens": "bench_special_tokens",
    "fidelity_pwlq_int": "fidelity_pwlq_int",
    "study_vs_ours": "bench_study_vs_ours",
    "study_pass": "bench_study_pass",
    "search": "bench_search",
    "memory": "bench_memory",
    "cpu_int8": "bench_cpu_int8",
    "onnx": "bench_onnx",
    "long_fold": "bench_long_fold",
    "small_commands": "bench_small_commands",
    "tmscore": "bench_tmscore",
    "embed": "bench_embed",
    "esmc_embed": "bench_esmc_embed",
    "esmc_study": "bench_esmc_study",
    "kernels": "bench_kernels",
    "gpu_check": "gpu_check",
}


def describe(module: str) -> str:
    """The first line of ``scripts/<module>.py``'s docstring."""
    doc = ast.get_docstring(ast.parse((HERE / f"{module}.py").read_text())) or ""
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
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # the scripts import their siblings as top-level modules
    module = importlib.import_module(BENCHES[name])
    saved, sys.argv = sys.argv, [str(HERE / f"{BENCHES[name]}.py"), *rest]  # what the script sees run directly
    try:
        return int(module.main(rest) or 0)
    finally:
        sys.argv = saved


if __name__ == "__main__":
    sys.exit(main())
