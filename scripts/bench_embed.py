#!/usr/bin/env python
"""Embedding throughput of ``ptq-protein embed`` against the loops users run instead, in one run.

Workload: the bundled sets' sequences (cameo139, casp14, cameo2022: 495 sequences, 30-949
residues, about 135k residues), whole, batched by 4096 tokens; mean of the last layer kept.
Model: a seeded random fair-esm ESM2 with planted outlier channels, ESM-2 35M-sized (12 x 480)
by default. Rows, each timed over the whole workload at each thread count (best of ``--reps``):

* fair-esm ``scripts/extract.py``'s loop, FP32 (``FastaBatchedDataset``, ``get_batch_indices``);
* transformers ``EsmModel`` (SDPA attention), FP32, the same weights and the same batches as ours;
* ``torch.ao`` ``quantize_dynamic`` (int8 Linear) in fair-esm's loop;
* ``embed`` with the FP32 model, and with each 8-bit artifact (``backend="int8"``).

Then masked-marginals of one 300-residue protein (``bench_score.py``: ``score`` against predict.py's
one-forward-per-position loop, and each 8-bit row's drift Spearman over all single mutants).

Also per recipe: the last layer's per-residue error against FP (relative Frobenius norm over
all residues of 24 sequences), and the share of padding computed. Random weights: this measures
the toolkit, never biology. ``--memory`` adds peak RSS of ESM-2 650M-sized embedding in fresh
processes (fair-esm's loop FP32 vs an int8 artifact), 20 sequences.

    python scripts/bench_embed.py                  # ~10 min at 1 and 2 threads on 2 cores
    python scripts/bench_embed.py --quick          # tiny model, 12 sequences: a smoke test
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import ModelShape, command_line, cpu_facts, environment_line, markdown_table  # noqa: E402
from bench_score import score_table  # noqa: E402

GOAL_VS_FAIR_ESM, GOAL_VS_HF, GOAL_ERROR, GOAL_MEMORY = 1.6, 1.15, 0.02, 0.4
SHAPES = {"35m": ModelShape(12, 480, 20, 1022), "650m": ModelShape(33, 1280, 20, 1022),
          "quick": ModelShape(2, 64, 4, 1022)}
PRESETS = ("w8a8-uniform", "w8a8-smoothquant", "w8a8-pwlq")
TOKS = 4096
ERROR_SEQS = 24
SCORE_LENGTH = 300  # residues of the protein scored (masked-marginals); --quick: QUICK_SCORE_LENGTH
QUICK_SCORE_LENGTH = 40


def bundled_records(count: int) -> List[Tuple[str, str]]:
    """(label, sequence) of the first ``count`` bundled sequences, shortest sets' order kept (deterministic)."""
    from ptq_protein.data.sets import load_set

    records = [(t.id, t.sequence) for name in ("cameo139", "casp14", "cameo2022") for t in load_set(name)]
    return records[:count]


def fair_esm_loop(model, alphabet, fasta: Path, quantized=None) -> Callable[[], int]:
    """fair-esm extract.py's loop (mean of the last layer), on ``quantized`` when given; returns residues."""
    import esm

    def run() -> int:
        dataset = esm.FastaBatchedDataset.from_file(str(fasta))
        batches = dataset.get_batch_indices(TOKS, extra_toks_per_seq=1)
        loader = torch.utils.data.DataLoader(dataset, collate_fn=alphabet.get_batch_converter(1022),
                                             batch_sampler=batches)
        done, net = 0, quantized or model
        with torch.no_grad():
            for _labels, strs, toks in loader:
                out = net(toks, repr_layers=[model.num_layers])["representations"][model.num_layers]
                for i, s in enumerate(strs):
                    out[i, 1:len(s) + 1].mean(0).clone()
                    done += len(s)
        return done
    return run


def hf_sdpa_loop(hf_model, records: Sequence[Tuple[str, str]]) -> Callable[[], int]:
    """transformers EsmModel (SDPA) over our token batches; returns residues."""
    from ptq_protein.models.lm_outputs import lm_forward, lm_tokens
    from ptq_protein.workloads.token_batches import token_batches

    plan = token_batches([len(s) for _, s in records], TOKS)

    def run() -> int:
        for batch in plan.batches:
            lm_forward(hf_model, lm_tokens([records[i][1] for i in batch]), [hf_model.config.num_hidden_layers])
        return sum(len(s) for _, s in records)
    return run


