"""Bundled benchmark sets, set specs, pairing natives by id, and integrity checks."""

import gzip
import logging
import shutil

import pytest

from ptq_protein import data as bundle
from ptq_protein.data.sets import (
    BUNDLED_SETS,
    BenchmarkSet,
    Numbering,
    SetSpec,
    Target,
    load_set,
    match_natives,
    parse_set_spec,
    read_structure_text,
)
from ptq_protein.support.errors import ArtifactError, InputError

THREE_TO_ONE = {"ALA": "A", "ARG": "R", "ASN": "N", "ASP": "D", "CYS": "C", "GLN": "Q", "GLU": "E", "GLY": "G",
                "HIS": "H", "ILE": "I", "LEU": "L", "LYS": "K", "MET": "M", "PHE": "F", "PRO": "P", "SER": "S",
                "THR": "T", "TRP": "W", "TYR": "Y", "VAL": "V"}


def within_one_edit(a, b):
    """True when ``a`` and ``b`` differ by at most one substitution, insertion or deletion."""
    if abs(len(a) - len(b)) > 1:
        return False
    prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[prefix + 1:] == b[prefix + 1:] or a[prefix:] == b[prefix + 1:] or a[prefix + 1:] == b[prefix:]


def ca_residues(pdb_text):
    """[(residue number field, one-letter code)] of the first model's CA atoms, in file order."""
    out = []
    for line in pdb_text.splitlines():
        if line.startswith("ENDMDL"):
            break
        if line.startswith(("ATOM", "HETATM")) and line[12:16].strip() == "CA":
            out.append((line[22:27].strip(), THREE_TO_ONE.get(line[17:20], "X")))
    return out


@pytest.fixture(scope="module")
def sets():
    return {name: load_set(name) for name in BUNDLED_SETS}


def test_bundled_set_sizes_and_numbering(sets):
    cameo139, casp14, cameo2022 = sets["cameo139"], sets["casp14"], sets["cameo2022"]
    assert (len(cameo139), len(cameo139.with_natives())) == (139, 139)
    assert (len(casp14), len(casp14.with_natives())) == (173, 33)
    assert (len(cameo2022), len(cameo2022.with_natives())) == (183, 183)
    assert {t.numbering for t in cameo139} == {t.numbering for t in casp14} == {Numbering.SEQUENCE}
    assert {t.numbering for t in cameo2022} == {Numbering.AUTHOR}
    assert sum("eigenfold_sample" in t.metadata for t in cameo2022) == 40
    assert all(t.native_path is None or bundle.DATA_DIR in t.native_path.parents for s in sets.values() for t in s)


def test_casp14_calibration_set_is_first_50_in_file_order(sets):
    manifest_ids = bundle.load_manifest()["sets"]["casp14"]["ids"]
    calibration = load_set("casp14:50")
    assert calibration.ids == manifest_ids[:50] == sets["casp14"].ids[:50]
    assert calibration.ids[:3] == ["T1024", "T1025", "T1026"] and calibration.name == "casp14:50"
    assert len(set(calibration.ids)) == 50 and not any("#" in i for i in calibration.ids)
    # repeated CASP14 ids (hetero-complex subunits) are renamed, never merged or dropped
    assert "H0953#2" in sets["casp14"].ids and sets["casp14"].get("H0953").sequence != \
        sets["casp14"].get("H0953#2").sequence


def test_manifest_hashes_lengths_and_size():
    manifest = bundle.load_manifest()
    total = 0
    for rel, entry in manifest["files"].items():
        raw = (bundle.DATA_DIR / rel).read_bytes()
        total += len(raw)
        assert bundle.sha256_bytes(raw) == entry["sha256"], rel
        if rel.endswith(".gz"):
            assert bundle.sha256_bytes(gzip.decompress(raw)) == entry["source_sha256"], rel
    assert total < 20e6
    assert "cameo2022/LICENSE.EigenFold" in manifest["files"]
    assert "MIT" in (bundle.DATA_DIR / "cameo2022/LICENSE.EigenFold").read_text()
    for name in BUNDLED_SETS:
        loaded = load_set(name)
        assert manifest["sets"][name]["lengths"] == [t.length for t in loaded]
        assert manifest["sets"][name]["source"] and manifest["sets"][name]["license"]
    assert manifest["sets"]["casp14"]["unpaired_natives"] == ["casp14/native/T1044.pdb.gz"]


@pytest.mark.parametrize("name", ["cameo139", "casp14"])
def test_sequence_numbered_natives_match_their_sequence(sets, name):
    for target in sets[name].with_natives():
        residues = ca_residues(sets[name].native_text(target))
        assert len(residues) > 10
        for number, letter in residues:
            assert target.sequence[int(number) - 1] == letter, (target.id, number)


def test_cameo2022_natives_paired_by_id_not_order(sets):
    exact = 0
    for target in sets["cameo2022"]:
        observed = "".join(letter for _, letter in ca_residues(sets["cameo2022"].native_text(target)))
        expected = target.metadata["observed_sequence"]
        assert within_one_edit(observed, expected), target.id
        exact += observed == expected
        assert target.native_path.name == f"{target.id}.pdb.gz"
    assert exact == 181  # the source README: 2 of 183 files differ from seq by one residue
    assert within_one_edit("MKTAY", "MKAY") and within_one_edit("MKTAY", "MKSAY") and not within_one_edit("MK", "KM")


def test_eigenfold_samples_are_numbered_along_seqres(sets):
    cameo2022 = sets["cameo2022"]
    for target in [t for t in cameo2022 if "eigenfold_sample" in t.metadata][:10]:
        residues = ca_residues(read_structure_text(target.metadata["eigenfold_sample"]))
        assert [int(n) for n, _ in residues] == list(range(1, target.length + 1))
        assert "".join(letter for _, letter in residues) == target.sequence


