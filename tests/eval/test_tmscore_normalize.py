"""``normalize="sequence"`` against the TMscore program called as ``TMscore native model``.

Goldens: data/golden_tmscore_sequence.json (data/make_golden_sequence.py, see data/README.md).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from eval_testlib import DATA, STRUCTURES

from ptq_protein.eval.tmscore import TMNormalize, paired_ca, tm_score, tm_score_batch
from ptq_protein.support.errors import InputError

TM_TOLERANCE = 0.01  # as test_tmscore_golden: every pair
TM_MEAN_TOLERANCE = 0.002


@pytest.fixture(scope="module")
def golden_sequence() -> dict:
    return json.loads((DATA / "golden_tmscore_sequence.json").read_text())


def _score(cases, normalize):
    paired = [paired_ca(STRUCTURES / c["model"], STRUCTURES / c["native"], c["pairing"], normalize=normalize)
              for c in cases]
    return tm_score_batch([(m, n) for m, n, _ in paired], lengths=[length for _, _, length in paired])


def test_sequence_normalisation_matches_tmscore_native_model(golden_sequence):
    cases = golden_sequence["cases"]
    assert golden_sequence["called_as"] == "TMscore native model" and len(cases) == 106
    results = _score(cases, "sequence")
    deltas = np.array([r.tm_score - c["tmscore_sequence"]["tm_score"] for c, r in zip(cases, results)])
    assert np.abs(deltas).max() <= TM_TOLERANCE, cases[int(np.argmax(np.abs(deltas)))]["id"]
    assert np.abs(deltas).mean() <= TM_MEAN_TOLERANCE
    for case, result in zip(cases, results):
        ref = case["tmscore_sequence"]
        assert (result.length, result.n_aligned) == (ref["length"], ref["n_aligned"]), case["id"]
        assert abs(result.gdt_ts - ref["gdt_ts"]) <= 0.01, case["id"]


def test_missing_native_residues_count_only_under_sequence_normalisation(golden_sequence):
    """A full-sequence prediction exact on the observed residues: 1 by the native, observed/L by the sequence."""
    missing = [c for c in golden_sequence["cases"] if c["part"] == "missing"]
    assert len(missing) == 6
    for case in missing:
        model, native = STRUCTURES / case["model"], STRUCTURES / case["native"]
        by_native = tm_score(model, native, pairing="sequence")
        by_sequence = tm_score(model, native, pairing="sequence", normalize="sequence")
        assert abs(by_native.tm_score - case["tmscore_native"]["tm_score"]) <= TM_TOLERANCE, case["id"]
        assert abs(by_sequence.tm_score - case["tmscore_sequence"]["tm_score"]) <= TM_TOLERANCE, case["id"]
        assert by_native.length == case["tmscore_native"]["length"] < by_sequence.length
        if case["id"].startswith("exact_"):
            # closed form: every observed residue exact, so TM = n_observed / L_sequence
            assert by_native.tm_score == pytest.approx(1.0, abs=1e-9)
            assert by_sequence.tm_score == pytest.approx(by_native.length / by_sequence.length, abs=1e-9)


def test_default_is_native_and_bad_value_is_one_clear_error():
    ca = np.cumsum(np.random.default_rng(0).normal(size=(30, 3)), axis=0) * 2
    assert tm_score(ca, ca).length == tm_score(ca, ca, normalize=TMNormalize.NATIVE).length == 30
    with pytest.raises(InputError, match="tm_normalize='model' is not one of 'native', 'sequence'"):
        tm_score(ca, ca, normalize="model")
