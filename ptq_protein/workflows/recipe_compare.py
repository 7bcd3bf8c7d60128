"""Several recipes side by side against the FP model (``ptq-protein quantize --compare``).

Every recipe is checked on the same sequences against FP outputs computed once,
and quantized from the calibration passes of
:func:`ptq_protein.workflows.shared_calibration.calibrate_recipes` (one pass for all the
recipes whose statistics agree). Each recipe's quantized copy is dropped before
the next is built, so memory holds the FP model plus one quantized copy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from torch import nn

from ptq_protein.api import CalibrationArg, CalibrationPass, calibration_records, crop_sequence, quantize
from ptq_protein.eval.bench.fidelity import Reference, compare_to_reference, fidelity_sequences
from ptq_protein.models.adapters import get_adapter
from ptq_protein.passes.recipe import resolve_recipe
from ptq_protein.recipes.config import QuantConfig, Scheme, TensorQuant
from ptq_protein.recipes.presets import PRESETS, resolve_config
from ptq_protein.recipes.site_plan import MixedPlan, UnitChoice
from ptq_protein.workflows.fidelity_bound import recipe_bound, verdict

__all__ = ["ComparisonRow", "FidelitySequences", "known_recipes", "choose_fidelity_sequences", "recipe_row",
           "compare_recipes", "storage_bits"]

log = logging.getLogger(__name__)


def storage_bits(spec: Optional[TensorQuant]) -> Optional[int]:
    """Bits stored per value of a tensor kind (None: kept in floating point).

    The code width: a ``bits``-bit PWLQ code here is one ``bits``-bit integer. The
    study's PWLQ stores a ``b``-bit centre code plus a ``b``-bit tail code over the
    whole range and a region flag: ``b + 1`` bits, shown as such so rows compare at
    the storage they really cost.
    """
    if spec is None:
        return None
    return spec.bits + 1 if spec.scheme is Scheme.STUDY_PWLQ else spec.bits


@dataclass(frozen=True)
class ComparisonRow:
    """One recipe's fidelity against the FP model, and the bits it stores per value."""

    recipe: str
    weight_bits: Union[int, str, None]  # None: floating point; a mixed plan's widths as text ("4-8", "fp-8")
    activation_bits: Union[int, str, None]
    metrics: Dict[str, float] = field(default_factory=dict)
    verdict: Optional[Dict[str, Any]] = None  # workflows.fidelity_bound.verdict (None: nothing quantized)
    trunk_dtype: Optional[str] = None  # ESMFold's trunk pair operations held and run in this dtype (QuantConfig's)

    def to_dict(self) -> Dict[str, Any]:
        out = {"recipe": self.recipe, "weight_bits": self.weight_bits, "activation_bits": self.activation_bits,
               **({} if self.trunk_dtype is None else {"trunk_dtype": self.trunk_dtype}), **self.metrics}
        return out if self.verdict is None else {**out, "verdict": self.verdict}


@dataclass(frozen=True)
class FidelitySequences:
    """The sequences the check runs on: which, why, and as the model sees them."""

    ids: Tuple[str, ...]
    sequences: Tuple[str, ...]
    full_lengths: Tuple[int, ...]
    source: str

    def to_dict(self) -> Dict[str, Any]:
        return {"ids": list(self.ids), "lengths": [len(s) for s in self.sequences],
                "full_lengths": list(self.full_lengths), "source": self.source}


def known_recipes(names: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(known preset names, unknown ones), each once and in order; unknown ones are logged and skipped."""
    known, unknown = [], []
    for name in dict.fromkeys(n.strip() for n in names if n.strip()):
        (known if name in PRESETS else unknown).append(name)
    for name in unknown:
        log.warning("compare: skipping %r, not a known preset (known: %s)", name, ", ".join(PRESETS))
    return known, unknown


def choose_fidelity_sequences(calibration: CalibrationArg, n: int,
                              max_length: Optional[int] = None) -> FidelitySequences:
    """The ``n`` median-length calibration sequences, cropped like calibration crops them."""
    ids, seqs = zip(*calibration_records(calibration))
    picked = fidelity_sequences([len(s) for s in seqs], n)
    source = f"the {len(picked)} median-length calibration sequences of {len(seqs)}"
    return FidelitySequences(tuple(ids[i] for i in picked), tuple(crop_sequence(seqs[i], max_length) for i in picked),
                             tuple(len(seqs[i]) for i in picked), source)


def recipe_row(cfg: QuantConfig, qmodel: nn.Module, references: Sequence[Reference],
               progress: bool = False) -> ComparisonRow:
    """Fidelity of ``qmodel`` (quantized with ``cfg``) against the FP ``references``."""
    metrics = compare_to_reference(qmodel, references, get_adapter(qmodel), progress=progress)
    state = getattr(qmodel, "ptq_state", None)
    plan = getattr(state, "plan", None)
    cfg = resolve_recipe(cfg).as_run(cfg, state)
    found = verdict(recipe_bound(cfg, plan), metrics)
    if plan is not None:
        return ComparisonRow(cfg.name, *plan_widths(plan), {"avg_bits": plan.avg_bits, **metrics}, found,
                             cfg.trunk_dtype)
    return ComparisonRow(cfg.name, storage_bits(cfg.weights), storage_bits(cfg.activations), metrics, found,
                         cfg.trunk_dtype)


def plan_widths(plan: MixedPlan) -> Tuple[str, str]:
    """The weight and activation widths a mixed plan uses, as ``"4-8"`` (``fp`` where a unit stays float)."""
    choices = [UnitChoice.parse(choice) for _, choice, _ in plan.units]

    def span(widths: Sequence[Optional[int]]) -> str:
        found = sorted({w for w in widths if w is not None})
        text = "-".join(str(w) for w in (found[:1] + found[-1:] if len(found) > 1 else found))
        return "-".join(x for x in ("fp" if None in widths else "", text) if x) or "fp"

    return span([c.weight_bits for c in choices]), span([c.act_bits for c in choices])


def compare_recipes(fp_model: nn.Module, recipes: Sequence[str], passes: Dict[str, Optional[CalibrationPass]],
                    references: Sequence[Reference], *, backend: Optional[str] = None,
                    **calibration_options) -> List[ComparisonRow]:
    """Quantize ``fp_model`` with each recipe from its calibration pass and check it on ``references``.

    A recipe without a pass (dynamic, or one that calibrates on its own: study-exact,
    SmoothQuant, GPTQ) is quantized with ``calibration_options`` (``calibration=``,
    ``batch_size=``, ``num_recycles=``, ``calib_max_length=`` of :func:`quantize`).
    """
    rows = []
    for name in recipes:
        cfg = resolve_config(name)
        qmodel = quantize(fp_model, cfg, statistics=passes.get(cfg.name), backend=backend, **calibration_options)
        rows.append(recipe_row(cfg, qmodel, references))
        del qmodel
    return rows
