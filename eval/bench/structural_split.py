"""ESM's structural split (``esm.data.ESMStructuralSplitDataset``) read from a local folder, and the study's P@L.

The PTQ4Protein study evaluated contacts of fair-esm ESM-2 650M on this dataset
(``split_level='fold'``, ``cv_partition='4'``; calibration on the first 50
training domains, test on every validation domain). Its folder layout::

    ROOT/structural-data/splits/{split_level}/{cv_partition}/{train,valid}.txt   one domain name per line
    ROOT/structural-data/pkl/{name[1:3]}/{name}.pkl                               dict: seq, ssp, dist, coords

The pickles hold only a dict of a str and NumPy arrays; they are read with an
unpickler that refuses every other class, so a tampered file cannot run code.

:func:`study_contact_precisions` follows the study's ``compute_precisions``
(``contact_prediction/scripts/quant_acts.py:116-207``): contacts are ``dist < 8``
with NaN distances (missing Cβ) counted as non-contacts, L is the sequence
length, and P@L is the fraction of true contacts among the L highest-scored
pairs of each separation range (local [3, 6), short [6, 12), medium [12, 24),
long >= 24). When a range has fewer than L pairs the rest of the top L are
pairs scored -inf, as in theirs; ties are broken by position here.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Union

import numpy as np

from ptq_protein.support.errors import InputError

__all__ = ["Domain", "read_structural_split", "study_contact_precisions", "STUDY_RANGES", "STUDY_SPLIT"]

STUDY_SPLIT = ("fold", "4")  # the last combination their loop left in place (quant_acts.py:289-304)
STUDY_RANGES = (("local", 3, 6), ("short", 6, 12), ("medium", 12, 24), ("long", 24, None))
CONTACT_DISTANCE = 8.0  # Å, their ``ele['dist'] < 8``
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"), ("builtins", "dict"), ("collections", "OrderedDict")}


@dataclass(frozen=True)
class Domain:
    """One SCOPe domain: its name, sequence and Cβ distance map [L, L] (NaN where Cβ is missing)."""

    name: str
    seq: str
    dist: np.ndarray


class _ArraysOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only NumPy arrays are expected")
        return super().find_class(module, name)


def read_structural_split(root: Union[str, Path], split: str, split_level: str = STUDY_SPLIT[0],
                          cv_partition: str = STUDY_SPLIT[1], limit: Optional[int] = None) -> List[Domain]:
    """The first ``limit`` domains (all when None) of one split, in the split file's order.

    ``root`` is the folder holding ``structural-data`` (ESM's ``root_path``) or that folder itself.
    """
    base = Path(root)
    if (base / "structural-data").is_dir():
        base = base / "structural-data"
    split_file = base / "splits" / split_level / str(cv_partition) / f"{split}.txt"
    if not split_file.is_file():
        raise InputError(f"{split_file} not found: pass the folder of ESM's structural split "
                         "(it holds structural-data/splits and structural-data/pkl)")
    names = [n.strip() for n in split_file.read_text().splitlines() if n.strip()]
    return [_domain(base, name) for name in names[:limit]]


def _domain(base: Path, name: str) -> Domain:
    path = base / "pkl" / name[1:3] / f"{name}.pkl"
    try:
        obj = _ArraysOnly(io.BytesIO(path.read_bytes())).load()
        seq, dist = obj["seq"], np.asarray(obj["dist"], dtype=np.float64)
    except (OSError, pickle.UnpicklingError, KeyError, TypeError, EOFError) as e:
        raise InputError(f"{path}: not a structural-split domain ({e}); expected a dict with 'seq' and 'dist'") from e
    if dist.shape != (len(seq), len(seq)):
        raise InputError(f"{path}: dist is {dist.shape} but the sequence has {len(seq)} residues")
    return Domain(name, str(seq), dist)


def study_contact_precisions(pred: np.ndarray, dist: np.ndarray) -> Dict[str, float]:
    """``{range}_P@L``, ``{range}_P@L2``, ``{range}_P@L5`` for the four ranges, the study's conventions.

    ``pred`` [L, L] contact scores (upper triangle read), ``dist`` [L, L] Å.
    """
    length = dist.shape[0]
    if pred.shape != dist.shape:
        raise InputError(f"prediction {pred.shape} and distance map {dist.shape} differ in size")
    with np.errstate(invalid="ignore"):
        truth = dist < CONTACT_DISTANCE  # NaN -> False: a non-contact, as theirs
    i, j = np.triu_indices(length, 1)
    out: Dict[str, float] = {}
    for name, lo, hi in STUDY_RANGES:
        sep = j - i
        scores = np.where((sep >= lo) & ((sep < hi) if hi else True), pred[i, j], -np.inf)
        keep = sep >= lo  # their np.triu_indices(L, minsep)
        order = np.argsort(-scores[keep], kind="stable")
        hits = truth[i[keep], j[keep]][order]
        for label, count in (("P@L", length), ("P@L2", length // 2), ("P@L5", length // 5)):
            out[f"{name}_{label}"] = float(hits[:count].sum() / count) if count else float("nan")
    return out