def embed_run(model, records, scratch: Path, name: str) -> Callable[[], int]:
    """``ptq-protein embed`` (the library run) into a fresh folder each time; returns residues."""
    from ptq_protein.workloads.embed import EmbedOptions
    from ptq_protein.workloads.embed_run import EmbedRun

    counter = [0]

    def run() -> int:
        counter[0] += 1
        out = scratch / f"{name.replace(' ', '_').replace(',', '')}-{counter[0]}"
        report = EmbedRun(records, out, EmbedOptions((-1,), ("mean",), TOKS)).run(model, {"name": name})
        run.padding = report.stats.padding_share
        return report.stats.residues
    return run


def last_layer_error(model, qmodel, records) -> float:
    """||q - fp||_F / ||fp||_F of the last layer's per-residue states over ``records``."""
    from ptq_protein.models.lm_outputs import lm_forward, lm_tokens

    num, den = 0.0, 0.0
    for _, seq in records:
        tokens = lm_tokens([seq])
        a = lm_forward(model, tokens, [model.num_layers]).representations[model.num_layers][0, 1:-1]
        b = lm_forward(qmodel, tokens, [model.num_layers]).representations[model.num_layers][0, 1:-1]
        num, den = num + float((a - b).pow(2).sum()), den + float(a.pow(2).sum())
    return (num / den) ** 0.5


def build_rows(shape: ModelShape, records, fasta: Path, scratch: Path, presets: Sequence[str],
               calib: Sequence[str]) -> Tuple[Dict[str, Callable[[], int]], Dict[str, float], nn.Module,
                                              Dict[str, nn.Module]]:
    """Every timed row (a callable returning residues), each 8-bit recipe's last-layer error, the FP model and
    the loaded artifacts (by recipe)."""
    import ptq_protein as pp
    from ptq_protein.models.tiny import tiny_esm2, tiny_hf_esm2

    model, alphabet = tiny_esm2(0, num_layers=shape.num_layers, embed_dim=shape.embed_dim, heads=shape.heads)[:2]
    model.eval()
    hf = tiny_hf_esm2(0, num_layers=shape.num_layers, embed_dim=shape.embed_dim, heads=shape.heads)[0].esm.eval()
    rows = {"fair-esm extract.py loop, FP32 [anchor]": fair_esm_loop(model, alphabet, fasta),
            "transformers EsmModel SDPA, FP32, same batches [anchor]": hf_sdpa_loop(hf, records)}
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():  # torch.ao's deprecation notices: the anchor users still run
        warnings.simplefilter("ignore")
        dynamic = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    rows["quantize_dynamic (torch.ao) in extract.py's loop [anchor]"] = fair_esm_loop(model, alphabet, fasta, dynamic)
    rows["embed, FP32"] = embed_run(model, records, scratch, "fp32")
    errors: Dict[str, float] = {}
    artifacts: Dict[str, nn.Module] = {}
    for preset in presets:
        art = scratch / f"art-{preset}"
        pp.save(pp.quantize(model, preset, calibration=list(calib), backend="int8"), art)
        qmodel = artifacts[preset] = pp.load(art)
        error = last_layer_error(model, qmodel, records[:ERROR_SEQS])  # its forwards choose the engine
        label = f"embed, {preset} artifact, int8 ({pp.engine_used(qmodel) or 'fake'})"
        rows[label], errors[label] = embed_run(qmodel, records, scratch, preset), error
    return rows, errors, model, artifacts


def time_rows(rows: Dict[str, Callable[[], int]], threads: int, reps: int) -> Dict[str, Tuple[float, float]]:
    """{row: (residues/s, padding share or nan)}, best of ``reps`` interleaved passes."""
    torch.set_num_threads(threads)
    best: Dict[str, float] = {}
    for _ in range(reps):
        for name, run in rows.items():
            start = time.perf_counter()
            residues = run()
            rate = residues / (time.perf_counter() - start)
            best[name] = max(best.get(name, 0.0), rate)
    return {name: (rate, getattr(rows[name], "padding", float("nan"))) for name, rate in best.items()}


