"""TMscore's superposition search, vectorised over seeds and over pairs (numpy, or torch on CPU or CUDA).

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

The search is written once against the array API (:mod:`ptq_protein.eval.arrays`):
numpy inputs run it without importing torch, torch tensors on their device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ptq_protein.eval.arrays import compute_context, device, namespace, on_accelerator, to_numpy
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
# The search's tensors are small (~1e5-1e6 elements): torch's intra-op threads
# gain little and, on oversubscribed cores, made it 5x slower in our measurements.
CPU_THREADS = 1


@dataclass(frozen=True)
class SearchOutput:
    """Per-pair results of :func:`tm_search` (arrays of the inputs' library, on their device)."""

    tm_score: Any  # [B]
    gdt_counts: Any  # [B, 5] int64: max number of pairs within GDT_CUTOFFS
    rmsd: Any  # [B] RMSD of all common pairs after their optimal superposition


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


def tm_search(x: Any, y: Any, n_common: Any, lengths: Any, chunk_elements: int = 0,
              cpu_threads: Optional[int] = CPU_THREADS) -> SearchOutput:
    """Best TM-score superposition of each pair of paired coordinate sets.

    Parameters
    ----------
    x, y : numpy array or torch tensor [B, N, 3]
        Model and native coordinates; pair ``b`` uses rows ``0 .. n_common[b] - 1``
        (paired row by row, in chain order); further rows are padding.
    n_common : array or sequence [B] of int
        Number of common pairs of each pair, at least 1.
    lengths : array or sequence [B] of int
        Normalisation length (the native length) of each pair.
    chunk_elements : int
        Bound on states x N evaluated at once (memory); 0 picks a default for the device.
    cpu_threads : int or None
        torch intra-op threads while searching on CPU (restored afterwards);
        None leaves torch's setting. Unused for numpy.

    Returns
    -------
    SearchOutput
    """
    xp = namespace(x, y)
    if x.shape != y.shape or x.ndim != 3 or x.shape[-1] != 3:
        raise ValueError(f"x and y must be [B, N, 3], got {tuple(x.shape)} and {tuple(y.shape)}")
    n_list = [int(v) for v in to_numpy(n_common).tolist()]
    length_list = [int(v) for v in to_numpy(lengths).tolist()]
    budget = chunk_elements or (CUDA_CHUNK_ELEMENTS if on_accelerator(x) else DEFAULT_CHUNK_ELEMENTS)
    where = device(x)
    tm = xp.zeros(len(n_list), dtype=x.dtype, device=where)
    counts = xp.zeros((len(n_list), len(GDT_CUTOFFS)), dtype=xp.int64, device=where)
    with compute_context(x, cpu_threads):
        for chunk in _chunks(n_list, budget):
            width = max(n_list[b] for b in chunk)
            index = xp.asarray(chunk, device=where)
            tm_c, counts_c = _search_chunk(xp, x[index, :width], y[index, :width], [n_list[b] for b in chunk],
                                           [length_list[b] for b in chunk], budget)
            tm[index], counts[index] = tm_c, counts_c
        valid = xp.arange(x.shape[1], device=where)[None, :] < xp.asarray(n_list, device=where)[:, None]
        rmsd = superposition_rmsd(x, y, xp.astype(valid, x.dtype))
    return SearchOutput(tm_score=tm, gdt_counts=counts, rmsd=rmsd)


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


def _search_chunk(xp: Any, x: Any, y: Any, n_list: list, lengths: list, budget: int) -> tuple:
    """Best TM-score and GDT counts [B], [B, 5] of one chunk of pairs (rows beyond n_common are padding).

    Each step's states are processed in blocks of about ``budget / N`` rows, so
    memory stays bounded (and in cache) whatever the chain length.
    """
    feats = _Features.build(xp, x, y, n_list, lengths)
    best_tm = xp.full((len(n_list),), -1.0, dtype=x.dtype, device=device(x))
    best_counts = xp.full((len(n_list), len(GDT_CUTOFFS)), -1, dtype=xp.int64, device=device(x))
    pair, mask, sums = _seed_states(xp, feats, n_list)
    block = max(1, budget // x.shape[1])
    seen: set = set()
    for step in range(MAX_ITERATIONS + 1):
        last = step == MAX_ITERATIONS
        cut_base = feats.d0_search + (1.0 if step else -1.0)
        new_masks = []
        for lo in range(0, pair.shape[0], block):
            part = slice(lo, lo + block)
            new_masks.append(_evaluate(xp, feats, pair[part], mask[part], None if sums is None else sums[part],
                                       best_tm, best_counts, None if last else cut_base))
        if last:
            break
        new_mask = xp.concat(new_masks)
        if step:  # a state whose kept set did not change would repeat its superposition
            changed = xp.any(new_mask != mask, axis=-1)
            pair, new_mask = pair[changed], new_mask[changed]
        pair, mask = _new_states(xp, pair, new_mask, seen)
        sums = None
        if pair.shape[0] == 0:
            break
    return best_tm, best_counts


def _evaluate(xp: Any, feats: "_Features", pair: Any, mask: Any, sums: Optional[Any], best_tm: Any,
              best_counts: Any, cut_base: Optional[Any]) -> Optional[Any]:
    """Fit, score and cut one block of states (sorted by pair); returns the next kept sets [S, N]."""
    slot, alive = _slots(xp, pair, feats.moments.shape[0])
    dtype, where = feats.moments.dtype, device(feats.moments)
    if sums is None:  # sums of the kept pairs' moments: one batched product
        weights = xp.zeros(alive.shape + (mask.shape[1],), dtype=dtype, device=where)
        weights[pair, slot] = xp.astype(mask, dtype)
        padded_sums = weights @ feats.moments
    else:
        padded_sums = xp.zeros(alive.shape + (sums.shape[-1],), dtype=dtype, device=where)
        padded_sums[pair, slot] = sums
    dist_sq = _fit_coefficients(xp, padded_sums) @ feats.basis  # [B, M, N]; padding rows come out huge
    _update_best(xp, best_tm, best_counts, dist_sq, alive, feats)
    if cut_base is None:
        return None
    return _cut(xp, dist_sq[pair, slot], cut_base[pair], feats.n_common[pair])


@dataclass(frozen=True)
class _Features:
    """Per-pair arrays that turn fits and distances into batched products.

    ``moments`` [B, N, 16] = (1, x, y, x_a y_b): a 0/1 weight row times it gives
    every sum a Kabsch fit needs; ``prefix`` [B, N + 1, 16] is its running sum
    (fits on consecutive fragments). ``basis`` [B, 17, N] is such that
    ``|R x_n + t - y_n|^2 = coefficients(R, t) . basis[:, :, n]``. Coordinates
    are centred on each pair's common residues (the scores are translation
    invariant) to keep the expanded squares small; padding rows get a huge
    ``|x|^2`` so that their distances never count.
    """

    moments: Any
    prefix: Any
    basis: Any
    n_common: Any  # [B]
    inv_d0_sq: Any  # [B]
    d0_search: Any  # [B]
    inv_length: Any  # [B]

    @classmethod
    def build(cls, xp: Any, x: Any, y: Any, n_list: list, lengths: list) -> "_Features":
        where, dtype = device(x), x.dtype
        n_common = xp.asarray(n_list, device=where)
        valid = xp.arange(x.shape[1], device=where)[None, :] < n_common[:, None]
        w = xp.astype(valid, dtype)[..., None]
        count = xp.astype(n_common, dtype)[:, None, None]
        x = (x - xp.sum(w * x, axis=1, keepdims=True) / count) * w
        y = (y - xp.sum(w * y, axis=1, keepdims=True) / count) * w
        moments = xp.concat([w, x, y, _outer(xp, x, y)], axis=-1)
        prefix = xp.cumulative_sum(moments, axis=1, include_initial=True)
        squares = xp.sum(x * x, axis=-1) + xp.sum(y * y, axis=-1)
        squares = xp.where(valid, squares, xp.full_like(squares, _FAR_SQ))
        linear = xp.concat([x, _outer(xp, y, x), y], axis=-1)  # [B, N, 15]; _outer(y, x)[3i + j] = y_i x_j
        basis = xp.stack([squares, xp.ones_like(squares)] + [linear[..., k] for k in range(15)], axis=1)
        d0 = xp.asarray([d0_from_length(v) for v in lengths], dtype=dtype, device=where)
        return cls(moments=moments, prefix=prefix, basis=basis, n_common=n_common, inv_d0_sq=1.0 / (d0 * d0),
                   d0_search=xp.clip(d0, min=D0_SEARCH_MIN, max=D0_SEARCH_MAX),
                   inv_length=1.0 / xp.asarray(lengths, dtype=dtype, device=where))


def _outer(xp: Any, a: Any, b: Any) -> Any:
    """Per-row outer products [..., 9] of [..., 3] vectors, flattened: index ``3i + j`` is ``a_i b_j``."""
    return xp.reshape(a[..., :, None] * b[..., None, :], a.shape[:-1] + (9,))


def _seed_states(xp: Any, feats: _Features, n_list: list) -> tuple:
    """(pair [S], mask [S, N], moment sums [S, 16]) of every seed fragment of every pair."""
    pair, start, size = [], [], []
    for b, n in enumerate(n_list):
        for length in seed_lengths(n):
            count = n - length + 1
            pair.extend([b] * count)
            start.extend(range(count))
            size.extend([length] * count)
    where = device(feats.moments)
    pair_a, start_a, size_a = (xp.asarray(v, device=where) for v in (pair, start, size))
    pos = xp.arange(feats.moments.shape[1], device=where)[None, :]
    mask = (pos >= start_a[:, None]) & (pos < (start_a + size_a)[:, None])
    sums = feats.prefix[pair_a, start_a + size_a] - feats.prefix[pair_a, start_a]
    return pair_a, mask, sums


def _slots(xp: Any, pair: Any, n_pairs: int) -> tuple:
    """Slot of each flat state (sorted by pair) in a padded [B, M] layout, and that layout's liveness."""
    ids = xp.arange(n_pairs, device=device(pair))
    first, end = xp.searchsorted(pair, ids), xp.searchsorted(pair, ids, side="right")
    slot = xp.arange(pair.shape[0], device=device(pair)) - first[pair]
    alive = xp.zeros((n_pairs, max(int(xp.max(end - first)), 1)), dtype=xp.bool, device=device(pair))
    alive[pair, slot] = True
    return slot, alive


def _fit_coefficients(xp: Any, sums: Any) -> Any:
    """Kabsch fit of each state from its moment sums [..., 16]; distance coefficients [..., 17].

    With the fit ``R, t``: ``|Rx + t - y|^2 = |x|^2 + |y|^2 + |t|^2 + 2 (R^T t).x
    - 2 sum_ij R_ij y_i x_j - 2 t.y``, matching the rows of ``_Features.basis``.
    """
    count = sums[..., 0]
    safe = xp.clip(count, min=1.0)[..., None]
    sx, sy = sums[..., 1:4], sums[..., 4:7]
    cov = xp.reshape(sums[..., 7:16], sums.shape[:-1] + (3, 3)) - sx[..., :, None] * sy[..., None, :] / safe[..., None]
    rotation = rotation_from_covariance(cov, identity_where=count <= 1)
    t = (sy - (rotation @ sx[..., None])[..., 0]) / safe
    rt = (xp.matrix_transpose(rotation) @ t[..., None])[..., 0]
    flat_rotation = xp.reshape(rotation, rotation.shape[:-2] + (9,))
    return xp.concat([xp.ones_like(t[..., :1]), xp.sum(t * t, axis=-1, keepdims=True), 2.0 * rt,
                      -2.0 * flat_rotation, -2.0 * t], axis=-1)


def _update_best(xp: Any, best_tm: Any, best_counts: Any, dist_sq: Any, alive: Any, feats: _Features) -> None:
    """Fold this step's TM-scores and GDT counts [B, M] into the per-pair maxima (in place)."""
    terms = dist_sq * feats.inv_d0_sq[:, None, None]
    terms += 1.0
    score = xp.sum(xp.divide(1.0, terms), axis=-1) * feats.inv_length[:, None]  # torch's 1.0 / terms is slower
    best_tm[...] = xp.maximum(best_tm, xp.max(xp.where(alive, score, -1.0), axis=-1))
    for k, cutoff in enumerate(GDT_CUTOFFS):
        within = xp.count_nonzero(dist_sq <= cutoff * cutoff, axis=-1)
        best_counts[:, k] = xp.maximum(best_counts[:, k], xp.max(xp.where(alive, within, -1), axis=-1))


def _cut(xp: Any, dist_sq: Any, base: Any, n_common: Any) -> Any:
    """Pairs closer than the cut [S, N]; the cut grows by 0.5 Å until it keeps 3 pairs (when n > 3)."""
    kept = dist_sq < (base * base)[:, None]
    short = (xp.count_nonzero(kept, axis=-1) < MIN_KEPT) & (n_common > MIN_KEPT)
    if bool(xp.any(short)):
        rows = xp.nonzero(short)[0]
        third = xp.sqrt(xp.clip(xp.sort(dist_sq[rows], axis=-1)[:, MIN_KEPT - 1], min=0.0))
        cut = base[rows] + CUT_GROWTH * (xp.floor((third - base[rows]) / CUT_GROWTH) + 1.0)
        kept[rows] = dist_sq[rows] < (cut * cut)[:, None]
    return kept


def _new_states(xp: Any, pair: Any, mask: Any, seen: set) -> tuple:
    """Drop states that repeat one of this step (same pair, same kept set) or of an earlier step.

    A set reached at an earlier step has the same future with more iterations
    left, so dropping the later copy changes no maximum. ``seen`` collects the
    sets of steps >= 1 (those at step 0 are seeds, cut at another distance).
    """
    if pair.shape[0] == 0:
        return pair, mask
    packed = np.packbits(to_numpy(mask), axis=1)
    keys = np.concatenate([to_numpy(pair).astype(">u4").view(np.uint8).reshape(-1, 4), packed], axis=1)
    width, blob = keys.shape[1], keys.tobytes()
    keep = []
    for i, start in enumerate(range(0, len(blob), width)):
        key = blob[start:start + width]
        if key not in seen:
            seen.add(key)
            keep.append(i)
    index = xp.asarray(keep, dtype=xp.int64, device=device(pair))
    return pair[index], mask[index]
