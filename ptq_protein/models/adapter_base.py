"""What every model adapter answers (:class:`ModelAdapter`) and the batch it builds (:class:`Batch`); the
families' adapters are in :mod:`ptq_protein.models.adapters`."""

from __future__ import annotations

import contextlib
import fnmatch
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

__all__ = ["Batch", "ModelAdapter", "ESM_ALPHABET_LETTERS", "ESM2_MAX_RESIDUES"]

# ESM-2 / ESM-1b positional limit: 1024 positions including BOS and EOS.
ESM2_MAX_RESIDUES = 1022
# Residue letters the ESM alphabet knows (20 standard + X, B, U, Z, O).
ESM_ALPHABET_LETTERS = "ACDEFGHIKLMNPQRSTVWYXBUZO"


@dataclass
class Batch:
    """One calibration/evaluation batch.

    ``token_mask`` [B, T]: True at language-model positions that hold a residue
    (False at BOS/EOS/CLS/padding). ``residue_mask`` [B, L]: True at real
    residues of residue-indexed tensors (ESMFold's trunk; equals token_mask
    without the BOS/EOS columns). ``special_mask`` [B, T]: True at the BOS/EOS
    (CLS/EOS) positions the LM computes (never at padding).
    """

    inputs: dict
    token_mask: torch.Tensor
    residue_mask: torch.Tensor
    sequences: Tuple[str, ...]
    special_mask: Optional[torch.Tensor] = None


class ModelAdapter:
    """Base adapter; subclasses fill in the family-specific parts."""

    family: str = "unknown"
    groups: Tuple[str, ...] = ("esm",)
    head_globs: Tuple[str, ...] = ()
    max_residues: Optional[int] = ESM2_MAX_RESIDUES
    layout: str = "BT"  # layout of the LM's hidden states: "BT" (batch first) or "TB"
    # (LayerNorm, Linears reading only its output), relative to their common parent module: the
    # pairs SmoothQuant may fold smoothing factors into. A pair that is wrong here breaks the float
    # model's equivalence, which tests/transforms/test_smoothquant.py checks on every family.
    norm_linear_pairs: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    # (module that can rotate its output online, the Linear reading only that output), relative to their common
    # parent: where a Hadamard rotation may go (the module has a ``rotation`` block size; ESM C's SwiGLU). Empty:
    # the family has no module of ours before such a Linear (fair-esm / transformers classes), so no rotation.
    rotation_pairs: Tuple[Tuple[str, str], ...] = ()
    # Calibration batch size when the caller gives none (``batch_size=None``).
    calibration_batch: int = 4

    def __init__(self, model: nn.Module):
        self.model = model

    # -- sites -----------------------------------------------------------------------
    def group_of(self, name: str) -> str:
        return self.groups[0]

    def is_head(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, g) or name.startswith(g.rstrip("*")) for g in self.head_globs)

    def prepare(self, model: nn.Module) -> None:
        """Make every quantization site visible as a module call (e.g. disable fused fast paths)."""

    @contextlib.contextmanager
    def calibration_mode(self, model: nn.Module) -> Iterator[None]:
        """Settings that keep activation shapes whole during calibration (no chunking)."""
        yield

    def calibrates_as_it_runs(self, model: nn.Module) -> bool:
        """True when :meth:`calibration_mode` leaves ``model``'s activations exactly as its own forward makes them."""
        return True

    def smoothing_pairs(self, model: nn.Module) -> List[Tuple[str, Tuple[str, ...]]]:
        """``[(layernorm name, (linear names, ...))]`` of ``model``, in module order."""
        modules = dict(model.named_modules())
        pairs = []
        for name in modules:
            for norm, linears in self.norm_linear_pairs:
                if name != norm and not name.endswith("." + norm):
                    continue
                parent = name[:len(name) - len(norm)]
                names = tuple(parent + lin for lin in linears)
                if all(isinstance(modules.get(n), nn.Linear) for n in names):
                    pairs.append((name, names))
        return pairs

    def rotation_sites(self, model: nn.Module) -> List[Tuple[str, str]]:
        """``[(rotating module name, Linear name)]`` of ``model`` (see :attr:`rotation_pairs`), in module order."""
        modules = dict(model.named_modules())
        found = []
        for name, module in modules.items():
            for op, linear in self.rotation_pairs:
                if name == op or name.endswith("." + op):
                    target = name[:len(name) - len(op)] + linear
                    if hasattr(module, "rotation") and isinstance(modules.get(target), nn.Linear):
                        found.append((name, target))
        return found

    def forward_for_sites(self, model: nn.Module, batch: Batch, sites: Sequence[Any], **kwargs: Any) -> Any:
        """A forward that calls every one of ``sites`` (objects with a ``name``) as :meth:`forward` does.

        Calibration reads only its sites' inputs: a family whose sites of some group all run before anything
        that group does not reach (ESMFold's ESM-2 stem) runs that part alone. Here: the whole forward.
        """
        return self.forward(model, batch, **kwargs)

    # -- inputs ----------------------------------------------------------------------
    def validate(self, sequences: Sequence[str], where: str = "calibration") -> List[str]:
        from ptq_protein.data.fasta import validate_sequence

        return [validate_sequence(s, alphabet=ESM_ALPHABET_LETTERS, max_length=self.max_residues,
                                  where=f"{where} sequence {i + 1}") for i, s in enumerate(sequences)]

    def batch_size(self, batch_size: Optional[int] = None) -> int:
        """``batch_size``, or this family's :attr:`calibration_batch` when None."""
        if batch_size is None:
            return self.calibration_batch
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive integer (--batch-size N, N >= 1)")
        return batch_size

    def batches(self, sequences: Sequence[str], batch_size: Optional[int] = None) -> Iterator[Batch]:
        """Length-sorted batches, so padding is small; batch size never equals a sequence axis.

        One sequence a batch has no padding to save: the given order is kept, so a
        batch-1 pass sees the sequences as the study's own pass does (order-dependent
        observers, such as the study's first calls, then agree with it).
        """
        batch_size = self.batch_size(batch_size)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i])) if batch_size > 1 \
            else range(len(sequences))
        start = 0
        while start < len(order):
            chunk = [sequences[i] for i in order[start:start + batch_size]]
            longest = max(len(s) for s in chunk)
            # B == T or B == L would make activation layouts ambiguous for mask alignment.
            while len(chunk) > 1 and len(chunk) in (longest, longest + 2):
                chunk = chunk[:-1]
            start += len(chunk)
            yield self.make_batch(chunk)

    def make_batch(self, sequences: Sequence[str]) -> Batch:
        raise NotImplementedError

    def forward(self, model: nn.Module, batch: Batch) -> Any:
        raise NotImplementedError

    # -- special tokens ----------------------------------------------------------------
    def token_ids_tap(self, model: nn.Module) -> Optional[Tuple[str, Tuple[int, ...], int]]:
        """``(name of the LM's token-embedding module, BOS/EOS ids, padding id)``, or None.

        Every LM forward passes its token ids through that module, so a hook there
        learns which positions of the call are BOS/EOS (see ``nn/special_tokens``).
        """
        return None
