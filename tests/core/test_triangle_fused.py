"""The bf16 trunk's fused triangle operations (``nn.triangle_sdpa``, ``nn.triangle_mul_bf16``).

References are transformers' own modules: the multiplicative update under the same autocast (the fused one
must be bit-identical), and the triangle attention in float64 (the fused kernel must be at least as near it as
transformers' written-out attention under bfloat16 autocast).
"""

import copy
import types

import pytest
import torch
from transformers.models.esm.modeling_esmfold import EsmFoldTriangleAttention, EsmFoldTriangleMultiplicativeUpdate

from ptq_protein.models.esmfold_cfg import FUSED_ATTENTION as SDPA_ATTR
from ptq_protein.nn import trunk_dtype
from ptq_protein.nn.triangle_mul_bf16 import use_fused_update
from ptq_protein.nn.triangle_sdpa import use_sdpa

C_Z, L = 16, 11


def _seeded(module: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(3)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)
    return module.eval()


def _held(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with its Linears in bfloat16, running under autocast (what the bf16 trunk does)."""
    trunk_dtype._hold_linears(module, "bfloat16")
    module.forward = types.MethodType(trunk_dtype._autocast_forward, module)
    return module


def _pair(padded: bool):
    torch.manual_seed(5)
    x, mask = torch.randn(1, L, L, C_Z) * 2, torch.ones(1, L, L)
    if padded:
        mask[:, -3:, :] = 0
        mask[:, :, -3:] = 0
    return x, mask


@pytest.mark.parametrize("outgoing", [True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_fused_multiplicative_update_is_bit_identical_to_transformers_under_autocast(outgoing, padded):
    config = types.SimpleNamespace(pairwise_state_dim=C_Z)
    reference = _held(_seeded(EsmFoldTriangleMultiplicativeUpdate(config, _outgoing=outgoing)))
    fused = copy.deepcopy(reference)
    use_fused_update(fused)
    x, mask = _pair(padded)
    with torch.no_grad():
        assert torch.equal(fused(x, mask=mask), reference(x, mask=mask))


@pytest.mark.parametrize("starting", [True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_fused_triangle_attention_is_as_near_float64_as_transformers_bf16(starting, padded):
    module = _seeded(EsmFoldTriangleAttention(C_Z, 8, 2, starting=starting))
    exact = copy.deepcopy(module).double()
    written = _held(copy.deepcopy(module))
    fused = _held(copy.deepcopy(module))
    use_sdpa(fused.mha)
    x, mask = _pair(padded)
    with torch.no_grad():
        truth = exact(x.double(), mask=mask.double(), chunk_size=None)
        err = {name: ((m(x, mask=mask, chunk_size=None).double() - truth).norm() / truth.norm()).item()
               for name, m in (("written", written), ("fused", fused))}
        chunked = fused(x, mask=mask, chunk_size=4)  # transformers' chunk_layer calls the fused forward per chunk
    assert 0 < err["fused"] <= 1.1 * err["written"] and err["fused"] < 0.05
    assert ((chunked.double() - truth).norm() / truth.norm()).item() < 0.05


def test_fused_attention_hands_transformers_own_kernels_back():
    module = _seeded(EsmFoldTriangleAttention(C_Z, 8, 2))
    fused = copy.deepcopy(module)
    use_sdpa(fused.mha)
    x, _ = _pair(False)
    with torch.no_grad():
        assert torch.equal(fused.mha(x, x, [], use_lma=True), module.mha(x, x, [], use_lma=True))


@pytest.mark.parametrize("native", [True, False])
def test_the_bf16_trunk_fuses_its_triangle_operations_only_where_it_runs_autocast(esmfold, monkeypatch, native):
    monkeypatch.setattr(trunk_dtype, "native_bf16", lambda device: native)
    model = trunk_dtype.use_trunk_dtype(copy.deepcopy(esmfold))
    block = model.trunk.blocks[0]
    assert getattr(block.tri_att_start.mha, SDPA_ATTR, False) is native
    assert getattr(block.tri_att_end.mha, SDPA_ATTR, False) is native
    assert ("forward" in block.tri_mul_in.__dict__) is native
    assert not hasattr(esmfold.trunk.blocks[0].tri_att_start.mha, SDPA_ATTR)  # the float model keeps transformers'
