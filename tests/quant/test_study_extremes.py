"""The study observer's pre-filtered extremes equal those of a full sort, value for value.

The pre-filter (row minima/maxima, then topk on the few rows that can hold the
answer) is only a speed-up: the independent reference here is ``torch.sort`` of
the whole tensor, the operation the study's own code ran.
"""

from __future__ import annotations

import pytest
import torch

from ptq_protein.quant.study_observer import extremes

K = 5


def _sorted_ends(flat: torch.Tensor, k: int):
    ordered = torch.sort(flat.float()).values  # NaN sorts last, as topk orders it largest
    n = min(k, flat.numel())
    return ordered[:n], ordered[ordered.numel() - n:]


def _sample(kind: str, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    if kind == "ties":
        x = x.round()
    elif kind == "relu":  # most values tie at the minimum
        x = x.clamp_min(0)
    elif kind == "constant":
        x = torch.zeros(n)
    elif kind == "heavy":
        x = x ** 5
    elif kind == "one_row":  # all k smallest and k largest values inside one row of the pre-filter
        x[5000:5000 + K] = -100.0 - torch.arange(K, dtype=x.dtype)
        x[5100:5100 + K] = 100.0 + torch.arange(K, dtype=x.dtype)
    elif kind == "in_remainder":  # the extremes in the values past the last whole row
        x[-K:] = -1e4
        x[-2 * K:-K] = 1e4
    elif kind == "nan":
        x[n // 3] = float("nan")
    return x


_PLAIN = ["gaussian", "ties", "relu", "constant", "heavy", "nan"]
_PLANTED = ["one_row", "in_remainder"]  # need a tensor large enough to hold the planted values
_CASES = [(kind, n) for n in (3, 1000, 1 << 15, 300_007) for kind in _PLAIN + (_PLANTED if n > 6000 else [])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind,n", _CASES)
def test_extremes_equal_a_full_sort(dtype, kind, n):
    flat = _sample(kind, n).to(dtype)
    lo, hi = extremes(flat, K)
    want_lo, want_hi = _sorted_ends(flat, K)
    assert lo.dtype == dtype and hi.dtype == dtype
    torch.testing.assert_close(lo.float(), want_lo, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(hi.float(), want_hi, rtol=0, atol=0, equal_nan=True)


def test_extremes_take_the_prefilter_on_large_tensors(monkeypatch):
    """The fast path is the one exercised above (a regression that always took topk would pass unnoticed)."""
    calls = []
    real = torch.Tensor.amin
    monkeypatch.setattr(torch.Tensor, "amin", lambda self, *a, **kw: calls.append(self.shape) or real(self, *a, **kw))
    extremes(_sample("gaussian", 300_007), K)
    assert calls and calls[0][1] > 1
