"""The outlier-shape planters: names and aliases, validation, and determinism per seed (the measured claims of each
shape on a written checkpoint are in tests/test_bench_scripts.py, which runs the random-checkpoint maker)."""

import pytest
import torch

from ptq_protein.models.outlier_shapes import (
    SHAPE_NAMES,
    LnGainSpec,
    OutlierShape,
    SinkSpec,
    plant_attention_sink_,
    plant_ln_gain_,
)


@pytest.mark.parametrize("shape", list(OutlierShape))
def test_every_shape_parses_from_its_name_and_mix_is_the_union(shape):
    assert OutlierShape.parse(shape.value) is shape and shape.value in SHAPE_NAMES
    assert shape.parts <= OutlierShape.MIX.parts and (shape is OutlierShape.PLAIN) == (not shape.parts)


def test_aliases_keep_the_old_names():
    assert OutlierShape.parse("outliers") is OutlierShape.parse(True) is OutlierShape.RESIDUAL
    assert OutlierShape.parse(False) is OutlierShape.PLAIN
    with pytest.raises(ValueError, match="ln-gain"):
        OutlierShape.parse("layernorm")


def _gains(seed):
    gains = [torch.ones(32) for _ in range(4)]
    return gains, plant_ln_gain_(gains, LnGainSpec(), seed=seed)


def test_ln_gain_scales_the_same_channels_everywhere_within_the_range_deterministically():
    gains, channels = _gains(0)
    assert len(channels) == 3 and all(torch.equal(g, gains[0]) for g in gains)
    others = [c for c in range(32) if c not in channels]
    assert gains[0][others].eq(1).all() and gains[0][channels].ge(20).all() and gains[0][channels].le(50).all()
    assert torch.equal(_gains(0)[0][0], gains[0]) and not torch.equal(_gains(1)[0][0], gains[0])
    with pytest.raises(ValueError, match="one shape"):
        plant_ln_gain_([torch.ones(4), torch.ones(5)], LnGainSpec(), seed=0)
    with pytest.raises(ValueError, match="low"):
        LnGainSpec(low=5.0, high=2.0)


def test_sink_sets_the_sink_rows_and_each_heads_slowest_rotary_key_row():
    dim, heads, spec = 16, 2, SinkSpec()
    embedding, q_bias, k_weight = torch.randn(6, dim), torch.zeros(dim), torch.randn(dim, dim)
    before = embedding.clone()
    channels = plant_attention_sink_(embedding, [(q_bias, k_weight)], heads, spec, seed=3, sink_tokens=(0, 2))
    assert torch.equal(embedding[[1, 3, 4, 5]], before[[1, 3, 4, 5]])
    assert embedding[0, channels].abs().eq(spec.scale * 4).all() and torch.equal(embedding[0, channels],
                                                                                   embedding[2, channels])
    rows = [3, 11]  # head_dim 8: rotate_half pairs (3, 7); the last first-half index has the lowest frequency
    assert q_bias.nonzero().flatten().tolist() == rows
    assert (k_weight[rows].abs() > 0).sum(dim=1).tolist() == [len(channels)] * 2
    with pytest.raises(ValueError, match="even head dimension"):
        plant_attention_sink_(torch.zeros(3, 6), [], 2, spec, seed=0, sink_tokens=(0,))
    with pytest.raises(ValueError, match="attention_logit"):
        SinkSpec(attention_logit=0.0)
