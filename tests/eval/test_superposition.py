"""Batched Horn/Kabsch superposition against an independent float64 SVD reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from eval_testlib import random_rotation

from ptq_protein.eval.superpose import apply_transform, kabsch, superposition_rmsd


def svd_reference(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple:
    """Weighted Kabsch by SVD with the reflection fix (Kabsch 1976), float64 numpy."""
    cx, cy = (w[:, None] * x).sum(0) / w.sum(), (w[:, None] * y).sum(0) / w.sum()
    h = ((x - cx) * w[:, None]).T @ (y - cy)
    u, _, vt = np.linalg.svd(h)
    d = np.sign(np.linalg.det(vt.T @ u.T))
    r = vt.T @ np.diag([1.0, 1.0, d]) @ u.T
    return r, cy - r @ cx


@pytest.mark.parametrize("noise", [0.0, 0.5, 5.0, 50.0])
def test_matches_svd_reference(noise):
    rng = np.random.default_rng(0)
    xs, ys, ws = [], [], []
    for _ in range(64):
        x = rng.normal(0, 10, (12, 3)) + rng.normal(0, 100, 3)
        y = x @ random_rotation(rng).T + rng.normal(0, 30, 3) + rng.normal(0, noise, (12, 3))
        xs.append(x)
        ys.append(y)
        ws.append((rng.random(12) < 0.7).astype(float) + 1e-3 * (noise > 1))
    rotation, translation = kabsch(torch.tensor(np.array(xs)), torch.tensor(np.array(ys)), torch.tensor(np.array(ws)))
    for i in range(64):
        r_ref, t_ref = svd_reference(xs[i], ys[i], ws[i])
        res = lambda r, t, i=i: (ws[i] * ((xs[i] @ r.T + t - ys[i]) ** 2).sum(1)).sum()  # noqa: E731
        assert res(rotation[i].numpy(), translation[i].numpy()) == pytest.approx(res(r_ref, t_ref), rel=1e-9, abs=1e-9)
        assert np.linalg.det(rotation[i].numpy()) == pytest.approx(1.0, abs=1e-12)
        np.testing.assert_allclose(rotation[i].numpy(), r_ref, atol=1e-6)


def test_mirror_image_gets_a_proper_rotation():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 5, (20, 3))
    y = x * np.array([1.0, 1.0, -1.0])  # a reflection: no rotation superposes it
    rotation, translation = kabsch(torch.tensor(x), torch.tensor(y))
    r_ref, t_ref = svd_reference(x, y, np.ones(20))
    assert torch.linalg.det(rotation).item() == pytest.approx(1.0)
    np.testing.assert_allclose(apply_transform(torch.tensor(x), rotation, translation).numpy(), x @ r_ref.T + t_ref,
                               atol=1e-8)


def test_zero_weights_select_a_subset_and_empty_is_identity():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(10, 3)), rng.normal(size=(10, 3))
    w = np.r_[np.ones(6), np.zeros(4)]
    r_sub, t_sub = kabsch(torch.tensor(x[:6]), torch.tensor(y[:6]))
    r_w, t_w = kabsch(torch.tensor(x), torch.tensor(y), torch.tensor(w))
    torch.testing.assert_close(r_w, r_sub)
    torch.testing.assert_close(t_w, t_sub)
    r0, t0 = kabsch(torch.tensor(x), torch.tensor(y), torch.zeros(10, dtype=torch.float64))
    torch.testing.assert_close(r0, torch.eye(3, dtype=torch.float64))
    torch.testing.assert_close(t0, torch.zeros(3, dtype=torch.float64))
    r1, t1 = kabsch(torch.tensor(x[:1]), torch.tensor(y[:1]))  # one point: translation only (TMscore's u3b)
    torch.testing.assert_close(r1, torch.eye(3, dtype=torch.float64))
    torch.testing.assert_close(t1, torch.tensor(y[0] - x[0]))


def test_rmsd_of_exact_copy_and_of_known_offset():
    rng = np.random.default_rng(3)
    x = torch.tensor(rng.normal(0, 8, (30, 3)))
    r = torch.tensor(random_rotation(rng))
    assert superposition_rmsd(x, x @ r.T + 4.0).item() == pytest.approx(0.0, abs=1e-9)
    y = x.clone()
    y[0] += torch.tensor([0.0, 0.0, 3.0])  # one point displaced: RMSD after fit is below 3/sqrt(30)
    assert 0 < superposition_rmsd(x, y).item() < 3.0 / np.sqrt(30)
    with pytest.raises(ValueError):
        kabsch(x, x[:5])


def test_numpy_arrays_give_numpy_results_equal_to_torch():
    """One implementation for both libraries: numpy in, numpy out, the same rotation as torch and as the SVD."""
    rng = np.random.default_rng(4)
    x = rng.normal(0, 10, (8, 15, 3))
    y = np.stack([xi @ random_rotation(rng).T + rng.normal(0, 1.0, xi.shape) for xi in x])
    w = (rng.random((8, 15)) < 0.8).astype(float)
    rotation, translation = kabsch(x, y, w)
    assert isinstance(rotation, np.ndarray) and isinstance(translation, np.ndarray)
    r_t, t_t = kabsch(torch.tensor(x), torch.tensor(y), torch.tensor(w))
    np.testing.assert_allclose(rotation, r_t.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(translation, t_t.numpy(), rtol=0, atol=1e-12)
    for i in range(8):
        r_ref, t_ref = svd_reference(x[i], y[i], w[i])
        np.testing.assert_allclose(rotation[i], r_ref, atol=1e-9)
        np.testing.assert_allclose(translation[i], t_ref, atol=1e-8)
    rmsd = superposition_rmsd(x, y, w)
    np.testing.assert_allclose(rmsd, superposition_rmsd(torch.tensor(x), torch.tensor(y), torch.tensor(w)).numpy(),
                               rtol=0, atol=1e-12)
