"""Planted outlier channels give asymmetric, heavy-tailed pre-LayerNorm activations, as in trained ESM."""

import numpy as np
import pytest
import scipy.stats
import torch

from ptq_protein.data.sets import load_set
from ptq_protein.models import OutlierSpec, channel_asymmetry, channel_kurtosis, tiny_esm2, tiny_esmfold, tiny_hf_esm2
from ptq_protein.models.tokens import tokenize_fair_esm

INT8_MAX = 127  # symmetric signed 8-bit grid


@pytest.fixture(scope="module")
def sequences():
    return [s[:120] for s in load_set("cameo139:6").sequences()]


def pre_layernorm_inputs(model, call, dims):
    """{LayerNorm name: its input} for every nn.LayerNorm of width ``dims`` that runs during ``call()``."""
    captured, handles = {}, []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm) and module.normalized_shape == (dims,):
            handles.append(module.register_forward_pre_hook(
                lambda mod, args, name=name: captured.setdefault(name, args[0].detach())))
    try:
        with torch.no_grad():
            call()
    finally:
        for handle in handles:
            handle.remove()
    return captured


def residual_sites(model, alphabet, sequences, hf=False):
    """Pre-LN activations of the residual stream, real tokens only: {site: (N, D)}."""
    tokens, mask = tokenize_fair_esm(alphabet, sequences)
    if hf:
        sites = pre_layernorm_inputs(model, lambda: model(input_ids=tokens, attention_mask=mask.long()),
                                     model.config.hidden_size)
    else:
        sites = pre_layernorm_inputs(model, lambda: model(tokens), model.embed_dim)
    out = {}
    for name, x in sites.items():
        if "lm_head" in name:  # the LM head's LayerNorm reads the head's dense output, not the residual stream
            continue
        x = x.transpose(0, 1) if x.shape[:2] == mask.shape[::-1] and x.shape[:2] != mask.shape else x
        out[name] = x[mask]
    return out


def planted_channels(spec, dims, seed):
    generator = torch.Generator().manual_seed(seed + spec.seed_offset)
    return sorted(torch.randperm(dims, generator=generator)[:spec.num_channels].tolist())


def assert_outliers(sites, channels):
    assert len(sites) >= 5  # 2 layers x 2 LayerNorms + the final one
    for name, x in sites.items():
        rest = [c for c in range(x.shape[1]) if c not in channels]
        kurt, asym = channel_kurtosis(x), channel_asymmetry(x)
        for k, c in enumerate(channels):
            sign = 1 if k % 2 == 0 else -1  # OutlierSpec alternates +, -
            assert kurt[c] > 15, (name, c)  # heavy tail (Gaussian: 3)
            assert asym[c] > 4, (name, c)  # one extreme much larger than the other
            assert (torch.sign(x[:, c]) == sign).double().mean() > 0.99, (name, c)  # one-sided
            assert x[:, c].abs().max() > 4 * x[:, rest].abs().max(), (name, c)
        assert kurt[rest].median() < 4, name
        assert 0.2 < (x[:, rest] > 0).double().mean(dim=0).median() < 0.8, name


def test_fair_esm2_planted_channels_are_heavy_tailed_and_one_sided(sequences):
    spec = OutlierSpec()
    model, alphabet = tiny_esm2(seed=0, outliers=spec)
    assert_outliers(residual_sites(model, alphabet, sequences), planted_channels(spec, 64, seed=0))


def test_hf_esm2_carries_the_same_channels(sequences):
    spec = OutlierSpec(num_channels=3)
    model, _ = tiny_hf_esm2(seed=4, outliers=spec)
    _, alphabet = tiny_esm2(seed=4)
    assert_outliers(residual_sites(model, alphabet, sequences, hf=True), planted_channels(spec, 64, seed=4))


def test_esmfold_stem_carries_outliers(sequences):
    model, _ = tiny_esmfold(seed=0)
    _, alphabet = tiny_esm2(seed=0)
    sites = residual_sites(model.esm, alphabet, sequences, hf=True)  # ESMFold's ESM-2 stem is an EsmModel
    assert_outliers(sites, planted_channels(OutlierSpec(), model.config.hidden_size, seed=0))


def test_without_outliers_no_channel_stands_out(sequences):
    model, alphabet = tiny_esm2(seed=0, outliers=None)
    for name, x in residual_sites(model, alphabet, sequences).items():
        assert channel_kurtosis(x).max() < 10 and x.abs().max() < 10, name


def test_per_tensor_int8_loses_the_normal_channels_only_with_outliers(sequences):
    """Why uniform A8 fails: a symmetric per-tensor grid sized for the outliers has steps larger than normal values."""
    errors = {}
    for label, spec in (("planted", OutlierSpec()), ("plain", None)):
        model, alphabet = tiny_esm2(seed=0, outliers=spec)
        x = residual_sites(model, alphabet, sequences)["layers.1.self_attn_layer_norm"]
        step = x.abs().max() / INT8_MAX
        quantized = torch.clamp(torch.round(x / step), -INT8_MAX, INT8_MAX) * step
        rest = [c for c in range(64) if c not in planted_channels(OutlierSpec(), 64, seed=0)]
        errors[label] = ((quantized - x)[:, rest].norm() / x[:, rest].norm()).item()
    assert errors["plain"] < 0.02 and errors["planted"] > 0.2, errors


def test_statistics_match_scipy_and_closed_forms():
    rng = np.random.default_rng(0)
    x = np.stack([rng.normal(size=4000), rng.exponential(size=4000), rng.uniform(-1, 1, size=4000)], axis=1)
    ours = channel_kurtosis(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours, scipy.stats.kurtosis(x, axis=0, fisher=False), rtol=1e-12)
    two_point = torch.tensor([[-1.0], [1.0]] * 50)
    assert channel_kurtosis(two_point).item() == pytest.approx(1.0)  # closed form for +-1 with equal weight
    assert channel_asymmetry(torch.tensor([[-2.0], [8.0], [1.0]])).item() == pytest.approx(4.0)
    with pytest.raises(ValueError, match="shape"):
        channel_kurtosis(torch.ones(5))


def test_spec_validation_and_determinism():
    with pytest.raises(ValueError, match="num_channels"):
        OutlierSpec(num_channels=0)
    with pytest.raises(ValueError, match="scale"):
        OutlierSpec(scale=-1.0)
    with pytest.raises(ValueError, match="cannot plant"):
        tiny_esm2(embed_dim=8, heads=2, outliers=OutlierSpec(num_channels=9))
    assert OutlierSpec().to_dict()["num_channels"] == 2
