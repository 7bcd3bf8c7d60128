"""GPTQ on one weight: beats round-to-nearest, and equals a plain float64 re-implementation."""

import pytest
import torch

from ptq_protein.quant.gptq import gptq_quantize, symmetric_scale


def _reference_gptq(w, h, bits, damp, act_order, group_size=-1):
    """The algorithm column by column, every update immediate (no lazy blocks), float64 throughout."""
    w = w.double().clone()
    h = h.double().clone()
    n, k = w.shape
    qmax = 2 ** (bits - 1) - 1
    if group_size > 0:
        scales = [(w[:, g:g + group_size].abs().amax(1) .float() / qmax).double() for g in range(0, k, group_size)]
        col_scale = torch.stack([scales[j // group_size] for j in range(k)], dim=1)
    else:
        col_scale = (w.abs().amax(1).float() / qmax).double().unsqueeze(1).expand(n, k)
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h += damp * torch.diag(h).mean() * torch.eye(k, dtype=torch.float64)
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(k)
    w, h, col_scale = w[:, perm], h[perm][:, perm], col_scale[:, perm]
    u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)  # H^-1 = U^T U
    q = torch.zeros_like(w)
    for j in range(k):
        q[:, j] = torch.clamp(torch.round(w[:, j] / col_scale[:, j]), -qmax, qmax) * col_scale[:, j]
        err = (w[:, j] - q[:, j]) / u[j, j]
        w[:, j + 1:] -= err.unsqueeze(1) * u[j, j + 1:].unsqueeze(0)
    return q[:, torch.argsort(perm)]


def _layer(seed, n=24, k=64, rows=512):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    # correlated inputs with a few outlier channels, as after a LayerNorm
    x = torch.randn(rows, k, generator=g) @ (torch.eye(k) + 0.3 * torch.randn(k, k, generator=g))
    x[:, :3] *= 8
    return w, x


@pytest.mark.parametrize("act_order", [True, False])
@pytest.mark.parametrize("block_size", [128, 16, 5])
def test_equals_float64_reference(act_order, block_size):
    w, x = _layer(0)
    h = 2 * x.double().T @ x.double() / x.shape[0]
    got = gptq_quantize(w, h, bits=4, act_order=act_order, block_size=block_size).dequantize().double()
    ref = _reference_gptq(w, h, 4, 0.01, act_order)
    out_got, out_ref = x.double() @ got.T, x.double() @ ref.T
    assert torch.allclose(got, ref, atol=1e-6, rtol=0)
    assert float((out_got - out_ref).abs().max()) <= 1e-6 * float(out_ref.abs().max())


def test_groups_equal_reference():
    w, x = _layer(1)
    h = x.double().T @ x.double()
    got = gptq_quantize(w, h, bits=4, group_size=16, block_size=8)
    assert got.scale.shape == (24, 4)
    ref = _reference_gptq(w, h, 4, 0.01, True, group_size=16)
    assert torch.allclose(got.dequantize().double(), ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("bits", [4, 3])
def test_w4_output_error_below_round_to_nearest(seed, bits):
    w, x = _layer(seed)
    result = gptq_quantize(w, x.T @ x, bits=bits)
    scale = symmetric_scale(w, bits)
    qmax = 2 ** (bits - 1) - 1
    rtn = torch.clamp(torch.round(w / scale), -qmax, qmax) * scale
    assert torch.equal(result.scale, scale)  # same grid as RTN: only the rounding decisions differ
    err_gptq = ((x @ w.T - x @ result.dequantize().T) ** 2).mean()
    err_rtn = ((x @ w.T - x @ rtn.T) ** 2).mean()
    assert err_gptq < 0.9 * err_rtn
    assert int(result.codes.abs().max()) <= qmax and result.codes.dtype == torch.int8


def test_dead_inputs_and_bad_shapes():
    w, x = _layer(3)
    x[:, 5] = 0  # a channel that never fires: its column is zeroed, nothing is NaN
    result = gptq_quantize(w, x.T @ x, bits=4)
    assert torch.isfinite(result.dequantize()).all() and bool((result.codes[:, 5] == 0).all())
    with pytest.raises(ValueError, match="hessian shape"):
        gptq_quantize(w, torch.eye(3), bits=4)
    with pytest.raises(ValueError, match="group_size"):
        gptq_quantize(w, x.T @ x, bits=4, group_size=10)
    with pytest.raises(ValueError, match="at most 8"):
        gptq_quantize(w, x.T @ x, bits=12)
