"""ESM C's optional SwiGLU rotation: off by default (the official module), what it computes, how artifacts record it."""

import math

import pytest
import torch
from torch.nn import functional as F

from ptq_protein.models.architecture import build_architecture, describe_architecture
from ptq_protein.models.esmc import ESMC, SwiGLU
from ptq_protein.support.errors import ArtifactError


def _sylvester(n: int) -> torch.Tensor:
    """Closed form, entry by entry: ``(-1)^popcount(i & j) / sqrt(n)``."""
    return torch.tensor([[(-1) ** bin(i & j).count("1") for j in range(n)] for i in range(n)],
                        dtype=torch.float64) / math.sqrt(n)


def _input(width: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(2, 5, 2 * width, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)


def test_default_is_the_official_product():
    x = _input(8)
    a, b = x[..., :8], x[..., 8:]
    assert SwiGLU().rotation == 0
    torch.testing.assert_close(SwiGLU()(x), F.silu(a) * b, rtol=0, atol=0)


def test_rotation_multiplies_the_product_by_block_diagonal_hadamard():
    x = _input(256)
    product = F.silu(x[..., :256]) * x[..., 256:]
    want = product @ torch.block_diag(_sylvester(128), _sylvester(128))
    torch.testing.assert_close(SwiGLU(128)(x), want, rtol=0, atol=1e-12)


def test_a_bfloat16_product_comes_back_in_bfloat16_within_its_last_rounding():
    x = _input(128, torch.bfloat16)
    product = F.silu(x[..., :128].float()).bfloat16() * x[..., 128:]  # the product as bfloat16 computes it
    got = SwiGLU(128)(x)
    assert got.dtype == torch.bfloat16
    # within the last rounding to bfloat16 of the float64 rotation: half a step, 2^-8 relative (8 significant bits)
    torch.testing.assert_close(got.double(), product.double() @ _sylvester(128), rtol=2 ** -8, atol=1e-30)


def test_the_state_dict_is_the_official_one():
    plain, rotated = ESMC(64, 4, 2), ESMC(64, 4, 2, ffn_rotation=128)
    assert list(plain.state_dict()) == list(rotated.state_dict())
    assert plain.ffn_rotation == 0 and rotated.ffn_rotation == 128
    assert [b.ffn[2].rotation for b in rotated.transformer.blocks] == [128, 128]


def test_the_architecture_records_the_rotation_only_when_set():
    assert describe_architecture(ESMC(64, 4, 2))["kwargs"] == {"d_model": 64, "n_heads": 4, "n_layers": 2}
    desc = describe_architecture(ESMC(64, 4, 2, ffn_rotation=64))
    assert desc["kwargs"] == {"d_model": 64, "n_heads": 4, "n_layers": 2, "ffn_rotation": 64}
    rebuilt = build_architecture(desc)
    assert type(rebuilt) is ESMC and rebuilt.ffn_rotation == 64


def test_blocks_rotated_unalike_cannot_be_described():
    model = ESMC(64, 4, 2)
    model.transformer.blocks[0].ffn[2].rotation = 128
    with pytest.raises(ValueError, match="different blocks"):
        describe_architecture(model)


@pytest.mark.parametrize("value, words", [(96, "power of two"), (512, "does not divide the SwiGLU width 256"),
                                          ("128", "power of two")])
def test_bad_rotations_are_refused(value, words):
    with pytest.raises(ValueError, match=words):
        ESMC(64, 4, 2, ffn_rotation=value)
    desc = {"library": "ptq-protein", "class": "ESMC",
            "kwargs": {"d_model": 64, "n_heads": 4, "n_layers": 2, "ffn_rotation": value}}
    with pytest.raises(ArtifactError, match="corrupt"):
        build_architecture(desc)


def test_an_unknown_esmc_argument_is_refused():
    desc = {"library": "ptq-protein", "class": "ESMC", "kwargs": {"d_model": 64, "n_heads": 4, "n_layers": 2,
                                                                  "rotation": 128}}
    with pytest.raises(ArtifactError, match="corrupt"):
        build_architecture(desc)
