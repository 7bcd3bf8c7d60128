"""Tiny seeded models and sequences shared by several test folders (built once per session)."""

import pytest

SEQS = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "MENDELKKLLAAGHRW", "ACDEFGHIKLMNPQRSTVWYACDEFGHIKL",
        "GSHMLEDPVAGVSKEELLKLAEEAR", "MSTNPKPQRKTKRNTNRRPQDVKFPGG"]


@pytest.fixture(scope="session")
def esm2():
    from ptq_protein.models.tiny import tiny_esm2

    return tiny_esm2(seed=0)[0]


@pytest.fixture(scope="session")
def esm2_plain():
    from ptq_protein.models.tiny import tiny_esm2

    return tiny_esm2(seed=1, outliers=None)[0]


@pytest.fixture(scope="session")
def hf_esm2():
    from ptq_protein.models.tiny import tiny_hf_esm2

    return tiny_hf_esm2(seed=0)[0]


@pytest.fixture(scope="session")
def esmc():
    from ptq_protein.models.tiny import tiny_esmc

    return tiny_esmc(seed=0)[0]


@pytest.fixture(scope="session")
def esmfold():
    from ptq_protein.models.tiny import tiny_esmfold

    return tiny_esmfold(seed=0)[0]


@pytest.fixture()
def seqs():
    return list(SEQS)


@pytest.fixture(scope="session")
def calib_seqs():
    """The same sequences for session/module-scoped fixtures (a tuple: nobody mutates it)."""
    return tuple(SEQS)


def write_fair_esm2(path, seed=0):
    """The tiny ESM-2 as a fair-esm ``.pt`` file (``cfg['model']``, the published key layout): what ``--low-memory``
    streams, and a file whose family (so ``--bits``' recipe) is known only once loaded."""
    import argparse

    import torch

    from ptq_protein.models.tiny import build_tiny

    model, _, _ = build_tiny("tiny-esm2", seed=seed)
    body = {("encoder." if k.startswith(("lm_head.", "contact_head.")) else "encoder.sentence_encoder.") + k: v
            for k, v in model.state_dict().items()}
    cfg = argparse.Namespace(encoder_layers=model.num_layers, encoder_embed_dim=model.embed_dim,
                             encoder_attention_heads=model.attention_heads, token_dropout=model.token_dropout)
    torch.save({"model": body, "cfg": {"model": cfg}}, path)
    return path


def write_fair_esmfold(model, path, with_stem=True):
    """Save a transformers ESMFold as a fair-esm ``esmfold_3B_v1.pt``-style file (fair-esm names)."""
    import types

    import torch

    from ptq_protein.models.esmfold_convert import hf_esmfold_to_fair

    state = dict(hf_esmfold_to_fair(model.state_dict()).state_dict)
    if with_stem:  # fair-esm's stem carries its own LM head, which ESMFold does not use
        state["esm.lm_head.bias"] = torch.zeros(33)
    else:
        state = {k: v for k, v in state.items() if not k.startswith("esm.")}
    path.parent.mkdir(parents=True, exist_ok=True)
    # SimpleNamespace stands for omegaconf's DictConfig: a class torch's weights-only loader rejects
    torch.save({"model": state, "cfg": {"model": types.SimpleNamespace(trunk={"num_blocks": 2})}}, path)
    return path
