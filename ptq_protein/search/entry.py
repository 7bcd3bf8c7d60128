"""``pp.quantize``: a named recipe or config through :func:`ptq_protein.api.quantize`, ``"auto"`` through the search.

Lives above the API so that ``pp.quantize(model, "auto", budget=...)`` can reach
:func:`ptq_protein.search.auto.auto_quantize` without the API importing upward.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from torch import nn

from ptq_protein import api
from ptq_protein.recipes.config import QuantConfig
from ptq_protein.support.errors import InputError

__all__ = ["quantize", "AUTO"]

AUTO = "auto"


def quantize(model: nn.Module, config: Union[str, QuantConfig, dict] = "w8a8-pwlq", calibration: Any = None, *,
             budget: Optional[str] = None, max_bits_avg: Optional[float] = None, **kwargs: Any) -> nn.Module:
    """Quantize an ESM model (fair-esm, transformers, or ESM C) and return a copy, called like the original.

    A named recipe or config runs its passes (`ptq_protein.api.quantize`); `config="auto"` instead
    searches a per-unit precision plan meeting `budget` / `max_bits_avg`
    (`ptq_protein.search.auto.auto_quantize`). A model that is already quantized is refused
    (quantize its float source). The returned model's record is `qmodel.ptq_state`.

    Parameters
    ----------
    model
        fair-esm `ESM2` / `ProteinBertModel`, transformers `EsmModel` / `EsmForMaskedLM` /
        `EsmForProteinFolding`, or ESM C (`ptq_protein.models.esmc.ESMC`); not modified unless `inplace=True`.
    config
        A preset name (`"w8a8-pwlq"`; see `ptq_protein.recipes.presets.PRESETS`), a `QuantConfig`, its
        `to_dict()`, or `"auto"` for the mixed-precision search.
    calibration
        FASTA path, bundled set spec (`"casp14:50"`), or a list of sequences; needed when
        activations are static, and always by the search.
    budget
        `"auto"` only: what the plan must keep, e.g. `"tm>=0.99"` or `"logits_rel<=0.02"`.
    max_bits_avg
        `"auto"` only: the most bits per value the plan may average.
    **kwargs
        Keywords of the recipe driver (below) or, with `"auto"`, of the search
        (`search_set`, `holdout`, `unit`, `choices`, `metric`, `backend`, `batch_size`,
        `num_recycles`, `max_length`).

    Other Parameters
    ----------------
    batch_size : int, optional
        Calibration batch size (None: the model family's, 1 for ESMFold and 4 for language models).
    backend : str, optional
        `"fake"` (simulation) or `"int8"` (integer GEMMs); overrides the config.
    inplace : bool
        Modify `model` itself instead of a deep copy (the CLI does: no second copy of the
        weights). Float weights are dropped as each layer is swapped.
    progress : bool
        Log calibration progress.
    num_recycles : int, optional
        ESMFold only: recycles during calibration (default: the model's).
    calib_max_length : int, optional
        Crop calibration sequences longer than this to their central window of this many
        residues (None keeps them whole). ESMFold's triangle attention is cubic in length, so
        long sequences dominate CPU calibration.
    statistics : CalibrationPass, optional
        A pass from an earlier calibration of this same model
        (`ptq_protein.workflows.shared_calibration.calibrate_recipes`), used instead of
        calibrating so several recipes share one pass; `calibration`, `batch_size`,
        `num_recycles` and `calib_max_length` are then unused. A pass that lacks this recipe's
        statistics is refused (ValueError).

    Returns
    -------
    nn.Module
        The quantized model, of the input's class; `qmodel.ptq_state` holds the record (with
        `"auto"`, `qmodel.ptq_state.plan` is the chosen plan).

    Examples
    --------
    >>> import ptq_protein as pp
    >>> qmodel = pp.quantize(model, "w8a8-pwlq", calibration="casp14:50")
    >>> logits = qmodel(tokens)["logits"]
    >>> mixed = pp.quantize(model, "auto", calibration="casp14:50", budget="tm>=0.99")
    >>> mixed.ptq_state.plan.avg_bits
    """
    if isinstance(config, str) and config == AUTO:
        from ptq_protein.search.auto import auto_quantize

        return auto_quantize(model, budget, max_bits_avg=max_bits_avg, calibration=calibration, **kwargs)
    if budget is not None or max_bits_avg is not None:
        raise InputError("budget= and max_bits_avg= only apply to the automatic search: pass config='auto'")
    return api.quantize(model, config, calibration, **kwargs)
