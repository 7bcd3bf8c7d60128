"""The study's calibration pass: once every site outside ESMFold's LM has its calls, later sequences run the LM only,
with the same statistics as running every forward whole."""

import torch

from ptq_protein.calibration.sites import discover_sites
from ptq_protein.calibration.study import study_calibrate
from ptq_protein.config import SiteKind
from ptq_protein.data.sets import load_set
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.loading import load_model


def test_stem_only_forwards_give_the_statistics_of_whole_forwards(monkeypatch):
    model = load_model("tiny-esmfold").model
    adapter = get_adapter(model)
    sites = [s for s in discover_sites(model, adapter)  # the study's sites: no product operands; one never runs
             if s.kind is not SiteKind.MATMUL and not s.name.endswith("contact_head.regression")]
    seqs = [s[:40] for s in load_set("casp14:6").sequences()]
    trunk_runs = []
    model.trunk.register_forward_pre_hook(lambda *a: trunk_runs.append(1))
    calls = 4  # the trunk's sites get 3 calls per sequence (2 recycles): full after 2 of the 6 sequences

    fast = study_calibrate(model, adapter, sites, seqs, k=2, calls=calls)
    fast_trunk = len(trunk_runs)
    monkeypatch.setattr(type(adapter), "stem", None)
    whole = study_calibrate(model, adapter, sites, seqs, k=2, calls=calls)
    assert len(trunk_runs) - fast_trunk == len(seqs) and fast_trunk < len(seqs)  # the trunk was skipped
    lm = [name for name in whole if name.startswith("esm.")]
    assert lm and all(whole[name].count == min(calls, len(seqs)) for name in lm)
    for name, obs in whole.items():
        assert fast[name].count == obs.count, name
        if obs.count:
            for a, b in zip(fast[name].bounds(), obs.bounds()):
                assert torch.equal(a, b), name
