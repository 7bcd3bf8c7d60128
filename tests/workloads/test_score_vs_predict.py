"""Variant scores equal fair-esm predict.py's arithmetic, recomputed here one forward at a time.

The reference below is written from predict.py's ``label_row`` and its
masked-marginals loop (fair-esm ``examples/variant-prediction/predict.py``; the
script is not part of the ``esm`` package, so it is restated, not imported): the
model's own forward, ``log_softmax``, one masked copy per forward. ``pseudo-ppl``
follows the definition (every residue masked once, the log-probability of its own
letter), not predict.py's offset loop; see ``ptq_protein.workloads.variant_scores``.
"""

import pytest
import torch

from ptq_protein.workloads.mutants import parse_mutant
from ptq_protein.workloads.variant_scores import (
    pseudo_log_likelihoods,
    score_mutants,
    single_mutant_scores,
)

SEQ = "MKTAYIAKQRQISFVKSHF"
MUTANTS = ["M1A", "K2W", "F19Y", "A4G:Q9E", "S13S"]
ALPHABET = "<cls> <pad> <eos> <unk> L A G V S E R T I D P K Q N F Y M H W C X B U Z O . - <null_1> <mask>".split()
TOL = dict(atol=1e-4, rtol=0)


def _logits(model, tokens):
    if type(model).__name__ == "ESM2":  # fair-esm
        return model(tokens)["logits"]
    return model(input_ids=tokens).logits  # transformers EsmForMaskedLM


@torch.no_grad()
def _log_probs(model, sequence, masked_at=None):
    tokens = torch.tensor([[0] + [ALPHABET.index(a) for a in sequence] + [2]])
    if masked_at is not None:
        tokens[0, masked_at] = ALPHABET.index("<mask>")
    return torch.log_softmax(_logits(model, tokens), dim=-1)[0]


def _reference(model, strategy, sequence, mutant):
    subs = [(m[0], int(m[1:-1]) - 1, m[-1]) for m in mutant.split(":")]
    if strategy == "pseudo-ppl":
        seq = list(sequence)
        for _, i, mt in subs:
            seq[i] = mt
        return sum(_log_probs(model, seq, 1 + j)[1 + j, ALPHABET.index(a)].item() for j, a in enumerate(seq))
    total = 0.0
    for wt, i, mt in subs:
        row = _log_probs(model, sequence, None if strategy == "wt-marginals" else 1 + i)[1 + i]
        total += (row[ALPHABET.index(mt)] - row[ALPHABET.index(wt)]).item()
    return total


@pytest.fixture(params=["fair-esm", "transformers"])
def model(request, esm2, hf_esm2):
    return esm2 if request.param == "fair-esm" else hf_esm2


@pytest.mark.parametrize("strategy", ["wt-marginals", "masked-marginals", "pseudo-ppl"])
def test_scores_equal_the_one_forward_at_a_time_reference(model, strategy):
    mutants = [parse_mutant(m, SEQ) for m in MUTANTS]
    got = score_mutants(model, SEQ, mutants, strategy, toks_per_batch=64)  # several copies per batch
    want = [_reference(model, strategy, SEQ, m) for m in MUTANTS]
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64), **TOL)
    assert got[-1] == pytest.approx(0.0 if strategy != "pseudo-ppl" else want[-1])  # S13S: synonymous


@pytest.mark.parametrize("strategy", ["wt-marginals", "masked-marginals", "pseudo-ppl"])
def test_the_single_mutant_grid_holds_the_same_numbers(esm2, strategy):
    seq = SEQ[:6]
    scores = single_mutant_scores(esm2, seq, strategy, toks_per_batch=40)
    assert scores.grid.shape == (6, 20)
    for name in ("M1A", "K2W", "Y5C", "I6V"):
        cell = scores.grid[int(name[1:-1]) - 1, "ACDEFGHIKLMNPQRSTVWY".index(name[-1])].item()
        assert cell == pytest.approx(_reference(esm2, strategy, seq, name), abs=1e-4)
    wild = scores.grid[0, "ACDEFGHIKLMNPQRSTVWY".index("M")].item()
    assert wild == scores.wild_type
    if strategy == "pseudo-ppl":
        assert scores.wild_type == pytest.approx(pseudo_log_likelihoods(esm2, [seq])[0], abs=1e-5)
    else:
        assert scores.wild_type == 0.0


def test_the_token_budget_does_not_change_the_numbers(esm2):
    mutants = [parse_mutant(m, SEQ) for m in MUTANTS]
    one = score_mutants(esm2, SEQ, mutants, "masked-marginals", toks_per_batch=1)  # a copy per forward
    many = score_mutants(esm2, SEQ, mutants, "masked-marginals", toks_per_batch=10_000)  # all in one
    torch.testing.assert_close(torch.tensor(one), torch.tensor(many), atol=1e-5, rtol=0)
