"""Reading structures: PDB, PDB.gz, mmCIF, text, ESMFold's PDB output, arrays; the atom37 layout."""

from __future__ import annotations

import gzip
import io

import numpy as np
import pytest
import torch
from eval_testlib import FULL_NATIVE, ca_residues, pdb_lines, random_walk

from ptq_protein.eval.atoms import ATOM37_INDEX, ATOM37_NAMES
from ptq_protein.eval.structure import Structure, as_structure, load_structure


def test_atom37_names_are_openfolds():
    from transformers.models.esm.openfold_utils import residue_constants

    assert list(ATOM37_NAMES) == list(residue_constants.atom_types)


def test_reads_the_native(full_native, full_native_text):
    s = full_native
    assert (len(s), s.chain_id) == (63, "C")
    assert s.residue_numbers.tolist() == list(range(1, 64))
    assert s.sequence.startswith("M") and "X" not in s.sequence
    first_ca = next(line for line in full_native_text.splitlines() if line[12:16] == " CA ")
    np.testing.assert_allclose(s.ca[0], [float(first_ca[30:38]), float(first_ca[38:46]), float(first_ca[46:54])],
                               atol=1e-4)
    n_atoms = sum(1 for line in full_native_text.splitlines() if line.startswith("ATOM") and line[76:78].strip() != "H")
    assert s.atom37_mask.sum() == n_atoms
    assert s.has_side_chains
    with pytest.raises(ValueError):
        s.atom37[0, 0, 0] = 1.0  # read-only


def test_pdb_gz_text_and_mmcif_agree(tmp_path, full_native, full_native_text):
    from Bio.PDB import MMCIFIO, PDBParser

    plain = tmp_path / "native.pdb"
    plain.write_text(full_native_text)
    parsed = PDBParser(QUIET=True).get_structure("x", str(plain))
    writer = MMCIFIO()
    writer.set_structure(parsed)
    cif = tmp_path / "native.cif"
    writer.save(str(cif))
    gz_cif = tmp_path / "native.cif.gz"
    gz_cif.write_bytes(gzip.compress(cif.read_bytes()))
    for source in (plain, str(plain), full_native_text, cif, gz_cif, cif.read_text()):
        other = load_structure(source)
        assert other.sequence == full_native.sequence
        np.testing.assert_array_equal(other.residue_numbers, full_native.residue_numbers)
        np.testing.assert_array_equal(other.atom37_mask, full_native.atom37_mask)
        np.testing.assert_allclose(other.atom37, full_native.atom37, atol=1e-3)


def test_esmfold_output_to_pdb_round_trip(full_native):
    """The path other teams use: EsmForProteinFolding.output_to_pdb text -> load_structure."""
    from transformers.models.esm.modeling_esmfold import EsmForProteinFolding
    from transformers.models.esm.openfold_utils import data_transforms, residue_constants

    aatype = torch.tensor([residue_constants.restype_order.get(c, 20) for c in full_native.sequence])
    masks = data_transforms.make_atom14_masks({"aatype": aatype})
    index = masks["residx_atom14_to_atom37"].long()[..., None].expand(-1, -1, 3)
    atom14 = torch.gather(torch.tensor(full_native.atom37), 1, index)
    output = {"positions": atom14[None, None].float(), "aatype": aatype[None],
              "atom37_atom_exists": masks["atom37_atom_exists"][None],
              "residx_atom37_to_atom14": masks["residx_atom37_to_atom14"][None],
              "residue_index": torch.arange(len(full_native))[None],
              "plddt": torch.full((1, len(full_native), 37), 80.0)}
    pdb = EsmForProteinFolding.output_to_pdb(output)[0]
    pred = load_structure(pdb)
    assert pred.chain_id == "A" and pred.sequence == full_native.sequence
    assert pred.residue_numbers.tolist() == list(range(1, 64))
    expected_mask = masks["atom37_atom_exists"].bool().numpy()
    np.testing.assert_array_equal(pred.atom37_mask, expected_mask)
    both = expected_mask & full_native.atom37_mask
    np.testing.assert_allclose(pred.atom37[both], full_native.atom37[both], atol=1e-3)
    from ptq_protein.eval.tmscore import tm_score

    assert tm_score(pdb, FULL_NATIVE).tm_score == pytest.approx(1.0, abs=1e-6)


