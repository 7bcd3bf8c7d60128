"""Hadamard rotations (QuaRot, Ashkboos et al. 2024): spread a heavy-tailed activation over a block of channels.

A normalised Hadamard matrix ``H`` (``n x n``, entries ``+-1/sqrt(n)``) is symmetric and orthonormal
(``H @ H = I``). Multiplying an activation by ``H`` before a Linear whose weight is multiplied by ``H`` on its input
side leaves the product unchanged (``(x H)(W H)^T = x W^T``), while each rotated channel becomes a mix of ``n``
channels: a few outlier channels no longer set one token's quantization scale alone. Block-diagonal ``H`` (one
``b x b`` block per ``b`` channels) costs ``b`` multiply-adds per value instead of the width.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch
from torch import Tensor

__all__ = ["hadamard_matrix", "block_hadamard", "check_hadamard_block"]


def check_hadamard_block(block: int, what: str = "Hadamard block") -> None:
    """Refuse a size that has no Sylvester Hadamard matrix: ``block`` must be a power of two, at least 2."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 2 or block & (block - 1):
        raise ValueError(f"{what}={block!r} must be a power of two >= 2 (e.g. 64, 128, 256)")


def hadamard_matrix(n: int, dtype: torch.dtype = torch.float64, device: Optional[torch.device] = None) -> Tensor:
    """The normalised Sylvester Hadamard matrix [n, n] (``n`` a power of two): ``[[H, H], [H, -H]] / sqrt(2)``.

    Examples
    --------
    >>> hadamard_matrix(2) * 2 ** 0.5
    tensor([[ 1.,  1.],
            [ 1., -1.]], dtype=torch.float64)
    """
    check_hadamard_block(n, "Hadamard size")
    h = torch.ones(1, 1, dtype=torch.float64, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return (h / math.sqrt(n)).to(dtype)


def block_hadamard(x: Tensor, block: int) -> Tensor:
    """``x`` [..., C] times the block-diagonal matrix of ``C / block`` Hadamard blocks, in ``x``'s dtype.

    Each run of ``block`` consecutive channels is rotated on its own: ``x`` as ``[..., C / block, block]`` times
    ``H``. ``C`` must be a multiple of ``block``. As the matrix is symmetric, this is also ``x`` times its transpose.
    The reshapes name every leading size (not ``unflatten`` / ``flatten``), so that a traced ONNX graph keeps the
    batch and length dynamic: with ``unflatten`` the exporter fixed the per-token scales' shape to the traced one.
    """
    *lead, channels = x.shape
    if channels % block:
        raise ValueError(f"a Hadamard block of {block} does not divide the {channels} channels")
    if block > PRODUCT_WIDTH:
        return _butterflies(x, block)
    h = _cached_matrix(block, x.dtype, x.device)
    return (x.reshape(*lead, channels // block, block) @ h).reshape(x.shape)


# The widest Hadamard factor applied as a matrix product; a wider block adds one add/subtract pass per doubling.
# Measured (one Zen 4 core, [1120, 3072] float32, block 128): one product with H_128 12.9 ms; H_32 then two
# butterfly passes 7.7 ms; H_64 and one pass 9.8 ms; H_16 and three 9.2 ms.
PRODUCT_WIDTH = 32


def _butterflies(x: Tensor, block: int) -> Tensor:
    """:func:`block_hadamard` by Sylvester's recursion: ``x H_b`` for ``x = [x_a, x_b]`` is
    ``[(x_a + x_b) H_{b/2}, (x_a - x_b) H_{b/2}]``, so each run of :data:`PRODUCT_WIDTH` channels is multiplied by
    the small matrix and the runs are then combined pairwise, once per doubling (fewer operations than the
    ``b``-term products, hence no larger rounding). ``x`` is kept. Each pass writes its sums and differences into a
    second buffer; under autograd or tracing (ONNX export) they are stacked instead: the same values, bit for bit,
    so an exported graph computes what the model does.
    """
    width = PRODUCT_WIDTH
    runs = block // width
    y = torch.matmul(x.reshape(-1, width), _cached_matrix(width, x.dtype, x.device)).reshape(-1, runs, width)
    buffers = not torch.jit.is_tracing() and not (x.requires_grad and torch.is_grad_enabled())
    z = torch.empty_like(y) if buffers else None
    stride = 1
    while stride < runs:
        shape = (-1, runs // (2 * stride), 2, stride, width)
        pairs = y.reshape(shape)
        a, b = pairs[:, :, 0], pairs[:, :, 1]
        if buffers:
            other = z.view(shape)
            torch.add(a, b, out=other[:, :, 0])
            torch.sub(a, b, out=other[:, :, 1])
            y, z = z, y
        else:
            y = torch.stack((a + b, a - b), dim=2).reshape(-1, runs, width)
        stride *= 2
    return (y.mul_(1 / math.sqrt(runs)) if buffers else y * (1 / math.sqrt(runs))).reshape(x.shape)


@functools.lru_cache(maxsize=16)
def _cached_matrix(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """:func:`hadamard_matrix`, built once per (size, dtype, device): the SwiGLU rotation runs every forward."""
    return hadamard_matrix(n, dtype=dtype, device=device)
