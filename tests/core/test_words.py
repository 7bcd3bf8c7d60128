"""What the toolkit says must be true: warnings on poor pairings, mixed widths, yes/no variables, odd paths."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from ptq_protein.data.fasta import read_fasta
from ptq_protein.eval.structure import Structure
from ptq_protein.eval.tmscore import tm_score
from ptq_protein.recipes.site_plan import MixedPlan
from ptq_protein.search.metrics import Metric, choose_metric
from ptq_protein.support.errors import InputError
from ptq_protein.support.io_utils import env_flag
from ptq_protein.workflows.recipe_compare import plan_widths

LETTERS = np.array(list("ACDEFGHIKLMNPQRSTVWY"))


def _walk(n, seed):
    steps = np.random.default_rng(seed).normal(size=(n, 3))
    return np.cumsum(3.8 * steps / np.linalg.norm(steps, axis=1, keepdims=True), axis=0)


def test_unrelated_chains_paired_by_number_warn():
    """Two unrelated chains sharing 9 residue numbers: scored, but with a warning naming why (as TMscore shows the
    aligned sequences); the same chain against itself stays silent."""
    rng = np.random.default_rng(0)
    a = Structure.from_arrays(_walk(60, 1), sequence="".join(rng.choice(LETTERS, 60)))
    b = Structure.from_arrays(_walk(9, 2), sequence="".join(rng.choice(LETTERS, 9)),
                              residue_numbers=np.arange(52, 61))
    big = Structure.from_arrays(_walk(60, 3), sequence="".join(rng.choice(LETTERS, 60)))
    with pytest.warns(UserWarning, match="same amino acid"):
        tm_score(big, a)
    with pytest.warns(UserWarning, match="same amino acid"):  # the audit's case: 9 pairs of unrelated residues
        tm_score(b, a)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tm_score(a, a).tm_score == pytest.approx(1.0)

def test_few_pairs_warn():
    rng = np.random.default_rng(1)
    seq = "".join(rng.choice(LETTERS, 60))
    a = Structure.from_arrays(_walk(60, 1), sequence=seq)
    shifted = Structure.from_arrays(_walk(60, 1), sequence=seq, residue_numbers=np.arange(1, 61) + 50)
    with pytest.warns(UserWarning, match="only 10 of 60 residues pair"):
        tm_score(shifted, a)


def test_mixed_plan_widths_are_shown_not_fp():
    plan = MixedPlan(units=(("layer0", "w4a8-pwlq", ("a",)), ("layer1", "w8a6-pwlq", ("b",)),
                            ("layer2", "fp", ("c",))), avg_bits=5.06)
    assert plan_widths(plan) == ("fp-4-8", "fp-6-8")
    assert plan_widths(MixedPlan(units=(("l", "w8a8-pwlq", ("a",)),))) == ("8", "8")


def test_auto_metric_contradicting_the_budget_is_refused():
    with pytest.raises(InputError, match="contradicts"):
        choose_metric("fair-esm", "contacts", budget_metric="logits")
    with pytest.raises(InputError, match="folding model"):
        choose_metric("fair-esm", "tm")
    assert choose_metric("hf-esmfold") is Metric.TM and choose_metric("hf-esm") is Metric.LOGITS


@pytest.mark.parametrize("value, expected", [("", False), ("0", False), ("false", False), ("No", False),
                                             ("1", True), ("yes", True), (" TRUE ", True), ("on", True)])
def test_env_flag_reads_yes_and_no(monkeypatch, value, expected):
    monkeypatch.setenv("PTQ_TEST_FLAG", value)
    assert env_flag("PTQ_TEST_FLAG") is expected


def test_env_flag_refuses_other_words(monkeypatch):
    monkeypatch.setenv("PTQ_TEST_FLAG", "maybe")
    with pytest.raises(InputError, match="PTQ_TEST_FLAG='maybe'"):
        env_flag("PTQ_TEST_FLAG")


def test_memory_check_is_not_skipped_by_zero(monkeypatch, tmp_path):
    from ptq_protein.workflows import memory_budget

    weights = tmp_path / "w.pt"
    weights.write_bytes(b"0" * 1000)
    monkeypatch.setattr(memory_budget, "available_memory_bytes", lambda: 10)
    monkeypatch.setenv("PTQ_PROTEIN_SKIP_MEMORY_CHECK", "0")
    assert memory_budget.shortfall(weights, low_memory=False, calibration_tokens=10) is not None
    monkeypatch.setenv("PTQ_PROTEIN_SKIP_MEMORY_CHECK", "1")
    assert memory_budget.shortfall(weights, low_memory=False, calibration_tokens=10) is None


def test_fasta_from_a_device_or_folder_says_so(tmp_path):
    with pytest.raises(InputError, match="is a device"):
        list(read_fasta("/dev/null"))
    with pytest.raises(InputError, match="is a folder"):
        list(read_fasta(tmp_path))
    with pytest.raises(InputError, match="not found"):
        list(read_fasta(tmp_path / "missing.fasta"))


def test_did_you_mean_for_models_and_presets():
    from ptq_protein.models.loading import load_model
    from ptq_protein.recipes.presets import get_preset

    with pytest.raises(InputError, match="did you mean 'esm2_t6_8M_UR50D'"):
        load_model("esm2_t6_8M")
    with pytest.raises(ValueError, match="did you mean 'w8a8-pwlq'"):
        get_preset("w8a8-pwql")


def test_contact_labels_use_the_column_spelling():
    """One spelling of contact metrics: every summary label names its column's statistic as the column does."""
    from ptq_protein.eval.bench.contacts_task import CONTACT_METRICS

    for metric in CONTACT_METRICS:
        stat = metric.column.split("_", 1)[1]
        if "@" in stat:
            assert stat in metric.label, (metric.column, metric.label)
