"""study-* equals an independent re-implementation of the study's quantizers bit for bit (torch.equal).

The reference (``study_reference.py``) is shaped like the study's own code;
``ptq_protein.quant.study`` is the library's. Equality is exact, on synthetic
Gaussian / heavy-tailed / one-sided samples and on activations captured from
tiny ESMFold.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ptq_protein as pp
from ptq_protein.nn.study import StudyActQuant, study_weights_
from ptq_protein.quant.study import study_breakpoint, study_pwlq, study_uniform
from ptq_protein.quant.study_observer import StudyTopKObserver
from ptq_protein.recipes.config import QuantConfig, Scheme, StudyOptions
from tests.quant.study_reference import RefQuantAct, ref_bisect, ref_clip, ref_pwlq3, ref_uniform, ref_w8_state

SAMPLES = ("gaussian", "heavy", "one_sided", "shifted")


def _sample(kind: str, seed: int, n: int = 4096) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, n // 4, generator=g)
    if kind == "heavy":  # Student-t with 2 degrees of freedom: rare huge values
        x = x / torch.sqrt(torch.distributions.Chi2(2.0).sample((4, n // 4)) / 2.0)
    elif kind == "one_sided":  # post-ReLU: calibrated min >= 0 -> unsigned branch
        x = torch.relu(x) * 3.0
    elif kind == "shifted":  # max <= 0 on some calls: the fallback of their max
        x = x - 4.0
    return x


def _calibrate_both(kind: str, k: int, calls: int = 60, samples: int = 50, cols: int = 1000):
    ref = RefQuantAct(0, True, samples=samples, topk=cols)
    obs = StudyTopKObserver(k, samples)
    for i in range(calls):
        x = _sample(kind, 1000 + i)
        ref(x)
        obs.update(x)
    ref_bounds = (ref_clip(ref.minv, k, "min"), ref_clip(ref.maxv, k, "max"))
    return ref_bounds, obs.bounds()


def _ref_quantizer(bits: int, scheme: str, bounds) -> RefQuantAct:
    ref = RefQuantAct(bits, False, scheme=scheme)
    state = ref.state_dict()
    state["minv"][0], state["maxv"][0] = bounds  # load_model_act_stats: checkpoint[key][0] = value
    ref.load_state_dict(state)
    return ref


# Golden values: the study's act_clip_bounds (quant_acts.py:130-140, run unchanged) on the [50, 1000] max buffer
# their QuantAct fills (quant_acts.py:35-44: one row per call, the call's 1000 largest values ascending) from the
# calls x_i = randn(4000, generator=Generator().manual_seed(i)) - 30, i = 0..49. Every max is <= 0, so the fallback
# runs; it re-slices the k columns already kept (line 133 rebinds stats), so k = 1 and k = 2 differ.
THEIR_FALLBACK_MAX = {1: -26.4015, 2: -26.6413}


@pytest.mark.parametrize("k", sorted(THEIR_FALLBACK_MAX))
def test_topk_fallback_for_a_negative_max_is_theirs(k):
    ref, obs = RefQuantAct(0, True), StudyTopKObserver(k)
    for i in range(50):
        x = torch.randn(4000, generator=torch.Generator().manual_seed(i)) - 30
        ref(x)
        obs.update(x)
    theirs = ref_clip(ref.maxv, k, "max")
    assert theirs.item() == pytest.approx(THEIR_FALLBACK_MAX[k], abs=5e-5)  # the reference is their behaviour
    assert torch.equal(obs.bounds()[1], theirs)


def test_float_reason_says_why_a_site_stays_float():
    from ptq_protein.quant.study_observer import float_reason

    obs = StudyTopKObserver(2)
    assert float_reason(obs) == "never ran during calibration"
    for _ in range(3):
        obs.update(torch.zeros(64))
    assert float_reason(obs) == "ran 3 time(s), only on all-zero inputs"
    obs.update(torch.randn(64))
    assert float_reason(obs) is None


@pytest.mark.parametrize("kind", SAMPLES)
@pytest.mark.parametrize("k", [1, 2, 5, 100])
def test_topk_range_statistic_matches(kind, k):
    ref_bounds, ours = _calibrate_both(kind, k)
    assert torch.equal(ref_bounds[0], ours[0]) and torch.equal(ref_bounds[1], ours[1])


@pytest.mark.parametrize("kind", SAMPLES)
@pytest.mark.parametrize("k", [1, 2, 5, 100])
def test_uniform_matches(kind, k):
    bounds, ours_bounds = _calibrate_both(kind, k)
    ref = _ref_quantizer(8, "uniform", bounds)
    ours = StudyActQuant(Scheme.STUDY_UNIFORM, 8, *ours_bounds)
    for seed in (7, 8, 9):  # several calls: their quantizer rebinds its bounds on the first
        x = _sample(kind, seed) * 1.5  # some values beyond the range: clipped
        assert torch.equal(ours(x), ref(x))


@pytest.mark.parametrize("kind", SAMPLES)
@pytest.mark.parametrize("k", [2, 5])
def test_pwlq_matches(kind, k):
    bounds, ours_bounds = _calibrate_both(kind, k)
    ref = _ref_quantizer(8, "pwlq-3", bounds)
    ours = StudyActQuant(Scheme.STUDY_PWLQ, 8, *ours_bounds)
    for seed, gain in ((7, 1.0), (8, 1.5), (9, 40.0)):  # gain 40: breakpoint beyond M, their quirk
        x = _sample(kind, seed) * gain
        assert torch.equal(ours(x), ref(x))
    # two full 8-bit grids: a Gaussian call takes more than 2^8 distinct levels (9 bits per value)
    if kind == "gaussian":
        assert ours(_sample(kind, 11)).unique().numel() > 256


@pytest.mark.parametrize("bits", [4, 8])
def test_pure_functions_match(bits):
    x = _sample("heavy", 3)
    m = float(x.abs().max()) / 3
    assert torch.equal(study_uniform(x, bits, True, m), ref_uniform(x, bits, -m, m, True))
    mt = torch.tensor([m])
    assert torch.equal(study_uniform(x.relu(), bits, False, mt), ref_uniform(x.relu(), bits, 0, mt, False))
    assert torch.equal(study_pwlq(x, bits, True, m), ref_pwlq3(x, bits, -m, m, True))


def test_breakpoint_matches_and_is_their_value():
    for m in (1.5, 4.0, 8.0, 16.0, 32.0, 128.0, 1e4):
        assert study_breakpoint(m) == ref_bisect(m)
    # values the review measured with their package (study_spec.md section 4)
    assert [round(study_breakpoint(m), 4) for m in (4, 8, 16, 32, 128)] == [1.3921, 2.0151, 2.5872, 3.0667, 3.8422]


class _Toy(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.block = nn.Sequential(nn.Linear(16, 24), nn.LayerNorm(24))
        self.other = nn.Linear(24, 4)
        self.register_buffer("inv_freq", torch.rand(8, generator=g))
        self.conv = nn.Conv1d(3, 5, 3)  # a 3-D weight: rows over the remaining dims
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.3


def test_w8_matches():
    model = _Toy()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opts = StudyOptions(weight_prefixes=("block.", "conv"))
    done = study_weights_(model, opts)
    keys = [k for k in before if k.startswith(("block.", "conv"))]
    assert sorted(done) == sorted(keys)
    expected = ref_w8_state(before, keys)
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected[key]), key
    assert torch.equal(model.other.weight, before["other.weight"])  # outside the prefixes: untouched
    rotary = _Toy()
    study_weights_(rotary, StudyOptions(weight_prefixes=("inv",), round_rotary=True))
    assert torch.equal(rotary.inv_freq, ref_w8_state(before, ["inv_freq"])["inv_freq"])


# -- tiny ESMFold: real activations, real sites ---------------------------------------------------------------

SEQS = ["MKTAYIAKQRQISFVKSHFSRQ", "GSHMLEDPVAGKTWQ", "MSTNPKPQRKTKRNTNRRPQDVKFPGG"]
CALLS = 3  # StudyOptions(calls=3) with 3 sequences: the reference buffer has 3 rows, as theirs had 50


@pytest.fixture(scope="module")
def esmfold():
    from ptq_protein.models.tiny import tiny_esmfold

    return tiny_esmfold()[0]


def _their_sites(model):
    from transformers.models.esm.modeling_esmfold import EsmFoldLinear

    types = (nn.Linear, EsmFoldLinear, nn.LayerNorm, nn.Softmax)  # exact types, quant_acts.py:81
    return {n for n, m in model.named_modules() if type(m) in types}


def _captured(model, names):
    """Every input of the named modules over SEQS, one sequence per forward."""
    from ptq_protein.models.adapters import get_adapter

    seen = {n: [] for n in names}
    hooks = [model.get_submodule(n).register_forward_pre_hook(lambda m, a, n=n: seen[n].append(a[0].detach().clone()))
             for n in names]
    adapter = get_adapter(model)
    try:
        with torch.no_grad():
            for s in SEQS:
                adapter.forward(model, adapter.make_batch([s]))
    finally:
        for h in hooks:
            h.remove()
    return seen


@pytest.mark.parametrize("preset,scheme", [("study-a8-pwlq", "pwlq-3"), ("study-a8-uniform", "uniform")])
def test_tiny_esmfold_matches(esmfold, preset, scheme):
    cfg = pp.get_preset(preset).replace(study=StudyOptions(calls=CALLS))
    qmodel = pp.quantize(esmfold, cfg, calibration=SEQS)
    chosen = {s.name for s in qmodel.ptq_state.sites}
    assert chosen == _their_sites(esmfold)
    assert "trunk.structure_module.ipa.softmax" in chosen
    probe = ["esm.encoder.layer.0.attention.self.query", "trunk.blocks.0.tri_mul_out.layer_norm_in",
             "trunk.structure_module.ipa.softmax", "trunk.structure_module.angle_resnet.linear_out",
             "lddt_head.1"]
    probe = [p for p in probe if p in chosen]
    assert len(probe) >= 4
    captured = _captured(esmfold, probe)
    k = cfg.activations.topk
    for name in probe:
        ref = RefQuantAct(0, True, samples=CALLS, topk=8)
        for x in captured[name]:
            ref(x)
        bounds = (ref_clip(ref.minv, k, "min"), ref_clip(ref.maxv, k, "max"))
        quant = qmodel.get_submodule(name).input_quant
        assert torch.equal(quant.minv[0], bounds[0]) and torch.equal(quant.maxv[0], bounds[1]), name
        ref_q = _ref_quantizer(8, scheme, bounds)
        for x in captured[name][:4]:
            assert torch.equal(quant(x), ref_q(x)), name


def test_tiny_esmfold_w8_after_a8_matches(esmfold):
    a8 = pp.get_preset("study-a8-pwlq").replace(study=StudyOptions(calls=CALLS))
    w8a8 = pp.get_preset("study-w8a8-pwlq").replace(study=StudyOptions(calls=CALLS))
    base = pp.quantize(esmfold, a8, calibration=SEQS).state_dict()
    full = pp.quantize(esmfold, w8a8, calibration=SEQS).state_dict()
    keys = [k for k in base if k.startswith(("esm.encoder.", "trunk.block")) and base[k].is_floating_point()
            and not k.endswith("inv_freq")]
    assert any(k.endswith("input_quant.maxv") for k in keys)  # the range buffers are rounded too
    expected = ref_w8_state(base, keys)
    for key in base:
        assert torch.equal(full[key], expected[key]), key


def test_study_config_round_trip_and_validation():
    for name in pp.PRESETS:
        cfg = pp.get_preset(name)
        assert QuantConfig.from_dict(cfg.to_dict()) == cfg
    cfg = pp.get_preset("study-a8-pwlq")
    with pytest.raises(ValueError, match="study"):
        cfg.replace(study=None)
    with pytest.raises(ValueError, match="study_topk"):
        cfg.replace(activations=cfg.activations.__class__(bits=8, scheme="study_pwlq", topk=2))
    with pytest.raises(ValueError, match="calls"):
        StudyOptions(calls=0)
    assert "9 bits/value" in cfg.activations.describe()


def test_sites_left_in_floating_point_say_why(esmfold, caplog):
    """Tiny ESMFold's trunk runs once (max_recycles=1): its recycle norms run, on zeros only."""
    cfg = pp.get_preset("study-a8-uniform").replace(study=StudyOptions(calls=CALLS))
    with caplog.at_level("WARNING", logger="ptq_protein.api"):
        qmodel = pp.quantize(esmfold, cfg, calibration=SEQS)
    assert {"trunk.recycle_s_norm", "trunk.recycle_z_norm"} <= set(qmodel.ptq_state.fp_sites)
    assert f"ran {len(SEQS)} time(s), only on all-zero inputs: trunk.recycle_s_norm" in caplog.text
