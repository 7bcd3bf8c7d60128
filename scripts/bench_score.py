"""Masked-marginals of one protein: ``ptq-protein score``'s batched masked copies against predict.py's loop.

fair-esm's ``examples/variant-prediction/predict.py`` runs one forward per masked position; ``score`` batches
the L masked copies under the token budget. Rows (same model, same protein, timed at each thread count):

* predict.py's loop, FP32 (one masked forward at a time, written here as that script runs it) [anchor];
* ``score --strategy masked-marginals`` (FP32 model, then each 8-bit artifact).

Each 8-bit row also gives the quantization drift that ``eval variants`` reports: Spearman rho of its scores
against FP's over all 19 x L single mutants. Random weights: a toolkit check, never biology.
Used by ``bench_embed.py`` (its last table).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import markdown_table  # noqa: E402

GOAL_SPEED, GOAL_DRIFT, DRIFT_RECIPE = 1.6, 0.99, "w8a8-pwlq"
LOOP = "predict.py loop (one masked forward each), FP32 [anchor]"


def predict_loop(model, sequence: str) -> torch.Tensor:
    """predict.py's masked-marginals: mask residue i, one forward, log-softmax at i; [L, V]."""
    from ptq_protein.models.lm_outputs import lm_forward, lm_tokens
    from ptq_protein.models.tokens import esm_vocab

    tokens, mask = lm_tokens([sequence]), esm_vocab().index("<mask>")
    rows = []
    for i in range(1, len(sequence) + 1):
        masked = tokens.clone()
        masked[0, i] = mask
        rows.append(torch.log_softmax(lm_forward(model, masked).logits[0, i], dim=-1))
    return torch.stack(rows)


def score_rows(model, artifacts: Dict[str, torch.nn.Module], sequence: str) -> Dict[str, Callable[[], object]]:
    """Every timed row: a callable returning its single-mutant grid (or the loop's table)."""
    from ptq_protein.workloads.variant_scores import single_mutant_scores

    rows: Dict[str, Callable[[], object]] = {LOOP: lambda: predict_loop(model, sequence)}
    for name, net in {"FP32": model, **artifacts}.items():
        rows[f"score masked-marginals, {name}"] = (
            lambda net=net: single_mutant_scores(net, sequence, "masked-marginals").grid)
    return rows


def score_table(model, artifacts: Dict[str, torch.nn.Module], sequence: str, threads: Sequence[int]) -> List[str]:
    """The timed rows at each thread count, each 8-bit row's drift, and the goals judged."""
    from ptq_protein.eval.rank_correlation import spearman

    rows = score_rows(model, artifacts, sequence)
    grids = {name: run() for name, run in rows.items()}  # warm-up (compilation, prepacking) and the grids
    fp = grids["score masked-marginals, FP32"].flatten().tolist()
    drift = {name: spearman(fp, grid.flatten().tolist()) for name, grid in grids.items()
             if name != LOOP and not name.endswith("FP32")}
    lines = [f"\n### masked-marginals, one {len(sequence)}-residue protein ({len(sequence)} masked copies)\n"]
    for n in threads:
        torch.set_num_threads(n)
        seconds = {}
        for name, run in rows.items():
            start = time.perf_counter()
            run()
            seconds[name] = time.perf_counter() - start
        table = [[name, f"{s:.2f}", f"{seconds[LOOP] / s:.2f}x", f"{drift[name]:.4f}" if name in drift else ""]
                 for name, s in seconds.items()]
        lines += [f"\n{n} thread(s)\n", markdown_table(["row", "seconds", "vs predict.py loop",
                                                       "Spearman vs FP (all single mutants)"], table)]
        best = max(seconds[LOOP] / s for name, s in seconds.items() if name != LOOP)
        lines.append(f"\nfastest score row {best:.2f}x predict.py's loop (goal >= {GOAL_SPEED}x: "
                     f"{'met' if best >= GOAL_SPEED else 'missed'})")
    pwlq = [v for name, v in drift.items() if DRIFT_RECIPE in name]
    if pwlq:
        lines.append(f"{DRIFT_RECIPE} drift Spearman {pwlq[0]:.4f} (goal >= {GOAL_DRIFT}: "
                     f"{'met' if pwlq[0] >= GOAL_DRIFT else 'missed'})")
    return lines
