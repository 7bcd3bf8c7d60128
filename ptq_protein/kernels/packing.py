"""Int4 weight packing: two signed 4-bit values per byte along K (the host side, plain torch).

Layout: ``packed[n, j]`` holds ``w[n, 2j]`` in the low nibble and
``w[n, 2j+1]`` in the high nibble, both two's complement. An odd K is padded
with a zero high nibble in the last byte. :func:`pack_int4` / :func:`unpack_int4`
are the torch side; :func:`~ptq_protein.kernels.gemm_common.load_int4_tile` is the
Triton side used by the GEMM kernel (:func:`ptq_protein.kernels.int4_gemm.int4_linear`).
This module imports no Triton: saving and loading an artifact need only these.
"""

from __future__ import annotations

import torch

from ptq_protein.kernels.checks import check_int_matrix

__all__ = ["INT4_MAX", "INT4_MIN", "pack_int4", "packed_width", "unpack_int4"]

INT4_MIN, INT4_MAX = -8, 7  # two's complement nibble
_NIBBLE = 0xF
_NIBBLE_SPAN = 16


def packed_width(k: int) -> int:
    """Bytes per row of a packed ``[N, k]`` int4 matrix: ``ceil(k / 2)``."""
    return (k + 1) // 2


def pack_int4(w_q: torch.Tensor) -> torch.Tensor:
    """Pack int4 values stored in int8 into bytes.

    Parameters
    ----------
    w_q : torch.Tensor, int8, shape [N, K]
        Values in ``[-8, 7]`` (symmetric quantizers use ``[-7, 7]``).

    Returns
    -------
    torch.Tensor, uint8, shape [N, ceil(K/2)]

    Examples
    --------
    >>> pack_int4(torch.tensor([[1, -1, 7]], dtype=torch.int8))
    tensor([[241,   7]], dtype=torch.uint8)
    """
    w_q = check_int_matrix("w_q", w_q)
    if w_q.numel() and (int(w_q.min()) < INT4_MIN or int(w_q.max()) > INT4_MAX):
        raise ValueError(
            f"w_q values must lie in [{INT4_MIN}, {INT4_MAX}] to pack as int4, got "
            f"[{int(w_q.min())}, {int(w_q.max())}]; quantize with bits=4 first"
        )
    w = w_q.to(torch.int16)
    if w.shape[1] % 2:
        w = torch.nn.functional.pad(w, (0, 1))
    low = w[:, 0::2] & _NIBBLE
    high = w[:, 1::2] & _NIBBLE
    return (low | (high << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: uint8 ``[N, ceil(k/2)]`` to int8 ``[N, k]``."""
    packed = check_int_matrix("packed", packed, dtype=torch.uint8)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"K={k!r} must be a positive int (the unpacked row length)")
    if packed.shape[1] != packed_width(k):
        raise ValueError(
            f"packed has {packed.shape[1]} bytes per row but K={k} needs {packed_width(k)}; pass the K used to pack"
        )
    p = packed.to(torch.int16)
    nibbles = torch.stack((p & _NIBBLE, (p >> 4) & _NIBBLE), dim=-1).reshape(p.shape[0], -1)[:, :k]
    signed = torch.where(nibbles > INT4_MAX, nibbles - _NIBBLE_SPAN, nibbles)
    return signed.to(torch.int8)
