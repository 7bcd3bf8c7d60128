"""Recipes as sequences of passes: which passes a config lists, in which order, over which sites.

A pass is listed when its ``applies(cfg)`` says the config asks for it (the
recipe's entry: ``cfg.rotate_ffn``, ``cfg.smoothquant``, ``cfg.gptq``, ``cfg.study``, ...). Our
recipes and the study's are two pipelines: ours transforms, calibrates, fits and
swaps; the study's calibrates with its own observers, attaches its quantizers and
rounds its weights, as their notebook does. Adding a method is a pass file plus
its place in one of these tuples.

Whatever else depends on which pipeline a config runs (``--low-memory`` streams ours only, an artifact holds
ours only, the study's W8 may find no tensor to round) is answered by :class:`Recipe`, so that no code outside
this folder reads the config's ``study`` entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from torch import nn

from ptq_protein.calibration.sites import Site, discover_sites, select_sites
from ptq_protein.passes.base import Pass
from ptq_protein.passes.calibrate import CalibrateOurs
from ptq_protein.passes.fit_activations import FitActivations
from ptq_protein.passes.fold_smoothquant import FoldSmoothQuant
from ptq_protein.passes.pair_int8 import PairInt8
from ptq_protein.passes.report_rows import ReportRows
from ptq_protein.passes.rotate_ffn import RotateFfnProduct
from ptq_protein.passes.sequential_gptq import SequentialGptq
from ptq_protein.passes.special_tokens import SpecialTokenRows
from ptq_protein.passes.study_activations import StudyActivations
from ptq_protein.passes.study_calibrate import StudyCalibrate
from ptq_protein.passes.study_w8 import StudyW8
from ptq_protein.passes.swap import SwapModules
from ptq_protein.passes.trunk_dtype import TrunkDtype
from ptq_protein.recipes.config import QuantConfig, SiteKind
from ptq_protein.support.errors import InputError

__all__ = ["Recipe", "resolve_recipe", "OUR_PASSES", "STUDY_PASSES"]

# In order. Transforms that change the model come before the calibration that must see them.
OUR_PASSES = (RotateFfnProduct, FoldSmoothQuant, SequentialGptq, CalibrateOurs, FitActivations, SwapModules,
              SpecialTokenRows, ReportRows, PairInt8, TrunkDtype)
STUDY_PASSES = (StudyCalibrate, StudyActivations, StudyW8, PairInt8, TrunkDtype)


@dataclass(frozen=True)
class Recipe:
    """A config's passes; ``study``: the study's pipeline (module-input sites only, so no MATMUL)."""

    passes: Tuple[Pass, ...]
    study: bool = False

    def select(self, all_sites: Sequence[Site], cfg: QuantConfig) -> List[Site]:
        """The sites this recipe quantizes, of those discovered."""
        chosen = select_sites(all_sites, cfg)
        return [s for s in chosen if s.kind is not SiteKind.MATMUL] if self.study else chosen

    def choose(self, model: nn.Module, adapter, cfg: QuantConfig) -> List[Site]:
        """:meth:`select` on ``model``, refusing a model or a recipe with nothing to quantize, and a model a
        pass of the recipe cannot change (its ``check``)."""
        for step in self.passes:
            check = getattr(step, "check", None)
            if check is not None:
                check(model, adapter, cfg)
        all_sites = discover_sites(model, adapter)
        if not all_sites and not self.study:
            raise InputError(f"{type(model).__name__} has no quantizable sites (no Linear or LayerNorm modules)")
        chosen = self.select(all_sites, cfg)
        wanted = cfg.activations is not None if self.study else bool(cfg.kinds)
        if wanted and not chosen:
            raise InputError(f"recipe {cfg.name!r} selects no site of this model: check kinds/groups/include/exclude")
        return chosen

    def not_streamed(self, plan) -> Optional[str]:
        """Why ``--low-memory`` (our calibrate, fit and swap passes, layer by layer) cannot run this recipe, whose
        calibration is ``plan``; None when it can."""
        return "it is the study's own pipeline" if self.study else plan.own_pass

    @property
    def saved(self) -> bool:
        """Whether an artifact can hold a model of this recipe (the study's reproductions run in float
        simulation, in memory only)."""
        return not self.study

    def as_run(self, cfg: QuantConfig, state) -> QuantConfig:
        """``cfg`` as it ran on a model whose ``ptq_state`` is ``state``: the study's W8 rounds tensors under its
        own prefixes, and where it found none the weights stayed in floating point."""
        if self.study and cfg.weights is not None and state is not None and not any(
                str(how).startswith("W") for how in state.quantized.values()):
            return cfg.replace(weights=None)
        return cfg


def resolve_recipe(cfg: QuantConfig) -> Recipe:
    """The passes ``cfg`` lists, in pipeline order."""
    study = cfg.study is not None
    return Recipe(tuple(p() for p in (STUDY_PASSES if study else OUR_PASSES) if p.applies(cfg)), study)
