"""Tiny seeded models shared by the interop tests (built once per session), and a saved masked-LM artifact."""

import pytest
from tiny_fixtures import SEQS, calib_seqs, esm2, esmc, esmfold, hf_esm2, seqs  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def masked_lm_artifact(hf_esm2, calib_seqs, tmp_path_factory):  # noqa: F811 (hf_esm2 is the fixture above)
    """A quantized EsmForMaskedLM saved from a folder laid out as save_pretrained writes it (with tokenizer)."""
    from transformers import EsmForMaskedLM

    import ptq_protein as pp
    from ptq_protein.models.tiny import esm_tokenizer

    source = tmp_path_factory.mktemp("src") / "esm2-tiny"
    hf_esm2.save_pretrained(source)
    esm_tokenizer().save_pretrained(source)
    q = pp.quantize(EsmForMaskedLM.from_pretrained(source), "w8a8-uniform", calibration=list(calib_seqs))
    out = tmp_path_factory.mktemp("art") / "a"
    pp.save(q, out, model_info={"name": "esm2-tiny", "source": str(source)})
    return out
