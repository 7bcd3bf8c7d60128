"""TMscore's superposition search, vectorised over seeds and over pairs (torch).

For each pair of paired CA traces (``n`` pairs in common, native length ``L``)
the TMscore program (Zhang & Skolnick 2004, TMscore.f) does:

1. seed fragments of ``n, n/2, n/4, ...`` consecutive common pairs (integer
   division, at most 6 lengths, the last one 4), each slid over every start;
2. superpose on the seed (Kabsch), score, and keep the pairs closer than
   ``d0_search - 1`` (the cut grows by 0.5 Å until it holds 3 pairs);
3. up to 20 times: superpose on the kept pairs, score, keep those closer than
   ``d0_search + 1``, stop when the kept set no longer changes;
4. report the maximum TM-score and, separately, the maximum GDT counts over
   every superposition visited.

Here every seed of every pair is a row of one batch ("state") and all states
step together. A fit needs only sums of per-pair moments (1, x, y, x y^T) over
the kept set, one batched product of the 0/1 masks with a moment table (or
prefix sums for the seeds); the rotation is Horn's quaternion (batched 4x4
``eigh``); all distances after the fit come from one more product, with
``|Rx + t - y|^2`` expanded on a per-pair basis. A kept set that another state
of the same pair already reached, at this step or an earlier one, has the
same future with no more iterations left, so it is dropped; so is a state
whose set stopped changing (its further superpositions would repeat). Both
are exact, and cut the work several-fold. Golden tests show agreement with
the program to its printed precision.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch

from ptq_protein.eval.superpose import rotation_from_covariance, superposition_rmsd

__all__ = ["SearchOutput", "tm_search", "d0_from_length", "seed_lengths"]

D0_MIN = 0.5  # TM-score: d0 floor (TMscore.f)
D0_SEARCH_MIN, D0_SEARCH_MAX = 4.5, 8.0  # TMscore.f: clip of d0 for the cut distance
MAX_ITERATIONS = 20  # TMscore.f n_it
MAX_SEED_LENGTHS = 6  # TMscore.f n_init_max
MIN_SEED_LENGTH = 4  # TMscore.f L_ini_min
CUT_GROWTH = 0.5  # Å added to the cut until it holds MIN_KEPT pairs (TMscore.f score_fun)
MIN_KEPT = 3
GDT_CUTOFFS = (0.5, 1.0, 2.0, 4.0, 8.0)  # Å, "d <= cutoff" as in TMscore.f
_FAR_SQ = 1e30  # squared distance given to padding rows
DEFAULT_CHUNK_ELEMENTS = 500_000  # states x padded length per step on CPU (stays in cache)
CUDA_CHUNK_ELEMENTS = 32_000_000
# The search's tensors are small (~1e5-1e6 elements): intra-op threads gain
# little and, on oversubscribed cores, made it 5x slower in our measurements.
CPU_THREADS = 1


@dataclass(frozen=True)
class SearchOutput:
    """Per-pair results of :func:`tm_search` (tensors on the input device)."""

    tm_score: torch.Tensor  # [B]
    gdt_counts: torch.Tensor  # [B, 5] max number of pairs within GDT_CUTOFFS
    rmsd: torch.Tensor  # [B] RMSD of all common pairs after their optimal superposition


def d0_from_length(length: int) -> float:
    """TM-score's distance scale: ``1.24 (L - 15)^(1/3) - 1.8``, floored at 0.5 Å (L <= 15 gives 0.5)."""
    if length <= 15:
        return D0_MIN
    return max(D0_MIN, 1.24 * (length - 15) ** (1.0 / 3.0) - 1.8)


def seed_lengths(n_common: int) -> list:
    """Seed fragment lengths TMscore tries for ``n_common`` pairs: n, n/2, n/4, ... down to 4."""
    floor = min(MIN_SEED_LENGTH, n_common)
    lengths = []
    for k in range(MAX_SEED_LENGTHS - 1):
        value = n_common // 2 ** k
        if value <= floor:
            lengths.append(floor)
            return lengths
        lengths.append(value)
    lengths.append(floor)
    return lengths


