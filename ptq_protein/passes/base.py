"""The interface every pass implements: what it needs, what it changes, what it records.

A recipe is a sequence of passes (:mod:`ptq_protein.passes.recipe`). Before any
pass runs, the driver asks each one what it **needs** (:class:`Needs`), and the
planner (:mod:`ptq_protein.passes.plan`) turns the answers into one
:class:`~ptq_protein.passes.plan.CalibrationPlan`: which sequences, which
statistics at which sites, whether the recipe can read a shared pass. Then each
pass **runs** on a :class:`~ptq_protein.passes.run.Run`, the record the passes
share: it changes the model copy, the sites or the quantizers, and records report
rows and artifact fields there. Each pass file's docstring says which fields of
the run it reads and writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from ptq_protein.calibration.sites import Site
from ptq_protein.recipes.config import QuantConfig

__all__ = ["Needs", "Pass", "EveryRecipe", "STATIC_ACTIVATIONS"]

STATIC_ACTIVATIONS = "static activations"  # the reason our calibration pass gives for needing sequences


@dataclass(frozen=True)
class Needs:
    """What a pass asks of the calibration plan, decided from the recipe and its sites before anything runs.

    ``sequences``: why the pass needs calibration sequences ("" for none; the
    words of the error when none were given). ``changes_model``: it edits the
    model before activations are calibrated, so a shared pass of unchanged-model
    statistics cannot serve the recipe. ``statistics``: it reads our per-site
    statistics (:mod:`ptq_protein.calibration.calibrate`) at the recipe's static
    sites. ``study_observers``: it reads the study's top-k observers at the recipe's sites.
    """

    sequences: str = ""
    changes_model: bool = False
    statistics: bool = False
    study_observers: bool = False


class Pass(Protocol):
    """One step of a recipe. ``applies`` says whether a config lists it (the recipe's entry).

    A pass that can change only some models may also define ``check(model, adapter, cfg)``, which raises
    :class:`~ptq_protein.support.errors.InputError` for a model it cannot change;
    :meth:`ptq_protein.passes.recipe.Recipe.choose` calls it before anything runs.
    """

    @staticmethod
    def applies(cfg: QuantConfig) -> bool: ...

    def needs(self, cfg: QuantConfig, sites: Sequence[Site]) -> Needs: ...

    def run(self, run: "Run") -> None: ...  # noqa: F821 (ptq_protein.passes.run.Run: it imports this file)


class EveryRecipe:
    """Defaults of a pass that every config of its pipeline lists and that needs nothing: override what differs."""

    @staticmethod
    def applies(cfg: QuantConfig) -> bool:
        return True

    def needs(self, cfg: QuantConfig, sites: Sequence[Site]) -> Needs:
        return Needs()
