"""lDDT against closed forms and an independent dense float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
from eval_testlib import random_walk

from ptq_protein.eval.atoms import AMBIGUOUS_ATOM_SWAPS, ATOM37_INDEX
from ptq_protein.eval.lddt import LDDTMode, lddt
from ptq_protein.eval.structure import Structure
from ptq_protein.support.errors import InputError


def dense_reference(model_xyz, native_xyz, residue_of, cutoff=15.0, thresholds=(0.5, 1, 2, 4)):
    """lDDT from full distance matrices: ordered pairs of atoms in different residues (float64)."""
    dn = np.linalg.norm(native_xyz[:, None] - native_xyz[None], axis=-1)
    dm = np.linalg.norm(model_xyz[:, None] - model_xyz[None], axis=-1)
    include = (dn < cutoff) & (residue_of[:, None] != residue_of[None, :])
    diff = np.abs(dm - dn)
    score = np.mean([np.where(np.isnan(diff), False, diff < t) for t in thresholds], axis=0) * include
    per_residue = np.array([score[residue_of == r].sum() / include[residue_of == r].sum()
                            for r in np.unique(residue_of)])
    return score.sum() / include.sum(), per_residue


def _flat_atoms(structure: Structure):
    rows, slots = np.nonzero(structure.atom37_mask)
    return structure.atom37[rows, slots], rows, slots


def test_identity_is_one_in_both_modes(full_native):
    for mode in ("ca", "all"):
        result = lddt(full_native, full_native, mode=mode)
        assert result.lddt == 1.0 and result.mode == mode
        assert np.all(result.per_residue == 1.0)


def test_closed_form_three_residues():
    native = np.array([[0.0, 0, 0], [3.8, 0, 0], [7.6, 0, 0]])
    model = native.copy()
    model[2, 0] += 0.75  # BC and AC change by 0.75 Å: preserved at 1, 2, 4 Å only
    result = lddt(model, native)
    assert result.lddt == pytest.approx((1 + 0.75 + 0.75) / 3)
    np.testing.assert_allclose(result.per_residue, [(1 + 0.75) / 2, (1 + 0.75) / 2, 0.75])
    assert result.n_distances == 3


def test_ca_mode_matches_dense_reference():
    rng = np.random.default_rng(0)
    native = random_walk(90, seed=1, step=3.8) * 0.6  # compact: many pairs within 15 Å
    model = native + rng.normal(0, 0.8, native.shape)
    model[30:34] = np.nan  # unresolved in the model: count as not preserved
    ref_global, ref_per = dense_reference(model, native, np.arange(90))
    result = lddt(model, native)
    assert result.lddt == pytest.approx(ref_global, abs=1e-12)
    np.testing.assert_allclose(result.per_residue, ref_per, atol=1e-12)
    assert np.all(result.per_residue[30:34] == 0.0)


def test_all_atom_matches_dense_reference_without_ambiguous_residues(full_native):
    rng = np.random.default_rng(2)
    plain = [i for i, c in enumerate(full_native.sequence) if c not in "DEFYR"]
    native = full_native.select(plain)
    model = Structure(chain_id="A", residue_numbers=native.residue_numbers, insertion_codes=native.insertion_codes,
                      sequence=native.sequence, atom37=native.atom37 + rng.normal(0, 0.7, native.atom37.shape),
                      atom37_mask=native.atom37_mask)
    xyz_n, rows, slots = _flat_atoms(native)
    xyz_m = model.atom37[rows, slots]
    ref_global, ref_per = dense_reference(xyz_m, xyz_n, rows)
    result = lddt(model, native)
    assert result.mode == "all"
    assert result.lddt == pytest.approx(ref_global, abs=1e-12)
    np.testing.assert_allclose(result.per_residue, ref_per, atol=1e-12)


def test_swapped_symmetric_atoms_are_resolved(full_native):
    swapped = full_native.atom37.copy()
    n_swaps = 0
    for i, letter in enumerate(full_native.sequence):
        name = {"D": "ASP", "E": "GLU", "F": "PHE", "Y": "TYR", "R": "ARG"}.get(letter)
        for a, b in AMBIGUOUS_ATOM_SWAPS.get(name, ()):
            ia, ib = ATOM37_INDEX[a], ATOM37_INDEX[b]
            if full_native.atom37_mask[i, [ia, ib]].all():
                swapped[i, [ia, ib]] = full_native.atom37[i, [ib, ia]]
                n_swaps += 1
    assert n_swaps > 10
    model = Structure(chain_id="A", residue_numbers=full_native.residue_numbers, sequence=full_native.sequence,
                      insertion_codes=full_native.insertion_codes, atom37=swapped, atom37_mask=full_native.atom37_mask)
    assert lddt(model, full_native).lddt == 1.0
    xyz_n, rows, slots = _flat_atoms(full_native)
    assert dense_reference(model.atom37[rows, slots], xyz_n, rows)[0] < 0.99  # without renaming it would drop


def test_displaced_residue_lowers_only_its_neighbourhood():
    native = random_walk(80, seed=3)
    model = native.copy()
    model[40] += [0.0, 0.0, 6.0]
    result = lddt(model, native)
    assert result.per_residue[40] < 0.5
    far = np.linalg.norm(native - native[40], axis=1) >= 15.0
    assert np.all(result.per_residue[far] == 1.0)
    assert 0.9 < result.lddt < 1.0


def test_modes_and_errors(full_native):
    ca_only = Structure.from_arrays(full_native.ca, sequence=full_native.sequence)
    assert lddt(ca_only, full_native).mode == "ca"  # auto: CA when one side has no side chains
    assert lddt(full_native, full_native, mode=LDDTMode.AUTO).mode == "all"
    with pytest.raises(InputError, match="mode='all'"):
        lddt(ca_only, full_native, mode="all")
    with pytest.raises(InputError, match="mode="):
        lddt(ca_only, full_native, mode="backbone")
    far = np.array([[0.0, 0, 0], [40.0, 0, 0]])
    with pytest.raises(InputError, match="no distances"):
        lddt(far, far)
    out = lddt(ca_only, full_native).to_dict()
    assert set(out) == {"lddt", "mode", "n_distances", "n_residues", "per_residue"} and len(out["per_residue"]) == 63


def test_sequence_pairing_for_author_numbering(full_native):
    renumbered = Structure(chain_id="C", residue_numbers=full_native.residue_numbers + 200,
                           insertion_codes=full_native.insertion_codes, sequence=full_native.sequence,
                           atom37=full_native.atom37, atom37_mask=full_native.atom37_mask)
    assert lddt(full_native, renumbered, pairing="sequence").lddt == 1.0
