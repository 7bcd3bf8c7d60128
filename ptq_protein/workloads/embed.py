"""Embeddings of many sequences, as fair-esm's ``scripts/extract.py`` writes them.

Per sequence, a dict with the keys ``extract.py`` writes and downstream code reads:
``label``; ``representations`` {layer: [L, C]} (``per_tok``: rows 1..L, the
residues); ``mean_representations`` {layer: [C]} (``mean``: the mean over the
residues); ``bos_representations`` {layer: [C]} (``bos``: row 0); ``contacts``
[L, L]; and, beyond ``extract.py``, ``logits`` [L, V] (the residues' rows over the
33-token vocabulary). ``L`` is the sequence's length after truncation to
``truncation_seq_length``, as ``extract.py`` truncates. Tensors are float32.

The batches follow a token budget over length-sorted sequences
(:mod:`~ptq_protein.workloads.token_batches`), so little padding is computed;
where a batch would not fit the memory budget it is split
(:mod:`~ptq_protein.workloads.embed_memory`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

import torch
from torch import nn

from ptq_protein.models.lm_outputs import LMOutputs, lm_forward, lm_info, lm_tokens, normalize_layers
from ptq_protein.support.progress import progress
from ptq_protein.workloads.embed_options import INCLUDE_CHOICES, EmbedOptions

__all__ = ["INCLUDE_CHOICES", "EmbedOptions", "EmbedStats", "embed_batch", "sequence_result", "embed_all"]

log = logging.getLogger(__name__)

@dataclass
class EmbedStats:
    """What a run computed: sequences, residues and tokens (padding included), and seconds."""

    sequences: int = 0
    residues: int = 0
    tokens: int = 0
    real_tokens: int = 0
    seconds: float = 0.0

    @property
    def padding_share(self) -> float:
        return 0.0 if not self.tokens else 1.0 - self.real_tokens / self.tokens

    @property
    def residues_per_second(self) -> float:
        return self.residues / self.seconds if self.seconds > 0 else 0.0


def sequence_result(label: str, length: int, row: int, out: LMOutputs, include: Sequence[str]) -> Dict[str, object]:
    """``extract.py``'s dict for the ``row``-th sequence of a batch, ``length`` residues after truncation."""
    result: Dict[str, object] = {"label": label}
    reps = out.representations
    if "per_tok" in include:
        result["representations"] = {k: t[row, 1:length + 1].clone() for k, t in reps.items()}
    if "mean" in include:
        result["mean_representations"] = {k: t[row, 1:length + 1].mean(0).clone() for k, t in reps.items()}
    if "bos" in include:
        result["bos_representations"] = {k: t[row, 0].clone() for k, t in reps.items()}
    if "contacts" in include:
        result["contacts"] = out.contacts[row, :length, :length].clone()
    if "logits" in include:
        result["logits"] = out.logits[row, 1:length + 1].clone()
    return result


def embed_batch(model: nn.Module, records: Sequence[Tuple[str, str]], layers: Sequence[int],
                options: EmbedOptions) -> List[Dict[str, object]]:
    """One forward over ``records`` (label, sequence already truncated); one result dict each."""
    tokens = lm_tokens([seq for _, seq in records])
    out = lm_forward(model, tokens, layers if options.wants_representations else (),
                     contacts="contacts" in options.include, logits="logits" in options.include)
    return [sequence_result(label, len(seq), i, out, options.include) for i, (label, seq) in enumerate(records)]


def embed_all(model: nn.Module, records: Sequence[Tuple[str, str]], batches: Sequence[List[int]],
              options: EmbedOptions, write: Callable[[List[Dict[str, object]]], None],
              show_progress: bool = False) -> EmbedStats:
    """Embed ``records`` batch by batch (``batches``: lists of indices into it); ``write`` gets each batch's dicts.

    ``records`` hold sequences already truncated. Progress counts residues (rate and ETA).
    Returns what was computed.
    """
    info = lm_info(model)
    if "logits" in options.include and not info.has_lm_head:
        raise ValueError(f"{type(model).__name__} has no LM head, so it has no logits; leave 'logits' out of "
                         "--include, or use a model with its head (EsmForMaskedLM)")
    if "contacts" in options.include and not info.has_contact_head:
        raise ValueError(f"{type(model).__name__} has no contact head; leave 'contacts' out of --include")
    layers = normalize_layers(options.repr_layers, info.last_layer, info.layer_words)
    stats = EmbedStats()
    start = time.perf_counter()
    residues = [sum(len(records[i][1]) for i in batch) for batch in batches]
    for batch in progress(batches, "embedding", "batches", show=show_progress, weights=residues,
                          weight_unit="residues"):
        chunk = [records[i] for i in batch]
        with torch.inference_mode():
            write(embed_batch(model, chunk, layers, options))
        longest = max(len(seq) for _, seq in chunk)
        stats.sequences += len(chunk)
        stats.residues += sum(len(seq) for _, seq in chunk)
        stats.tokens += (longest + 2) * len(chunk)
        stats.real_tokens += sum(len(seq) + 2 for _, seq in chunk)
    stats.seconds = time.perf_counter() - start
    return stats
