"""TM-score, GDT and RMSD against golden values from the TMscore program (100 pairs of every quality).

How the goldens were made is in data/README.md (tests/eval/data/make_golden.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from eval_testlib import STRUCTURES

from ptq_protein.eval.tmscore import paired_ca, tm_score, tm_score_batch

TM_TOLERANCE = 0.01  # issue goal: every pair
TM_MEAN_TOLERANCE = 0.002  # issue goal: mean over pairs
GDT_TOLERANCE = 0.01
RMSD_TOLERANCE = 0.01  # Å; the program prints 3 decimals


@pytest.fixture(scope="module")
def scored(golden):
    """(case, our result) for every golden case, scored in one batch."""
    cases = golden["cases"]
    paired = [paired_ca(STRUCTURES / c["model"], STRUCTURES / c["native"], c["pairing"]) for c in cases]
    results = tm_score_batch([(m, n) for m, n, _ in paired], lengths=[length for _, _, length in paired])
    return list(zip(cases, results))


def test_golden_set_covers_every_quality(golden):
    cases = golden["cases"]
    assert len(cases) == 100
    assert {c["category"] for c in cases} == {"noise", "hinge", "register_shift", "unrelated", "missing", "short",
                                              "eigenfold"}
    tm = np.array([c["tmscore"]["tm_score"] for c in cases])
    assert tm.min() < 0.15 and tm.max() > 0.98
    assert np.histogram(tm, bins=[0, 0.3, 0.5, 0.7, 0.9, 1.0])[0].min() >= 5


def test_tm_score_matches_tmscore_program(scored):
    deltas = np.array([r.tm_score - c["tmscore"]["tm_score"] for c, r in scored])
    worst = int(np.argmax(np.abs(deltas)))
    assert np.abs(deltas).max() <= TM_TOLERANCE, scored[worst][0]["id"]
    assert np.abs(deltas).mean() <= TM_MEAN_TOLERANCE


def test_gdt_matches_tmscore_program(scored):
    ts = np.array([r.gdt_ts - c["tmscore"]["gdt_ts"] for c, r in scored])
    ha = np.array([r.gdt_ha - c["tmscore"]["gdt_ha"] for c, r in scored])
    assert np.abs(ts).max() <= GDT_TOLERANCE
    assert np.abs(ha).max() <= GDT_TOLERANCE


def test_rmsd_and_counts_match_tmscore_program(scored):
    for case, result in scored:
        ref = case["tmscore"]
        assert result.n_aligned == ref["n_aligned"], case["id"]
        assert result.length == ref["length"], case["id"]
        assert abs(result.rmsd - ref["rmsd"]) <= RMSD_TOLERANCE, case["id"]


@pytest.mark.parametrize("case_id",
                         ["noise_7VNA_8", "eigenfold_7oj2.A", "shift_7TZG_8", "missing_7TZG", "short_7TV9_12"])
def test_single_pair_api_reads_files(golden, case_id):
    case = next(c for c in golden["cases"] if c["id"] == case_id)
    result = tm_score(STRUCTURES / case["model"], STRUCTURES / case["native"], pairing=case["pairing"])
    assert result.tm_score == pytest.approx(case["tmscore"]["tm_score"], abs=1e-4)
    assert result.gdt_ts == pytest.approx(case["tmscore"]["gdt_ts"], abs=1e-4)


def test_against_tmtools_fixed_alignment(golden):
    """tmtools' TM-align with the identity alignment fixed, normalised by the paired length."""
    tmtools = pytest.importorskip("tmtools")
    cases = golden["cases"][::4]
    pairs = [paired_ca(STRUCTURES / c["model"], STRUCTURES / c["native"], c["pairing"])[:2] for c in cases]
    ours = tm_score_batch(pairs)  # default length: the paired rows, as tmtools normalises
    for case, (model, native), result in zip(cases, pairs, ours):
        seq = "A" * len(model)
        ref = tmtools.tm_align(np.ascontiguousarray(model), np.ascontiguousarray(native), seq, seq, [seq, seq])
        assert result.tm_score == pytest.approx(ref.tm_norm_chain2, abs=1e-4), case["id"]
