"""PWLQ: piecewise-affine encoding and the fused region-GEMM kernel."""

import pytest
import torch
from kernel_testlib import (
    assert_epilogue_close,
    asymmetric_pwlq5,
    codebook_of,
    codes,
    decode_pwlq,
    dev,
    symmetric_pwlq,
)

from ptq_protein.kernels import pwlq_gemm
from ptq_protein.kernels._triton import ConfigTable
from ptq_protein.kernels.int8_gemm import int8_linear
from ptq_protein.kernels.pwlq_codebook import check_codebook, gemm_plan
from ptq_protein.kernels.pwlq_encode import pwlq_quantize
from ptq_protein.kernels.pwlq_gemm import pwlq_linear
from ptq_protein.kernels.quantize import quantize_per_tensor

BACKENDS = ("triton", "torch")
UNIFORM = {"offsets": [0.0], "scales": [0.03125], "code_lo": [-127], "code_hi": [127], "thresholds": []}
BOOKS = {"uniform": UNIFORM, "symmetric": symmetric_pwlq(2.0, 6.0), "asymmetric5": asymmetric_pwlq5()}


def _x(gen, m, k, spread=3.0):
    return dev(torch.randn(m, k, generator=gen) * spread)


def _pwlq_ref64(q, book, w_q, w_scale, bias):
    """Decode to float64 and multiply with dequantized weights: the definition, no decomposition."""
    q, w_q, w_scale, bias = (t.cpu() for t in (q, w_q, w_scale, bias))
    values, magnitude = decode_pwlq(q, *codebook_of(book).values())
    w = w_q.double() * w_scale.double()[:, None]
    y = values @ w.t() + bias.double()[None, :]
    return y, magnitude @ w.abs().t() + bias.double().abs()[None, :]


