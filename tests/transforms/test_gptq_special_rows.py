"""GPTQ's Hessian with the BOS/EOS rows (``GPTQSpec(special_rows=True)``) or with residue rows only (the default).

Reference: the site's input captured by a plain forward hook, its rows picked by the token ids themselves (BOS/EOS,
residues, padding), summed in float64.
"""

import torch
from tiny_fixtures import SEQS

from ptq_protein.calibration.hessian import input_hessian
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.tiny import tiny_esm2
from ptq_protein.recipes.config import GPTQSpec

SITE = "layers.1.fc1"


def _reference(model, batch):
    """(sum x x^T over residue rows, over residue and BOS/EOS rows, and the row counts) of SITE's input."""
    seen = []
    handle = model.get_submodule(SITE).register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            model(batch.inputs["tokens"])
    finally:
        handle.remove()
    x = seen[0].transpose(0, 1).double()  # fair-esm runs time first: [B, T, C]
    tokens = batch.inputs["tokens"]
    special = (tokens == model.cls_idx) | (tokens == model.eos_idx)
    residue = (tokens != model.padding_idx) & ~special
    out = []
    for rows in (residue, residue | special):
        picked = x[rows]
        out.append((picked.T @ picked, picked.shape[0]))
    return out, int(special.sum())


def test_the_hessian_takes_bos_eos_rows_only_when_asked():
    model = tiny_esm2(seed=0)[0].eval()
    adapter = get_adapter(model)
    batch = adapter.make_batch([SEQS[0], SEQS[1], SEQS[3]])  # padded: padding rows never count
    ((residues, n_residues), (both, n_both)), n_special = _reference(model, batch)
    assert n_special == 6 and n_both == n_residues + 6
    got, rows = input_hessian(model, adapter, SITE, [batch])
    assert rows == n_residues
    torch.testing.assert_close(got, residues, rtol=1e-12, atol=1e-9)
    got, rows = input_hessian(model, adapter, SITE, [batch], special=True)
    assert rows == n_both
    torch.testing.assert_close(got, both, rtol=1e-12, atol=1e-9)


def test_the_option_round_trips_and_old_configs_read_as_residues_only():
    on = GPTQSpec(special_rows=True)
    assert GPTQSpec.from_dict(on.to_dict()) == on
    assert "special_rows" not in GPTQSpec().to_dict()  # written as before the field existed
    assert GPTQSpec.from_dict({"damp": 0.01, "act_order": True, "block_size": 128, "group_size": -1}) == GPTQSpec()
