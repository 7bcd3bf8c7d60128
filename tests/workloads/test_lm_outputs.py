"""One LM forward, the same outputs from fair-esm and transformers (tiny_esm2 and tiny_hf_esm2 share weights)."""

import pytest
import torch

from ptq_protein.models.lm_outputs import lm_forward, lm_info, lm_tokens, normalize_layers


def test_normalize_layers_follows_fair_esm():
    # fair-esm's extract.py: (i + num_layers + 1) % (num_layers + 1)
    assert normalize_layers([0, -1, 6, -13, 12], 12) == [0, 12, 6]
    for bad in (13, -14):
        with pytest.raises(ValueError, match=f"layer {bad} does not exist"):
            normalize_layers([bad], 12)


def test_fair_esm_and_transformers_agree(esm2, hf_esm2, seqs):
    tokens = lm_tokens(seqs[:3])
    a = lm_forward(esm2, tokens, [0, 1, 2], contacts=True)
    b = lm_forward(hf_esm2, tokens, [0, 1, 2], contacts=True)
    assert lm_info(esm2).num_layers == lm_info(hf_esm2).num_layers == 2
    for layer in (0, 1, 2):
        rows = tokens != 1  # padding rows differ between libraries and are never read
        torch.testing.assert_close(a.representations[layer][rows], b.representations[layer][rows], atol=1e-4,
                                   rtol=1e-4)
    torch.testing.assert_close(a.logits[tokens != 1], b.logits[tokens != 1], atol=1e-4, rtol=1e-4)
    L = len(seqs[0])
    torch.testing.assert_close(a.contacts[0, :L, :L], b.contacts[0, :L, :L], atol=1e-5, rtol=1e-4)


def test_transformers_contacts_leave_sdpa_in_place(hf_esm2, seqs):
    before = hf_esm2.config._attn_implementation
    out = lm_forward(hf_esm2, lm_tokens(seqs[:2]), [], contacts=True)
    assert out.contacts is not None and hf_esm2.config._attn_implementation == before
    # the contacts equal transformers' own predict_contacts under eager attention
    hf_esm2.set_attn_implementation("eager")
    try:
        tokens = lm_tokens(seqs[:2])
        ref = hf_esm2.esm.predict_contacts(tokens, (tokens != 1).long())
    finally:
        hf_esm2.set_attn_implementation(before)
    torch.testing.assert_close(out.contacts, ref)


def test_esmfold_is_refused_with_the_fix(esmfold):
    with pytest.raises(TypeError, match="ptq-protein fold"):
        lm_info(esmfold)
