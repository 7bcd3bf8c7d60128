"""Seeded sample generators shared by the quantizer tests."""

import pytest
import torch


def gaussian(n: int, seed: int) -> torch.Tensor:
    """Unit-variance Gaussian samples (float64)."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def laplacian(n: int, seed: int) -> torch.Tensor:
    """Unit-variance Laplacian samples (float64, scale 1/sqrt(2)) by inverse CDF."""
    u = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) - 0.5
    return -torch.sign(u) * torch.log1p(-2 * u.abs()) / 2**0.5


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