def tm_search(x: torch.Tensor, y: torch.Tensor, n_common: torch.Tensor, lengths: torch.Tensor,
              chunk_elements: int = 0, cpu_threads: Optional[int] = CPU_THREADS) -> SearchOutput:
    """Best TM-score superposition of each pair of paired coordinate sets.

    Parameters
    ----------
    x, y : torch.Tensor [B, N, 3]
        Model and native coordinates; pair ``b`` uses rows ``0 .. n_common[b] - 1``
        (paired row by row, in chain order); further rows are padding.
    n_common : torch.Tensor [B] int
        Number of common pairs of each pair, at least 1.
    lengths : torch.Tensor [B] int
        Normalisation length (the native length) of each pair.
    chunk_elements : int
        Bound on states x N evaluated at once (memory); 0 picks a default for the device.
    cpu_threads : int or None
        torch intra-op threads while searching on CPU (restored afterwards);
        None leaves torch's setting.

    Returns
    -------
    SearchOutput
    """
    if x.shape != y.shape or x.dim() != 3 or x.shape[-1] != 3:
        raise ValueError(f"x and y must be [B, N, 3], got {tuple(x.shape)} and {tuple(y.shape)}")
    n_list = [int(v) for v in n_common.tolist()]
    budget = chunk_elements or (CUDA_CHUNK_ELEMENTS if x.is_cuda else DEFAULT_CHUNK_ELEMENTS)
    tm = torch.zeros(len(n_list), dtype=x.dtype, device=x.device)
    counts = torch.zeros(len(n_list), len(GDT_CUTOFFS), dtype=torch.long, device=x.device)
    with _threads(cpu_threads if x.device.type == "cpu" else None), torch.no_grad():
        for chunk in _chunks(n_list, budget):
            width = max(n_list[b] for b in chunk)
            index = torch.as_tensor(chunk, device=x.device)
            tm_c, counts_c = _search_chunk(x[index, :width], y[index, :width], [n_list[b] for b in chunk],
                                           lengths.to(x.device)[index], budget)
            tm[index], counts[index] = tm_c, counts_c
        valid = torch.arange(x.shape[1], device=x.device)[None, :] < n_common.to(x.device)[:, None]
        rmsd = superposition_rmsd(x, y, valid.to(x.dtype))
    return SearchOutput(tm_score=tm, gdt_counts=counts, rmsd=rmsd)


@contextlib.contextmanager
def _threads(limit: Optional[int]) -> Iterator[None]:
    """Cap torch's intra-op threads for the duration (restored even on error)."""
    before = torch.get_num_threads()
    if limit is not None and 0 < limit < before:
        torch.set_num_threads(limit)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _chunks(n_list: list, budget: int) -> list:
    """Group pairs (longest first) so that initial states x width stays near ``budget``."""
    order = sorted(range(len(n_list)), key=lambda b: -n_list[b])
    chunks, current, width, states = [], [], 0, 0
    for b in order:
        n_states = sum(n_list[b] - s + 1 for s in seed_lengths(n_list[b]))
        new_width = max(width, n_list[b])
        if current and (states + n_states) * new_width > budget:
            chunks.append(current)
            current, width, states = [], 0, 0
            new_width = n_list[b]
        current.append(b)
        width, states = new_width, states + n_states
    if current:
        chunks.append(current)
    return chunks


