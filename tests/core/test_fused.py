"""The compiled (fused) fake quantizers equal the eager reference exactly, and fall back cleanly."""

import logging

import pytest
import torch

from ptq_protein.nn import fused
from ptq_protein.nn.modules import ActQuantizer
from ptq_protein.quant.codebook import codebook_step_function, pwlq_fake_quantize
from ptq_protein.quant.pwlq import asymmetric_pwlq, pwlq_from_breakpoints
from ptq_protein.recipes.config import Granularity, Scheme, TensorQuant

CODEBOOKS = [asymmetric_pwlq(3.0, 1.0, 20.0, 4.0, 8),  # 4 regions: the presets' shape
             pwlq_from_breakpoints([1.0, 3.0], [0.5, 2.0, 6.0], 9.0, 30.0, 8),  # 7 regions, padded to 8
             pwlq_from_breakpoints([], [2.0], 3.0, 20.0, 8)]  # 3 regions, padded to 4
IDS = ["asym-4-regions", "7-regions", "3-regions"]


@pytest.fixture
def fused_mode():
    """Set the fused policy for one test, restore it (and a remembered failure) afterwards."""
    saved_broken = fused._broken

    def set_mode(mode, min_numel=0):
        fused.configure(mode, min_numel)

    old = fused.configure()
    yield set_mode
    fused.configure(old.mode, old.min_numel)
    fused._broken = saved_broken


def _hard_values(cb, dtype):
    """Random values plus every threshold, level and rounding midpoint, and their float neighbours."""
    torch.manual_seed(0)
    levels, bounds = codebook_step_function(cb)
    mids = (levels[1:] + levels[:-1]) / 2
    edges = torch.cat([torch.tensor(cb.thresholds, dtype=torch.float64), bounds, levels, mids]).to(dtype)
    around = torch.cat([edges, torch.nextafter(edges, torch.tensor(float("inf"), dtype=dtype)),
                        torch.nextafter(edges, torch.tensor(-float("inf"), dtype=dtype))])
    special = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e30, -1e30], dtype=dtype)
    noise = (torch.randn(4096, dtype=torch.float64) * 8).to(dtype)
    return torch.cat([around, special, noise])


