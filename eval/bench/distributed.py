"""Evaluation across processes: ``torchrun --nproc-per-node N ptq-protein eval ...``.

Why torch.distributed: it is the launcher users of several GPUs already have;
``torchrun`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and a rendezvous, and
:func:`process_group` joins it (gloo on CPU, nccl on CUDA, each rank pinned to
``cuda:LOCAL_RANK``). Nothing here runs, and nothing changes, in a single process.

How the work is shared (:func:`ptq_protein.eval.bench.runner.run_recipes`):
every rank reads the results table, then all agree (barrier) before anyone
writes, so all hold the same list of pending ``(recipe, target)`` pairs. The
``fp`` rows are shared first (the quantized rows are scored against them), a
barrier, then the quantized pairs in recipe-major order, one contiguous block
per rank (so a rank quantizes few recipes, each once). Rows go to the one
``results.csv`` through :class:`~ptq_protein.eval.bench.results_store.ResultsStore`,
whose per-row file lock keeps every writer's rows; rank 0 alone holds the
folder, checks ``run.json`` and writes the summary after the last barrier.
Rows are keyed by target x recipe, never by rank, so a run resumes with any N.

A rank that dies (killed, out of memory) ends the run: torchrun stops the
others; rerunning the command (with any N) computes only the missing rows.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, TypeVar

from ptq_protein.support.errors import InputError

__all__ = ["Ranks", "SINGLE", "launched_with_ranks", "process_group"]

T = TypeVar("T")

# A rank may wait at a barrier while the others fold their share of a large set
# (hours for ESMFold on CPU). A dead rank is caught by torchrun, not by this timeout.
_BARRIER_TIMEOUT = datetime.timedelta(hours=24)


@dataclass(frozen=True)
class Ranks:
    """This process's place among the evaluation processes (``world_size == 1``: a plain run)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    def __post_init__(self) -> None:
        if not (self.world_size >= 1 and 0 <= self.rank < self.world_size and self.local_rank >= 0):
            raise ValueError(f"rank {self.rank} / world size {self.world_size} / local rank {self.local_rank} "
                             "is not a valid placement")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def shared(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.shared:
            import torch.distributed as dist

            dist.barrier()

    def gather(self, obj: Any) -> List[Any]:
        """``obj`` of every rank, in rank order (``[obj]`` in a single process)."""
        if not self.shared:
            return [obj]
        import torch.distributed as dist

        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def share(self, items: Sequence[T]) -> List[T]:
        """This rank's contiguous block of ``items`` (sizes differ by at most one; earlier ranks get the extra)."""
        base, extra = divmod(len(items), self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return list(items[start:start + base + (self.rank < extra)])

    def agree(self, error: Optional[Exception]) -> None:
        """Raise on every rank when any rank failed (its own error, else the first rank's message as InputError).

        Collective: every rank must call it, so one rank's refusal (a busy folder,
        a different run in ``run.json``) ends all of them with the same line.
        """
        messages = self.gather(None if error is None else str(error))
        if error is not None:
            raise error
        failed = [(r, m) for r, m in enumerate(messages) if m is not None]
        if failed:
            rank, message = failed[0]
            raise InputError(f"rank {rank} stopped the run: {message}")

    def device(self, device: str) -> str:
        """``cuda`` -> ``cuda:LOCAL_RANK`` for a shared run (one GPU per rank); anything else unchanged."""
        return f"cuda:{self.local_rank}" if self.shared and device == "cuda" else device


SINGLE = Ranks()


def launched_with_ranks() -> bool:
    """True when a launcher (torchrun) started this process as one of several (``WORLD_SIZE`` > 1)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError as e:
        raise InputError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number; launch with torchrun") from e


@contextlib.contextmanager
def process_group(device: str) -> Iterator[Ranks]:
    """Join torchrun's process group for the block (destroyed after it); :data:`SINGLE` when not launched by it.

    ``device`` (``cpu`` or ``cuda``) picks the backend: gloo on CPU, nccl on
    CUDA, where each rank is pinned to ``cuda:LOCAL_RANK`` first.
    """
    if not launched_with_ranks():
        yield SINGLE
        return
    import torch
    import torch.distributed as dist

    cuda = str(device).startswith("cuda")
    local_rank = dist.get_node_local_rank(fallback_rank=0)
    if cuda:
        if local_rank >= torch.cuda.device_count():
            raise InputError(f"LOCAL_RANK {local_rank} has no GPU ({torch.cuda.device_count()} visible); "
                             "use --nproc-per-node <= the number of GPUs")
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=_BARRIER_TIMEOUT)
    finished = False
    try:
        yield Ranks(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank)
        finished = True
    finally:
        if finished:  # leave together: no rank tears its group down while a peer still uses the connection
            dist.barrier()
        dist.destroy_process_group()