def _search_chunk(x: torch.Tensor, y: torch.Tensor, n_list: list, lengths: torch.Tensor, budget: int) -> tuple:
    """Best TM-score and GDT counts [B], [B, 5] of one chunk of pairs (rows beyond n_common are padding).

    Each step's states are processed in blocks of about ``budget / N`` rows, so
    memory stays bounded (and in cache) whatever the chain length.
    """
    feats = _Features.build(x, y, n_list, lengths)
    best_tm = torch.full((len(n_list),), -1.0, dtype=x.dtype, device=x.device)
    best_counts = torch.full((len(n_list), len(GDT_CUTOFFS)), -1, dtype=torch.long, device=x.device)
    pair, mask, sums = _seed_states(feats, n_list)
    block = max(1, budget // x.shape[1])
    seen: set = set()
    for step in range(MAX_ITERATIONS + 1):
        last = step == MAX_ITERATIONS
        cut_base = feats.d0_search + (1.0 if step else -1.0)
        new_masks = []
        for lo in range(0, pair.numel(), block):
            part = slice(lo, lo + block)
            new_masks.append(_evaluate(feats, pair[part], mask[part], None if sums is None else sums[part],
                                       best_tm, best_counts, None if last else cut_base))
        if last:
            break
        new_mask = torch.cat(new_masks)
        keep = torch.ones_like(pair, dtype=torch.bool) if step == 0 else (new_mask != mask).any(-1)
        pair, mask = _new_states(pair[keep], new_mask[keep], seen)
        sums = None
        if pair.numel() == 0:
            break
    return best_tm, best_counts


def _evaluate(feats: "_Features", pair: torch.Tensor, mask: torch.Tensor, sums: Optional[torch.Tensor],
              best_tm: torch.Tensor, best_counts: torch.Tensor,
              cut_base: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Fit, score and cut one block of states (sorted by pair); returns the next kept sets [S, N]."""
    slot, alive = _slots(pair, feats.moments.shape[0])
    dtype, device = feats.moments.dtype, feats.moments.device
    if sums is None:  # sums of the kept pairs' moments: one batched product
        weights = torch.zeros(alive.shape + (mask.shape[1],), dtype=dtype, device=device)
        weights[pair, slot] = mask.to(dtype)
        padded_sums = weights @ feats.moments
    else:
        padded_sums = torch.zeros(alive.shape + (sums.shape[-1],), dtype=dtype, device=device)
        padded_sums[pair, slot] = sums
    dist_sq = _fit_coefficients(padded_sums) @ feats.basis  # [B, M, N]; padding rows come out huge
    _update_best(best_tm, best_counts, dist_sq, alive, feats)
    if cut_base is None:
        return None
    return _cut(dist_sq[pair, slot], cut_base[pair], feats.n_common[pair])


@dataclass(frozen=True)
class _Features:
    """Per-pair tensors that turn fits and distances into batched products.

    ``moments`` [B, N, 16] = (1, x, y, x_a y_b): a 0/1 weight row times it gives
    every sum a Kabsch fit needs; ``prefix`` is its running sum (fits on
    consecutive fragments). ``basis`` [B, 17, N] is such that
    ``|R x_n + t - y_n|^2 = coefficients(R, t) . basis[:, :, n]``. Coordinates
    are centred on each pair's common residues (the scores are translation
    invariant) to keep the expanded squares small; padding rows get a huge
    ``|x|^2`` so that their distances never count.
    """

    moments: torch.Tensor
    prefix: torch.Tensor
    basis: torch.Tensor
    n_common: torch.Tensor  # [B]
    inv_d0_sq: torch.Tensor  # [B]
    d0_search: torch.Tensor  # [B]
    inv_length: torch.Tensor  # [B]

    @classmethod
    def build(cls, x: torch.Tensor, y: torch.Tensor, n_list: list, lengths: torch.Tensor) -> "_Features":
        device, dtype = x.device, x.dtype
        n_common = torch.as_tensor(n_list, device=device)
        valid = torch.arange(x.shape[1], device=device)[None, :] < n_common[:, None]
        w = valid.to(dtype)[..., None]
        x = (x - (w * x).sum(1, keepdim=True) / n_common[:, None, None]) * w
        y = (y - (w * y).sum(1, keepdim=True) / n_common[:, None, None]) * w
        ones = w
        moments = torch.cat([ones, x, y, (x[..., :, None] * y[..., None, :]).flatten(-2)], dim=-1)
        prefix = torch.cat([torch.zeros_like(moments[:, :1]), moments.cumsum(1)], dim=1)
        squares = (x * x).sum(-1, keepdim=True) + (y * y).sum(-1, keepdim=True)
        squares = torch.where(valid[..., None], squares, torch.full_like(squares, _FAR_SQ))
        yx = (y[..., :, None] * x[..., None, :]).flatten(-2)  # index 3i + j: y_i x_j
        basis = torch.cat([squares, torch.ones_like(squares), x, yx, y], dim=-1).transpose(1, 2).contiguous()
        d0 = torch.as_tensor([d0_from_length(int(v)) for v in lengths.tolist()], dtype=dtype, device=device)
        return cls(moments=moments, prefix=prefix, basis=basis, n_common=n_common, inv_d0_sq=1.0 / (d0 * d0),
                   d0_search=d0.clamp(D0_SEARCH_MIN, D0_SEARCH_MAX), inv_length=1.0 / lengths.to(device, dtype))


def _seed_states(feats: _Features, n_list: list) -> tuple:
    """(pair [S], mask [S, N], moment sums [S, 16]) of every seed fragment of every pair."""
    pair, start, size = [], [], []
    for b, n in enumerate(n_list):
        for length in seed_lengths(n):
            count = n - length + 1
            pair.extend([b] * count)
            start.extend(range(count))
            size.extend([length] * count)
    device = feats.moments.device
    pair_t, start_t, size_t = (torch.as_tensor(v, device=device) for v in (pair, start, size))
    pos = torch.arange(feats.moments.shape[1], device=device)[None, :]
    mask = (pos >= start_t[:, None]) & (pos < (start_t + size_t)[:, None])
    sums = feats.prefix[pair_t, start_t + size_t] - feats.prefix[pair_t, start_t]
    return pair_t, mask, sums


def _slots(pair: torch.Tensor, n_pairs: int) -> tuple:
    """Slot of each flat state (sorted by pair) in a padded [B, M] layout, and that layout's liveness."""
    counts = torch.bincount(pair, minlength=n_pairs)
    slot = torch.arange(pair.numel(), device=pair.device) - (torch.cumsum(counts, 0) - counts)[pair]
    alive = torch.zeros(n_pairs, max(int(counts.max()), 1), dtype=torch.bool, device=pair.device)
    alive[pair, slot] = True
    return slot, alive


def _fit_coefficients(sums: torch.Tensor) -> torch.Tensor:
    """Kabsch fit of each state from its moment sums [..., 16]; distance coefficients [..., 17].

    With the fit ``R, t``: ``|Rx + t - y|^2 = |x|^2 + |y|^2 + |t|^2 + 2 (R^T t).x
    - 2 sum_ij R_ij y_i x_j - 2 t.y``, matching the rows of ``_Features.basis``.
    """
    count = sums[..., 0]
    safe = count.clamp_min(1.0)[..., None]
    sx, sy = sums[..., 1:4], sums[..., 4:7]
    cov = sums[..., 7:16].unflatten(-1, (3, 3)) - sx[..., :, None] * sy[..., None, :] / safe[..., None]
    rotation = rotation_from_covariance(cov, identity_where=count <= 1)
    t = (sy - (rotation @ sx[..., None]).squeeze(-1)) / safe
    rt = (rotation.transpose(-1, -2) @ t[..., None]).squeeze(-1)
    ones = torch.ones_like(t[..., :1])
    return torch.cat([ones, (t * t).sum(-1, keepdim=True), 2.0 * rt, -2.0 * rotation.flatten(-2), -2.0 * t], dim=-1)


def _update_best(best_tm: torch.Tensor, best_counts: torch.Tensor, dist_sq: torch.Tensor, alive: torch.Tensor,
                 feats: _Features) -> None:
    """Fold this step's TM-scores and GDT counts [B, M] into the per-pair maxima (in place)."""
    terms = (dist_sq * feats.inv_d0_sq[:, None, None]).add_(1.0).reciprocal_()
    score = terms.sum(-1) * feats.inv_length[:, None]
    best_tm.copy_(torch.maximum(best_tm, score.masked_fill(~alive, -1.0).amax(-1)))
    for k, cutoff in enumerate(GDT_CUTOFFS):
        within = (dist_sq <= cutoff * cutoff).view(torch.uint8).sum(-1, dtype=torch.int32).long()
        best_counts[:, k] = torch.maximum(best_counts[:, k], within.masked_fill(~alive, -1).amax(-1))


def _cut(dist_sq: torch.Tensor, base: torch.Tensor, n_common: torch.Tensor) -> torch.Tensor:
    """Pairs closer than the cut [S, N]; the cut grows by 0.5 Å until it keeps 3 pairs (when n > 3)."""
    kept = dist_sq < (base * base)[:, None]
    short = (kept.view(torch.uint8).sum(-1, dtype=torch.int32) < MIN_KEPT) & (n_common > MIN_KEPT)
    if bool(short.any()):
        rows = short.nonzero().squeeze(-1)
        third = torch.kthvalue(dist_sq[rows], MIN_KEPT, dim=-1).values.clamp_min(0.0).sqrt()
        cut = base[rows] + CUT_GROWTH * (torch.floor((third - base[rows]) / CUT_GROWTH) + 1.0)
        kept[rows] = dist_sq[rows] < (cut * cut)[:, None]
    return kept


def _new_states(pair: torch.Tensor, mask: torch.Tensor, seen: set) -> tuple:
    """Drop states that repeat one of this step (same pair, same kept set) or of an earlier step.

    A set reached at an earlier step has the same future with more iterations
    left, so dropping the later copy changes no maximum. ``seen`` collects the
    sets of steps >= 1 (those at step 0 are seeds, cut at another distance).
    """
    if pair.numel() == 0:
        return pair, mask
    packed = np.packbits(mask.cpu().numpy(), axis=1)
    keys = np.concatenate([pair.cpu().numpy().astype(">u4").view(np.uint8).reshape(-1, 4), packed], axis=1)
    width, blob = keys.shape[1], keys.tobytes()
    keep = []
    for i, start in enumerate(range(0, len(blob), width)):
        key = blob[start:start + width]
        if key not in seen:
            seen.add(key)
            keep.append(i)
    index = torch.as_tensor(keep, dtype=torch.long, device=pair.device)
    return pair[index], mask[index]
