"""ONNX Runtime's u8 x u8 GEMM (``nn/cpu_int8_mlas``) against exact integer products (float64 references)."""

import pytest
import torch

from ptq_protein.kernels.reference import int_matmul
from ptq_protein.nn import cpu_int8, cpu_int8_mlas

pytestmark = pytest.mark.skipif(not cpu_int8_mlas.available(), reason=cpu_int8_mlas.reason())

SHAPES = [(1, 5, 3), (7, 41, 17), (130, 129, 9), (4, 1920, 11)]  # (M, K, N): odd on purpose


def _codes(m, k, gen, lo=-128, hi=127):
    return torch.randint(lo, hi + 1, (m, k), dtype=torch.int8, generator=gen)


def test_u8_codes_round_trip_every_value():
    codes = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8)
    u8 = cpu_int8_mlas.to_u8(codes)
    assert u8.dtype == torch.uint8 and torch.equal(u8.to(torch.int16), codes.to(torch.int16) + 128)
    assert torch.equal(cpu_int8_mlas.from_u8(u8), codes)


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("zero", [0, 17, -128, 127])
@pytest.mark.parametrize("extreme", [None, (127, 127), (-128, -127), (127, -127)])
def test_accumulators_identical(m, k, n, zero, extreme):
    """Unit scales: the float32 output is the integer ``(a - zero) @ W^T`` itself (exact below 2^24)."""
    gen = torch.Generator().manual_seed(m * k + n)
    if extreme is None:
        a, w = _codes(m, k, gen), _codes(n, k, gen, -127)
    else:
        a, w = torch.full((m, k), extreme[0], dtype=torch.int8), torch.full((n, k), extreme[1], dtype=torch.int8)
    y = cpu_int8_mlas.matmul(cpu_int8_mlas.to_u8(a), cpu_int8_mlas.to_u8(w.t()), 1.0, zero, torch.ones(n), None)
    exact = (a.double() - zero) @ w.double().t()
    assert torch.equal(y.double(), exact)
    assert torch.equal((y.double() + zero * w.double().sum(1)).to(torch.int32), int_matmul(a, w))


@pytest.mark.parametrize("m,k,n", [(0, 24, 5), (3, 0, 5)])
def test_empty_operands_give_the_bias(m, k, n):
    bias = torch.randn(n)
    y = cpu_int8_mlas.matmul(torch.zeros(m, k, dtype=torch.uint8), torch.zeros(k, n, dtype=torch.uint8), 0.5, 0,
                             torch.ones(n), bias)
    assert y.shape == (m, n) and torch.equal(y, bias.expand(m, n))


def test_epilogue_matches_float64():
    gen = torch.Generator().manual_seed(3)
    a, w = _codes(33, 67, gen), _codes(40, 67, gen, -127)
    w_scale, bias = torch.rand(40, generator=gen) + 0.01, torch.randn(40, generator=gen)
    y = cpu_int8_mlas.matmul(cpu_int8_mlas.to_u8(a), cpu_int8_mlas.to_u8(w.t()), 0.037, -5, w_scale, bias)
    exact = 0.037 * w_scale.double() * ((a.double() + 5) @ w.double().t()) + bias.double()
    assert float((y.double() - exact).abs().max() / exact.abs().max()) <= 1e-6


def test_thread_counts_give_the_same_result():
    gen = torch.Generator().manual_seed(4)
    a, w = cpu_int8_mlas.to_u8(_codes(64, 96, gen)), cpu_int8_mlas.to_u8(_codes(48, 96, gen, -127).t())
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_int8_mlas.matmul(a, w, 1.0, 0, torch.ones(48), None)
        torch.set_num_threads(2)
        two = cpu_int8_mlas.matmul(a, w, 1.0, 0, torch.ones(48), None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_long_reductions_stay_on_onednn(monkeypatch):
    """Past ``MAX_K`` the u8 x u8 int32 sum could overflow: the weight is packed for oneDNN (split there) and the
    accumulators stay exact; the GEMM itself refuses such a reduction."""
    if cpu_int8.mode() is None:
        pytest.skip(cpu_int8.reason())
    monkeypatch.setattr(cpu_int8, "mode", lambda: "mlas")
    monkeypatch.setattr(cpu_int8, "_one_thread", lambda: True)
    k = cpu_int8_mlas.MAX_K + 1
    # saturating pairs (127 x 127) whose sum stays exact in float32 (alternating signs: below 2^24)
    a = torch.full((2, k), 127, dtype=torch.int8)
    w = torch.full((3, k), 127, dtype=torch.int8)
    w[:, 1::2] = -127
    w[1, :5] = 127
    packed = cpu_int8.prepack(w, torch.ones(3))
    assert cpu_int8.engine_of(packed) == "onednn"
    assert torch.equal(cpu_int8.accumulators(a, packed).double(), a.double() @ w.double().t())
    assert cpu_int8.engine_of(cpu_int8.prepack(w[:, :-1], torch.ones(3))) == "onnxruntime"
    with pytest.raises(ValueError, match="exceeds 33025"):
        cpu_int8_mlas.matmul(cpu_int8_mlas.to_u8(a), cpu_int8_mlas.to_u8(w.t()), 1.0, 0, torch.ones(3), None)


def test_weight_is_one_u8_copy_and_unpacks_to_the_codes(monkeypatch):
    monkeypatch.setattr(cpu_int8, "mode", lambda: "mlas")
    monkeypatch.setattr(cpu_int8, "_one_thread", lambda: True)
    gen = torch.Generator().manual_seed(5)
    w = _codes(17, 41, gen, -127)
    packed = cpu_int8.prepack(w, torch.ones(17))
    assert packed.weight.dtype == torch.uint8 and packed.weight.shape == (41, 17)
    assert torch.equal(cpu_int8.unpack(packed), w) and torch.equal(cpu_int8.dense_codes(packed), w.t())


def test_probe_without_onnxruntime_falls_back_to_split(monkeypatch):
    """No onnxruntime (or a failing one): a saturating CPU keeps the split oneDNN engine, and says so."""
    monkeypatch.setattr(cpu_int8_mlas, "available", lambda: False)
    monkeypatch.setattr(cpu_int8_mlas, "reason", lambda: "onnxruntime is not installed")
    mode, why = cpu_int8._probe.__wrapped__()
    if cpu_int8.mode() == "native":
        assert mode == "native"
    else:
        assert mode == "split" and "onnxruntime is not installed" in why


def test_more_threads_keep_onednn(monkeypatch):
    """ONNX Runtime's GEMM is chosen, at prepacking, for one-thread processes only (its workers and PyTorch's
    OpenMP threads contend for the cores otherwise)."""
    if cpu_int8.mode() is None:
        pytest.skip(cpu_int8.reason())
    monkeypatch.setattr(cpu_int8, "mode", lambda: "mlas")
    w = _codes(5, 24, torch.Generator().manual_seed(6), -127)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_int8.prepack(w, torch.ones(5))
        torch.set_num_threads(2)
        two = cpu_int8.prepack(w, torch.ones(5))
    finally:
        torch.set_num_threads(threads)
    assert (cpu_int8.engine_of(one), cpu_int8.engine_of(two)) == ("onnxruntime", "onednn")
    a = _codes(3, 24, torch.Generator().manual_seed(7))
    assert torch.equal(cpu_int8.accumulators(a, one), cpu_int8.accumulators(a, two))
