"""Token-budget batches against fair-esm's own FastaBatchedDataset.get_batch_indices."""

import itertools
import random

import pytest

from ptq_protein.workloads.token_batches import token_batches


def _brute_force(sizes, budget, per_batch):
    """The cheapest cost over every cut of ``sizes`` (ascending) into consecutive batches, by enumeration."""
    n, best = len(sizes), None
    for mask in itertools.product((False, True), repeat=n - 1):
        cuts = [0] + [i + 1 for i, cut in enumerate(mask) if cut] + [n]
        parts = [sizes[a:b] for a, b in zip(cuts, cuts[1:])]
        if any(len(p) > 1 and max(p) * len(p) > budget for p in parts):
            continue
        cost = sum(max(p) * len(p) + per_batch for p in parts)
        best = cost if best is None else min(best, cost)
    return best


def test_batches_are_the_cheapest_cut_by_enumeration():
    """Every cut of the sorted sequences into consecutive batches within the budget, enumerated: the plan's
    tokens plus one forward's cost (budget / 32) per batch is the minimum; each index is in one batch."""
    rng = random.Random(0)
    for _ in range(60):
        n, budget = rng.randint(1, 11), rng.choice([40, 64, 200, 1024])
        lengths = [rng.randint(1, 120) for _ in range(n)]
        plan = token_batches(lengths, budget)
        assert sorted(i for b in plan.batches for i in b) == list(range(n))
        assert all(len(b) == 1 or (max(lengths[i] for i in b) + 2) * len(b) <= budget for b in plan.batches)
        per_batch = max(1, budget // 32)
        assert plan.tokens + per_batch * len(plan.batches) == _brute_force(sorted(x + 2 for x in lengths), budget,
                                                                            per_batch)


def test_less_padding_than_fair_esm_within_its_budget():
    esm_data = pytest.importorskip("esm.data")
    rng = random.Random(0)
    lengths = [rng.randint(1, 400) for _ in range(200)]
    dataset = esm_data.FastaBatchedDataset([str(i) for i in range(200)], ["A" * n for n in lengths])
    for budget in (512, 1024, 4096):
        ref = dataset.get_batch_indices(budget, extra_toks_per_seq=2)  # fair-esm counts BOS only: one more here
        ref_tokens = sum((max(lengths[i] for i in b) + 2) * len(b) for b in ref)
        plan = token_batches(lengths, budget)
        assert plan.tokens + (budget // 32) * len(plan.batches) <= ref_tokens + (budget // 32) * len(ref)


def test_padding_share_and_budget():
    plan = token_batches([10, 10, 12, 500], 40)
    assert plan.batches == [[0, 1], [2], [3]]  # 12+2 = 14 x 3 = 42 > 40
    assert plan.tokens == 12 * 2 + 14 + 502 and plan.real_tokens == 12 * 2 + 14 + 502
    assert plan.padding_share == 0.0
    mixed = token_batches([10, 11], 100)  # together: 13 x 2 + 3 = 29 tokens; apart: 12 + 13 + 2 x 3 = 31
    assert mixed.batches == [[0, 1]] and mixed.padding_share == pytest.approx(1 / 26)
    assert token_batches([10, 20], 100).batches == [[0], [1]]  # together: 22 x 2 + 3 = 47; apart: 12 + 22 + 6


@pytest.mark.parametrize("bad", [0, -5, 1.5, True])
def test_bad_budget(bad):
    with pytest.raises(ValueError, match="toks_per_batch"):
        token_batches([3], bad)
