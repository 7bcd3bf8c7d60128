"""Int8 pair activations.

The holder's rounding, the chunked trunk against transformers, fidelity, recipes, artifacts.
"""

import copy
import math

import pytest
import torch

import ptq_protein as pp
from ptq_protein.models.adapters import HFEsmFoldAdapter
from ptq_protein.nn.pair_int8 import Int8Pair, holder, pair_bits_of, use_pair_int8
from ptq_protein.recipes.config import QuantConfig

LONG = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEKAVQVKVKALPDAQ"  # 66 residues


def _pair(x: torch.Tensor) -> Int8Pair:
    b, n, _, c = x.shape
    out = Int8Pair(b, n, c, x.dtype)
    for start in range(0, n, 3):
        out.write(x[:, start:start + 3], rows=slice(start, start + 3))
    return out


def test_rounding_error_is_within_half_a_step_of_each_channel_groups_own_range():
    # Scales spread over rows (1e-3..1e3) and over the 16-channel groups of a vector (1..1e4), values one-sided in
    # some groups: each group's error is bounded by its own range / 255 (closed form, float64), up to the bfloat16
    # rounding of its offset (down, by < 2^-6 |min|) and scale (up, by < 2^-6).
    g = holder.GROUP
    x = torch.randn(2, 7, 7, 4 * g, dtype=torch.float64) * torch.logspace(-3, 3, 7, dtype=torch.float64)[:, None, None]
    x = x * torch.logspace(0, 4, 4, dtype=torch.float64).repeat_interleave(g)
    x[..., g:2 * g] += 5 * x[..., g:2 * g].abs().amax(-1, keepdim=True)  # a one-sided group
    got = _pair(x).read(rows=slice(0, 7))
    groups = x.unflatten(-1, (4, g))
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    half_step = (high - low + 2 ** -6 * low.abs()) / 255 * (1 + 2 ** -6) / 2
    assert bool(((got - x).unflatten(-1, (4, g)).abs() <= half_step * (1 + 1e-6)).all())


def test_groups_beat_one_range_per_vector_on_gaussian_vectors():
    # The design's reason, on Gaussian vectors (the pair state's are near-Gaussian): 16-channel [min, max] groups
    # round with less error than one symmetric absmax scale per 128-vector (the closed form: absmax / 127 steps).
    x = torch.randn(64, 64, 128, dtype=torch.float64)
    step = x.abs().amax(-1, keepdim=True) / 127
    one_scale = (x / step).round() * step
    grouped = _pair(x[None]).read(rows=slice(0, 64))[0]
    assert (grouped - x).norm() < 0.85 * (one_scale - x).norm()


def test_outlier_vectors_are_exact_and_capped(monkeypatch):
    monkeypatch.setattr(holder, "MAX_OUTLIER_FRACTION", 0.05)
    x = torch.randn(1, 8, 8, 32, dtype=torch.float64).clamp(-2, 2)  # crest factors well under 4
    x[0, 2, 5, 0] = 400.0  # one channel dominates: crest near sqrt(32)
    x[0, 6, 1, 3] = -300.0
    pair = _pair(x)
    assert pair.outlier_count == 2
    assert torch.equal(pair.read(rows=slice(2, 3))[0, 0, 5], x[0, 2, 5])
    assert torch.equal(pair.read(cols=slice(1, 2))[0, 6, 0], x[0, 6, 1])
    *_, mask = holder.quantize_vectors(torch.randn(4, 100, 32) * (torch.rand(4, 100, 32) > 0.97))
    assert int(mask.sum()) <= int(0.05 * 400)


def test_rows_and_columns_read_the_same_values():
    x = torch.randn(2, 9, 9, 8)
    pair = _pair(x)
    assert torch.equal(pair.read(rows=slice(0, 9)), pair.read(cols=slice(0, 9)))
    assert torch.equal(pair.read(cols=slice(4, 6)), pair.read(rows=slice(0, 9))[:, :, 4:6])


@pytest.mark.parametrize("chunk", [None, 5])
def test_chunked_trunk_equals_transformers_when_every_vector_is_kept_exact(esmfold, monkeypatch, chunk):
    # With every vector an "outlier" the holder stores floats: what is left is the chunked
    # rewrite of every pair operation, which must reproduce transformers' forward (float64).
    monkeypatch.setattr(holder, "OUTLIER_CREST", 0.0)
    monkeypatch.setattr(holder, "MAX_OUTLIER_FRACTION", 1.0)
    monkeypatch.setattr("ptq_protein.nn.pair_int8.trunk.ROWS", 7)
    model = copy.deepcopy(esmfold).double()
    adapter = HFEsmFoldAdapter(model)
    batch = adapter.make_batch([LONG[:20], LONG[:14]])  # padding in the batch
    with torch.no_grad():
        ref = adapter.forward(model, batch, num_recycles=1)
        chunked = use_pair_int8(copy.deepcopy(model), 8)
        chunked.trunk.set_chunk_size(chunk)
        out = adapter.forward(chunked, batch, num_recycles=1)
    for key in ("positions", "plddt", "ptm", "s_s", "angles", "lm_logits"):
        torch.testing.assert_close(out[key], ref[key], rtol=1e-9, atol=1e-9, msg=key)


