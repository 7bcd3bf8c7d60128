"""Calibration batches: each family's default size, length-sorted padding, the given order at batch 1."""

import pytest

from ptq_protein.models.adapters import get_adapter

SEQS = ["MKTAYIAKQRQISFVKSHFS", "MKT", "MKTAYIAKQR", "MKTAYI", "MKTAYIAKQRQIS"]


def test_each_family_has_its_default_batch_size(esm2, esmfold):
    assert get_adapter(esm2).batch_size() == 4  # language models: padded batches are cheap
    assert get_adapter(esmfold).batch_size() == 1  # pair tensors: padding costs L^2, and the study's pass
    assert get_adapter(esmfold).batch_size(3) == 3
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            get_adapter(esm2).batch_size(bad)


def test_batches_sort_by_length_to_pad_little_but_keep_the_order_one_at_a_time(esm2):
    adapter = get_adapter(esm2)
    padded = [b.sequences for b in adapter.batches(SEQS, 2)]
    assert padded == [("MKT", "MKTAYI"), ("MKTAYIAKQR", "MKTAYIAKQRQIS"), ("MKTAYIAKQRQISFVKSHFS",)]
    assert [b.sequences for b in adapter.batches(SEQS, 1)] == [(s,) for s in SEQS]  # as the study's pass
    assert [len(b.sequences) for b in adapter.batches(SEQS)] == [4, 1]  # the family's default, 4
