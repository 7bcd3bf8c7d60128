"""Hand-made TM-score cases: identity, rigid-motion and order invariance, hinge, register shift, API contract."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from eval_testlib import ca_residues, pdb_lines, random_rotation, random_walk

from ptq_protein.eval.structure import Structure, load_structure
from ptq_protein.eval.tmscore import TMScoreResult, tm_score, tm_score_batch
from ptq_protein.eval.tmsearch import d0_from_length, seed_lengths
from ptq_protein.support.errors import InputError


def test_identity_scores_one(full_native):
    result = tm_score(full_native, full_native)
    assert result.tm_score == pytest.approx(1.0, abs=1e-12)
    assert result.gdt_ts == result.gdt_ha == 1.0
    assert result.rmsd == pytest.approx(0.0, abs=1e-6)
    assert result.n_aligned == result.length == 63


def test_invariant_under_rigid_motions():
    rng = np.random.default_rng(1)
    native = random_walk(120, seed=2)
    model = native + rng.normal(0, 2.0, native.shape)
    ref = tm_score(model, native)
    for _ in range(3):
        moved_model = model @ random_rotation(rng).T + rng.normal(0, 50, 3)
        moved_native = native @ random_rotation(rng).T + rng.normal(0, 50, 3)
        other = tm_score(moved_model, moved_native)
        assert other.tm_score == pytest.approx(ref.tm_score, abs=1e-9)
        assert other.gdt_ts == pytest.approx(ref.gdt_ts, abs=1e-12)
        assert other.rmsd == pytest.approx(ref.rmsd, abs=1e-9)


def test_invariant_under_atom_and_residue_order_in_files(full_native_text):
    """Shuffling atom records within residues, or residue blocks of the model, changes nothing."""
    rng = np.random.default_rng(3)
    atoms = [line for line in full_native_text.splitlines() if line.startswith("ATOM")]
    blocks = {}
    for line in atoms:
        blocks.setdefault(line[22:27], []).append(line)
    noisy = []
    for key in blocks:  # perturb the model a little so the search has work to do
        for line in blocks[key]:
            xyz = np.array([float(line[30:38]), float(line[38:46]), float(line[46:54])]) + rng.normal(0, 1.5, 3)
            noisy.append(line[:30] + "".join(f"{v:8.3f}" for v in xyz) + line[54:])
    model_text = "\n".join(noisy) + "\nEND\n"
    ref = tm_score(model_text, full_native_text)
    shuffled = {}
    for line in noisy:
        shuffled.setdefault(line[22:27], []).append(line)
    order = list(shuffled)
    rng.shuffle(order)
    lines = [line for key in order for line in rng.permutation(shuffled[key]).tolist()]
    other = tm_score("\n".join(lines) + "\nEND\n", full_native_text)
    assert other.tm_score == pytest.approx(ref.tm_score, abs=1e-12)
    assert other.gdt_ts == ref.gdt_ts and other.gdt_ha == ref.gdt_ha


def test_two_domain_hinge_keeps_the_larger_domain():
    native = random_walk(150, seed=4)
    hinge = 90  # domains of 90 and 60 residues
    axis = np.array([0.3, -0.5, 0.8]) / np.linalg.norm([0.3, -0.5, 0.8])
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    rotation = np.eye(3) + np.sin(2.5) * k + (1 - np.cos(2.5)) * k @ k  # 143 degrees
    model = native.copy()
    model[hinge:] = (native[hinge:] - native[hinge]) @ rotation.T + native[hinge]
    result = tm_score(model, native)
    # the large domain alone superposes exactly: at least its share of the score, and of GDT
    assert result.tm_score >= hinge / 150 - 1e-9
    assert result.gdt_ts >= hinge / 150 - 1e-9
    assert result.tm_score < 0.9
    assert result.rmsd > 5.0


def test_shifted_register_by_number_and_by_sequence():
    rng = np.random.default_rng(5)
    native_ca = random_walk(80, seed=6)
    letters = "".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWY"), 80))
    native = Structure.from_arrays(native_ca, sequence=letters)
    shifted = Structure.from_arrays(native_ca, sequence=letters, residue_numbers=np.arange(1, 81) + 3)
    by_number = tm_score(shifted, native)
    assert by_number.n_aligned == 77 and by_number.length == 80
    assert by_number.tm_score < 0.5
    by_sequence = tm_score(shifted, native, pairing="sequence")
    assert by_sequence.n_aligned == 80
    assert by_sequence.tm_score == pytest.approx(1.0, abs=1e-12)


def test_missing_model_residues_normalise_by_native_length():
    native = random_walk(60, seed=7)
    model = native.copy()
    model[10:20] = np.nan  # unresolved in the model
    result = tm_score(model, native)
    assert result.n_aligned == 50 and result.length == 60
    assert result.tm_score == pytest.approx(50 / 60, abs=1e-12)
    assert result.gdt_ts == pytest.approx(50 / 60, abs=1e-12)


def test_d0_and_seed_lengths_follow_tmscore():
    assert d0_from_length(10) == 0.5 and d0_from_length(15) == 0.5 and d0_from_length(21) == 0.5
    assert d0_from_length(100) == pytest.approx(1.24 * 85 ** (1 / 3) - 1.8)
    assert d0_from_length(22) == pytest.approx(max(0.5, 1.24 * 7 ** (1 / 3) - 1.8))
    assert seed_lengths(300) == [300, 150, 75, 37, 18, 4]
    assert seed_lengths(1000) == [1000, 500, 250, 125, 62, 4]
    assert seed_lengths(100) == [100, 50, 25, 12, 6, 4]
    assert seed_lengths(8) == [8, 4]
    assert seed_lengths(3) == [3]


def test_batch_matches_single_and_torch_matches_numpy():
    rng = np.random.default_rng(8)
    pairs = []
    for n, sigma in [(40, 1.0), (95, 3.0), (130, 6.0), (17, 0.5)]:
        native = random_walk(n, seed=n)
        pairs.append((native + rng.normal(0, sigma, native.shape), native))
    batch = tm_score_batch(pairs)
    for pair, result in zip(pairs, batch):
        _assert_same(tm_score(*pair), result)
    tensors = [(torch.tensor(m), torch.tensor(n)) for m, n in pairs]
    for a, b in zip(tm_score_batch(tensors), batch):
        _assert_same(a, b)
    single = tm_score_batch([(m.float(), n.float()) for m, n in tensors], dtype=torch.float32)
    for a, b in zip(single, batch):
        assert a.tm_score == pytest.approx(b.tm_score, abs=1e-4)


def _assert_same(a: TMScoreResult, b: TMScoreResult) -> None:
    """Equal up to summation order (padding differs between batch compositions)."""
    assert (a.n_aligned, a.length) == (b.n_aligned, b.length)
    for name in ("tm_score", "rmsd", "gdt_ts", "gdt_ha"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), abs=1e-9), name


def test_pdb_text_and_arrays_agree():
    native = random_walk(50, seed=9)
    model = native + np.random.default_rng(10).normal(0, 1.0, native.shape)
    text_model = "\n".join(pdb_lines(ca_residues(model))) + "\nEND\n"
    text_native = "\n".join(pdb_lines(ca_residues(native))) + "\nEND\n"
    from_text = tm_score(text_model, text_native)
    from_arrays = tm_score(np.round(model, 3), np.round(native, 3))
    assert from_text.tm_score == pytest.approx(from_arrays.tm_score, abs=1e-6)  # Biopython reads float32
    assert load_structure(text_model).sequence == "A" * 50


def test_result_contract():
    result = TMScoreResult(tm_score=0.5, rmsd=2.0, gdt_ts=0.4, gdt_ha=0.3, n_aligned=10, length=12)
    assert result.to_dict() == {"tm_score": 0.5, "rmsd": 2.0, "gdt_ts": 0.4, "gdt_ha": 0.3, "n_aligned": 10,
                                "length": 12}
    with pytest.raises(ValueError):
        TMScoreResult(tm_score=1.5, rmsd=2.0, gdt_ts=0.4, gdt_ha=0.3, n_aligned=10, length=12)
    with pytest.raises(ValueError):
        TMScoreResult(tm_score=0.5, rmsd=2.0, gdt_ts=0.4, gdt_ha=0.3, n_aligned=13, length=12)


def test_batch_input_errors():
    ca = random_walk(20, seed=11)
    assert tm_score_batch([]) == []
    with pytest.raises(InputError, match="pair them first"):
        tm_score_batch([(ca, ca[:10])])
    with pytest.raises(InputError, match="smaller than"):
        tm_score_batch([(ca, ca)], lengths=[5])
    with pytest.raises(InputError, match="no finite pair"):
        tm_score_batch([(np.full((5, 3), np.nan), ca[:5])])
    with pytest.raises(InputError, match="\\[N, 3\\]"):
        tm_score_batch([(ca[:, :2], ca[:, :2])])
    with pytest.warns(UserWarning, match="degenerate"):
        tm_score_batch([(ca[:2], ca[:2])])


@pytest.mark.gpu
def test_cuda_tensors_stay_on_gpu_and_agree():
    rng = np.random.default_rng(12)
    pairs = [(n + rng.normal(0, s, n.shape), n) for s, n in [(1.0, random_walk(200, 1)), (4.0, random_walk(90, 2))]]
    cpu = tm_score_batch(pairs)
    gpu = tm_score_batch([(torch.tensor(m, device="cuda"), torch.tensor(n, device="cuda")) for m, n in pairs])
    for a, b in zip(cpu, gpu):
        _assert_same(a, b)


def test_small_memory_budget_gives_the_same_scores():
    """Blocks of a few states and one pair per chunk: the same search, in pieces."""
    from ptq_protein.eval.tmsearch import tm_search

    rng = np.random.default_rng(13)
    natives = [random_walk(n, seed=n) for n in (30, 75, 120)]
    models = [nat + rng.normal(0, 3.0, nat.shape) for nat in natives]
    width = max(len(n) for n in natives)
    x = torch.zeros(3, width, 3, dtype=torch.float64)
    y = torch.zeros_like(x)
    for b, (m, n) in enumerate(zip(models, natives)):
        x[b, : len(m)], y[b, : len(n)] = torch.tensor(m), torch.tensor(n)
    n_common = torch.tensor([len(n) for n in natives])
    full = tm_search(x, y, n_common, n_common)
    small = tm_search(x, y, n_common, n_common, chunk_elements=600)
    torch.testing.assert_close(small.tm_score, full.tm_score, rtol=0, atol=1e-12)
    assert torch.equal(small.gdt_counts, full.gdt_counts)
