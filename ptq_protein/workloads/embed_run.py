"""A whole ``embed`` run over a FASTA: check everything, then embed what is not yet written.

Two phases, so that bad input costs nothing: :meth:`EmbedRun.__init__` checks
the options, the FASTA and the output folder before any model is loaded;
:meth:`EmbedRun.run` binds the model's identity to the folder (a rerun with
another model is refused there), plans this shard's batches under the memory
budget and writes them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from torch import nn

from ptq_protein import __version__
from ptq_protein.data.fasta import ESM_AMINO_ACIDS, read_fasta_records
from ptq_protein.models.lm_outputs import lm_info, normalize_layers
from ptq_protein.support.errors import InputError
from ptq_protein.workflows.memory_budget import process_budget, resident_bytes
from ptq_protein.workloads.embed import EmbedOptions, EmbedStats, embed_all
from ptq_protein.workloads.embed_memory import fit_batches
from ptq_protein.workloads.embed_seal import label_stem
from ptq_protein.workloads.embed_store import EmbedFolder, records_digest
from ptq_protein.workloads.shards import Shard
from ptq_protein.workloads.token_batches import token_batches

__all__ = ["EmbedRun", "EmbedReport", "fasta_labels"]

log = logging.getLogger(__name__)


def fasta_labels(path, duplicates: str = "error", changes: Optional[Dict[str, str]] = None) -> List[Tuple[str, str]]:
    """(label, sequence) of every record; the label is the whole header, as fair-esm's ``FastaBatchedDataset``
    (stripped at both ends; a tab or two spaces inside are kept).

    Letters outside the ESM alphabet, duplicate ids (both named; ``duplicates="rename"``
    names the k-th repeat ``<id>#k`` instead) and an empty file are refused in one
    line naming the file. ``changes``, if given, is filled with label -> what reading changed in that sequence
    (lower case read as upper case, a terminal ``*`` dropped).
    """
    found: Dict[str, str] = {}
    records = read_fasta_records(Path(path), alphabet=ESM_AMINO_ACIDS, duplicates=duplicates, changes=found)
    if not records:
        raise ValueError(f"{path} holds no FASTA records; give a file with '>id' headers and sequences")
    labels = [(r.header or r.id, r.sequence) for r in records]
    if changes is not None:
        changes.update({label: found[r.id] for (label, _), r in zip(labels, records) if r.id in found})
    return labels


@dataclass
class EmbedReport:
    """What a run did: computed (stats), skipped (already written), refused (too large), where it wrote."""

    stats: EmbedStats
    skipped: int
    refused: Dict[str, str] = field(default_factory=dict)
    files: Optional[Path] = None


class EmbedRun:
    """One shard of an embed run into ``out_dir``; construction checks all that can be checked without the model.

    ``run_options``: what else changes the outputs (backend, dtype), recorded with the
    options; ``model_hint``: the part of the model's identity known before loading it.
    """

    def __init__(self, records: Sequence[Tuple[str, str]], out_dir, options: EmbedOptions,
                 shard: Optional[Shard] = None, run_options: Optional[Mapping[str, Any]] = None,
                 model_hint: Optional[Mapping[str, Any]] = None):
        self.records, self.options, self.shard = list(records), options, shard or Shard()
        # what else changes outputs (the backend, the dtype): recorded with the options
        identity = {"tool": "ptq-protein embed", "format_version": 1, "fasta_sha256": records_digest(self.records),
                    "options": {**options.to_dict(), **dict(run_options or {})}}
        _check_stems([label for label, _ in self.records])
        self.folder = EmbedFolder(Path(out_dir), identity, options.format, self.shard)
        self.folder.check(model_hint)  # holds this shard of the folder until run() ends

    def run(self, model: nn.Module, model_identity: Mapping[str, Any], max_memory: Optional[int] = None,
            show_progress: bool = False) -> EmbedReport:
        try:
            return self._run(model, model_identity, max_memory, show_progress)
        finally:
            self.folder.release()

    def _run(self, model: nn.Module, model_identity: Mapping[str, Any], max_memory: Optional[int],
             show_progress: bool) -> EmbedReport:
        info = lm_info(model)
        layers = normalize_layers(self.options.repr_layers, info.last_layer, info.layer_words)  # refused now
        budget = process_budget(max_memory)  # validated before anything is written
        numbering = {"repr_layers": info.layer_words} if info.family == "esmc" else {}  # see docs/esmc.md, Layers
        written = self.folder.bind({**model_identity, **numbering, "ptq_protein": __version__.split("+")[0]})
        cut = self.options.truncation_seq_length
        records = [(label, seq[:cut]) for label, seq in self.records]
        mine = self.shard.select([len(seq) for _, seq in records])
        todo = [i for i in mine if not self.folder.is_written(records[i][0], written)]
        skipped = len(mine) - len(todo)
        if skipped:
            log.info("%d of this run's %d sequences are already in %s: embedding the other %d", skipped, len(mine),
                     self.folder.out_dir, len(todo))
        subset = [records[i] for i in todo]
        lengths = [len(seq) for _, seq in subset]
        plan = token_batches(lengths, self.options.toks_per_batch)
        kept = len(layers)
        batches, too_big = fit_batches(plan.batches, lengths, [label for label, _ in subset], info, budget,
                                       resident_bytes(), kept_layers=kept if self.options.wants_representations else 0,
                                       contacts="contacts" in self.options.include,
                                       logits="logits" in self.options.include)
        stats = embed_all(model, subset, batches, self.options, self.folder.write, show_progress=show_progress)
        files = self.folder.finish()
        return EmbedReport(stats, skipped, {subset[i][0]: reason for i, reason in too_big.items()}, files)


def _check_stems(labels: Sequence[str]) -> None:
    """Refuse two labels whose files would be one (a digest collision of :func:`label_stem`), naming both."""
    seen: Dict[str, str] = {}
    for label in labels:
        other = seen.setdefault(label_stem(label), label)
        if other != label:
            raise InputError(f"ids {other!r} and {label!r} would be written to one file ({label_stem(label)}); "
                             "rename one of them in the FASTA")
