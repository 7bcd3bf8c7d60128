"""Progress inside one ESMFold fold: a log line at least every 30 s while its trunk runs, none for a short fold.

A fold is one forward call (a 48-block trunk on 150 residues takes minutes on one CPU thread), so the
per-sequence progress of ``fold`` says nothing meanwhile. The trunk's blocks are counted as they run (every
recycling pass runs them all) and :class:`~ptq_protein.support.progress.Ticker` turns the count into a line
with an ETA, rate-limited to :data:`~ptq_protein.support.progress.LINE_EVERY_S`.

Each block is counted by a forward hook on its sequence transition (``mlp_seq``), not on the block: the
int8 pair trunk (:mod:`ptq_protein.nn.pair_int8.trunk`) calls its own block function with the block's
modules, and ``mlp_seq`` is the one module both paths call exactly once per block.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator, Optional

from torch import nn

from ptq_protein.support.progress import LINE_EVERY_S, Ticker

__all__ = ["fold_progress", "trunk_passes"]


@contextlib.contextmanager
def fold_progress(model: nn.Module, desc: str, num_recycles: Optional[int] = None, show: bool = True,
                  interval: Optional[float] = None, clock: Callable[[], float] = time.perf_counter) -> Iterator[None]:
    """While the block runs, log ``desc: b/N trunk blocks (pass p/P), ... left`` at most every ``interval`` s.

    ``num_recycles`` as given to the fold (None: the model's); ``interval`` None: :data:`LINE_EVERY_S`. Nothing
    for a model without an ESMFold trunk, or when ``show`` is off. The hooks are removed on exit, whatever happens
    inside.
    """
    trunk = getattr(model, "trunk", None)
    blocks = list(getattr(trunk, "blocks", None) or [])
    if not show or not blocks or not all(hasattr(b, "mlp_seq") for b in blocks):
        yield
        return
    passes = trunk_passes(trunk, num_recycles)
    ticker = Ticker(desc, passes * len(blocks), "trunk blocks", LINE_EVERY_S if interval is None else interval, clock)
    done = [0]

    def count(*_) -> None:
        done[0] += 1
        ticker(done[0], f"pass {min(passes, (done[0] - 1) // len(blocks) + 1)}/{passes}")

    handles = [block.mlp_seq.register_forward_hook(count) for block in blocks]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def trunk_passes(trunk: nn.Module, num_recycles: Optional[int]) -> int:
    """Passes through the trunk's blocks, as transformers counts them: ``max_recycles`` when not given (that
    many passes), else the first pass plus ``num_recycles``."""
    return max(1, int(trunk.config.max_recycles) if num_recycles is None else num_recycles + 1)
