"""The saturation-free oneDNN GEMMs of AVX2 without VNNI (``nn/cpu_int8_split``) against exact integer products.

They run on every CPU with oneDNN's int8 linear: the operands they build are
exact there whether or not the native call saturates.
"""

import pytest
import torch

from ptq_protein.kernels.reference import int_matmul
from ptq_protein.nn import cpu_int8, cpu_int8_split

pytestmark = pytest.mark.skipif(cpu_int8.mode() is None, reason=cpu_int8.reason())

SHAPES = [(7, 41, 17), (33, 67, 40), (130, 129, 9)]  # (M, K, N): odd on purpose


def _codes(kind: str, m: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Codes in one 130-code window, or with tails in two columns, or everywhere."""
    if kind == "top":
        return torch.full((m, k), 127, dtype=torch.int8)
    if kind == "dense":
        return torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=gen)
    a = torch.randint(-7, 123, (m, k), dtype=torch.int8, generator=gen)  # a post-GELU site's busiest window
    if kind == "columns":
        a[:, [0, k // 2]] = torch.randint(-128, 128, (m, 2), dtype=torch.int8, generator=gen)
    return a


@pytest.fixture
def calls(monkeypatch):
    """How many int8 GEMMs and "sum" post-ops ran, and whether the column correction ran."""
    seen = {"gemm": 0, "sum": 0}
    for name, key in (("_unit_gemm", "gemm"), ("sum_post_op", "sum")):
        real = getattr(cpu_int8_split, name)

        def spy(*args, real=real, key=key):
            seen[key] += 1
            return real(*args)

        monkeypatch.setattr(cpu_int8_split, name, spy)
    return seen


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("zero", [0, 9, -128])
@pytest.mark.parametrize("kind,gemms", [("top", 1), ("window", 1), ("columns", 1), ("dense", 2)])
def test_exact_accumulators(calls, m, k, n, zero, kind, gemms):
    gen = torch.Generator().manual_seed(m * k + n)
    a = _codes(kind, m, k, gen)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    acc = cpu_int8_split.exact_accumulators(a, cpu_int8.prepack(w, torch.ones(n)), zero, whole=True)
    exact = int_matmul(a, w).to(torch.int64) - zero * w.to(torch.int64).sum(dim=1)
    assert torch.equal(acc.to(torch.int64), exact)
    assert calls["gemm"] + calls["sum"] == gemms


def test_one_native_call_when_every_code_is_safe():
    a = torch.randint(-128, cpu_int8_split.SAFE_CODE + 1, (5, 24), dtype=torch.int8)
    packed = cpu_int8.prepack(torch.full((3, 24), 127, dtype=torch.int8), torch.ones(3))
    assert cpu_int8_split.exact_accumulators(a, packed) is None  # the caller keeps oneDNN's fused epilogue
    assert cpu_int8_split.exact_accumulators(a, packed, x_zero=3) is not None  # a zero point meets the integers


def test_busiest_window_holds_the_most_codes():
    a = torch.tensor([[-7, 0, 5, 122, 127, -100]], dtype=torch.int8)
    shift = cpu_int8_split._busiest_window(a)
    held = ((a >= shift - 128) & (a <= shift + cpu_int8_split.SAFE_CODE)).sum()
    best = max(int(((a >= lo) & (a <= lo + 129)).sum()) for lo in range(-128, 127))  # brute force
    assert int(held) == best == 4


def test_reused_window_and_columns_stay_exact_when_the_codes_move(calls):
    """One packed weight, batches whose outlier columns and busiest window change: the window and column codes
    kept from an earlier call are reused only while they fit, and every sum stays exact."""
    gen = torch.Generator().manual_seed(3)
    k, n = 64, 24
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    packed = cpu_int8.prepack(w, torch.ones(n))
    batches = []
    for low, cols in ((-7, [0, 5]), (-7, [0, 5]), (-7, [9, 40, 63]), (-120, [1]), (-7, [0, 5])):
        a = torch.randint(low, low + 120, (9, k), dtype=torch.int8, generator=gen)
        a[:, cols] = torch.randint(-128, 128, (9, len(cols)), dtype=torch.int8, generator=gen)
        a[0, cols] = 127 if low > -100 else -128  # outside the busiest window
        batches.append(a)
    for a in batches:
        acc = cpu_int8_split.exact_accumulators(a, packed, 0, whole=True)
        assert torch.equal(acc.to(torch.int64), int_matmul(a, w).to(torch.int64))
        assert torch.equal(packed.memo["col_codes"], w[:, packed.memo["cols"]].t())  # the kept columns' codes
    assert calls["gemm"] == len(batches) and calls["sum"] == 0  # one GEMM + columns each time
