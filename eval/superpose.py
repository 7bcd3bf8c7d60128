"""Batched weighted least-squares superposition (Kabsch problem) in torch, CPU or CUDA.

The rotation comes from Horn's quaternion method (J. Opt. Soc. Am. A 4, 629,
1987): the optimal rotation is the quaternion of the largest eigenvalue of a
4x4 symmetric matrix built from the 3x3 covariance, which always gives a
proper rotation (no reflection fix-up as with an SVD); ``torch.linalg.eigh``
solves thousands of these 4x4 problems in one batched call.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["kabsch", "rotation_from_covariance", "apply_transform", "superposition_rmsd"]


def rotation_from_covariance(cov: torch.Tensor, identity_where: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Rotation R [..., 3, 3] maximising ``sum_n (R x_n) . y_n`` given ``cov = sum_n x_n y_n^T``.

    Parameters
    ----------
    cov : torch.Tensor [..., 3, 3]
        Covariance of centred mobile (x) and target (y) coordinates.
    identity_where : torch.Tensor [...] of bool, optional
        Where True the rotation is the identity (no point or a single one, as
        TMscore's u3b returns).
    """
    _, vectors = torch.linalg.eigh(_horn_matrix(cov))
    q = vectors[..., :, -1]  # eigenvalues ascend: the last is the largest
    if identity_where is not None:
        identity = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=cov.dtype, device=cov.device)
        q = torch.where(identity_where[..., None], identity, q)
    return _quaternion_to_matrix(q)


def kabsch(x: torch.Tensor, y: torch.Tensor, weights: Optional[torch.Tensor] = None) -> tuple:
    """Rotation and translation minimising ``sum_n w_n |R x_n + t - y_n|^2``.

    Parameters
    ----------
    x, y : torch.Tensor [..., N, 3]
        Mobile and target coordinates, paired row by row.
    weights : torch.Tensor [..., N], optional
        Non-negative weights (a 0/1 mask selects a subset); default all ones.
        Where all weights are zero the transform is the identity (as TMscore's u3b).

    Returns
    -------
    rotation : torch.Tensor [..., 3, 3]
        A proper rotation (det +1).
    translation : torch.Tensor [..., 3]

    Examples
    --------
    >>> x = torch.randn(5, 3, dtype=torch.float64)
    >>> r, t = kabsch(x, x + 1.0)
    >>> torch.allclose(apply_transform(x, r, t), x + 1.0)
    True
    """
    if x.shape != y.shape or x.shape[-1] != 3:
        raise ValueError(f"x and y must both be [..., N, 3], got {tuple(x.shape)} and {tuple(y.shape)}")
    w = torch.ones(x.shape[:-1], dtype=x.dtype, device=x.device) if weights is None else weights.to(x.dtype)
    total = w.sum(-1, keepdim=True)
    safe = total.clamp_min(torch.finfo(x.dtype).tiny)
    cx = (w.unsqueeze(-1) * x).sum(-2) / safe
    cy = (w.unsqueeze(-1) * y).sum(-2) / safe
    xc, yc = x - cx.unsqueeze(-2), y - cy.unsqueeze(-2)
    wx = xc * w.unsqueeze(-1)
    cov = wx.transpose(-1, -2) @ yc
    rotation = rotation_from_covariance(cov, identity_where=(w > 0).sum(-1) <= 1)
    translation = cy - (rotation @ cx.unsqueeze(-1)).squeeze(-1)
    empty = total.squeeze(-1) <= 0
    translation = torch.where(empty.unsqueeze(-1), torch.zeros_like(translation), translation)
    return rotation, translation


def apply_transform(x: torch.Tensor, rotation: torch.Tensor, translation: torch.Tensor) -> torch.Tensor:
    """``R x + t`` for coordinates [..., N, 3], rotation [..., 3, 3], translation [..., 3]."""
    return x @ rotation.transpose(-1, -2) + translation.unsqueeze(-2)


def superposition_rmsd(x: torch.Tensor, y: torch.Tensor, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """RMSD [...] of the (weighted) pairs after their optimal superposition."""
    rotation, translation = kabsch(x, y, weights)
    sq = ((apply_transform(x, rotation, translation) - y) ** 2).sum(-1)
    w = torch.ones_like(sq) if weights is None else weights.to(sq.dtype)
    return torch.sqrt((w * sq).sum(-1) / w.sum(-1).clamp_min(torch.finfo(sq.dtype).tiny))


def _horn_matrix(cov: torch.Tensor) -> torch.Tensor:
    """Horn's 4x4 symmetric matrix [..., 4, 4] of a covariance ``S_ab = sum x_a y_b``."""
    s = cov
    xx, xy, xz = s[..., 0, 0], s[..., 0, 1], s[..., 0, 2]
    yx, yy, yz = s[..., 1, 0], s[..., 1, 1], s[..., 1, 2]
    zx, zy, zz = s[..., 2, 0], s[..., 2, 1], s[..., 2, 2]
    rows = [
        [xx + yy + zz, yz - zy, zx - xz, xy - yx],
        [yz - zy, xx - yy - zz, xy + yx, zx + xz],
        [zx - xz, xy + yx, yy - xx - zz, yz + zy],
        [xy - yx, zx + xz, yz + zy, zz - xx - yy],
    ]
    return torch.stack([torch.stack(row, dim=-1) for row in rows], dim=-2)


def _quaternion_to_matrix(q: torch.Tensor) -> torch.Tensor:
    """Rotation matrices [..., 3, 3] of unit quaternions [..., 4] (w, x, y, z)."""
    w, x, y, z = q.unbind(-1)
    rows = [
        [w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z],
    ]
    return torch.stack([torch.stack(row, dim=-1) for row in rows], dim=-2)
