#!/usr/bin/env python
"""ESM C quantization study: per-site activation statistics, and each 8-bit recipe's error and variant-score drift.

A toolkit measurement: on random weights it measures the quantizers on ESM C's architecture, never biology.
Model: a seeded random ESM C (ptq-protein's ``ESMC``, the official layout) of ``--size``, once plain and once
with planted outlier channels (``ptq_protein.models.outliers``: one-sided embedding columns, BOS/EOS their
tail, grown by each block's SwiGLU output rows), as the ESM-2 benches plant them; or real weights with
``--weights FILE`` (the official ``.pth``; nothing planted). Tables, per model:

1. per-site activation statistics by role in the block (over every block's site of that role): the calibrated
   range, its asymmetry ``(max + min) / (max - min)`` (0 symmetric, +-1 one-sided), the largest kurtosis, and
   the median histogram SQNR of w8a8-pwlq's and w8a8-uniform's activation quantizers;
2. per recipe (``backend="int8"`` where it runs, else fake): the last layer's per-residue error against FP
   (relative Frobenius norm over the residues of the held-out sequences, one at a time), the logits' error, and
   the drift of masked-marginals scores: Spearman rho against FP over all 19 x L single mutants of one
   ``--protein-length``-residue protein (0: no drift; it costs L forwards of L + 2 tokens per recipe). The goal
   line: best 8-bit recipe's error <= 2%, drift >= 0.99.

    python -m scripts.bench esmc_study --quick                    # tiny model, 40-residue protein: a smoke test
    python -m scripts.bench esmc_study                            # 12 x 384 (21M), plain and planted, 300 residues
    python -m scripts.bench esmc_study --size 600m --outliers planted --recipes w8a8-pwlq --protein-length 0
    python -m scripts.bench esmc_study --split --no-site-table    # + weights-alone, activations-alone error
    python -m scripts.bench esmc_study --weights esmc_300m_2024_12_v0.pth   # the same tables on real weights
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import bundled_records, command_line, environment_line, markdown_table  # noqa: E402
from bench.inprocess import per_token_error as last_layer_error  # noqa: E402

SIZES = {"quick": (2, 64, 4), "small": (12, 384, 6), "300m": (30, 960, 15), "600m": (36, 1152, 18)}  # layers, d, heads
RECIPES = ("w8a8-uniform", "w8a8-smoothquant", "w8a8-pwlq", "w8a8-pwlq-int", "w8a8-dynamic", "w8a8-rotate",
           "w8a8-rotate-gptq")
GOAL_ERROR, GOAL_DRIFT = 0.02, 0.99
CALIB, CALIB_CROP, HELD_OUT, HELD_OUT_CROP = "casp14:16", 256, 8, 256
ROLES = {  # site name after "transformer.blocks.N." -> what its input is
    "attn.layernorm_qkv.0": "attention LayerNorm input (residual stream)",
    "attn.layernorm_qkv.1": "QKV Linear input (after LayerNorm)",
    "attn.q_ln": "q LayerNorm input (QKV output)",
    "attn.k_ln": "k LayerNorm input (QKV output)",
    "attn.out_proj": "attention output Linear input",
    "ffn.0": "FFN LayerNorm input (residual stream)",
    "ffn.1": "SwiGLU in Linear input (after LayerNorm)",
    "ffn.3": "SwiGLU out Linear input (silu(a) * b)",
    "transformer.norm": "final LayerNorm input (residual stream)",
}


def build_model(size: str, planted: bool, weights: Optional[Path]):
    """(model, label): a seeded random ESM C, or the file at ``weights``."""
    if weights is not None:
        from ptq_protein.models.loading import load_model

        return load_model(weights).model, f"ESM C from {weights.name}"
    from ptq_protein.models.tiny import DEMO_OUTLIERS, tiny_esmc

    layers, width, heads = SIZES[size]
    model = tiny_esmc(0, num_layers=layers, d_model=width, heads=heads, outliers=DEMO_OUTLIERS if planted else None)[0]
    kind = "planted outlier channels" if planted else "plain"
    return model, f"random ESM C {layers} x {width}, {heads} heads, {kind}"


def role_table(reports: Dict[str, List[dict]]) -> str:
    """Table 1 from the per-site reports of w8a8-pwlq (ranges, kurtosis, SQNR) and w8a8-uniform (SQNR)."""
    rows = []
    for role, words in ROLES.items():
        pick = {name: [r for r in rep if r.get("count") and _role(r["site"]) == role] for name, rep in reports.items()}
        sites = pick.get("w8a8-pwlq") or []
        if not sites:
            continue
        asym = [r["asymmetry"] for r in sites]
        extreme = max(asym, key=abs)
        rows.append([words, len(sites), min(r["min"] for r in sites), max(r["max"] for r in sites),
                     statistics.median(asym), extreme, max(r["kurtosis"] for r in sites)]
                    + [_median_sqnr(pick.get(name) or []) for name in ("w8a8-pwlq", "w8a8-uniform")])
    header = ["site input", "sites", "min", "max", "asymmetry median", "most one-sided", "kurtosis max",
              "SQNR pwlq (dB, median)", "SQNR uniform (dB, median)"]
    return markdown_table(header, rows)


def _role(site: str) -> str:
    parts = site.split(".")
    return ".".join(parts[3:]) if site.startswith("transformer.blocks.") else site


def _median_sqnr(rows: List[dict]) -> object:
    values = [r["sqnr_db"] for r in rows if r.get("sqnr_db") is not None]
    return statistics.median(values) if values else ""


def quantize(model, recipe: str, calib: Sequence[str]):
    """The recipe with integer GEMMs where its config allows them, else simulated; (qmodel, backend)."""
    import ptq_protein as pp

    try:
        return pp.quantize(model, recipe, calibration=list(calib), backend="int8"), "int8"
    except ValueError:
        return pp.quantize(model, recipe, calibration=list(calib)), "fake"


def logits_error(model, qmodel, sequences: Sequence[str]) -> float:
    from ptq_protein.models.lm_outputs import lm_forward, lm_tokens

    num = den = 0.0
    for seq in sequences:
        a = lm_forward(model, lm_tokens([seq])).logits[0, 1:-1]
        b = lm_forward(qmodel, lm_tokens([seq])).logits[0, 1:-1]
        num, den = num + float((a - b).pow(2).sum()), den + float(a.pow(2).sum())
    return (num / den) ** 0.5


def split_errors(model, recipe: str, calib, held_out) -> List[object]:
    """Last-layer error of ``recipe`` with only its weights quantized, then with only its activations: where the
    8-bit error comes from ("-" where the recipe cannot run that way)."""
    import ptq_protein as pp
    from ptq_protein.recipes.presets import get_preset

    errors: List[object] = []
    for half in ({"activations": None}, {"weights": None, "gptq": None}):
        try:
            qmodel = pp.quantize(model, get_preset(recipe).replace(**half), calibration=list(calib))
        except ValueError:
            errors.append("-")
            continue
        errors.append(f"{100 * last_layer_error(model, qmodel, [('', s) for s in held_out]):.2f}%")
    return errors


def study(model, label: str, recipes: Sequence[str], calib, held_out, protein: str, split: bool = False,
          site_table: bool = True) -> List[str]:
    from ptq_protein.eval.rank_correlation import spearman
    from ptq_protein.workloads.variant_scores import single_mutant_scores

    start = time.perf_counter()

    def grid(net) -> List[float]:
        return single_mutant_scores(net, protein, "masked-marginals").grid.flatten().tolist()

    fp_grid = grid(model) if protein else None
    rows, reports = [], {}
    for recipe in recipes:
        qmodel, backend = quantize(model, recipe, calib)
        reports[recipe] = qmodel.ptq_state.report
        rows.append([recipe, backend, last_layer_error(model, qmodel, [("", s) for s in held_out]),
                     logits_error(model, qmodel, held_out), spearman(fp_grid, grid(qmodel)) if protein else None]
                    + (split_errors(model, recipe, calib, held_out) if split else []))
        print(f"  done {recipe} ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        del qmodel
    lines = [f"\n## {label}\n"]
    if site_table:
        for name in ("w8a8-uniform", "w8a8-pwlq"):
            if name not in reports:
                reports[name] = quantize(model, name, calib)[0].ptq_state.report
        lines += ["Per-site activation statistics (calibration, residues only), by role in the block:\n",
                  role_table(reports)]
    drift = (f"drift over all {19 * len(protein)} single mutants of a {len(protein)}-residue protein" if protein
             else "no drift measured (--protein-length 0)")
    header = ["recipe", "backend", "last-layer error", "logits error", "drift Spearman"]
    header += ["weights alone", "activations alone"] if split else []
    lines += [f"\nPer recipe: error against FP on {len(held_out)} held-out sequences (whole, at most "
              f"{HELD_OUT_CROP} residues), {drift}:\n",
              markdown_table(header, [[r[0], r[1], f"{100 * r[2]:.2f}%", f"{100 * r[3]:.2f}%", _drift(r[4]), *r[5:]]
                                      for r in rows])]
    best = min(rows, key=lambda r: r[2])
    drift_words = ("not measured" if best[4] is None else
                   f"{best[4]:.4f} (goal >= {GOAL_DRIFT}: {'met' if best[4] >= GOAL_DRIFT else 'missed'})")
    lines.append(f"\nbest 8-bit recipe by last-layer error: {best[0]}: {100 * best[2]:.2f}% (goal <= "
                 f"{100 * GOAL_ERROR:.0f}%: {'met' if best[2] <= GOAL_ERROR else 'missed'}), drift Spearman "
                 f"{drift_words}")
    return lines


def _drift(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny model, 40-residue protein, 4 held-out sequences")
    p.add_argument("--size", choices=[s for s in SIZES if s != "quick"], default="small", help="default small")
    p.add_argument("--weights", type=Path, help="an ESM C .pth file (real weights) instead of a random model")
    p.add_argument("--outliers", choices=["both", "plain", "planted"], default="both")
    p.add_argument("--recipes", nargs="+", default=list(RECIPES))
    p.add_argument("--protein-length", type=int, default=300)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--split", action="store_true",
                   help="also each recipe's error with only its weights, then only its activations quantized")
    p.add_argument("--no-site-table", action="store_true", help="skip the per-site statistics (two calibrations)")
    args = p.parse_args(argv)
    if args.protein_length < 0 or args.threads < 1:
        p.error("--protein-length must be >= 0 and --threads positive")
    if args.weights is not None and not args.weights.is_file():
        p.error(f"--weights {args.weights}: no such file")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    from ptq_protein.api import crop_sequence, resolve_calibration

    length = 40 if args.quick else args.protein_length
    calib = [crop_sequence(s, CALIB_CROP) for s in resolve_calibration("casp14:4" if args.quick else CALIB)[1]]
    records = bundled_records(495)
    held_out = [seq[:HELD_OUT_CROP] for _, seq in records[-(4 if args.quick else HELD_OUT):]]  # cameo2022's last
    protein = next(seq for _, seq in records if len(seq) >= length)[:length] if length else ""
    print(f"# bench_esmc_study\n\n`{command_line(argv if argv is not None else sys.argv[1:], __file__)}`\n\n"
          f"{environment_line(args.threads)}; calibration {CALIB if not args.quick else 'casp14:4'} cropped to "
          f"{CALIB_CROP}; toolkit measurement on random weights unless --weights: not biology")
    plans = [False] if args.weights else {"both": [False, True], "plain": [False], "planted": [True]}[args.outliers]
    for planted in plans:
        model, label = build_model("quick" if args.quick else args.size, planted, args.weights)
        print("\n".join(study(model.eval(), label, args.recipes, calib, held_out, protein, args.split,
                               not args.no_site_table)), flush=True)
        del model
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
