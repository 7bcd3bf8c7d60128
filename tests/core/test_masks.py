"""valid_boxes selects exactly the positions align_mask selects, as views, in every layout."""

import pytest
import torch

from ptq_protein.calibration.masks import align_mask, valid_boxes

B, T, L, C, H = 3, 9, 7, 5, 2


def _masks():
    """BOS + residues + EOS + padding; sequence lengths 7, 4 and 0 (an empty one)."""
    lengths = [7, 4, 0]
    residue = torch.zeros(B, L, dtype=torch.bool)
    for b, n in enumerate(lengths):
        residue[b, :n] = True
    token = torch.nn.functional.pad(residue, (1, 1), value=False)
    return token, residue


LAYOUTS = [((B, T, C), True), ((T, B, C), True), ((B, L, L, C), True), ((B, L, C), True),
           ((B * H, T, T), False), ((B * T, C), True), ((T, B, 2 * C), True)]


@pytest.mark.parametrize("shape, channel_last", LAYOUTS, ids=[str(s) for s, _ in LAYOUTS])
def test_boxes_hold_exactly_the_masked_values(shape, channel_last):
    token, residue = _masks()
    x = torch.randn(shape)
    mask = align_mask(shape, token, residue, channel_last=channel_last)
    want = x[mask.expand(shape)] if not channel_last else x[mask.expand(*shape[:-1], 1).squeeze(-1)]
    boxes = valid_boxes(shape, token, residue, channel_last=channel_last)
    assert boxes is not None and len(boxes) == 2  # the empty sequence has no box
    parts = [x[box] for box in boxes]
    assert all(p.data_ptr() >= x.data_ptr() and p._base is x for p in parts)  # views, not copies
    got = torch.cat([p.reshape(-1) for p in parts])
    assert torch.equal(got.sort().values, want.reshape(-1).sort().values)


def test_boxes_refuse_a_mask_with_two_runs():
    token, residue = _masks()
    token[0, 3] = False  # a hole inside sequence 0
    assert valid_boxes((B, T, C), token, residue) is None
    assert align_mask((B, T, C), token, residue) is not None  # the boolean path still works


def test_boxes_refuse_unknown_layouts():
    token, residue = _masks()
    assert valid_boxes((11, 13, C), token, residue) is None
