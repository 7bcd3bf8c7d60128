"""Which sequences this process embeds: ``--shard K/N`` for job arrays, or torchrun's rank with no flag.

The shares interleave over the length-sorted order (every N-th sequence), so
each shard gets about the same number of residues and the same mix of lengths.
Nothing here needs a process group: the shards share no state but the output folder.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ptq_protein.support.errors import InputError

__all__ = ["Shard", "parse_shard", "shard_from_env", "choose_shard", "rank_device"]

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int = 1
    count: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.index <= self.count:
            raise InputError(f"--shard {self.index}/{self.count}: K must be between 1 and N (e.g. --shard 1/4)")

    @property
    def tag(self) -> str:
        return f"{self.index}-of-{self.count}"

    def select(self, lengths: Sequence[int]) -> List[int]:
        """Indices of this shard's sequences: every ``count``-th one in length order, from the ``index``-th."""
        order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
        return sorted(order[self.index - 1::self.count])


def parse_shard(text: str) -> Shard:
    """``"K/N"`` -> :class:`Shard`; anything else is one line naming the form."""
    match = _SHARD.match(text or "")
    if not match:
        raise InputError(f"--shard {text!r} is not K/N; write e.g. --shard 3/8 for the third of eight jobs")
    return Shard(int(match.group(1)), int(match.group(2)))


def shard_from_env() -> Optional[Shard]:
    """The shard of a process torchrun started as one of several (``RANK``/``WORLD_SIZE``), else None."""
    world = os.environ.get("WORLD_SIZE")
    if world is None:
        return None
    try:
        count, rank = int(world), int(os.environ.get("RANK", "0"))
    except ValueError as err:
        raise InputError(f"WORLD_SIZE={world!r} / RANK={os.environ.get('RANK')!r} are not numbers; launch with "
                         "torchrun, or unset them and use --shard K/N") from err
    if count > 1 and not 0 <= rank < count:
        raise InputError(f"RANK={rank} with WORLD_SIZE={count}: a rank counts from 0 to WORLD_SIZE-1; launch with "
                         "torchrun, or unset them and use --shard K/N")
    return None if count <= 1 else Shard(rank + 1, count)


def choose_shard(flag: Optional[str]) -> Shard:
    """``--shard`` when given, else torchrun's rank, else the whole input; both at once is refused."""
    from_env = shard_from_env()
    if flag is not None and from_env is not None:
        raise InputError(f"--shard {flag} was given under torchrun (rank {from_env.index - 1} of {from_env.count}), "
                         "which shares the work by itself; drop --shard, or run without torchrun")
    return parse_shard(flag) if flag is not None else (from_env or Shard())


def rank_device(device: str) -> str:
    """``cuda`` -> ``cuda:LOCAL_RANK`` in a process torchrun started as one of several (one GPU each)."""
    if device != "cuda" or shard_from_env() is None:
        return device
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