@pytest.mark.parametrize("batch, length, rows", [(1, 50, 7), (2, 37, 64), (1, 20, 1)])
def test_recycle_bins_equal_transformers_distogram(batch, length, rows):
    from transformers.models.esm.modeling_esmfold import EsmFoldingTrunk

    from ptq_protein.nn.pair_int8.trunk import recycle_bins

    coords = torch.randn(batch, length, 3, 3, generator=torch.Generator().manual_seed(length)) * 8
    got = recycle_bins(coords, 15, rows)
    want = EsmFoldingTrunk.distogram(coords, 3.375, 21.375, 15)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_recycle_bins_hold_only_their_int64_result_at_full_size():
    # transformers' distogram holds [L, L, 3] differences and sums [L, L, 14] comparisons cast to int64 (~140 bytes
    # a pair); by row chunks, the allocations alive at once are the L x L int64 result and one chunk's temporaries.
    from torch.profiler import ProfilerActivity, profile

    from ptq_protein.nn.pair_int8.trunk import recycle_bins

    n, rows = 512, 16
    coords = torch.randn(1, n, 3, 3) * 8
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        recycle_bins(coords, 15, rows)
    live = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                            if e.name() == "[memory]"):
        live += nbytes
        peak = max(peak, live)
    assert peak <= 8 * n * n + 256 * rows * n  # 2.1 MB + 2.1 MB; transformers' own: ~36 MB


@pytest.mark.parametrize("recycles", [0, 2])
def test_only_a_pass_that_is_read_bins_its_coordinates(esmfold, monkeypatch, recycles):
    from transformers.models.esm.modeling_esmfold import EsmFoldingTrunk

    import ptq_protein.nn.pair_int8.trunk as trunk_module

    calls = []
    binned = trunk_module.recycle_bins
    monkeypatch.setattr(trunk_module, "recycle_bins", lambda *a: calls.append(1) or binned(*a))
    monkeypatch.setattr(EsmFoldingTrunk, "distogram", None)  # the full-size version is never called
    model = use_pair_int8(copy.deepcopy(esmfold), 8)
    adapter = HFEsmFoldAdapter(model)
    with torch.no_grad():
        adapter.forward(model, adapter.make_batch([LONG[:20]]), num_recycles=recycles)
    assert len(calls) == recycles  # passes - 1: the last pass's bins would be read by no one


def test_int8_fold_matches_the_float_fold(esmfold):
    from ptq_protein.eval.bench.folding import fold_one
    from ptq_protein.eval.structure import as_structure
    from ptq_protein.eval.tmscore import tm_score

    pdb_fp, plddt_fp, _ = fold_one(esmfold, LONG, num_recycles=1)
    pdb_q, plddt_q, _ = fold_one(use_pair_int8(copy.deepcopy(esmfold), 8), LONG, num_recycles=1)
    assert tm_score(as_structure(pdb_q), as_structure(pdb_fp), pairing="number").tm_score >= 0.98
    assert math.isclose(plddt_q, plddt_fp, abs_tol=1.0)


def test_none_restores_the_float_forward_bit_for_bit(esmfold):
    adapter = HFEsmFoldAdapter(esmfold)
    batch = adapter.make_batch([LONG[:30]])
    with torch.no_grad():
        before = adapter.forward(esmfold, batch)["positions"]
        model = use_pair_int8(use_pair_int8(copy.deepcopy(esmfold), 8), None)
        assert pair_bits_of(model) is None and "forward" not in model.__dict__
        assert torch.equal(adapter.forward(model, batch)["positions"], before)


def test_config_records_pair_bits_only_when_set():
    assert "pair_bits" not in QuantConfig().to_dict()
    cfg = QuantConfig(pair_bits=8)
    assert cfg.to_dict()["pair_bits"] == 8 and QuantConfig.from_dict(cfg.to_dict()) == cfg
    assert "pair activations int8" in cfg.describe()
    with pytest.raises(ValueError, match="pair_bits=4"):
        QuantConfig(pair_bits=4)


def test_a_recipe_with_pair_bits_saves_and_loads_running_int8_pairs(esmfold, tmp_path):
    from ptq_protein.eval.bench.folding import fold_one

    cfg = pp.get_preset("w8a8-uniform").replace(pair_bits=8)
    qmodel = pp.quantize(esmfold, cfg, calibration=[LONG[:24]], num_recycles=0)
    assert pair_bits_of(qmodel) == 8 and pair_bits_of(esmfold) is None
    pp.save(qmodel, tmp_path / "art")
    loaded = pp.load(tmp_path / "art", backend="fake")
    assert pair_bits_of(loaded) == 8
    assert fold_one(loaded, LONG[:40])[0] == fold_one(qmodel, LONG[:40])[0]


def test_refuses_models_it_cannot_run(esm2, esmfold):
    with pytest.raises(ValueError, match="ESMFold"):
        use_pair_int8(esm2, 8)
    with pytest.raises(ValueError, match="only"):
        use_pair_int8(copy.deepcopy(esmfold), 4)
    cfg = pp.get_preset("w8a8-uniform").replace(kinds=("linear", "matmul"), pair_bits=8)
    with pytest.raises(ValueError, match="matmul"):
        pp.quantize(esmfold, cfg, calibration=[LONG[:24]], num_recycles=0)
