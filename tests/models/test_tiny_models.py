"""Tiny seeded models: real classes, deterministic weights, fair-esm and transformers agree."""

import pytest
import torch

from ptq_protein.models import TINY_MODELS, build_tiny, tiny_esm2, tiny_esmfold, tiny_esmfold_config, tiny_hf_esm2
from ptq_protein.models.tokens import tokenize_esmfold, tokenize_fair_esm, tokenize_hf_esm

SEQUENCES = ["MKTAYIAKQRQISFVKSHFSRQ", "GSHMLEDPV"]


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tiny_esm2_is_the_real_class_and_deterministic():
    from esm.model.esm2 import ESM2

    model, alphabet = tiny_esm2(seed=0)
    assert isinstance(model, ESM2) and not model.training
    assert (model.num_layers, model.embed_dim, model.attention_heads) == (2, 64, 4)
    assert alphabet.all_toks[:4] == ["<cls>", "<pad>", "<eos>", "<unk>"] and len(alphabet.all_toks) == 33
    assert _same_state(model, tiny_esm2(seed=0)[0])
    assert not _same_state(model, tiny_esm2(seed=1)[0])
    assert torch.count_nonzero(model.embed_tokens.weight[alphabet.padding_idx]) == 0
    tokens, _ = tokenize_fair_esm(alphabet, SEQUENCES)
    with torch.no_grad():
        logits = model(tokens)["logits"]
    assert logits.shape == (2, len(SEQUENCES[0]) + 2, 33) and torch.isfinite(logits).all()


def test_seeding_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_esm2(seed=5)
    tiny_hf_esm2(seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_hf_tiny_esm2_has_the_same_weights_and_outputs_as_fair_esm():
    from transformers import EsmForMaskedLM, EsmTokenizer

    fair, alphabet = tiny_esm2(seed=3)
    hf, tokenizer = tiny_hf_esm2(seed=3)
    assert isinstance(hf, EsmForMaskedLM) and isinstance(tokenizer, EsmTokenizer)
    assert hf.config.position_embedding_type == "rotary" and hf.config.vocab_size == 33
    assert tuple(tokenizer.get_vocab()) [:33] == tuple(alphabet.all_toks)
    fair_tokens, fair_mask = tokenize_fair_esm(alphabet, SEQUENCES)
    hf_tokens, hf_mask = tokenize_hf_esm(tokenizer, SEQUENCES)
    assert torch.equal(fair_tokens, hf_tokens) and torch.equal(fair_mask, hf_mask)
    with torch.no_grad():
        reference = fair(fair_tokens, repr_layers=[2])
        ours = hf(input_ids=hf_tokens, attention_mask=hf_mask.long(), output_hidden_states=True)
    # two independent implementations of the same network; padding positions are not compared
    torch.testing.assert_close(ours.logits[hf_mask], reference["logits"][fair_mask], rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(ours.hidden_states[-1][hf_mask], reference["representations"][2][fair_mask],
                               rtol=1e-5, atol=1e-4)


def test_tiny_esmfold_folds_deterministically():
    from transformers import EsmForProteinFolding

    model, tokenizer = tiny_esmfold(seed=0)
    assert isinstance(model, EsmForProteinFolding) and model.config.esmfold_config.fp16_esm is False
    assert all(p.dtype == torch.float32 for p in model.parameters())
    config = tiny_esmfold_config()
    assert config.esmfold_config.trunk.num_blocks == 2 and config.intermediate_size == 4 * config.hidden_size
    with torch.no_grad():
        out = model.infer(SEQUENCES[1])
        again = tiny_esmfold(seed=0)[0].infer(SEQUENCES[1])
    length = len(SEQUENCES[1])
    assert out.positions.shape == (2, 1, length, 14, 3)  # (structure-module blocks, batch, L, atom14, xyz)
    assert torch.isfinite(out.positions).all() and out.positions.abs().max() > 0.1
    assert ((out.plddt >= 0) & (out.plddt <= 100)).all()
    assert torch.equal(out.positions, again.positions)
    # tokenizer and tokenize_esmfold agree with infer()'s own AF2 encoding
    ids = tokenizer([SEQUENCES[1]], add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenize_esmfold([SEQUENCES[1]])[0][0].tolist() == out.aatype[0].tolist()


def test_tiny_esmfold_trunk_is_not_an_identity():
    """transformers zero-inits the trunk's output layers; seeded_init_ must not, or quantizing it shows nothing."""
    model, _ = tiny_esmfold(seed=0)
    block = model.trunk.blocks[0]
    for linear in (block.tri_mul_out.linear_z, block.seq_attention.o_proj, block.mlp_seq.mlp[-2]):
        assert linear.weight.abs().max() > 0


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_registry_builds_every_tiny_model(name):
    model, vocab, spec = build_tiny(name, seed=0)
    assert spec.family in {"fair-esm", "hf-esm", "hf-esmfold", "esmc"} and vocab is not None
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    with pytest.raises(ValueError, match="unknown tiny model"):
        build_tiny("tiny-bert")
