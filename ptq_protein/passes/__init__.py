"""Recipes as sequences of passes, and the planner of their calibration forwards.

``pp.quantize`` (:mod:`ptq_protein.api`) is a short driver: it resolves the
config's passes (:mod:`~ptq_protein.passes.recipe`), plans the calibration once
from what they need (:mod:`~ptq_protein.passes.plan`), and runs them in order on
one :class:`~ptq_protein.passes.run.Run`. The interface of a pass is in
:mod:`~ptq_protein.passes.base`; each pass is one file here.

This room sits above the stages it calls (calibration, nn, transforms, models)
and below the API, the workflows and the search.
"""
