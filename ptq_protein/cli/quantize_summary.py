"""What ``quantize`` prints when it is done: the summary of the artifact it wrote, and for a language model which
embedding point its recipe sits on (``ptq-protein presets`` marks them)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ptq_protein.cli.compare_table import print_comparison

__all__ = ["summary_of", "print_summary"]


def summary_of(qmodel, out: Path, recipe: str, model_name: str) -> dict:
    from ptq_protein.recipes.presets import LM_FAMILIES, lm_point

    state = qmodel.ptq_state
    kinds: dict = {}
    for kind in state.quantized.values():
        kinds[kind] = kinds.get(kind, 0) + 1
    size = sum(f.stat().st_size for f in out.iterdir())
    return {"artifact": str(out), "model": model_name, "recipe": recipe, "config": state.config.describe(),
            "sites_quantized": len(state.quantized), "by_kind": kinds, "fp_sites": len(state.fp_sites),
            "calibration": None if state.calibration is None else state.calibration.to_dict(),
            "artifact_bytes": size, "family": state.family, "trunk_dtype": state.config.trunk_dtype,
            "lm_point": (lm_point(state.config) or "neither") if state.family in LM_FAMILIES else None}


_POINTS = {"fast": "the fast point (every quantized Linear one integer GEMM)",
           "accurate": "the accurate point (integer GEMMs, the sites where outliers cost most in floating point)",
           "neither": "on neither point (not one integer GEMM per quantized Linear)"}
_SLOW_ON_CPU = ("w8a8-pwlq",)  # the study's kind of recipe, ours: measured 1.0-1.1x FP32 on CPU (BENCHMARKS.md)


def print_summary(summary: dict, demo: bool) -> None:
    sites = ", ".join(f"{k}: {v}" for k, v in sorted(summary["by_kind"].items()))
    print(f"quantized {summary['model']} with {summary['recipe']}: "
          + (f"{summary['sites_quantized']} sites ({sites})" if summary["sites_quantized"] else "no site quantized"))
    calib = summary["calibration"]
    if calib:
        print(f"calibration: {calib['name']} ({calib['num_sequences']} sequences, sha256 {calib['sha256'][:12]})")
    if summary.get("trunk_dtype"):
        print(f"folding trunk: pair operations in {summary['trunk_dtype']} (their Linear weights stored so; their "
              "products run so where the CPU or GPU has it natively, else float32)")
    print(f"artifact: {summary['artifact']} ({summary['artifact_bytes'] / 1e6:.2f} MB)")
    if summary.get("lm_point"):
        print(f"embeddings on a CPU: {_POINTS[summary['lm_point']]} ('ptq-protein presets' marks every recipe)")
    if summary.get("lm_point") and summary["recipe"] in _SLOW_ON_CPU:
        print(f"speed: on CPU, {summary['recipe']} runs about as fast as the FP model (its outlier pieces take a "
              "float product); for embed and score, --preset w8a8-smoothquant runs the fused integer layer, 2-3x "
              "FP32 (docs/int8.md); --compare w8a8-smoothquant shows its error here")
    search = summary.get("smoothquant_alpha")
    if search:
        print(f"smoothquant alpha {_alpha_text(search['chosen'])}, the lowest relative error vs FP on "
              f"{', '.join(search['scored_on'])}: " + ", ".join(f"{_alpha_text(t['alpha'])} {t['relative_error']:.4f}"
                                                         for t in search["trials"]))
    plan = summary.get("plan")
    if plan:
        print(f"plan for {plan['budget']}: {plan['avg_bits']:.2f} average bits; held-out "
              + ", ".join(f"{k} {v:.4f}" for k, v in plan["verified"].items()))
        for unit in plan["units"]:
            print(f"  {unit['unit']:<40} {unit['choice']}")
    if summary.get("comparison"):
        print_comparison(summary["comparison"], demo)


def _alpha_text(alpha: Optional[float]) -> str:
    return "off (no smoothing)" if alpha is None else f"{alpha:g}"
