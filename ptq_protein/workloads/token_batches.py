"""Batches by token budget over length-sorted sequences, so that little padding is computed.

fair-esm's ``FastaBatchedDataset.get_batch_indices`` sorts by length and fills a
batch while ``longest x count`` stays within ``toks_per_batch``; this does the
same (with BOS and EOS counted), and says how much padding the batches hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

__all__ = ["TokenBatches", "token_batches"]


@dataclass(frozen=True)
class TokenBatches:
    """``batches``: lists of indices into the input, each sorted by length; token counts of the plan."""

    batches: List[List[int]]
    tokens: int  # tokens the batches compute, padding included
    real_tokens: int  # tokens that hold a residue, BOS or EOS

    @property
    def padding_share(self) -> float:
        """Share of the computed tokens that are padding (0 when nothing is computed)."""
        return 0.0 if not self.tokens else 1.0 - self.real_tokens / self.tokens


def token_batches(lengths: Sequence[int], toks_per_batch: int, extra_tokens: int = 2) -> TokenBatches:
    """Group indices of ``lengths`` (residues) into batches of at most ``toks_per_batch`` tokens.

    A batch costs ``(longest + extra_tokens) x count`` tokens (padded to its longest);
    a sequence longer than the budget gets a batch of its own. Shortest first.

    >>> token_batches([5, 3, 4, 30], 20).batches
    [[1, 2], [0], [3]]
    """
    if isinstance(toks_per_batch, bool) or not isinstance(toks_per_batch, int) or toks_per_batch < 1:
        raise ValueError(f"toks_per_batch={toks_per_batch!r} must be a positive integer (e.g. --toks-per-batch 4096)")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: List[List[int]] = []
    current: List[int] = []
    longest = 0
    for i in order:
        size = lengths[i] + extra_tokens
        if current and max(size, longest) * (len(current) + 1) > toks_per_batch:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    computed = sum((max(lengths[i] for i in b) + extra_tokens) * len(b) for b in batches)
    real = sum(lengths[i] + extra_tokens for b in batches for i in b)
    return TokenBatches(batches, computed, real)
