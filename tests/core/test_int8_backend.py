"""backend="int8" (integer GEMMs; Triton under TRITON_INTERPRET on CPU) matches backend="fake"."""

import pytest
import torch

import ptq_protein as pp
from ptq_protein.models.adapters import get_adapter
from ptq_protein.eval.bench.fidelity import relative_error
from ptq_protein.nn.int_exec import first_accumulators
from ptq_protein.nn.modules import QuantLinear


def _codes_by_site(model, run):
    """Input codes of every quantized Linear during one forward (as the site's quantizer encodes them)."""
    codes, handles = {}, []
    for name, module in model.named_modules():
        if isinstance(module, QuantLinear) and module.input_quant is not None:
            def hook(mod, args, name=name):
                codes.setdefault(name, mod.input_quant.encode(args[0].reshape(-1, args[0].shape[-1]))[0])
            handles.append(module.register_forward_pre_hook(hook))
    try:
        out = run(model)
    finally:
        for h in handles:
            h.remove()
    return out, codes


def _compare(fake, real, run):
    out_f, codes_f = _codes_by_site(fake, run)
    out_i, codes_i = _codes_by_site(real, run)
    differ = sum(int((codes_f[k] != codes_i[k]).sum()) for k in codes_f)
    total = sum(codes_f[k].numel() for k in codes_f)
    return out_f, out_i, differ / total


@pytest.mark.parametrize("preset", ["w8a8-uniform", "w8a8-pwlq", "w4a8-pwlq", "w8a8-dynamic"])
def test_esm2_int8_matches_fake(esm2, seqs, preset):
    fake = pp.quantize(esm2, preset, calibration=seqs)
    real = pp.quantize(esm2, preset, calibration=seqs, backend="int8")
    tokens = get_adapter(esm2).make_batch(seqs[:2]).inputs["tokens"]
    with torch.no_grad():
        out_f, out_i, frac = _compare(fake, real, lambda m: m(tokens)["logits"])
    print(preset, "relative error", relative_error(out_f, out_i), "codes differing", frac)
    assert relative_error(out_f, out_i) <= 1e-3
    assert frac < 1e-3


def test_first_site_accumulators_identical(esm2, seqs):
    real = pp.quantize(esm2, "w8a8-uniform", calibration=seqs, backend="int8")
    first = next(m for m in real.modules() if isinstance(m, QuantLinear) and m.input_quant is not None)
    x = torch.randn(7, first.in_features) * 3
    acc = first_accumulators(first, x)
    codes, _ = first.input_quant.encode(x)
    exact = codes.double() @ first.weight_codes.double().t()
    assert acc.dtype == torch.int32 and torch.equal(acc.double(), exact)


def test_esmfold_int8_matches_fake(esmfold, seqs):
    fake = pp.quantize(esmfold, "w8a8-uniform", calibration=seqs[:2], num_recycles=0)
    real = pp.quantize(esmfold, "w8a8-uniform", calibration=seqs[:2], num_recycles=0, backend="int8")
    adapter = get_adapter(esmfold)
    batch = adapter.make_batch([seqs[1][:12]])
    with torch.no_grad():
        out_f, out_i, frac = _compare(fake, real, lambda m: adapter.forward(m, batch, num_recycles=0)["positions"])
    print("esmfold relative error", relative_error(out_f, out_i), "codes differing", frac)
    assert relative_error(out_f, out_i) <= 1e-3
    assert frac < 1e-3
