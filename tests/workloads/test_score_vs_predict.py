"""Variant scores equal fair-esm predict.py's arithmetic, recomputed here one forward at a time.

The reference below is written from predict.py's ``label_row`` and its
masked-marginals loop (fair-esm ``examples/variant-prediction/predict.py``; the
script is not part of the ``esm`` package, so it is restated, not imported): the
model's own forward, ``log_softmax``, one masked copy per forward. ``pseudo-ppl``
follows the definition (every residue masked once, the log-probability of its own
letter), not predict.py's offset loop; see ``ptq_protein.workloads.variant_scores``.

Nothing here is exact on every CPU: the scores are float sums of float forwards, and a
batch of masked copies runs other GEMM shapes than one copy at a time (other kernels,
other summation orders; on a Sapphire Rapids Xeon a float32 pseudo-log-likelihood of 6
residues moved by 2.2e-4). So the models run in float64 here, where the forwards agree
to ~1e-15 whatever the batch, and the reference is float64 throughout. What is left is
the library's own float32 step: ``lm_forward`` returns the logits in float32 and the
log-softmax runs in float32. Per log-probability that costs at most
``eps32 * (4 * max|logit| + V + 2)`` (the logits' rounding and the max subtraction,
``V`` rounded exponentials summed, the log and the last subtraction; ``eps32 = 2**-23``),
and a score adds ``n`` of them: :func:`_tolerance`.
"""

import copy

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
EPS32 = 2.0 ** -23


def _logits(model, tokens):
    if type(model).__name__ == "ESM2":  # fair-esm
        return model(tokens)["logits"]
    return model(input_ids=tokens).logits  # transformers EsmForMaskedLM


@torch.no_grad()
def _log_probs(model, sequence, masked_at=None, seen=None):
    tokens = torch.tensor([[0] + [ALPHABET.index(a) for a in sequence] + [2]])
    if masked_at is not None:
        tokens[0, masked_at] = ALPHABET.index("<mask>")
    logits = _logits(model, tokens)
    if seen is not None:
        seen.append(float(logits.abs().max()))
    return torch.log_softmax(logits, dim=-1)[0]


def _reference(model, strategy, sequence, mutant, seen=None):
    """The score, from one float64 forward at a time; ``seen`` collects each forward's largest |logit|."""
    subs = [(m[0], int(m[1:-1]) - 1, m[-1]) for m in mutant.split(":")]
    if strategy == "pseudo-ppl":
        seq = list(sequence)
        for _, i, mt in subs:
            seq[i] = mt
        return sum(_log_probs(model, seq, 1 + j, seen)[1 + j, ALPHABET.index(a)].item() for j, a in enumerate(seq))
    total = 0.0
    for wt, i, mt in subs:
        row = _log_probs(model, sequence, None if strategy == "wt-marginals" else 1 + i, seen)[1 + i]
        total += (row[ALPHABET.index(mt)] - row[ALPHABET.index(wt)]).item()
    return total


def _tolerance(strategy, sequence, mutant, seen):
    """The float32 rounding a score may carry (module docstring): n log-probabilities of at most
    ``eps32 * (4 * max|logit| + V + 2)`` each."""
    subs = len(mutant.split(":"))
    n = len(sequence) if strategy == "pseudo-ppl" else 2 * subs
    return n * EPS32 * (4 * max(seen) + len(ALPHABET) + 2)


def _checked(model, strategy, sequence, mutant, got):
    seen = []
    want = _reference(model, strategy, sequence, mutant, seen)
    assert abs(got - want) <= _tolerance(strategy, sequence, mutant, seen), (mutant, got, want)
    return want


@pytest.fixture(scope="module")
def float64_models(esm2, hf_esm2):
    return {"fair-esm": copy.deepcopy(esm2).double(), "transformers": copy.deepcopy(hf_esm2).double()}


@pytest.fixture(params=["fair-esm", "transformers"])
def model(request, float64_models):
    return float64_models[request.param]


@pytest.mark.parametrize("strategy", ["wt-marginals", "masked-marginals", "pseudo-ppl"])
def test_scores_equal_the_one_forward_at_a_time_reference(model, strategy):
    mutants = [parse_mutant(m, SEQ) for m in MUTANTS]
    got = score_mutants(model, SEQ, mutants, strategy, toks_per_batch=64)  # several copies per batch
    for name, value in zip(MUTANTS, got):
        _checked(model, strategy, SEQ, name, value)
    if strategy != "pseudo-ppl":
        assert got[-1] == 0.0  # S13S: synonymous, the same log-probability subtracted from itself


@pytest.mark.parametrize("strategy", ["wt-marginals", "masked-marginals", "pseudo-ppl"])
def test_the_single_mutant_grid_holds_the_same_numbers(float64_models, strategy):
    model = float64_models["fair-esm"]
    seq = SEQ[:6]
    scores = single_mutant_scores(model, seq, strategy, toks_per_batch=40)
    assert scores.grid.shape == (6, 20)
    for name in ("M1A", "K2W", "Y5C", "I6V"):
        cell = scores.grid[int(name[1:-1]) - 1, "ACDEFGHIKLMNPQRSTVWY".index(name[-1])].item()
        _checked(model, strategy, seq, name, cell)
    wild = scores.grid[0, "ACDEFGHIKLMNPQRSTVWY".index("M")].item()
    assert wild == scores.wild_type
    if strategy == "pseudo-ppl":
        _checked(model, strategy, seq, "M1M", pseudo_log_likelihoods(model, [seq])[0])
        _checked(model, strategy, seq, "M1M", scores.wild_type)
    else:
        assert scores.wild_type == 0.0


def test_the_token_budget_does_not_change_the_numbers(float64_models):
    model = float64_models["fair-esm"]
    mutants = [parse_mutant(m, SEQ) for m in MUTANTS]
    one = score_mutants(model, SEQ, mutants, "masked-marginals", toks_per_batch=1)  # a copy per forward
    many = score_mutants(model, SEQ, mutants, "masked-marginals", toks_per_batch=10_000)  # all in one
    for name, a, b in zip(MUTANTS, one, many):
        seen = []
        _reference(model, "masked-marginals", SEQ, name, seen)
        assert abs(a - b) <= _tolerance("masked-marginals", SEQ, name, seen)
