"""Calibration shares the statistics of sites fed the very same tensor, and only then."""

import pytest
import torch
from torch import nn

from ptq_protein.calibration import calibrate as cal
from ptq_protein.calibration.sites import Site, discover_sites, select_sites
from ptq_protein.models.adapters import get_adapter
from ptq_protein.recipes.config import RangeMethod, SiteKind, TensorQuant
from ptq_protein.recipes.presets import PRESETS


def _state_of(stats):
    """Every number a SiteStats holds, for exact comparison."""
    h, m = stats.histogram, stats.moments.moments
    out = [stats.minmax.min_val, stats.minmax.max_val, h.counts, torch.tensor([h.lo, h.width, h.min_val, h.max_val]),
           m.n, m.mean, m.m2, torch.tensor([stats.calls, stats.count])]
    return out + ([stats.topk._sums] if stats.topk is not None else [])


def _calibrate(model, seqs, preset):
    cfg = PRESETS[preset]
    adapter = get_adapter(model)
    sites = select_sites(discover_sites(model, adapter), cfg)
    return cal.calibrate(model, adapter, sites, {s.name: cfg.activations for s in sites}, seqs, batch_size=2)


@pytest.mark.parametrize("preset", ["w8a8-uniform", "w8a8-pwlq-all"])
def test_shared_inputs_give_the_same_statistics_as_observing_each(esm2, seqs, preset, monkeypatch):
    copies = []
    real_copy = cal.SiteStats.copy_from
    monkeypatch.setattr(cal.SiteStats, "copy_from", lambda self, other: copies.append(self.site.name) or
                        real_copy(self, other))
    shared = _calibrate(esm2, seqs, preset)
    assert {n.rsplit(".", 1)[-1] for n in copies} == {"k_proj", "v_proj"}  # q/k/v read one tensor
    monkeypatch.setattr(cal._Observation, "shared_with", lambda *args: False)
    each = _calibrate(esm2, seqs, preset)
    assert shared.keys() == each.keys()
    for name in each:
        for a, b in zip(_state_of(shared[name]), _state_of(each[name])):
            assert torch.equal(torch.as_tensor(a), torch.as_tensor(b)), name


class _Toy(nn.Module):
    """a and b read the same tensor; c reads it after an in-place change; d reads an equal copy."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(4, 4) for _ in range(4))

    def forward(self, x):
        x = x.clone()
        self.a(x)
        self.b(x)
        self.d(x.clone())
        x.mul_(2)
        self.c(x)


def _toy_stats(specs):
    model = _Toy()
    sites = [Site(n, SiteKind.LINEAR, "esm", "Linear", False) for n in "abcd"]
    with torch.no_grad(), cal.collect_stats(model, sites, dict(zip("abcd", specs))) as (stats, state):
        model(torch.randn(6, 4))
    return stats


def test_in_place_changes_and_copies_are_observed_on_their_own(monkeypatch):
    copies = []
    real_copy = cal.SiteStats.copy_from
    monkeypatch.setattr(cal.SiteStats, "copy_from", lambda self, other: copies.append(self.site.name) or
                        real_copy(self, other))
    stats = _toy_stats([TensorQuant()] * 4)
    assert copies == ["b"]
    assert float(stats["c"].minmax.max_val) == 2 * float(stats["a"].minmax.max_val)
    assert torch.equal(stats["d"].histogram.counts, stats["a"].histogram.counts)  # computed, and equal


def test_sites_with_other_specs_do_not_share(monkeypatch):
    copies = []
    monkeypatch.setattr(cal.SiteStats, "copy_from", lambda self, other: copies.append(self.site.name))
    stats = _toy_stats([TensorQuant(range_method=RangeMethod.TOPK, topk=3), TensorQuant()] * 2)
    assert copies == [] and stats["a"].topk is not None and stats["b"].topk is None


def test_per_channel_ranges_ignore_padding(esm2, seqs):
    """Per-channel extremes from padded batches (per-sequence views) equal those of one sequence at a time."""
    from ptq_protein.recipes.config import Granularity

    spec = TensorQuant(granularity=Granularity.PER_CHANNEL, symmetric=False)
    adapter = get_adapter(esm2)
    sites = select_sites(discover_sites(esm2, adapter), PRESETS["w8a8-uniform"])
    specs = {s.name: spec for s in sites}
    together = cal.calibrate(esm2, adapter, sites, specs, seqs[:3], batch_size=3)
    alone = [cal.calibrate(esm2, adapter, sites, specs, [s], batch_size=1) for s in seqs[:3]]
    for name, st in together.items():
        lo = torch.stack([a[name].minmax.min_val for a in alone]).amin(0)
        hi = torch.stack([a[name].minmax.max_val for a in alone]).amax(0)
        assert st.minmax.min_val.shape == (st.minmax.min_val.numel(),) and st.minmax.min_val.numel() > 1
        assert torch.equal(st.minmax.min_val, lo) and torch.equal(st.minmax.max_val, hi), name
