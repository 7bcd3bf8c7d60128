"""Global sequence alignment against Biopython's PairwiseAligner, and residue pairing."""

from __future__ import annotations

import numpy as np
import pytest

from ptq_protein.eval.align import Pairing, global_align, pair_residues
from ptq_protein.eval.structure import Structure
from ptq_protein.support.errors import InputError

AMINO = list("ACDEFGHIKLMNPQRSTVWY")


@pytest.fixture(scope="module")
def aligner():
    from Bio import Align
    from Bio.Align import substitution_matrices

    al = Align.PairwiseAligner(mode="global", substitution_matrix=substitution_matrices.load("BLOSUM62"),
                               open_gap_score=-11, extend_gap_score=-1)
    al.end_gap_score = 0
    return al


def _mutate(seq: str, rng: np.random.Generator, edits: int) -> str:
    out = list(seq)
    for _ in range(edits):
        k = int(rng.integers(0, len(out)))
        op = rng.integers(3)
        if op == 0 and len(out) > 1:
            del out[k]
        elif op == 1:
            out.insert(k, str(rng.choice(AMINO)))
        else:
            out[k] = str(rng.choice(AMINO))
    return "".join(out)


def _path_score(a: str, b: str, ia: np.ndarray, ib: np.ndarray) -> int:
    """Score of the alignment given by its aligned columns (free end gaps)."""
    from Bio.Align import substitution_matrices

    m = substitution_matrices.load("BLOSUM62")
    score = sum(int(m[a[i], b[j]]) for i, j in zip(ia, ib))
    for index in (ia, ib):
        gaps = np.diff(index) - 1
        score -= sum(11 + (g - 1) for g in gaps[gaps > 0])
    return score


def test_optimal_score_matches_biopython(aligner):
    rng = np.random.default_rng(0)
    for trial in range(120):
        a = "".join(rng.choice(AMINO, int(rng.integers(1, 60))))
        b = _mutate(a, rng,
                    int(rng.integers(0, 10))) if trial % 2 else "".join(rng.choice(AMINO, int(rng.integers(1, 60))))
        aln = global_align(a, b)
        assert aln.score == aligner.score(a, b), (a, b)
        assert _path_score(a, b, aln.index_a, aln.index_b) == aln.score
        assert np.all(np.diff(aln.index_a) > 0) and np.all(np.diff(aln.index_b) > 0)


def _gotoh_score(a: str, b: str, gap_open: int = 11, gap_extend: int = 1) -> int:
    """Best global score with free end gaps: an independent float-free O(n*m) Gotoh in plain Python."""
    from Bio.Align import substitution_matrices

    m = substitution_matrices.load("BLOSUM62")
    neg = -10 ** 9
    n, k = len(a), len(b)
    h = [[0] * (k + 1) for _ in range(n + 1)]  # zero borders: leading gaps are free
    e = [[neg] * (k + 1) for _ in range(n + 1)]
    f = [[neg] * (k + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, k + 1):
            e[i][j] = max(h[i - 1][j] - gap_open, e[i - 1][j] - gap_extend)
            f[i][j] = max(h[i][j - 1] - gap_open, f[i][j - 1] - gap_extend)
            h[i][j] = max(h[i - 1][j - 1] + int(m[a[i - 1], b[j - 1]]), e[i][j], f[i][j])
    return max(max(h[n]), max(row[k] for row in h))  # trailing gaps are free


def test_optimal_score_matches_an_independent_gotoh():
    rng = np.random.default_rng(7)
    for trial in range(40):
        a = "".join(rng.choice(AMINO, int(rng.integers(1, 25))))
        b = _mutate(a, rng,
                    int(rng.integers(0, 6))) if trial % 2 else "".join(rng.choice(AMINO, int(rng.integers(1, 25))))
        aln = global_align(a, b)
        assert aln.score == _gotoh_score(a, b) == _path_score(a, b, aln.index_a, aln.index_b), (a, b)


def test_native_fragment_with_a_deletion_aligns_exactly():
    rng = np.random.default_rng(1)
    full = "".join(rng.choice(AMINO, 200))
    observed = full[12:80] + full[95:190]  # missing termini and an internal loop
    aln = global_align(observed, full)
    expected = np.r_[12:80, 95:190]
    np.testing.assert_array_equal(aln.index_b, expected)
    np.testing.assert_array_equal(aln.index_a, np.arange(len(observed)))
    assert aln.n_identical == len(observed)


def test_bad_alignment_input():
    with pytest.raises(InputError):
        global_align("", "ACD")
    with pytest.raises(InputError):
        global_align("AC", "AC", gap_open=1, gap_extend=2)
    assert global_align("ACDZ*", "ACDX").index_a.size == 4  # unknown letters score as X


@pytest.mark.parametrize("pairing", list(Pairing))
def test_every_pairing_pairs_an_identical_chain_one_to_one(pairing):
    ca = np.cumsum(np.ones((30, 3)), axis=0)
    s = Structure.from_arrays(ca, sequence="ACDEFGHIKLMNPQRSTVWY" + "ACDEFGHIKL", residue_numbers=np.arange(101, 131))
    im, jn = pair_residues(s, s, pairing)
    np.testing.assert_array_equal(im, np.arange(30))
    np.testing.assert_array_equal(jn, np.arange(30))


def test_pairing_by_number_uses_insertion_codes():
    ca = np.zeros((4, 3)) + np.arange(4)[:, None]
    native = Structure.from_arrays(ca, residue_numbers=[51, 52, 52, 53], insertion_codes=["", "", "A", ""])
    model = Structure.from_arrays(ca[[0, 2, 3]], residue_numbers=[51, 52, 53], insertion_codes=["", "A", ""])
    im, jn = pair_residues(model, native, "number")
    assert list(zip(im.tolist(), jn.tolist())) == [(0, 0), (1, 2), (2, 3)]
    with pytest.raises(InputError, match="pairing"):
        pair_residues(model, native, "by-magic")
    with pytest.raises(InputError, match="needs residue names"):
        pair_residues(model, native, "sequence")  # arrays without a sequence read as all X
