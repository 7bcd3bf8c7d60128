"""TM-score, GDT-TS, GDT-HA and RMSD of a model against a native, as the TMscore program computes them.

Residues are paired by number (TMscore's default) or by a sequence alignment;
scores are normalised by ``L``: the native's residues with a CA (``normalize="native"``,
``TMscore model native``), or the model's (``normalize="sequence"``: for a
prediction, its full sequence, as ``TMscore native model`` computes it, which is how
the ESMFold-quantization study called the program).
The search itself is :func:`ptq_protein.eval.tmsearch.tm_search`: numpy for
numpy inputs (torch is not imported), torch for tensors (cuda tensors stay on
the GPU). ``rmsd`` is TMscore's "RMSD of the common residues": all paired CAs
after their own optimal (least-squares) superposition.

Differences from the program, by design: insertion codes take part in
pairing by number (TMscore reads the number only), MSE is read as MET
(TMscore skips HETATM records), common pairs are taken in native order
(TMscore takes model order; the same for files sorted by residue number, and
this way the result does not depend on the model's record order), and the
scores are not rounded to 4 decimals.
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence, Union

import numpy as np

from ptq_protein.eval.align import Pairing, pair_residues, parse_choice
from ptq_protein.eval.arrays import is_torch_array, pick_backend, to_numpy
from ptq_protein.eval.structure import as_structure
from ptq_protein.eval.tmsearch import tm_search
from ptq_protein.support.errors import InputError

__all__ = ["TMScoreResult", "TMNormalize", "tm_score", "tm_score_batch", "paired_ca"]

_TOLERANCE = 1e-6
_FEW_PAIRS = 3  # fewer common pairs than this make a superposition meaningless


class TMNormalize(str, enum.Enum):
    """Which structure's length normalises TM-score and GDT (and sets d0).

    The TMscore program normalises by its *second* argument: ``TMscore model
    native`` by the native (whose unobserved residues then do not count), and
    ``TMscore native model`` by the model, i.e. for a prediction by its full
    sequence (unobserved native residues count as misses).
    """

    NATIVE = "native"  # the native's residues with a CA (TMscore model native)
    SEQUENCE = "sequence"  # the model's residues with a CA: a prediction's full sequence (TMscore native model)

    @classmethod
    def parse(cls, value: Union[str, "TMNormalize"]) -> "TMNormalize":
        return parse_choice(cls, value, "tm_normalize")


@dataclass(frozen=True)
class TMScoreResult:
    """Scores of one model against one native (all normalised by ``length``)."""

    tm_score: float
    rmsd: float
    gdt_ts: float
    gdt_ha: float
    n_aligned: int
    length: int

    def __post_init__(self) -> None:
        if self.length < 1 or not 0 < self.n_aligned <= self.length:
            raise ValueError(f"need 0 < n_aligned <= length, got {self.n_aligned} and {self.length}")
        for name in ("tm_score", "gdt_ts", "gdt_ha"):
            value = getattr(self, name)
            if not -_TOLERANCE <= value <= 1 + _TOLERANCE:
                raise ValueError(f"{name}={value} is outside [0, 1]")
        if not (np.isfinite(self.rmsd) and self.rmsd >= 0):
            raise ValueError(f"rmsd={self.rmsd} must be finite and non-negative")

    def to_dict(self) -> dict:
        return asdict(self)


def tm_score(model: Any, native: Any, pairing: Union[str, Pairing] = "number", *,
             model_chain: Optional[str] = None, native_chain: Optional[str] = None,
             normalize: Union[str, TMNormalize] = "native") -> TMScoreResult:
    """Score a model against a native.

    Parameters
    ----------
    model, native : Structure, path, PDB/mmCIF text, or CA array [L, 3]
        Arrays are numbered 1..L (so two arrays pair row by row); NaN rows are missing.
    pairing : "number" or "sequence"
        `number` pairs equal residue numbers (and insertion codes), as TMscore
        does; `sequence` pairs residues through a global sequence alignment
        (natives in author numbering, e.g. cameo2022).
    model_chain, native_chain : str, optional
        Chains to read from files (default: the first).
    normalize : "native" or "sequence"
        Normalise by the native's residues with a CA (`TMscore model native`,
        the default) or by the model's (`TMscore native model`; for a
        prediction, its full sequence). See `TMNormalize`.

    Returns
    -------
    TMScoreResult

    Raises
    ------
    InputError
        No residues in common, or unreadable input.

    Examples
    --------
    >>> ca = np.cumsum(np.random.default_rng(0).normal(size=(40, 3)), axis=0) * 2
    >>> round(tm_score(ca, ca).tm_score, 6)
    1.0
    """
    model_ca, native_ca, length = paired_ca(model, native, pairing, model_chain, native_chain, normalize)
    return tm_score_batch([(model_ca, native_ca)], lengths=[length])[0]


def paired_ca(model: Any, native: Any, pairing: Union[str, Pairing] = "number",
              model_chain: Optional[str] = None, native_chain: Optional[str] = None,
              normalize: Union[str, TMNormalize] = "native") -> tuple:
    """(model CA [K, 3], native CA [K, 3], normalisation length) of the pairs with a CA on both sides.

    The length is the native's residues with a CA, or the model's when ``normalize="sequence"``.
    """
    by_model = TMNormalize.parse(normalize) is TMNormalize.SEQUENCE
    model_s, native_s = as_structure(model, model_chain), as_structure(native, native_chain)
    im, jn = pair_residues(model_s, native_s, pairing)
    model_ca, native_ca = model_s.ca[im], native_s.ca[jn]
    both = np.isfinite(model_ca).all(-1) & np.isfinite(native_ca).all(-1)
    length = int(np.isfinite((model_s if by_model else native_s).ca).all(-1).sum())
    if not both.any():
        hint = " (try pairing='sequence' if the numbering differs)" if Pairing.parse(pairing) is Pairing.NUMBER else ""
        raise InputError(f"{model_s.source} and {native_s.source} have no residues with CA in common{hint}")
    _warn_on_poor_pairing(model_s, native_s, im[both], jn[both], pairing)
    return model_ca[both], native_ca[both], length


_MIN_PAIRED = 0.5    # fewer paired residues than this share of the shorter chain's: say so
_MIN_IDENTITY = 0.5  # fewer identical residue names among the pairs: the chains may be unrelated


def _warn_on_poor_pairing(model_s, native_s, im, jn, pairing) -> None:
    """Warn when few residues pair, or paired residue names disagree (TMscore prints the aligned sequences)."""
    paired, problems = len(im), []
    # the shorter side bounds the pairs (a native's unobserved residues never pair; not a pairing problem)
    fewer = min(int(np.isfinite(s.ca).all(-1).sum()) for s in (model_s, native_s))
    if fewer and paired < _MIN_PAIRED * fewer:
        problems.append(f"only {paired} of {fewer} residues pair")
    names = [(model_s.sequence[i], native_s.sequence[j]) for i, j in zip(im.tolist(), jn.tolist())
             if model_s.sequence[i] != "X" and native_s.sequence[j] != "X"]
    if names:
        identity = sum(a == b for a, b in names) / len(names)
        if identity < _MIN_IDENTITY:
            problems.append(f"only {identity:.0%} of paired residues have the same amino acid")
    if problems:
        hint = ("; if the numbering differs, use pairing='sequence'" if Pairing.parse(pairing) is Pairing.NUMBER
                else "; are these the same protein?")
        warnings.warn(f"{model_s.source} vs {native_s.source}: {' and '.join(problems)}, so the score may compare "
                      f"unrelated residues{hint}", stacklevel=3)


def tm_score_batch(pairs: Sequence[tuple], lengths: Optional[Sequence[int]] = None, *,
                   device: Any = None, dtype: Any = None) -> list:
    """Score many (model, native) coordinate pairs at once.

    Parameters
    ----------
    pairs : sequence of (model_ca, native_ca)
        numpy arrays or torch tensors [N_i, 3], paired row by row; rows with a
        NaN on either side are left out.
    lengths : sequence of int, optional
        Normalisation length of each pair (the native length); default the
        number of finite native rows.
    device : str or torch.device, optional
        Where to compute (with torch); default the device of the first tensor.
        When every input is a numpy array and neither a device nor a torch
        dtype is given, the search runs in numpy and torch is not imported.
    dtype : torch or numpy dtype, optional
        Compute precision (float64 by default).

    Returns
    -------
    list of TMScoreResult, one per pair
    """
    if len(pairs) == 0:
        return []
    if lengths is not None and len(lengths) != len(pairs):
        raise InputError(f"lengths has {len(lengths)} entries for {len(pairs)} pairs")
    xp, where, dtype = pick_backend([item for pair in pairs for item in pair], device, dtype)
    x, y, n_common, norm = _pad_pairs(xp, pairs, lengths, where, dtype)
    out = tm_search(x, y, n_common, norm)
    gdt = to_numpy(out.gdt_counts).astype(np.float64) / np.asarray(norm, dtype=np.float64)[:, None]
    gdt_ts, gdt_ha = gdt[:, 1:5].mean(-1), gdt[:, 0:4].mean(-1)
    return [
        TMScoreResult(tm_score=float(t), rmsd=float(r), gdt_ts=float(ts), gdt_ha=float(ha),
                      n_aligned=int(n), length=int(lg))
        for t, r, ts, ha, n, lg in zip(to_numpy(out.tm_score).tolist(), to_numpy(out.rmsd).tolist(),
                                       gdt_ts.tolist(), gdt_ha.tolist(), n_common, norm)
    ]


def _as_array(xp: Any, value: Any, where: str, device: Any, dtype: Any) -> Any:
    if not is_torch_array(value):
        value = np.asarray(value, dtype=np.float64)
    array = xp.asarray(value, dtype=dtype, device=device)
    if array.ndim != 2 or array.shape[-1] != 3:
        raise InputError(f"{where} must be [N, 3] coordinates, got shape {tuple(array.shape)}")
    return array


def _pad_pairs(xp: Any, pairs: Sequence[tuple], lengths: Optional[Sequence[int]], device: Any, dtype: Any) -> tuple:
    """Padded [B, N, 3] coordinates of the finite pairs, their counts and normalisation lengths (lists)."""
    xs, ys, norm = [], [], []
    for b, pair in enumerate(pairs):
        if len(pair) != 2:
            raise InputError(f"pairs[{b}] must be a (model_ca, native_ca) pair")
        x = _as_array(xp, pair[0], f"pairs[{b}][0]", device, dtype)
        y = _as_array(xp, pair[1], f"pairs[{b}][1]", device, dtype)
        if x.shape != y.shape:
            raise InputError(f"pairs[{b}]: model and native have {x.shape[0]} and {y.shape[0]} rows; "
                             "pair them first (tm_score or paired_ca)")
        native_rows = xp.all(xp.isfinite(y), axis=-1)
        keep = xp.all(xp.isfinite(x), axis=-1) & native_rows
        n = int(xp.count_nonzero(keep))
        length = int(xp.count_nonzero(native_rows)) if lengths is None else int(lengths[b])
        if n == 0:
            raise InputError(f"pairs[{b}] has no finite pair of coordinates in common")
        if length < n:
            raise InputError(f"lengths[{b}]={length} is smaller than its {n} common pairs")
        if n < _FEW_PAIRS:
            warnings.warn(f"pairs[{b}] has only {n} common residues; its TM-score is degenerate", stacklevel=3)
        xs.append(x[keep])
        ys.append(y[keep])
        norm.append(length)
    width = max(v.shape[0] for v in xs)
    x_pad = xp.zeros((len(xs), width, 3), dtype=dtype, device=device)
    y_pad = xp.zeros_like(x_pad)
    for b, (x, y) in enumerate(zip(xs, ys)):
        x_pad[b, : x.shape[0]] = x
        y_pad[b, : y.shape[0]] = y
    return x_pad, y_pad, [v.shape[0] for v in xs], norm
