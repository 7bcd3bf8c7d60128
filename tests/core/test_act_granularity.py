"""Per-channel static and run-time (dynamic) activation presets; clear refusals where a kernel cannot run them."""

import pytest
import torch

import ptq_protein as pp
from ptq_protein.eval.bench.fidelity import relative_error
from ptq_protein.models.adapters import get_adapter


def _logits(model, seqs):
    with torch.no_grad():
        return model(get_adapter(model).make_batch(seqs[1:2]).inputs["tokens"])["logits"]


def test_per_channel_static_scales_each_channel(esm2, seqs):
    q = pp.quantize(esm2, "w8a8-uniform-per-channel", calibration=seqs)
    quant = q.layers[0].fc1.input_quant
    assert quant.scale.shape == (esm2.layers[0].fc1.in_features,)
    x = torch.randn(5, quant.scale.numel()) * 3
    expected = torch.clamp(torch.round(x / quant.scale), -127, 127) * quant.scale  # symmetric: zero point 0
    assert torch.equal(quant(x), expected)
    assert relative_error(_logits(esm2, seqs), _logits(q, seqs)) < 0.5


def test_per_channel_static_refuses_int8(esm2, seqs):
    with pytest.raises(ValueError, match="cannot run per-channel activation scales"):
        pp.quantize(esm2, "w8a8-uniform-per-channel", calibration=seqs, backend="int8")


def test_dynamic_pwlq_needs_no_calibration_and_runs_int8(esm2, seqs):
    fake = pp.quantize(esm2, "w8a8-pwlq-dynamic")
    real = pp.set_engine(pp.quantize(esm2, "w8a8-pwlq-dynamic", backend="int8"), "reference")  # integer GEMMs
    assert fake.ptq_state.calibration is None
    x = torch.randn(20, fake.layers[0].fc1.in_features, generator=torch.Generator().manual_seed(0)) * 3
    with torch.no_grad():  # one site: the same codebook from the same tensor, integer GEMM vs float
        y_fake, y_int = fake.layers[0].fc1(x), real.layers[0].fc1(x)
    assert relative_error(y_fake, y_int) <= 1e-5
    # Whole model: each run-time codebook follows its input's range, so the GEMMs' last-bit differences
    # move later layers' breakpoints and codes (measured ~1.6% on the logits, vs ~5% from quantization).
    assert relative_error(_logits(fake, seqs), _logits(real, seqs)) <= 0.05
