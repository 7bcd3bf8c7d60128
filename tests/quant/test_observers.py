"""Min-max and top-k observers: streaming equals one-shot, bounded state, errors."""

import pickle

import pytest
import torch

from ptq_protein.quant.histogram import HistogramObserver
from ptq_protein.quant.observers import MinMaxObserver, NonFiniteError, TopKObserver, check_finite
from ptq_protein.quant.stats import MomentsObserver


def _state_numel(obs) -> int:
    """Total number of tensor elements an observer holds (its memory)."""
    total = 0
    for v in vars(obs).values():
        if isinstance(v, torch.Tensor):
            total += v.numel()
        elif hasattr(v, "__dataclass_fields__"):
            total += sum(getattr(v, f).numel() for f in v.__dataclass_fields__)
    return total


@pytest.mark.parametrize("factory", [MinMaxObserver, lambda: MinMaxObserver(per_channel=True),
                                     lambda: TopKObserver(50), lambda: HistogramObserver(256),
                                     MomentsObserver, lambda: MomentsObserver(per_channel=True)])
def test_state_size_independent_of_number_of_updates(factory, gen):
    obs = factory()
    obs.update(torch.randn(64, 8, generator=gen))
    size = _state_numel(obs)
    for i in range(200):
        obs.update(torch.randn(64, 8, generator=gen) * (1 + i / 50))
    assert _state_numel(obs) == size


def test_minmax_streaming_is_exact(gen):
    batches = [torch.randn(int(n), 6, generator=gen) * 3 for n in torch.randint(1, 300, (40,), generator=gen)]
    data = torch.cat(batches)
    per_tensor, per_channel = MinMaxObserver(), MinMaxObserver(per_channel=True)
    for b in batches:
        per_tensor.update(b)
        per_channel.update(b)
    lo, hi = per_tensor.compute()
    assert float(lo) == float(data.min()) and float(hi) == float(data.max())
    lo, hi = per_channel.compute()
    assert lo.shape == (6,)
    assert torch.equal(lo, data.amin(0).double()) and torch.equal(hi, data.amax(0).double())


def test_minmax_errors_and_empty_updates():
    obs = MinMaxObserver(per_channel=True)
    with pytest.raises(ValueError, match="no values"):
        obs.compute()
    with pytest.raises(ValueError, match=r"\[tokens, channels\]"):
        obs.update(torch.zeros(5))
    obs.update(torch.zeros(0, 4))  # empty: ignored
    obs.update(torch.ones(2, 4))
    with pytest.raises(ValueError, match="4"):
        obs.update(torch.ones(2, 5))
    with pytest.raises(TypeError):
        MinMaxObserver().update([1.0, 2.0])


def _study_topk(batches, k):
    """The study's statistic from full per-batch sorts (PTQ4Protein act_clip_bounds)."""
    mins = torch.stack([torch.sort(b.flatten())[0][:k] for b in batches])
    maxs = torch.stack([torch.sort(b.flatten())[0][-k:] for b in batches])
    lo = torch.median(mins, 1).values.mean()
    hi = torch.median(maxs, 1).values.mean()
    if hi <= 0:
        hi = torch.median(maxs[:, -5:], 1).values.mean()
    return float(lo), float(hi)


@pytest.mark.parametrize("k", [1, 10, 1000])
def test_topk_matches_study_statistic(k, gen):
    batches = [torch.randn(4000, generator=gen, dtype=torch.float64) * (1 + i) for i in range(12)]
    obs = TopKObserver(k)
    for b in batches:
        obs.update(b)
    lo, hi = obs.compute()
    ref_lo, ref_hi = _study_topk(batches, k)
    assert float(lo) == pytest.approx(ref_lo, rel=1e-12) and float(hi) == pytest.approx(ref_hi, rel=1e-12)


def test_topk_fallback_to_top5_when_upper_bound_not_positive():
    # Only 3 positive values per batch: the median of the top 1000 is <= 0.
    batches = [torch.cat([-torch.rand(5000, dtype=torch.float64), torch.tensor([1.0, 2.0, 3.0])]) for _ in range(3)]
    obs = TopKObserver(1000)
    for b in batches:
        obs.update(b)
    lo, hi = obs.compute()
    ref_lo, ref_hi = _study_topk(batches, 1000)
    assert float(hi) == pytest.approx(ref_hi) and float(hi) > 0 and float(lo) == pytest.approx(ref_lo)


def test_topk_small_batches_and_errors():
    obs = TopKObserver(100)
    obs.update(torch.tensor([3.0, -1.0, 2.0]))  # fewer values than k: uses all
    lo, hi = obs.compute()
    assert float(lo) == float(hi) == 2.0  # both: the lower median of all three values
    with pytest.raises(ValueError, match="k="):
        TopKObserver(0)
    with pytest.raises(ValueError, match="no values"):
        TopKObserver(5).compute()


@pytest.mark.parametrize("factory", [MinMaxObserver, lambda: TopKObserver(4), HistogramObserver, MomentsObserver])
@pytest.mark.parametrize("bad, word", [(float("nan"), "NaN"), (float("inf"), "Inf"), (-float("inf"), "Inf")])
def test_non_finite_updates_raise(factory, bad, word):
    obs = factory()
    with pytest.raises(NonFiniteError, match=f"{word} in activations") as info:
        obs.update(torch.tensor([0.0, 1.0, bad]))
    assert isinstance(info.value, ValueError)
    err = info.value.at_site("layers.3.fc1")
    assert "at site 'layers.3.fc1'" in str(err) and f"{word} in activations" in str(err)
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


def test_check_finite_counts():
    with pytest.raises(NonFiniteError, match=r"2 NaN and 1 Inf of 5 values"):
        check_finite(torch.tensor([float("nan"), float("nan"), float("inf"), 0.0, 1.0]))
    check_finite(torch.tensor([1, 2, 3]))  # integers are always finite


@pytest.mark.parametrize("factory", [MinMaxObserver, lambda: TopKObserver(3), MomentsObserver])
def test_constant_inputs(factory):
    obs = factory()
    for _ in range(3):
        obs.update(torch.full((10,), -0.75))
    if isinstance(obs, MomentsObserver):
        assert float(obs.mean) == -0.75 and float(obs.std()) == 0.0
    else:
        lo, hi = obs.compute()
        assert float(lo) == float(hi) == -0.75


@pytest.mark.parametrize("largest", [True, False])
def test_blocked_topk_equals_torch_topk(largest):
    """The blockwise top-k returns exactly torch.topk's values, ties and sorted inputs included."""
    from ptq_protein.quant.observers import TOPK_BLOCK, _extreme_values

    gen = torch.Generator().manual_seed(5)
    for trial in range(60):
        n = int(torch.randint(TOPK_BLOCK * 400, 70000, (1,), generator=gen))
        x = torch.randn(n, generator=gen, dtype=torch.float64)
        if trial % 3 == 0:
            x = torch.round(x * 2)  # heavy ties
        if trial % 5 == 0:
            x = x.sort(descending=trial % 2 == 0).values  # extremes packed into few blocks
        for k in (1, 5, 100):
            want = torch.topk(x, k, largest=largest, sorted=True).values
            assert torch.equal(_extreme_values(x, k, largest), want), (trial, n, k)