@pytest.mark.parametrize("name", sorted(BOOKS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_encode_triton_equals_torch(name, dtype):
    book = BOOKS[name]
    gen = torch.Generator().manual_seed(len(name))
    x = _x(gen, 7, 150).to(dtype)
    got = pwlq_quantize(x, book["thresholds"], **codebook_of(book), backend="triton")
    assert got.dtype == torch.int8
    assert torch.equal(got, pwlq_quantize(x, book["thresholds"], **codebook_of(book), backend="torch"))
    lo, hi = book["code_lo"][0], book["code_hi"][-1]
    assert lo <= int(got.min()) and int(got.max()) <= hi


def test_encode_uniform_equals_per_tensor_quantization():
    gen = torch.Generator().manual_seed(1)
    x = _x(gen, 5, 90)
    got = pwlq_quantize(x, [], **codebook_of(UNIFORM), backend="triton")
    want = quantize_per_tensor(x, dev(torch.tensor(UNIFORM["scales"][0])), None, 8, True, backend="triton")
    assert torch.equal(got, want)


def test_encode_half_steps_thresholds_and_specials():
    """Power-of-two scales make (k + 1/2) steps exact: ties go to even; x == threshold goes up."""
    book = {"offsets": [-1.0, 0.0, 1.0], "scales": [0.25, 0.125, 0.25],
            "code_lo": [-127, -8, 9], "code_hi": [-9, 8, 127], "thresholds": [-1.0, 1.0]}
    x = torch.tensor([[0.0625, 0.1875, -0.0625, 1.0, -1.0, 1.125, 1.0 + 0.25 * 9.5, float("nan"), float("inf")]])
    got = pwlq_quantize(dev(x), book["thresholds"], **codebook_of(book), backend="triton").cpu()
    # centre: round(0.5)=0, round(1.5)=2, round(-0.5)=0; 1.0 -> upper tail round(0)=0 -> clamped to 9;
    # -1.0 -> centre round(-8) = -8; 1.125 -> tail round(0.5) = 0 -> 9; 1 + 9.5*0.25 -> round(9.5) = 10
    assert got.tolist() == [[0, 2, 0, 9, -8, 9, 10, 0, 127]]
    assert torch.equal(got, pwlq_quantize(x, book["thresholds"], **codebook_of(book), backend="torch"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(BOOKS))
@pytest.mark.parametrize("shape", [(1, 33, 33), (29, 64, 40)])
def test_linear_matches_float64_decode(shape, name, backend):
    m, k, n = shape
    book = BOOKS[name]
    gen = torch.Generator().manual_seed(m + k + len(name))
    q = pwlq_quantize(_x(gen, m, k), book["thresholds"], **codebook_of(book), backend="torch")
    w_q, w_scale, bias = dev(codes(gen, (n, k), -127, 127), torch.rand(n, generator=gen) * 0.01,
                             torch.randn(n, generator=gen))
    y = pwlq_linear(q, **codebook_of(book), w_q=w_q, w_scale=w_scale, bias=bias, backend=backend)
    assert_epilogue_close(y, *_pwlq_ref64(q, book, w_q, w_scale, bias))


def test_linear_large_k_and_half_precision_out():
    book = BOOKS["symmetric"]
    gen = torch.Generator().manual_seed(12)
    q = pwlq_quantize(_x(gen, 3, 4096), book["thresholds"], **codebook_of(book))
    w_q, w_scale, bias = dev(codes(gen, (5, 4096), -127, 127), torch.rand(5, generator=gen) * 1e-3,
                             torch.randn(5, generator=gen))
    y = pwlq_linear(q, **codebook_of(book), w_q=w_q, w_scale=w_scale, bias=bias, out_dtype=torch.float16,
                    backend="triton")
    assert y.dtype == torch.float16
    assert_epilogue_close(y, *_pwlq_ref64(q, book, w_q, w_scale, bias))


def test_uniform_codebook_is_the_int8_linear():
    gen = torch.Generator().manual_seed(6)
    x_q, w_q, w_scale = dev(codes(gen, (17, 48), -127, 127), codes(gen, (20, 48), -127, 127),
                            torch.rand(20, generator=gen))
    y = pwlq_linear(x_q, **codebook_of(UNIFORM), w_q=w_q, w_scale=w_scale, backend="triton")
    ref = int8_linear(x_q, dev(torch.tensor(UNIFORM["scales"][0])), None, w_q, w_scale, backend="triton")
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=0.0)


def test_plan_merges_regions():
    sym = gemm_plan(check_codebook(**codebook_of(BOOKS["symmetric"])))
    assert sym.kinds == (1, 1, 0)  # tail scale (regions 0, 2), centre scale, one +-offset indicator
    assert sym.pos[:2] == (0b101, 0b010) and sym.neg[:2] == (0, 0)
    assert {sym.pos[2], sym.neg[2]} == {0b001, 0b100}  # tails carry offsets -o and +o
    assert len(gemm_plan(check_codebook(**codebook_of(UNIFORM))).kinds) == 1
    assert len(gemm_plan(check_codebook(**codebook_of(BOOKS["asymmetric5"]))).kinds) == 9


@pytest.mark.parametrize("slots_per_pass", [1, 2, 4])
def test_slots_per_pass_do_not_change_the_result(monkeypatch, slots_per_pass):
    """Several passes over K (and up to four accumulators) give the same output."""
    book = BOOKS["asymmetric5"]
    gen = torch.Generator().manual_seed(13)
    q = pwlq_quantize(_x(gen, 18, 40), book["thresholds"], **codebook_of(book))
    w_q, w_scale = dev(codes(gen, (24, 40), -127, 127), torch.rand(24, generator=gen))
    base = pwlq_linear(q, **codebook_of(book), w_q=w_q, w_scale=w_scale, backend="triton")
    row = (16, 32, 32, 2, slots_per_pass, 4, 1)
    monkeypatch.setattr(pwlq_gemm, "_CONFIGS", ConfigTable(pwlq_gemm._CONFIGS.names, (row,), (row,), (row,)))
    got = pwlq_linear(q, **codebook_of(book), w_q=w_q, w_scale=w_scale, backend="triton")
    torch.testing.assert_close(got, base, rtol=1e-6, atol=1e-6)
    assert_epilogue_close(got, *_pwlq_ref64(q, book, w_q, w_scale, torch.zeros(24)))


def test_config_tables_fit_the_kernel():
    """At most four accumulators per pass (acc0..acc3 in the kernel)."""
    table = pwlq_gemm._CONFIGS
    for arch in ("hopper", "ampere", "interpreter"):
        assert all(1 <= row[table.names.index("SLOTS_PER_PASS")] <= 4 for row in table.rows(arch))
