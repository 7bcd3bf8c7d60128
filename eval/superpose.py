"""Batched weighted least-squares superposition (Kabsch problem) for numpy arrays or torch tensors (CPU or CUDA).

The rotation comes from Horn's quaternion method (J. Opt. Soc. Am. A 4, 629,
1987): the optimal rotation is the quaternion of the largest eigenvalue of a
4x4 symmetric matrix built from the 3x3 covariance, which always gives a
proper rotation (no reflection fix-up as with an SVD); one batched ``eigh``
solves thousands of these 4x4 problems. Written once against the array API
(:mod:`ptq_protein.eval.arrays`): results come back in the inputs' library and device.
"""

from __future__ import annotations

from typing import Any, Optional

from ptq_protein.eval.arrays import device, namespace

__all__ = ["kabsch", "rotation_from_covariance", "apply_transform", "superposition_rmsd"]


def rotation_from_covariance(cov: Any, identity_where: Optional[Any] = None) -> Any:
    """Rotation R [..., 3, 3] maximising ``sum_n (R x_n) . y_n`` given ``cov = sum_n x_n y_n^T``.

    Parameters
    ----------
    cov : array [..., 3, 3] (numpy or torch)
        Covariance of centred mobile (x) and target (y) coordinates.
    identity_where : array [...] of bool, optional
        Where True the rotation is the identity (no point or a single one, as
        TMscore's u3b returns).
    """
    xp = namespace(cov)
    _, vectors = xp.linalg.eigh(_horn_matrix(xp, cov))
    q = vectors[..., :, -1]  # eigenvalues ascend: the last is the largest
    if identity_where is not None:
        identity = xp.asarray([1.0, 0.0, 0.0, 0.0], dtype=cov.dtype, device=device(cov))
        q = xp.where(identity_where[..., None], identity, q)
    return _quaternion_to_matrix(xp, q)


def kabsch(x: Any, y: Any, weights: Optional[Any] = None) -> tuple:
    """Rotation and translation minimising ``sum_n w_n |R x_n + t - y_n|^2``.

    Parameters
    ----------
    x, y : array [..., N, 3] (numpy or torch)
        Mobile and target coordinates, paired row by row.
    weights : array [..., N], optional
        Non-negative weights (a 0/1 mask selects a subset); default all ones.
        Where all weights are zero the transform is the identity (as TMscore's u3b).

    Returns
    -------
    rotation : array [..., 3, 3]
        A proper rotation (det +1).
    translation : array [..., 3]

    Examples
    --------
    >>> x = np.random.default_rng(0).normal(size=(5, 3))
    >>> r, t = kabsch(x, x + 1.0)
    >>> np.allclose(apply_transform(x, r, t), x + 1.0)
    True
    """
    xp = namespace(x, y) if weights is None else namespace(x, y, weights)
    if x.shape != y.shape or x.shape[-1] != 3:
        raise ValueError(f"x and y must both be [..., N, 3], got {tuple(x.shape)} and {tuple(y.shape)}")
    if weights is None:
        w = xp.ones(x.shape[:-1], dtype=x.dtype, device=device(x))
    else:
        w = xp.astype(weights, x.dtype, copy=False)
    total = xp.sum(w, axis=-1, keepdims=True)
    safe = xp.clip(total, min=xp.finfo(x.dtype).smallest_normal)
    cx = xp.sum(w[..., None] * x, axis=-2) / safe
    cy = xp.sum(w[..., None] * y, axis=-2) / safe
    xc, yc = x - cx[..., None, :], y - cy[..., None, :]
    wx = xc * w[..., None]
    cov = xp.matrix_transpose(wx) @ yc
    rotation = rotation_from_covariance(cov, identity_where=xp.count_nonzero(w > 0, axis=-1) <= 1)
    translation = cy - (rotation @ cx[..., None])[..., 0]
    empty = total[..., 0] <= 0
    translation = xp.where(empty[..., None], xp.zeros_like(translation), translation)
    return rotation, translation


def apply_transform(x: Any, rotation: Any, translation: Any) -> Any:
    """``R x + t`` for coordinates [..., N, 3], rotation [..., 3, 3], translation [..., 3]."""
    xp = namespace(x, rotation, translation)
    return x @ xp.matrix_transpose(rotation) + translation[..., None, :]


def superposition_rmsd(x: Any, y: Any, weights: Optional[Any] = None) -> Any:
    """RMSD [...] of the (weighted) pairs after their optimal superposition."""
    xp = namespace(x, y)
    rotation, translation = kabsch(x, y, weights)
    sq = xp.sum((apply_transform(x, rotation, translation) - y) ** 2, axis=-1)
    w = xp.ones_like(sq) if weights is None else xp.astype(weights, sq.dtype, copy=False)
    return xp.sqrt(xp.sum(w * sq, axis=-1) / xp.clip(xp.sum(w, axis=-1), min=xp.finfo(sq.dtype).smallest_normal))


def _horn_matrix(xp: Any, cov: Any) -> Any:
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
    return xp.stack([xp.stack(row, axis=-1) for row in rows], axis=-2)


def _quaternion_to_matrix(xp: Any, q: Any) -> Any:
    """Rotation matrices [..., 3, 3] of unit quaternions [..., 4] (w, x, y, z)."""
    w, x, y, z = (q[..., i] for i in range(4))
    rows = [
        [w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z],
    ]
    return xp.stack([xp.stack(row, axis=-1) for row in rows], axis=-2)
