"""Will a batch fit? A memory estimate per embedding batch, and batches split until each fits.

The estimate of one forward over ``count`` sequences padded to ``T`` tokens, in
float32 bytes, for a model of width ``C``, ``H`` heads and ``N`` layers:

* transient activations of one layer: ``count x T x C x 16`` values (residual,
  q, k, v, attention output, the 4C-wide feed-forward in and out);
* attention scores of one layer: ``count x H x T x T x 4`` (scores, mask, softmax, probabilities);
* what the forward keeps: each requested layer's states and the logits (x3: the
  model's copy, the CPU copy, the per-sequence clones); with contacts every
  layer's attention maps, x7 (the per-layer maps, their stack, the masked,
  symmetrized and APC-corrected copies of the contact head).

The factors were measured (peak RSS rise of one forward, fair-esm 12 x 480 float32,
L = 50-1000, 2-80 sequences, with and without contacts): the estimate was 1.14-1.62x
the measured rise, never below it.

The budget is the process's (:func:`~ptq_protein.workflows.memory_budget.process_budget`):
``--max-memory``, else what the machine has available. A batch over it is split
in halves until each half fits; a single sequence that cannot fit is refused
before the first batch, in one line naming it (the others are embedded, as
``fold`` does).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ptq_protein.models.lm_outputs import LMInfo
from ptq_protein.support.errors import InputError

__all__ = ["batch_bytes", "fit_batches", "check_budget", "VOCAB"]

VOCAB = 33  # ESM tokens
_F32 = 4
_GIB = 2 ** 30


def batch_bytes(info: LMInfo, count: int, longest: int, kept_layers: int, contacts: bool, logits: bool) -> int:
    """Predicted peak bytes of one forward over ``count`` sequences of at most ``longest`` residues."""
    tokens = longest + 2
    states = count * tokens * info.embed_dim * _F32
    scores = count * info.heads * tokens * tokens * _F32
    need = 16 * states + 4 * scores + 3 * kept_layers * states
    if logits:
        need += 3 * count * tokens * VOCAB * _F32
    if contacts:
        need += 7 * info.num_layers * scores
    return int(need)


def fit_batches(batches: Sequence[List[int]], lengths: Sequence[int], labels: Sequence[str], info: LMInfo,
                budget: Optional[int], resident: int, *, kept_layers: int, contacts: bool,
                logits: bool) -> Tuple[List[List[int]], Dict[int, str]]:
    """``batches`` with each one over ``budget - resident`` bytes split in halves until it fits.

    ``budget`` None: no check. Returns the batches and, for each sequence that
    alone does not fit, its index -> a one-line reason (estimate and budget).
    """
    refused: Dict[int, str] = {}
    if budget is None:
        return [list(b) for b in batches], refused
    check_budget(budget, resident, "after loading the model")
    room = budget - resident

    def cost(batch: List[int]) -> int:
        return batch_bytes(info, len(batch), max(lengths[i] for i in batch), kept_layers, contacts, logits)

    out: List[List[int]] = []
    pending = [list(b) for b in reversed(batches)]
    while pending:
        batch = pending.pop()
        if cost(batch) <= room:
            out.append(batch)
        elif len(batch) == 1:
            i = batch[0]
            refused[i] = (f"{labels[i]}: {lengths[i]} residues need ~{cost(batch) / _GIB:.2f} GiB for one forward"
                          f"{' with contacts' if contacts else ''}, over the {max(room, 0) / _GIB:.2f} GiB left of "
                          f"the {budget / _GIB:.2f} GiB budget; raise --max-memory, lower "
                          "--truncation-seq-length, or leave contacts out")
        else:
            half = len(batch) // 2
            pending += [batch[half:], batch[:half]]
    return out, refused


def check_budget(budget: Optional[int], resident: int, when: str) -> None:
    """Refuse, in one line, a ``--max-memory`` that the process already holds (``when``: "before loading the
    model"; nothing could be embedded, so one line instead of one per sequence)."""
    if budget is not None and budget <= resident:
        raise InputError(f"--max-memory {_size(budget)} is below the {_size(resident)} this process holds "
                         f"{when}; raise it (e.g. --max-memory 8G), or leave it out to use what is available")


def _size(count: int) -> str:
    return f"{count / _GIB:.2f} GiB" if count >= _GIB // 100 else f"{count} bytes"
