"""w8a8-pwlq-int: the integer-friendly PWLQ (both centre pieces on one step) against w8a8-pwlq."""

import torch

import ptq_protein as pp
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.tiny import tiny_esm2
from ptq_protein.nn.modules import QuantLinear

SEQS = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "MENDELACDEFGHIKLMNPQRSTVWY", "ACDEFGHIKLMNPQRSTVWY", "GSHMKTAYIAKQ"]


def _books(qmodel):
    return {n: m.input_quant.codebook for n, m in qmodel.named_modules()
            if isinstance(m, QuantLinear) and m.input_quant is not None and m.input_quant.codebook is not None}


def test_every_site_has_one_centre_region_and_keeps_pwlq_fidelity():
    model = tiny_esm2(seed=0)[0]
    pwlq, pint = (pp.quantize(model, p, calibration=SEQS) for p in ("w8a8-pwlq", "w8a8-pwlq-int"))
    books, plain = _books(pint), _books(pwlq)
    assert books.keys() == plain.keys() and books
    for name, cb in books.items():  # centre, two tails; its centre decodes step * (q - z) with an integer z
        assert len(cb.code_lo) == 3 and len(plain[name].code_lo) == 4, name
        lo, hi, off, sc = cb.code_lo[1], cb.code_hi[1], cb.offset[1], cb.scale[1]
        zero = round(-off / sc)
        assert lo <= zero <= hi and abs(off + sc * zero) <= 1e-6 * abs(off), name
    tokens = get_adapter(model).make_batch(SEQS[:2]).inputs["tokens"]
    with torch.no_grad():
        ref = model(tokens)["logits"]
        err = {k: float((m(tokens)["logits"] - ref).norm() / ref.norm()) for k, m in (("pwlq", pwlq), ("int", pint))}
    assert err["int"] <= 1.25 * err["pwlq"]  # measured 1.07-1.08x on the tiny models (BENCHMARKS, issue 28)
