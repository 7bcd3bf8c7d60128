"""Zero-shot variant effect scores from an ESM language model: fair-esm's ``predict.py`` strategies.

fair-esm's ``examples/variant-prediction/predict.py`` (ESM-1v paper) scores a
substitution ``wt -> mt`` at residue ``i`` of a wild-type sequence by

* ``wt-marginals``: ``log p(mt) - log p(wt)`` at ``i`` from one unmasked forward of the wild type;
* ``masked-marginals``: the same difference from the forward in which residue ``i`` is masked
  (one masked copy per residue; here batched under a token budget, not one forward each);
* ``pseudo-ppl``: the pseudo-log-likelihood of the mutated sequence, ``sum_j log p(s_j | s with j masked)``
  (predict.py's ``compute_pppl``; see the note below).

Multi-mutants: the marginal strategies add the substitutions' scores (ProteinGym's
convention; predict.py scores single mutants only); ``pseudo-ppl`` scores the
sequence carrying all of them.

Note on ``pseudo-ppl``: predict.py's loop ``for i in range(1, len(sequence) - 1)``
masks token ``i`` (residue ``i - 1``) but reads the probability of ``sequence[i]``
(residue ``i``), and leaves the last two residues out. This module computes the
definition above, over every residue; its numbers therefore differ from predict.py's
for this strategy (not for the two marginal ones).

Pure functions of a model and a sequence: float and quantized models run alike
(:func:`~ptq_protein.models.lm_outputs.lm_forward`), fair-esm and transformers too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from ptq_protein.models.lm_outputs import lm_forward, lm_info, lm_tokens
from ptq_protein.models.tokens import esm_vocab
from ptq_protein.support.progress import progress as progress_of
from ptq_protein.workloads.mutants import AMINO_ACIDS, Mutant, mutate
from ptq_protein.workloads.score_strategy import DEFAULT_TOKS_PER_BATCH, Strategy
from ptq_protein.workloads.token_batches import token_batches

__all__ = ["Strategy", "SingleMutantScores", "position_log_probs", "pseudo_log_likelihoods", "score_mutants",
           "single_mutant_scores", "marginal_grid", "marginal_score", "DEFAULT_TOKS_PER_BATCH"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SingleMutantScores:
    """``grid`` [L, 20]: the score of residue ``i`` -> ``AMINO_ACIDS[a]``; ``wild_type``: the unmutated sequence's.

    Cells where ``AMINO_ACIDS[a]`` is the wild-type letter hold ``wild_type``
    (0 for the marginal strategies, the wild type's pseudo-log-likelihood for ``pseudo-ppl``).
    """

    grid: torch.Tensor
    wild_type: float


def position_log_probs(model: nn.Module, sequence: str, strategy: "str | Strategy",
                       toks_per_batch: int = DEFAULT_TOKS_PER_BATCH, progress: bool = False,
                       positions: Optional[Sequence[int]] = None) -> torch.Tensor:
    """log-softmax [L, V] (float32, CPU) at each residue: unmasked (wt-marginals) or residue masked (masked-marginals).

    Row ``i`` is position ``i`` of ``sequence``; columns are the model's token ids (ESM C gives 64 logits, its 33
    ESM ids first; the softmax runs over every logit the model gives). ``positions`` (0-based): the rows wanted
    (masked-marginals runs one masked copy per wanted row; the other rows are NaN); None: every row.
    """
    strategy = Strategy.parse(strategy)
    if not strategy.marginal:
        raise ValueError("pseudo-ppl has no per-position table; use pseudo_log_likelihoods")
    _check_lm(model)
    tokens = lm_tokens([sequence])
    if strategy is Strategy.WT_MARGINALS:
        return torch.log_softmax(lm_forward(model, tokens).logits[0, 1:len(sequence) + 1], dim=-1)
    out = None  # [L, V]: V is the model's logits width (33 for ESM-2, 64 for ESM C)
    wanted = sorted(set(range(len(sequence)) if positions is None else positions))
    for batch in _batches([len(sequence)] * len(wanted), toks_per_batch, progress, "masked-marginals"):
        rows = [wanted[k] for k in batch]
        copies = tokens.repeat(len(rows), 1)
        at = torch.tensor(rows) + 1  # BOS first
        copies[torch.arange(len(rows)), at] = _mask_id()
        logits = lm_forward(model, copies).logits
        out = torch.full((len(sequence), logits.shape[-1]), float("nan")) if out is None else out
        out[rows] = torch.log_softmax(logits[torch.arange(len(rows)), at], dim=-1)
    if out is None:  # no position wanted
        out = torch.full((len(sequence), len(esm_vocab())), float("nan"))
    return out


def pseudo_log_likelihoods(model: nn.Module, sequences: Sequence[str], toks_per_batch: int = DEFAULT_TOKS_PER_BATCH,
                           progress: bool = False) -> List[float]:
    """``sum_j log p(s_j | s with residue j masked)`` of each sequence; all masked copies batched by tokens."""
    _check_lm(model)
    copies = [(s, j) for s, seq in enumerate(sequences) for j in range(len(seq))]
    totals = [0.0] * len(sequences)
    vocab = {t: i for i, t in enumerate(esm_vocab())}
    plan = _batches([len(sequences[s]) for s, _ in copies], toks_per_batch, progress, "pseudo-ppl")
    for batch in plan:
        chosen = [copies[k] for k in batch]
        tokens = lm_tokens([sequences[s] for s, _ in chosen])
        rows = torch.arange(len(chosen))
        positions = torch.tensor([j + 1 for _, j in chosen])
        tokens[rows, positions] = _mask_id()
        log_probs = torch.log_softmax(lm_forward(model, tokens).logits[rows, positions], dim=-1)
        truth = torch.tensor([vocab[sequences[s][j]] for s, j in chosen])
        for (s, _), value in zip(chosen, log_probs[rows, truth].double().tolist()):
            totals[s] += value
    return totals


def score_mutants(model: nn.Module, sequence: str, mutants: Sequence[Mutant], strategy: "str | Strategy",
                  toks_per_batch: int = DEFAULT_TOKS_PER_BATCH, progress: bool = False) -> List[float]:
    """One score per mutant (parsed by `ptq_protein.workloads.mutants.parse_mutant` against `sequence`)."""
    strategy = Strategy.parse(strategy)
    if strategy.marginal:
        mutated = {s.index for mutant in mutants for s in mutant}  # masked copies only where a mutant reads
        table = position_log_probs(model, sequence, strategy, toks_per_batch, progress, positions=mutated)
        return [marginal_score(table, mutant) for mutant in mutants]
    variants = [mutate(sequence, m) for m in mutants]
    unique = list(dict.fromkeys(variants))  # a repeated mutant is scored once
    by_sequence: Dict[str, float] = dict(zip(unique, pseudo_log_likelihoods(model, unique, toks_per_batch, progress)))
    return [by_sequence[v] for v in variants]


def single_mutant_scores(model: nn.Module, sequence: str, strategy: "str | Strategy",
                         toks_per_batch: int = DEFAULT_TOKS_PER_BATCH, progress: bool = False) -> SingleMutantScores:
    """Every substitution by one of the 20 amino acids at every position (`SingleMutantScores`)."""
    strategy = Strategy.parse(strategy)
    if strategy.marginal:
        return marginal_grid(position_log_probs(model, sequence, strategy, toks_per_batch, progress), sequence)
    cells = [(i, a) for i, wt in enumerate(sequence) for a, aa in enumerate(AMINO_ACIDS) if aa != wt]
    variants = [sequence] + [sequence[:i] + AMINO_ACIDS[a] + sequence[i + 1:] for i, a in cells]
    scores = pseudo_log_likelihoods(model, variants, toks_per_batch, progress)
    grid = torch.full((len(sequence), len(AMINO_ACIDS)), scores[0], dtype=torch.float64)
    for (i, a), score in zip(cells, scores[1:]):
        grid[i, a] = score
    return SingleMutantScores(grid, scores[0])


def marginal_grid(table: torch.Tensor, sequence: str) -> SingleMutantScores:
    """Every single mutant's marginal score from a :func:`position_log_probs` table [L, V] of ``sequence``."""
    ids = torch.tensor([esm_vocab().index(a) for a in AMINO_ACIDS])
    wt = torch.tensor([esm_vocab().index(a) for a in sequence])
    return SingleMutantScores(table[:, ids] - table[torch.arange(len(sequence)), wt][:, None], 0.0)


def marginal_score(table: torch.Tensor, mutant: Mutant) -> float:
    """``sum over substitutions of log p(mt) - log p(wt)`` read from a :func:`position_log_probs` table."""
    vocab = esm_vocab()
    return float(sum(table[s.index, vocab.index(s.mt)] - table[s.index, vocab.index(s.wt)] for s in mutant))


def _batches(lengths: Sequence[int], toks_per_batch: int, progress: bool, desc: str) -> List[List[int]]:
    batches = token_batches(lengths, toks_per_batch).batches
    logger.debug("%s: %d masked copies in %d batches", desc, len(lengths), len(batches))
    return progress_of(batches, desc, "batches", show=progress)


def _mask_id() -> int:
    return esm_vocab().index("<mask>")


def _check_lm(model: nn.Module) -> None:
    if not lm_info(model).has_lm_head:
        raise ValueError(f"a {type(model).__name__} has no language-model head, which variant scores need; load the "
                         "masked-LM model (fair-esm ESM2, or transformers EsmForMaskedLM)")