def test_corrupt_bundled_files_raise_artifact_error(tmp_path, monkeypatch):
    shutil.copytree(bundle.DATA_DIR / "cameo139", tmp_path / "cameo139")
    shutil.copy(bundle.DATA_DIR / "manifest.json", tmp_path / "manifest.json")
    monkeypatch.setattr(bundle, "DATA_DIR", tmp_path)
    monkeypatch.setattr(bundle, "_verified", {})
    victim = tmp_path / "cameo139/native/7EQH.pdb.gz"
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))
    cameo = load_set("cameo139")  # natives are checked when read, not at load
    assert len(cameo.native_text("7ER0_A")) > 0
    with pytest.raises(ArtifactError, match="7EQH.pdb.gz is corrupt"):
        cameo.native_text("7EQH_A")
    (tmp_path / "cameo139/sequences.fasta.gz").write_bytes(b"truncated")
    with pytest.raises(ArtifactError, match="sequences.fasta.gz is corrupt"):
        load_set("cameo139")


def _user_set(tmp_path):
    fasta = tmp_path / "mine.fasta"
    fasta.write_text(">7EQH_A\nMKTAY\n>t2\nGGGG\n>7skh.B\nACDE\n>lonely\nMMMM\n")
    natives = tmp_path / "natives"
    natives.mkdir()
    # created in an order unrelated to the FASTA, with different case and compression
    (natives / "zzz_unused.pdb").write_text("ATOM\n")
    (natives / "7skh.B.pdb").write_text("REMARK skh\n")
    (natives / "T2.pdb.gz").write_bytes(gzip.compress(b"REMARK t2\n"))
    (natives / "7eqh.pdb").write_text("REMARK eqh\n")
    (natives / "notes.txt").write_text("not a structure")
    return fasta, natives


def test_user_natives_match_by_id(tmp_path, caplog):
    fasta, natives = _user_set(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ptq_protein.data.sets"):
        mine = load_set(f"{fasta}:{natives}")
    paths = {t.id: t.native_path.name if t.native_path else None for t in mine}
    assert paths == {"7EQH_A": "7eqh.pdb", "t2": "T2.pdb.gz", "7skh.B": "7skh.B.pdb", "lonely": None}
    assert "1 of 4 targets have no native" in caplog.text and "lonely" in caplog.text
    assert "zzz_unused.pdb" in caplog.text
    assert mine.native_text("t2") == "REMARK t2\n"
    assert {t.numbering for t in mine} == {Numbering.AUTHOR}
    extracted = mine.extract_native("t2", tmp_path / "out")
    assert extracted.name == "T2.pdb" and extracted.read_text() == "REMARK t2\n"
    with pytest.raises(InputError, match="no native structure"):
        mine.native_text("lonely")


def test_ambiguous_natives_are_an_error(tmp_path):
    fasta, natives = _user_set(tmp_path)
    (natives / "7skh.B.cif").write_text("data_x\n")
    with pytest.raises(InputError, match="matches several files"):
        match_natives(["7skh.B"], natives)
    with pytest.raises(InputError, match="not a folder"):
        match_natives(["a"], tmp_path / "nope")


def test_spec_syntax_and_python_forms(tmp_path):
    fasta, natives = _user_set(tmp_path)
    assert parse_set_spec("casp14:50") == SetSpec(name="casp14", limit=50)
    assert parse_set_spec(f"{fasta}:{natives}:2") == SetSpec(fasta=fasta, natives=natives, limit=2)
    assert parse_set_spec(f"{fasta}:3") == SetSpec(fasta=fasta, limit=3)
    assert parse_set_spec(fasta) == SetSpec(fasta=fasta)
    by_kwargs = load_set(fasta, natives=natives, limit=2, numbering="sequence")
    by_mapping = load_set({"fasta": str(fasta), "natives": str(natives), "limit": 2})
    assert by_kwargs.ids == by_mapping.ids == ["7EQH_A", "t2"]
    assert by_kwargs.targets[0].numbering is Numbering.SEQUENCE
    for bad, message in [("cameo139:natives", "has its own natives"), ("casp14:0", "positive integer"),
                         ("a:b:c", "is not NAME"), ("", "empty"), ({"fasta": "x", "extra": 1}, "unknown"),
                         ("camoe139", "neither a bundled set")]:
        with pytest.raises(InputError, match=message):
            load_set(bad)
    with pytest.raises(InputError, match="fewer than the 200"):
        load_set("cameo139:200")
    with pytest.raises(InputError, match="fixed numbering"):
        load_set("cameo139", numbering="author")


def test_set_operations(sets):
    cameo = sets["cameo139"]
    picked = cameo.select(["7ER0_A", "7EQH_A"])
    assert picked.ids == ["7ER0_A", "7EQH_A"] and picked.sequences() == [cameo.get("7ER0_A").sequence,
                                                                            cameo.get("7EQH_A").sequence]
    assert cameo.limit(3).ids == cameo.ids[:3] and len(list(iter(cameo.limit(3)))) == 3
    with pytest.raises(InputError, match="no target 'nope'"):
        cameo.select(["nope"])
    with pytest.raises(ValueError, match="repeated target ids"):
        BenchmarkSet("x", (Target("a", "MK"), Target("a", "GG")))
    with pytest.raises(ValueError, match="numbering="):
        Target("a", "MK", numbering="residue")
    with pytest.raises(ValueError, match="without whitespace"):
        Target("a b", "MK")
