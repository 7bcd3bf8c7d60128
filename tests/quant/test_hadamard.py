"""Hadamard rotations against their closed form: ``H[i, j] = (-1)^popcount(i & j) / sqrt(n)`` (Sylvester)."""

import math

import pytest
import torch

from ptq_protein.quant.hadamard import block_hadamard, check_hadamard_block, hadamard_matrix


def _closed_form(n: int) -> torch.Tensor:
    """Sylvester's matrix entry by entry from the bit parity of ``i & j`` (not by doubling)."""
    return torch.tensor([[(-1) ** bin(i & j).count("1") for j in range(n)] for i in range(n)],
                        dtype=torch.float64) / math.sqrt(n)


def test_hand_written_2x2_and_4x4():
    assert torch.equal(hadamard_matrix(2) * math.sqrt(2), torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64))
    four = torch.tensor([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]], dtype=torch.float64) / 2
    assert torch.equal(hadamard_matrix(4), four)


@pytest.mark.parametrize("n", [2, 8, 64, 128, 256])
def test_entries_are_the_closed_form_and_the_matrix_is_orthonormal(n):
    h = hadamard_matrix(n)
    assert h.dtype == torch.float64 and h.shape == (n, n)
    torch.testing.assert_close(h, _closed_form(n), rtol=0, atol=1e-15)
    assert torch.equal(h.abs(), torch.full((n, n), 1 / math.sqrt(n), dtype=torch.float64))
    torch.testing.assert_close(h @ h.T, torch.eye(n, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.equal(h, h.T)


def test_block_rotation_is_the_block_diagonal_product():
    x = torch.randn(2, 3, 24, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    diagonal = torch.block_diag(*[_closed_form(8)] * 3)  # [24, 24]
    got = block_hadamard(x, 8)
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, x @ diagonal, rtol=0, atol=1e-12)
    torch.testing.assert_close(block_hadamard(got, 8), x, rtol=0, atol=1e-12)  # its own inverse
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)


def test_block_rotation_runs_in_the_input_dtype():
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(1))
    got = block_hadamard(x, 16)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), x.double() @ _closed_form(16), rtol=0, atol=1e-5)


@pytest.mark.parametrize("bad", [0, 1, 3, 6, 96, -4, 2.0, True, "128"])
def test_sizes_without_a_sylvester_matrix_are_refused(bad):
    with pytest.raises(ValueError, match="power of two"):
        check_hadamard_block(bad)
    with pytest.raises(ValueError, match="power of two"):
        hadamard_matrix(bad)


def test_a_block_that_does_not_divide_the_channels_is_refused():
    with pytest.raises(ValueError, match="does not divide the 24 channels"):
        block_hadamard(torch.zeros(2, 24), 16)


@pytest.mark.parametrize("block", [64, 128, 512])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_wide_blocks_by_butterflies_equal_the_closed_form(block, dtype):
    """Blocks wider than the matrix-product width run as a small product then add/subtract passes (Sylvester's
    recursion): the block-diagonal product of the closed form within the dtype's rounding, and the same values
    under autograd (stacked passes) as without (buffered passes)."""
    x = torch.randn(3, 5, 2 * block, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    want = x @ torch.block_diag(*[_closed_form(block)] * 2)
    got = block_hadamard(x.to(dtype), block)
    assert got.dtype == dtype and got.shape == x.shape
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close(got.double(), want, rtol=0, atol=tol * float(x.abs().max()))
    tracked = block_hadamard(x.to(dtype).requires_grad_(), block)
    assert tracked.requires_grad and torch.equal(tracked.detach(), got)
    tracked.sum().backward()  # differentiable: the stacked passes keep the graph
