"""Protein metrics of a (partly) quantized model against the FP model's own outputs.

* ``tm``: TM-score of the quantized fold's CA trace against the FP fold's (ESMFold; 1 = identical);
* ``contacts``: precision of the quantized top-L contacts (|i - j| >= 6) against the FP model's
  top-L contacts: from contact probabilities for ESM-2 LMs, from virtual-CB distances of
  the predicted structure for ESMFold (1 = identical);
* ``logits``: relative error of the LM logits over residue positions (0 = identical), with
  top-1 agreement beside it.

Each sequence runs alone (no padding). FP outputs are computed once, when the scorer is made.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from torch import nn

from ptq_protein.eval.bench.fidelity import relative_error
from ptq_protein.models.adapters import ModelAdapter
from ptq_protein.support.errors import InputError

__all__ = ["Metric", "Scorer", "check_metric", "choose_metric", "default_metric", "MIN_SEPARATION", "METRIC_VALUES"]

MIN_SEPARATION = 6  # contacts: |i - j| >= 6, the CASP short+medium+long range convention
_LM_FAMILIES = ("fair-esm", "hf-esm", "esmc")
_CONTACT_LM_FAMILIES = ("fair-esm", "hf-esm")  # ESM C has no contact head
_FOLD_FAMILIES = ("hf-esmfold",)


class Metric(str, enum.Enum):
    """What sensitivity and the search measure."""

    TM = "tm"
    CONTACTS = "contacts"
    LOGITS = "logits"


#: metric -> (value names it reports, the first is the main one; True where higher is better)
METRIC_VALUES: Dict[Metric, Dict[str, bool]] = {
    Metric.TM: {"tm": True},
    Metric.CONTACTS: {"contacts": True},
    Metric.LOGITS: {"logits_rel": False, "top1": True},
}


def default_metric(family: str) -> Metric:
    """What a model of ``family`` is judged by when no metric is named: TM-score for ESMFold, logits for LMs."""
    return Metric.TM if family in _FOLD_FAMILIES else Metric.LOGITS


def choose_metric(family: str, metric: Optional[Union[str, Metric]] = None,
                  budget_metric: Optional[Union[str, Metric]] = None) -> Metric:
    """The metric named (checked for ``family``), the budget's, or the family's default; never one silently ignored."""
    if metric is not None:
        metric = check_metric(metric, family)
        if budget_metric is not None and Metric(budget_metric) is not metric:
            raise InputError(f"metric {metric.value!r} contradicts the budget's metric "
                             f"{Metric(budget_metric).value!r}: "
                             "drop --metric, or write the budget in that metric")
    return check_metric(budget_metric or metric or default_metric(family), family)


def check_metric(metric: Metric, family: str) -> Metric:
    """``metric`` if a model of ``family`` can give it, else an InputError naming what it can give."""
    metric = Metric(metric)
    able = {Metric.TM: _FOLD_FAMILIES, Metric.CONTACTS: _CONTACT_LM_FAMILIES + _FOLD_FAMILIES,
            Metric.LOGITS: _LM_FAMILIES}
    if family not in able[metric]:
        offered = [m.value for m, fams in able.items() if family in fams]
        raise InputError(f"metric {metric.value!r} needs "
                         f"{'a folding model (ESMFold)' if metric is Metric.TM else 'an ESM language model'}"
                         f", but this is a {family} model; it can give: {', '.join(offered)}")
    return metric


class Scorer:
    """Scores models against the FP reference outputs of ``sequences`` (computed here, once)."""

    def __init__(self, fp_model: nn.Module, adapter: ModelAdapter, metric: Metric, sequences: Sequence[str],
                 forward_kwargs: Dict[str, Any] = None):
        self.metric = check_metric(metric, adapter.family)
        self.adapter, self.sequences = adapter, list(sequences)
        if not self.sequences:
            raise InputError("no sequences to measure the metric on: give a set such as cameo139:5")
        self.forward_kwargs = dict(forward_kwargs or {})
        self._output: Callable = {Metric.TM: self._ca, Metric.CONTACTS: self._contact_scores,
                                  Metric.LOGITS: self._logits}[self.metric]
        with torch.no_grad():
            self.references = [self._output(fp_model, s) for s in self.sequences]

    @torch.no_grad()
    def score(self, model: nn.Module) -> Dict[str, float]:
        """Mean of each value over the sequences (``METRIC_VALUES[metric]`` keys)."""
        rows: List[Dict[str, float]] = [self._compare(ref, self._output(model, seq))
                                        for seq, ref in zip(self.sequences, self.references)]
        return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}

    def loss(self, values: Dict[str, float]) -> float:
        """0 for the FP model, larger is worse: 1 - TM, 1 - precision, or the logits' relative error."""
        main = next(iter(METRIC_VALUES[self.metric]))
        return values[main] if self.metric is Metric.LOGITS else 1.0 - values[main]

    # -- outputs -------------------------------------------------------------------------
    def _forward(self, model: nn.Module, seq: str):
        return self.adapter.forward(model, self.adapter.make_batch([seq]), **self.forward_kwargs)

    def _ca(self, model: nn.Module, seq: str) -> np.ndarray:
        return self._forward(model, seq)["positions"][-1][0, :, 1].double().cpu().numpy()

    def _contact_scores(self, model: nn.Module, seq: str) -> np.ndarray:
        if self.adapter.family in _LM_FAMILIES:
            from ptq_protein.eval.bench.contacts_task import predict_contacts

            return predict_contacts(model, seq).astype(np.float64)
        from ptq_protein.eval.contacts import virtual_cb

        atoms = self._forward(model, seq)["positions"][-1][0].double().cpu().numpy()  # atom14: N, CA, C, ...
        cb = virtual_cb(atoms[:, 0], atoms[:, 1], atoms[:, 2])
        return -np.linalg.norm(cb[:, None] - cb[None], axis=-1)  # closer = higher score

    def _logits(self, model: nn.Module, seq: str) -> torch.Tensor:
        batch = self.adapter.make_batch([seq])
        out = self.adapter.forward(model, batch, **self.forward_kwargs)
        logits = out["logits"] if hasattr(out, "keys") else out.logits
        return logits[0][batch.token_mask[0].to(logits.device)].double().cpu()

    def _compare(self, ref, out) -> Dict[str, float]:
        if self.metric is Metric.TM:
            from ptq_protein.eval.tmscore import tm_score

            return {"tm": tm_score(out, ref).tm_score}
        if self.metric is Metric.CONTACTS:
            return {"contacts": top_l_precision(out, ref)}
        return {"logits_rel": relative_error(ref, out),
                "top1": float((ref.argmax(-1) == out.argmax(-1)).double().mean())}


def top_l_pairs(scores: np.ndarray, min_separation: int = MIN_SEPARATION) -> set:
    """The L highest-scoring pairs (i < j, j - i >= min_separation) of an [L, L] score map (ties by index)."""
    length = scores.shape[0]
    i, j = np.triu_indices(length, k=min_separation)
    if i.size == 0:
        return set()
    order = np.argsort(-scores[i, j], kind="stable")[:length]
    return set(zip(i[order].tolist(), j[order].tolist()))


def top_l_precision(pred: np.ndarray, reference: np.ndarray) -> float:
    """Share of ``pred``'s top-L pairs that are among ``reference``'s top-L pairs (1 if there are none)."""
    truth, mine = top_l_pairs(reference), top_l_pairs(pred)
    return len(mine & truth) / len(mine) if mine else 1.0