def test_from_arrays_numbering_nan_rows_and_torch():
    ca = random_walk(10, seed=0)
    ca[4] = np.nan
    s = Structure.from_arrays(torch.tensor(ca), sequence="acdefghikl")
    assert s.residue_numbers.tolist() == list(range(1, 11))
    assert s.sequence == "ACDEFGHIKL"
    assert not s.atom37_mask[4, ATOM37_INDEX["CA"]] and np.isnan(s.ca[4]).all()
    assert not s.has_side_chains
    np.testing.assert_array_equal(s.ca[5], ca[5])
    assert as_structure(ca).residue_numbers.tolist() == list(range(1, 11))
    with pytest.raises(ValueError, match="unique"):
        Structure.from_arrays(ca, residue_numbers=[1] * 10)
    with pytest.raises(ValueError, match="shape"):
        Structure.from_arrays(ca, residue_numbers=[1, 2])


def test_selenomethionine_reads_as_methionine():
    lines = pdb_lines([("ALA", 1, "", [("N", (0, 0, 0)), ("CA", (1.4, 0, 0)), ("C", (2, 1.2, 0))])])
    lines += pdb_lines([("MSE", 2, "", [("N", (3.2, 1.3, 0)), ("CA", (4, 2.4, 0)), ("C", (5.4, 2.0, 0)),
                                        ("SE", (4.5, 3.5, 2.0))])], record="HETATM")
    lines += pdb_lines([("HOH", 3, "", [("O", (9, 9, 9))])], record="HETATM")
    s = load_structure("\n".join(lines) + "\nEND\n")
    assert s.sequence == "AM" and len(s) == 2
    assert s.atom37_mask[1, ATOM37_INDEX["SD"]]
    np.testing.assert_allclose(s.atom37[1, ATOM37_INDEX["SD"]], [4.5, 3.5, 2.0], atol=1e-3)


def test_alternate_locations_take_altloc_a():
    base = pdb_lines(ca_residues(random_walk(3, seed=1)))
    line = base[1]
    alt_a = line[:16] + "A" + line[17:54] + "  0.30" + line[60:]
    alt_b = line[:16] + "B" + line[17:30] + f"{50.0:8.3f}{50.0:8.3f}{50.0:8.3f}" + "  0.70" + line[60:]
    s = load_structure("\n".join([base[0], alt_a, alt_b, base[2]]) + "\nEND\n")
    np.testing.assert_allclose(s.ca[1], [float(line[30:38]), float(line[38:46]), float(line[46:54])], atol=1e-3)


def test_unknown_residue_reads_as_x():
    s = load_structure("\n".join(pdb_lines(ca_residues(random_walk(3, seed=2), resname="UNK"))) + "\n")
    assert s.sequence == "XXX"


def test_select_and_labels(full_native):
    sub = full_native.select([5, 6, 7])
    assert sub.residue_numbers.tolist() == [6, 7, 8]
    assert sub.residue_labels() == ["6", "7", "8"]
    assert sub.sequence == full_native.sequence[5:8]
    assert "length=3" in repr(sub)


def test_a_file_handle_is_refused_with_a_clear_message(full_native_text):
    with pytest.raises(TypeError, match="file path or the file's text"):
        load_structure(io.StringIO(full_native_text))


def test_package_exports_resolve():
    import ptq_protein.eval as ev

    for name in ev.__all__:
        assert getattr(ev, name) is not None
    with pytest.raises(AttributeError):
        ev.no_such_name  # noqa: B018
