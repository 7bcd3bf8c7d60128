"""GPTQ (Frantar et al. 2023): one Linear weight quantized with Hessian-based error feedback.

Columns are quantized one at a time (symmetric uniform codes, the same
``clamp(round(w / scale))`` as :mod:`ptq_protein.quant.uniform`); each column's
rounding error, divided by the diagonal of the upper Cholesky factor ``U`` of
``H^-1``, is spread onto the columns not yet quantized along ``U``'s row. Updates
inside a block of ``block_size`` columns are immediate and the rest are applied
once per block (the paper's "lazy batch" update: the same result, fewer
memory passes). Everything runs in float64 whatever the weight's dtype.

``H = 2 X^T X / n`` is the layer's input Hessian (``X`` [n, K] the calibration
inputs); only its shape matters here, so any positive multiple works.

Example
-------
>>> w = torch.randn(8, 16); x = torch.randn(64, 16)
>>> result = gptq_quantize(w, x.T @ x, bits=4)
>>> result.codes.shape, result.scale.shape
(torch.Size([8, 16]), torch.Size([8, 1]))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ptq_protein.quant.uniform import SCALE_FLOOR, check_bits, qrange

__all__ = ["GPTQResult", "gptq_quantize", "symmetric_scale"]


@dataclass
class GPTQResult:
    """Codes [N, K] (int8 up to 8 bits), float32 scales [N, 1] (or [N, K // group] with groups)."""

    codes: torch.Tensor
    scale: torch.Tensor
    group_size: int

    def dequantize(self) -> torch.Tensor:
        """float32 weight [N, K] the codes stand for."""
        scale = self.scale if self.group_size <= 0 else self.scale.repeat_interleave(self.group_size, dim=1)
        return self.codes.to(torch.float32) * scale


def symmetric_scale(w: torch.Tensor, bits: int) -> torch.Tensor:
    """float32 per-row scale ``max|w| / qmax`` of ``w`` [N, K] -> [N, 1] (as the RTN weights use)."""
    _, qmax = qrange(bits, symmetric=True)
    amax = w.detach().abs().amax(dim=1, keepdim=True).to(torch.float32)
    return (amax / qmax).clamp_min(SCALE_FLOOR)


def _prepare_hessian(h: torch.Tensor, w: torch.Tensor, damp: float) -> torch.Tensor:
    """Float64 H with dead inputs (zero diagonal) neutralised and ``damp * mean(diag)`` added."""
    h = h.detach().to(torch.float64).clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h.diagonal().add_(damp * float(torch.diag(h).mean()))
    return h


def _inverse_cholesky_upper(h: torch.Tensor) -> torch.Tensor:
    """Upper Cholesky factor of ``H^-1`` (float64)."""
    lower = torch.linalg.cholesky(h)
    return torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True)


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, bits: int, *, damp: float = 0.01,
                  act_order: bool = True, block_size: int = 128, group_size: int = -1) -> GPTQResult:
    """GPTQ-quantize ``weight`` [N, K] given the input Hessian ``hessian`` [K, K].

    With ``group_size > 0`` the scales are fixed per group of consecutive input
    columns before the pass (the reference's "static groups", so act-order does
    not scatter groups); ``K`` must then be a multiple of ``group_size``.
    """
    check_bits(bits)
    if bits > 8:
        raise ValueError(f"gptq_quantize stores int8 codes; bits={bits} must be at most 8")
    n, k = weight.shape
    if hessian.shape != (k, k):
        raise ValueError(f"hessian shape {tuple(hessian.shape)} does not match the weight's {k} input columns")
    if group_size > 0 and k % group_size:
        raise ValueError(f"group_size={group_size} does not divide the {k} input columns")
    _, qmax = qrange(bits, symmetric=True)
    w = weight.detach().to(torch.float64).clone()
    if group_size > 0:
        scale = torch.cat([symmetric_scale(g, bits) for g in w.split(group_size, dim=1)], dim=1)
        col_scale = scale.repeat_interleave(group_size, dim=1).to(torch.float64)
    else:
        scale = symmetric_scale(w, bits)
        col_scale = scale.to(torch.float64).expand(n, k)
    h = _prepare_hessian(hessian, w, damp)
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(k)
    w, h, col_scale = w[:, perm], h[perm][:, perm], col_scale[:, perm]
    u = _inverse_cholesky_upper(h)
    codes = torch.zeros_like(w)
    for start in range(0, k, block_size):
        stop = min(start + block_size, k)
        block = w[:, start:stop].clone()
        errors = torch.zeros_like(block)
        for i in range(stop - start):
            col, s = block[:, i], col_scale[:, start + i]
            q = torch.clamp(torch.round(col / s), -qmax, qmax)
            codes[:, start + i] = q
            err = (col - q * s) / u[start + i, start + i]
            block[:, i:] -= err.unsqueeze(1) * u[start + i, start + i:stop].unsqueeze(0)
            errors[:, i] = err
        w[:, stop:] -= errors @ u[start:stop, stop:]
    inverse = torch.argsort(perm)
    return GPTQResult(codes[:, inverse].to(torch.int8), scale, group_size)