def report(timed: Dict[str, Tuple[float, float]], errors: Dict[str, float], threads: int) -> List[str]:
    fair = timed["fair-esm extract.py loop, FP32 [anchor]"][0]
    hf = timed["transformers EsmModel SDPA, FP32, same batches [anchor]"][0]
    rows = [[name, f"{rate:.0f}", f"{rate / fair:.2f}x", f"{rate / hf:.2f}x",
             "" if pad != pad else f"{100 * pad:.1f}%", f"{100 * errors[name]:.2f}%" if name in errors else ""]
            for name, (rate, pad) in timed.items()]
    lines = [f"\n### {threads} thread(s)\n",
             markdown_table(["row", "residues/s", "vs fair-esm loop", "vs HF SDPA", "padding", "last-layer error"],
                            rows)]
    eligible = {n: timed[n][0] for n in errors if errors[n] <= GOAL_ERROR}
    if eligible:
        name = max(eligible, key=eligible.get)
        rate = eligible[name]
        lines.append(f"\nfastest 8-bit row with last-layer error <= {100 * GOAL_ERROR:.0f}%: {name}: "
                     f"{rate / fair:.2f}x fair-esm's loop (goal >= {GOAL_VS_FAIR_ESM}x: "
                     f"{'met' if rate / fair >= GOAL_VS_FAIR_ESM else 'missed'}), {rate / hf:.2f}x HF SDPA (goal >= "
                     f"{GOAL_VS_HF}x: {'met' if rate / hf >= GOAL_VS_HF else 'missed'})")
    else:
        lines.append(f"\nno 8-bit row has last-layer error <= {100 * GOAL_ERROR:.0f}%: throughput goals missed")
    return lines


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny model and 12 sequences (smoke test)")
    p.add_argument("--size", choices=["35m", "650m"], default="35m", help="model size (default 35m)")
    p.add_argument("--seqs", type=int, default=495, help="bundled sequences to embed (default all 495)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (default 1 2)")
    p.add_argument("--reps", type=int, default=1, help="interleaved passes per row, best kept (default 1)")
    p.add_argument("--presets", nargs="+", default=list(PRESETS), help="8-bit recipes to embed with")
    p.add_argument("--memory", action="store_true", help="also peak RSS of 650M-sized embedding (fresh processes)")
    args = p.parse_args(argv)
    if args.seqs < 1 or args.reps < 1 or min(args.threads) < 1:
        p.error("--seqs, --reps and --threads must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    shape = SHAPES["quick" if args.quick else args.size]
    records = bundled_records(12 if args.quick else args.seqs)
    if args.quick:
        records = [(label, seq[:60]) for label, seq in records]
    print(f"# bench_embed\n\n`{command_line(argv if argv is not None else sys.argv[1:], __file__)}`\n")
    print(f"{cpu_facts()}\n\n{environment_line(args.threads[0])}; model: seeded random fair-esm ESM2 "
          f"{shape.num_layers} x {shape.embed_dim}, {shape.heads} heads, planted outlier channels (random weights: "
          f"a toolkit measurement, not biology); {len(records)} bundled sequences, "
          f"{sum(len(s) for _, s in records)} residues, {TOKS} tokens per batch, mean of the last layer kept")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        fasta = scratch / "bench.fasta"
        fasta.write_text("".join(f">{label}\n{seq}\n" for label, seq in records))
        calib = [seq[:256] for _, seq in records[::max(1, len(records) // 16)]][:16]
        rows, errors, model, artifacts = build_rows(shape, records, fasta, scratch, args.presets, calib)
        for threads in args.threads:
            print("\n".join(report(time_rows(rows, threads, args.reps), errors, threads)))
        length = QUICK_SCORE_LENGTH if args.quick else SCORE_LENGTH
        protein = next(seq for _, seq in bundled_records(495) if len(seq) >= length)[:length]
        print("\n".join(score_table(model, artifacts, protein, args.threads)))
    if args.memory:
        from bench_embed_memory import memory_table

        print("\n".join(memory_table()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
