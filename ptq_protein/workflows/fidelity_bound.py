"""How far a recipe's own fidelity check may be from the FP model before the result is not a quantization of it.

``quantize`` checks the quantized model against its FP self on a few calibration
sequences (``eval/bench/fidelity``). A recipe that runs as designed stays close;
one that broke (a transform undone, a wrong scale) shows errors of the size of the
output itself. This module turns the check into a verdict, from the recipe's bits:

* **relative error** (logits, hidden states, or ESMFold's CA positions) at most
  ``min(1, 0.5 * 2 ** (8 - b))``, ``b`` the fewest bits any quantized tensor of the
  recipe stores. At 8 bits, 0.5: the error half the size of the output, several
  times what every 8-bit recipe gave on plain and planted-outlier ESM-2 in the
  audit (``scripts/audit_recipes.py``; BENCHMARKS.md). One bit fewer doubles a code's
  step and so the allowance, up to 1: an error as large as the output, which
  predicting zeros would match, is never a quantization of the model.
* **top-1 agreement** (language models) at least 0.5: the quantized model picks
  the FP model's token at most residues.
* **TM-score to the FP structure** (ESMFold) at least ``max(0.5, 1 - 0.1 * 2 ** (8 - b))``:
  0.9 at 8 bits. A small perturbation of a random ESMFold at the v1 trunk's widths (its stem
  cast to bfloat16) keeps 0.96-0.99 of its own fold, and the 8-bit default about as much;
  a recipe at 0.8 has moved the fold, which no sound 8-bit recipe does. One bit fewer doubles
  the allowed loss, down to 0.5, the usual same-fold threshold (Xu & Zhang 2010,
  Bioinformatics 26:889), below which the structure is another fold.

These bound what a working recipe may give, not what it usually gives: a
result inside them can still be poor (the check's numbers say how poor).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, Optional

from ptq_protein.recipes.config import QuantConfig

__all__ = ["FidelityBound", "recipe_bound", "verdict", "verdict_line"]

_REL_AT_8_BITS = 0.5  # rel. error allowed to an 8-bit recipe (see the module docstring)
_REL_CAP = 1.0        # an error the size of the output: no recipe's
_MIN_TOP1 = 0.5       # the FP model's token at most residues
_TM_LOSS_AT_8_BITS = 0.1  # TM-score to FP an 8-bit recipe may lose (see the module docstring)
_MIN_TM = 0.5         # same fold (Xu & Zhang 2010): the floor at any width
_SIGNIFICAND_BITS = {"bfloat16": 8}  # a trunk run in bfloat16 rounds each product to 8 significant bits


@dataclass(frozen=True)
class FidelityBound:
    """The check's limits for a recipe whose narrowest quantized tensor stores ``bits`` bits."""

    bits: int
    max_relative_error: float
    min_top1_agreement: float = _MIN_TOP1
    min_tm_vs_fp: float = _MIN_TM  # recipe_bound sets the width's own

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def recipe_bound(cfg: QuantConfig, plan: Any = None) -> Optional[FidelityBound]:
    """The bound of ``cfg`` (or of a mixed-precision ``plan``'s narrowest choice); None when nothing is quantized."""
    widths = list(_plan_bits(plan)) if plan is not None else [
        spec.bits for spec in (cfg.weights, cfg.activations) if spec is not None and cfg.kinds]
    if cfg.trunk_dtype is not None:
        widths.append(_SIGNIFICAND_BITS[cfg.trunk_dtype])
    if not widths:
        return None
    bits = min(widths)
    return FidelityBound(bits, min(_REL_CAP, _REL_AT_8_BITS * 2.0 ** (8 - bits)),
                         min_tm_vs_fp=max(_MIN_TM, 1.0 - _TM_LOSS_AT_8_BITS * 2.0 ** (8 - bits)))


def verdict(bound: Optional[FidelityBound], metrics: Dict[str, float]) -> Optional[Dict[str, Any]]:
    """``{"within": bool, "outside": [what], "bound": {...}}`` for a check's ``metrics``; None without a bound."""
    if bound is None or not metrics:
        return None
    outside = []
    rel = metrics.get("relative_error")
    if rel is not None and not rel <= bound.max_relative_error:  # NaN is outside
        outside.append(f"rel. error {rel:.4g} > {bound.max_relative_error:.2g}")
    top1 = metrics.get("top1_agreement")
    if top1 is not None and not top1 >= bound.min_top1_agreement:
        outside.append(f"top-1 agreement {top1:.4g} < {bound.min_top1_agreement:.2g}")
    tm = metrics.get("tm_vs_fp")
    if tm is not None and not tm >= bound.min_tm_vs_fp:
        outside.append(f"TM-score to FP {tm:.4g} < {bound.min_tm_vs_fp:.2g}")
    return {"within": not outside, "outside": outside, "bound": bound.to_dict()}


def verdict_line(recipe: str, found: Dict[str, Any]) -> str:
    """One sentence for a check outside its bound: what, against which limit, what it means."""
    return (f"{recipe}'s fidelity check is far outside what a {found['bound']['bits']}-bit recipe gives "
            f"({'; '.join(found['outside'])}): this is not a faithful quantization of the model")


def _plan_bits(plan: Any) -> Iterable[int]:
    from ptq_protein.recipes.site_plan import UnitChoice

    for _, choice, _ in plan.units:
        parsed = UnitChoice.parse(choice)
        yield from (b for b in (parsed.weight_bits, parsed.act_bits) if b is not None)