def _same(a, b):
    """Equal values, NaN where NaN (-0.0 == +0.0: inductor may drop the sign of zero)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(torch.isnan(a), torch.isnan(b)) and \
        torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))


def test_settings_validate_and_restore(monkeypatch):
    with pytest.raises(ValueError, match="PTQ_PROTEIN_FUSED"):
        fused.FusedSettings(mode="fast")
    with pytest.raises(ValueError, match="min_numel"):
        fused.FusedSettings(min_numel=-1)
    monkeypatch.setattr(fused, "_settings", None)
    monkeypatch.setenv(fused.ENV_VAR, " OFF ")
    assert fused.settings().mode == "off"
    old = fused.configure("on", 7)
    assert old.mode == "off" and fused.settings() == fused.FusedSettings("on", 7)


@pytest.mark.parametrize("cb", CODEBOOKS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_piecewise_fake_eager_matches_codebook(cb, dtype):
    x = _hard_values(cb, dtype)
    q = ActQuantizer(TensorQuant(bits=8, scheme=Scheme.PWLQ, symmetric=False), codebook=cb)
    thresholds, table = q._region_table(x.device)
    assert table.shape[0] in (4, 8) and thresholds.shape[0] == table.shape[0] - 1  # padded to a power of two
    want = pwlq_fake_quantize(x, cb).to(torch.float32)
    assert _same(fused.piecewise_fake(x, thresholds.to(dtype), table), want)


@pytest.mark.parametrize("cb", CODEBOOKS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_pwlq_matches_reference(fused_mode, cb, dtype):
    fused_mode("on")
    values = _hard_values(cb, dtype)
    x = torch.stack([values, values.flip(0)]).t()  # 2-D and not contiguous
    q = ActQuantizer(TensorQuant(bits=8, scheme=Scheme.PWLQ, symmetric=False), codebook=cb)
    with torch.no_grad():
        got = q(x)
    assert fused._broken is None, fused._broken  # the compiled path really ran
    assert _same(got, pwlq_fake_quantize(x, cb))


@pytest.mark.parametrize("symmetric, scale, zp", [(True, torch.tensor(0.05), torch.tensor(0)),
                                                  (False, torch.tensor([0.07, 1e-3, 0.5]),
                                                   torch.tensor([-13, 100, 0]))],
                         ids=["per-tensor-sym", "per-channel-asym"])
def test_compiled_uniform_matches_eager(fused_mode, symmetric, scale, zp):
    q = ActQuantizer(TensorQuant(bits=8, symmetric=symmetric), scale=scale, zero_point=zp)
    torch.manual_seed(1)
    x = torch.cat([torch.randn(3000, 3) * 20, torch.tensor([[float("nan"), float("inf"), -float("inf")]])])
    x = torch.cat([x, (torch.round(x * 40) / 40 + 0.0125)])  # rounding ties of the 0.05 grid
    with torch.no_grad():
        fused_mode("off")
        want = q(x)
        fused_mode("on")
        got = q(x.reshape(2, -1, 3))
    assert fused._broken is None, fused._broken
    assert _same(got.reshape(x.shape), want)


def test_auto_mode_keeps_small_tensors_eager(fused_mode, monkeypatch):
    calls = []
    monkeypatch.setattr(fused, "_compiled_version", lambda fn: calls.append(fn) or fn)
    monkeypatch.setattr(fused, "AUTO_AFTER_SECONDS", 0.0)  # compiling repays at once: only the size decides
    fused_mode("auto", 100)
    x = torch.randn(99)
    assert torch.equal(fused.fused_call(fused.uniform_fake, x, torch.tensor(0.1), torch.tensor(0), -128, 127),
                       fused.uniform_fake(x, torch.tensor(0.1), torch.tensor(0), -128, 127))
    assert calls == []
    fused.fused_call(fused.uniform_fake, torch.randn(100), torch.tensor(0.1), torch.tensor(0), -128, 127)
    assert calls == [fused.uniform_fake]
    meta = {"device": "meta"}  # under auto, only CPU tensors compile (exactness is verified there)
    fused.fused_call(fused.uniform_fake, torch.empty(1000, **meta), torch.tensor(0.1, **meta),
                     torch.tensor(0, **meta), -128, 127)
    assert len(calls) == 1
    fused_mode("off", 0)
    fused.fused_call(fused.uniform_fake, torch.randn(1000), torch.tensor(0.1), torch.tensor(0), -128, 127)
    assert len(calls) == 1


def test_compile_failure_warns_once_and_falls_back(fused_mode, monkeypatch, caplog):
    def broken(fn):
        def run(*args):
            raise RuntimeError("no C++ compiler found\nlong details")
        return run

    monkeypatch.setattr(fused, "_compiled_version", broken)
    fused_mode("on")
    cb = CODEBOOKS[0]
    q = ActQuantizer(TensorQuant(bits=8, scheme=Scheme.PWLQ, symmetric=False), codebook=cb)
    x = _hard_values(cb, torch.float32)
    with caplog.at_level(logging.WARNING, logger="ptq_protein.nn.fused"):
        first, second = q(x), q(x)
    assert _same(first, pwlq_fake_quantize(x, cb)) and _same(second, first)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "RuntimeError: no C++ compiler found" in warnings[0] and "long details" not in warnings[0]


@pytest.mark.parametrize("preset", ["w8a8-pwlq", "w8a8-uniform", "w8a8-pwlq-all"])
def test_compiled_model_is_bit_identical(fused_mode, preset):
    """A quantized tiny ESM-2 gives the same logits with the fused path on and off (matmul operands too)."""
    import ptq_protein as pp
    from ptq_protein.models.tiny import tiny_esm2

    model, alphabet = tiny_esm2(0)
    seqs = ["MKTAYIAKQRQISFVKSHFSRQ", "GSHMLEDPVAGKT"]
    tokens = torch.tensor([[alphabet.cls_idx] + [alphabet.get_idx(a) for a in seqs[0]] + [alphabet.eos_idx]])
    qmodel = pp.quantize(model, preset, calibration=seqs)
    with torch.no_grad():
        fused_mode("off")
        want = qmodel(tokens)["logits"]
        fused_mode("on")
        got = qmodel(tokens)["logits"]
    assert fused._broken is None, fused._broken
    assert torch.equal(got, want)


@pytest.mark.gpu
def test_compiled_pwlq_on_cuda_matches_eager(fused_mode):
    """Run on a GPU session: does the Triton loop (mode "on") equal the eager CUDA path?"""
    cb = CODEBOOKS[0]
    q = ActQuantizer(TensorQuant(bits=8, scheme=Scheme.PWLQ, symmetric=False), codebook=cb).cuda()
    x = _hard_values(cb, torch.float32).cuda()
    with torch.no_grad():
        fused_mode("off")
        want = q(x)
        fused_mode("on")
        got = q(x)
    assert fused._broken is None, fused._broken
    assert _same(got, want), f"{int((got != want).sum())} of {x.numel()} values differ"


def test_one_graph_serves_every_layout_and_codebook(fused_mode):
    """Views, transposes, ranks, 3/4-region codebooks and grad mode do not recompile (one graph per dtype)."""
    import torch._dynamo

    fused_mode("on")
    torch._dynamo.reset()
    fused._compiled.clear()
    compiles = []
    real = torch.compile

    def counting(fn, **kw):
        def backend(gm, inputs):
            compiles.append(fn.__name__)
            from torch._inductor.compile_fx import compile_fx
            return compile_fx(gm, inputs)
        return real(fn, backend=backend, dynamic=kw.get("dynamic"))

    import unittest.mock as um
    quants = [ActQuantizer(TensorQuant(bits=8, scheme=Scheme.PWLQ, symmetric=False), codebook=cb)
              for cb in (CODEBOOKS[0], CODEBOOKS[2])]
    base = torch.randn(6, 40, 48) * 5
    inputs = [base, base[:, 1:-1], base.transpose(0, 1), base.reshape(-1, 48)[::2], base.reshape(240, 48),
              base.reshape(2, 3, 40, 48)]
    with um.patch.object(torch, "compile", counting):
        for q in quants:
            for x in inputs:
                got = q(x)
                assert _same(got, pwlq_fake_quantize(x, q.codebook))
        with torch.enable_grad():
            quants[0](base)
    assert compiles == ["piecewise_fake"], compiles


def test_auto_mode_compiles_once_the_eager_calls_cost_what_compiling_costs(fused_mode, monkeypatch):
    """Rent until the rent paid equals the price: eager while a function's eager seconds stay below
    AUTO_AFTER_SECONDS, compiled from the call after they reach it."""
    calls = []
    monkeypatch.setattr(fused, "_compiled_version", lambda fn: calls.append(fn) or fn)
    monkeypatch.setattr(fused, "_eager_seconds", {})
    monkeypatch.setattr(fused, "_compiled", {})
    monkeypatch.setattr(fused, "AUTO_AFTER_SECONDS", 3600.0)
    fused_mode("auto", 0)
    args = (torch.randn(5000), torch.tensor(0.1), torch.tensor(0), -128, 127)
    for _ in range(3):
        fused.fused_call(fused.uniform_fake, *args)
    assert calls == [] and 0 < fused._eager_seconds[fused.uniform_fake] < 3600
    monkeypatch.setattr(fused, "AUTO_AFTER_SECONDS", fused._eager_seconds[fused.uniform_fake])
    fused.fused_call(fused.uniform_fake, *args)
    assert calls == [fused.uniform_fake]


@pytest.mark.parametrize("mode", ["on", "off"])
@pytest.mark.parametrize("cb", CODEBOOKS, ids=IDS)
def test_compiled_codes_match_encoders(fused_mode, cb, mode):
    """The int8 fast path's one-pass encoders (nn.int_fast.encode_codes) equal input_quant.encode, compiled and
    through their eager stand-ins (uniform_codes_eager)."""
    from ptq_protein.nn.int_fast import encode_codes

    fused_mode(mode)
    x = _hard_values(cb, torch.float32).reshape(-1, 1)
    pw = ActQuantizer(TensorQuant(bits=8, scheme=Scheme.PWLQ, symmetric=False), codebook=cb)
    uni = ActQuantizer(TensorQuant(bits=8, symmetric=False), scale=torch.tensor(0.05), zero_point=torch.tensor(-13))
    with torch.no_grad():
        for q in (pw, uni):
            got = encode_codes(q, x)[0]
            assert fused._broken is None, fused._broken
            assert got.dtype == torch.int8 and torch.equal(got, q.encode(x)[0].to(torch.int8))
        finite = x[torch.isfinite(x)][:4000].reshape(-1, 40)  # per-token ranges need finite rows
        for symmetric in (True, False):
            tok = ActQuantizer(TensorQuant(bits=8, granularity=Granularity.PER_TOKEN, dynamic=True,
                                           symmetric=symmetric))
            codes, params = encode_codes(tok, finite)
            want, want_params = tok.encode(finite)
            assert fused._broken is None, fused._broken
            assert torch.equal(codes, want.to(torch.int8))
            assert torch.equal(params[1], want_params[1]) and torch.equal(params[2], want_params[2])


def test_per_token_codes_of_a_long_input_compile(fused_mode, monkeypatch, caplog):
    """The first compiled call is checked against eager on the input's first rows; a per-token scale [rows, 1]
    must be cut with them (it was not: every int8 w8a8-dynamic embed of a long batch warned "fused fake
    quantization is unavailable (TorchRuntimeError ...)" and ran eagerly)."""
    from ptq_protein.nn.int_fast import encode_codes

    fused_mode("on")
    monkeypatch.setattr(fused, "_broken", None)
    monkeypatch.setattr(fused, "_checked", set())
    x = torch.randn(3000, 64)  # more rows than the check's probe (65543 values)
    tok = ActQuantizer(TensorQuant(bits=8, granularity=Granularity.PER_TOKEN, dynamic=True, symmetric=False))
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        codes, _ = encode_codes(tok, x)
    assert fused._broken is None, fused._broken
    assert "cannot run here" not in caplog.text
    assert torch.equal(codes, tok.encode(x)[0].to(torch.int8))


@pytest.mark.parametrize("bounds", [(-128, -97, 0), (9, 103, 8), (104, 127, 104), (-5, 5, -3)])
def test_compiled_region_operands_match_eager(fused_mode, bounds):
    """PWLQ region operands (nn.cpu_pwlq): the compiled passes equal a plain int64 evaluation on every code."""
    fused_mode("on")
    codes = torch.arange(-128, 128, dtype=torch.int8).repeat(3)
    lo, hi, shift = bounds
    inside = (codes.long() >= lo) & (codes.long() <= hi)
    b = torch.tensor(bounds, dtype=torch.int32)
    with torch.no_grad():
        operand = fused.fused_call(fused.region_operand, codes, b)
        mask = fused.fused_call(fused.region_mask, codes, b)
    assert fused._broken is None, fused._broken
    assert operand.dtype == mask.dtype == torch.int8
    assert torch.equal(operand.long(), torch.where(inside, codes.long() - shift, 0))
    assert torch.equal(mask.long(), inside.long())


def test_a_compiled_loop_that_differs_from_eager_is_caught_and_dropped(fused_mode, monkeypatch, caplog):
    """A wrong compiled kernel (a stale inductor cache gave 1e37 where eager gave 3.7) falls back to eager, said."""
    fused_mode("on")
    monkeypatch.setattr(fused, "_broken", None)
    monkeypatch.setattr(fused, "_checked", set())
    wrong = {fused.uniform_fake: lambda x, s, z, lo, hi: fused.uniform_fake(x, s, z, lo, hi) + 1}
    monkeypatch.setattr(fused, "_compiled", wrong)
    x = torch.randn(1000, 64)
    scale, zero = torch.tensor(0.02), torch.tensor(-3, dtype=torch.int32)
    with caplog.at_level(logging.WARNING):
        got = fused.fused_call(fused.uniform_fake, x, scale, zero, -128, 127)
    assert torch.equal(got, fused.uniform_fake(x, scale, zero, -128, 127))
    assert "differs from its eager values" in fused._broken and "the same results, more slowly" in caplog.text


def test_the_vector_width_is_part_of_the_compile_options():
    """Inductor's cache told AVX2 kernels from AVX-512 ones only through an explicit ``cpp.simdlen``."""
    width = fused._vector_width()
    if width is None:
        pytest.skip("inductor picks no vector ISA here")
    assert fused._compile_options()["cpp.simdlen"] == width


_CACHE_PROBE = """
import sys, torch
from ptq_protein.nn import fused
fused.configure("on", 0)
x = torch.randn(300, 1920, generator=torch.Generator().manual_seed(0)).abs() * 3 - 0.17
scale, zero = torch.tensor(0.0151), torch.tensor(-117, dtype=torch.int32)
got = fused.fused_call(fused.uniform_fake, x, scale, zero, -128, 127)
print(bool(torch.equal(got, fused.uniform_fake(x, scale, zero, -128, 127))), fused._broken)
"""


@pytest.mark.slow
def test_an_inductor_cache_shared_with_another_vector_isa_gives_the_same_values(tmp_path):
    """AVX-512 kernels cached, then read where AVX2 is picked: wrong values before the width was in the key."""
    import subprocess
    import sys

    from torch._inductor.cpu_vec_isa import pick_vec_isa

    isa = pick_vec_isa()
    if not isa or isa.bit_width() < 512:
        pytest.skip("needs an AVX-512 CPU to write kernels an AVX2 run must not reuse")
    import os

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    for capability in (None, "avx2"):
        run_env = dict(env, ATEN_CPU_CAPABILITY=capability) if capability else env
        out = subprocess.run([sys.executable, "-c", _CACHE_PROBE], env=run_env, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["True", "None"], (capability, out.stdout, out.stderr[-1000:])
