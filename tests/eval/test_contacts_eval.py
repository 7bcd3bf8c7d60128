"""Virtual-Cβ contact maps and contact precision: closed forms and a brute-force reference."""

from __future__ import annotations

import numpy as np
import pytest

from ptq_protein.eval.atoms import ATOM37_INDEX
from ptq_protein.eval.contacts import SEPARATION_RANGES, contact_map, contact_precision, virtual_cb
from ptq_protein.eval.structure import Structure
from ptq_protein.support.errors import InputError

RANGES = {name: (low, high) for name, low, high in SEPARATION_RANGES}


def _angle(a, b, c):
    u, v = a - b, c - b
    return np.arccos(np.sum(u * v, -1) / np.linalg.norm(u, axis=-1) / np.linalg.norm(v, axis=-1))


def _dihedral(p0, p1, p2, p3):
    b0, b1, b2 = p0 - p1, p2 - p1, p3 - p2
    b1 = b1 / np.linalg.norm(b1, axis=-1, keepdims=True)
    v = b0 - np.sum(b0 * b1, -1, keepdims=True) * b1
    w = b2 - np.sum(b2 * b1, -1, keepdims=True) * b1
    return np.arctan2(np.sum(np.cross(b1, v) * w, -1), np.sum(v * w, -1))


def brute_force(pred, targets, name, length):
    """Precision at floor(k L / 10), k = 1..10, by sorting a Python list (stable, descending)."""
    low, high = RANGES[name]
    high = high or length
    cells = [(pred[i, j], i, j) for i in range(length) for j in range(i + 1, length)
             if low <= j - i < high and targets[i, j] >= 0]
    ranked = sorted(range(len(cells)), key=lambda k: -cells[k][0])
    hits = [targets[cells[k][1], cells[k][2]] == 1 for k in ranked]
    precisions = [sum(hits[: k * length // 10]) / (k * length // 10) for k in range(1, 11)]
    return {f"{name}_P@L": precisions[9], f"{name}_P@L2": precisions[4], f"{name}_P@L5": precisions[1],
            f"{name}_AUC": float(np.mean(precisions))}


def test_virtual_cb_geometry(full_native):
    s = full_native
    cb = virtual_cb(s.n, s.ca, s.c)
    np.testing.assert_allclose(np.linalg.norm(cb - s.ca, axis=-1), 1.522, atol=1e-6)
    np.testing.assert_allclose(_angle(s.n, s.ca, cb), 1.927, atol=1e-6)
    np.testing.assert_allclose(_dihedral(s.c, s.n, s.ca, cb), -2.143, atol=1e-6)
    real = s.atom37_mask[:, ATOM37_INDEX["CB"]]
    assert np.linalg.norm(cb[real] - s.atom37[real, ATOM37_INDEX["CB"]], axis=-1).mean() < 0.2
    assert np.isfinite(cb[[i for i, c in enumerate(s.sequence) if c == "G"]]).all()  # glycine included


def test_contact_map_is_symmetric_and_marks_unresolved(full_native):
    cm = contact_map(full_native)
    assert cm.dtype == np.int8 and (cm == cm.T).all()
    assert set(np.unique(cm)) <= {0, 1}
    mask = full_native.atom37_mask.copy()
    mask[5, ATOM37_INDEX["N"]] = False
    broken = Structure(chain_id="C", residue_numbers=full_native.residue_numbers, sequence=full_native.sequence,
                       insertion_codes=full_native.insertion_codes, atom37=full_native.atom37, atom37_mask=mask)
    cm2 = contact_map(broken)
    assert (cm2[5] == -1).all() and (cm2[:, 5] == -1).all()
    assert (np.delete(np.delete(cm2, 5, 0), 5, 1) == np.delete(np.delete(cm, 5, 0), 5, 1)).all()


def test_perfect_and_inverted_predictors_in_closed_form(full_native):
    truth = contact_map(full_native)
    length = len(full_native)
    good = contact_precision(truth.astype(float), full_native)
    bad = contact_precision(1.0 - truth, full_native)
    assert len(good) == 16
    rows, cols = np.triu_indices(length, 1)
    for name, (low, high) in RANGES.items():
        sep = cols - rows
        in_range = (sep >= low) & (sep < (high or length))
        n_true = int((truth[rows, cols][in_range] == 1).sum())
        n_false = int(in_range.sum()) - n_true
        for key, tenths in (("P@L", 10), ("P@L2", 5), ("P@L5", 2)):
            top = tenths * length // 10
            assert good[f"{name}_{key}"] == pytest.approx(min(n_true, top) / top)
            assert bad[f"{name}_{key}"] == pytest.approx(max(0, min(top, n_true + n_false) - n_false) / top)


def test_random_scores_match_brute_force(full_native):
    rng = np.random.default_rng(0)
    length = len(full_native)
    pred = np.round(rng.random((length, length)), 2)  # coarse values: many ties
    ours = contact_precision(pred, full_native)
    truth = contact_map(full_native)
    for name in RANGES:
        for key, value in brute_force(pred, truth, name, length).items():
            assert ours[key] == pytest.approx(value, abs=1e-12), key


def test_sequence_length_is_l_even_when_residue_one_is_unresolved(full_native):
    """L is the map size; ESM's notebook would take it from residue 0's row (0 here)."""
    native = full_native.select(range(1, 63))  # residue 1 absent
    length = 63
    pred = np.random.default_rng(1).random((length, length))
    ours = contact_precision(pred, native)
    targets = np.full((length, length), -1, dtype=np.int8)
    targets[1:, 1:] = contact_map(native)
    for name in RANGES:
        for key, value in brute_force(pred, targets, name, length).items():
            assert ours[key] == pytest.approx(value, abs=1e-12), key


def test_denominator_stays_floor_fl_when_few_pairs_are_valid(full_native):
    part = full_native.select(range(20))  # residues 1-20 of a 63-long map: no long-range pair at all
    truth = np.zeros((63, 63))
    truth[:20, :20] = contact_map(part)
    metrics = contact_precision(truth, part)
    # no native long-range contact: precision is undefined (NaN), not 0.0 (issue 12)
    assert np.isnan(metrics["long_P@L"]) and np.isnan(metrics["long_AUC"])
    rows, cols = np.triu_indices(20, 1)
    sep = cols - rows
    n_short = int((contact_map(part)[rows, cols][(sep >= 6) & (sep < 12)] == 1).sum())
    assert metrics["short_P@L"] == pytest.approx(min(n_short, 63) / 63)


def test_sequence_argument_places_an_author_numbered_native(full_native):
    rng = np.random.default_rng(2)
    pred = rng.random((63, 63))
    author = Structure(chain_id="C", residue_numbers=full_native.residue_numbers + 300, sequence=full_native.sequence,
                       insertion_codes=full_native.insertion_codes, atom37=full_native.atom37,
                       atom37_mask=full_native.atom37_mask)
    with pytest.raises(InputError, match="outside 1..63"):
        contact_precision(pred, author)
    assert contact_precision(pred, author, sequence=full_native.sequence) == contact_precision(pred, full_native)
    with pytest.raises(InputError, match="sequence has"):
        contact_precision(pred, author, sequence=full_native.sequence[:-1])


def test_bad_maps(full_native):
    with pytest.raises(InputError, match="square"):
        contact_precision(np.zeros((63, 62)), full_native)
    nan = np.zeros((63, 63))
    nan[3, 4] = np.nan
    with pytest.raises(InputError, match="NaN"):
        contact_precision(nan, full_native)
    with pytest.raises(InputError, match="at least 10"):
        contact_precision(np.zeros((8, 8)), full_native.select(range(8)))
