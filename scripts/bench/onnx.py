#!/usr/bin/env python
"""CPU benchmark of the ONNX export: ONNX Runtime on our QDQ graphs, beside PyTorch and ORT's own quantizer.

On the seeded random fair-esm ESM-2 of ``quantize.py`` (12 layers x 480,
demo outlier channels; random weights: this measures the toolkit, not biology)
and one padded batch of random sequences (default 4 sequences, lengths from
``--length`` down to half of it), one run measures, interleaved (the order
rotates every round), medians of ``--reps``:

* PyTorch: the FP32 model and our ``w8a8-uniform`` / ``w8a8-dynamic`` fake models, and
  ``w8a8-uniform`` with BOS/EOS quantized like residues (``-include``): with BOS/EOS
  kept in float a ``Where`` separates each activation from its ``MatMul``, and ORT
  runs the weights as ``MatMulNBits``; without it ORT fuses ``MatMulIntegerToFloat``;
* ONNX Runtime (``ort_session``: CPU provider, exact uint8 kernels): the FP32
  export, our QDQ exports of the two recipes, and ORT's own
  ``quantize_dynamic`` of the FP32 export (int8 weights, with and without
  ``reduce_range``: x86 CPUs without VNNI saturate u8 x s8 pair sums otherwise).

Beside each time: the relative error of the logits against the FP32 model; for
our fake models, their own float64 run against the float32 one (how far float
rounding alone moves them: activation codes near a boundary flip); for our
exports, the relative error against our fake model, which the tests bound by
twice that float64 distance (floor 1e-5). No number is asserted.

    python -m scripts.bench onnx --threads 2            # the table of BENCHMARKS.md (a minute or two)
    python -m scripts.bench onnx --quick                # tiny model, seconds (smoke test)
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import ort as bench_ort  # noqa: E402  (sibling module: the ONNX export, ORT's quantize_dynamic and sessions)
from bench.common import (  # noqa: E402  (sibling module: shared model, sequences, timing and table helpers)
    FULL_SHAPE,
    QUICK_SHAPE,
    build_esm2,
    command_line,
    cpu_facts,
    environment_line,
    interleaved,
    markdown_table,
    medians,
    random_sequences,
)

RECIPES = ("w8a8-uniform", "w8a8-dynamic", "w8a8-uniform-include")  # -include: BOS/EOS quantized like residues


def _config(recipe: str):
    """The preset, or with ``-include`` its ``special_tokens="include"`` variant (ORT then fuses integer GEMMs)."""
    import ptq_protein as pp

    if recipe.endswith("-include"):
        return pp.get_preset(recipe[: -len("-include")]).replace(special_tokens="include")
    return recipe


def build_paths(shape, threads: int, length: int, folder: Path) -> tuple:
    """``({name: () -> logits}, tokens)`` for every path of the table."""
    import ptq_protein as pp
    from ptq_protein.interop.onnx_export import example_ids, export_onnx
    from ptq_protein.models.adapters import get_adapter

    model, _ = build_esm2(shape)
    seqs = random_sequences(4, length, seed=1)
    tokens = get_adapter(model).make_batch([s[: length - i * length // 8] for i, s in enumerate(seqs)]).inputs["tokens"]
    paths: Dict[str, Callable[[], object]] = {"torch FP32": lambda: model(tokens)["logits"]}
    fp = bench_ort.export_fp32(bench_ort.Logits(model), example_ids(), folder / "fp.onnx", input_name="input_ids")
    graphs = {"ORT FP32": fp}
    for recipe in RECIPES:
        qmodel = pp.quantize(model, _config(recipe), calibration=random_sequences(8, length, seed=2))
        pp.save(qmodel, folder / recipe)
        graphs[f"ORT ours {recipe}"] = export_onnx(folder / recipe, folder / f"{recipe}.onnx")
        paths[f"torch {recipe} fake"] = lambda q=qmodel: q(tokens)["logits"]
        fake64 = copy.deepcopy(qmodel).double()
        paths[f"torch {recipe} fake float64"] = lambda q=fake64: q(tokens)["logits"].float()
    for reduce in (False, True):
        name = f"ORT quantize_dynamic{' reduce_range' if reduce else ''}"
        graphs[name] = bench_ort.quantize_dynamic(fp, folder / f"{name}.onnx", "s8", reduce_range=reduce)
    for name, graph in graphs.items():
        run = bench_ort.logits_fn(graph, threads, input_name="input_ids")
        paths[name] = lambda run=run: run(tokens)
    return paths, tokens


def bench(paths: Dict[str, Callable[[], object]], reps: int) -> Dict[str, float]:
    with torch.no_grad():
        for path in paths.values():
            path()  # warm-up
        return medians(interleaved(paths, reps))


def rows(paths, tokens, medians: Dict[str, float]) -> List[list]:
    keep = tokens != 1

    def rel(a, b):
        return ((a - b)[keep].norm() / b[keep].norm()).item()

    with torch.no_grad():
        outs = {n: torch.as_tensor(f()) for n, f in paths.items()}
    fp = outs["torch FP32"]
    table = []
    for name in paths:
        fake = next((f"torch {r} fake" for r in sorted(RECIPES, key=len, reverse=True) if r in name), None)
        vs_fake = f"{rel(outs[name], outs[fake]):.2e}" if name.startswith("ORT ours") or "float64" in name else ""
        table.append([name, medians[name] * 1e3, medians[name] / medians["torch FP32"], rel(outs[name], fp), vs_fake])
    return table


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, seconds (smoke test)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--length", type=int, default=None, help="longest sequence (default 256; --quick 32)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shape = QUICK_SHAPE if args.quick else FULL_SHAPE
    length = args.length or shape.seq_len
    with tempfile.TemporaryDirectory() as tmp:
        paths, tokens = build_paths(shape, args.threads, length, Path(tmp))
        medians = bench(paths, args.reps)
        table = rows(paths, tokens, medians)
    print(f"`{command_line(sys.argv[1:] if argv is None else argv, __file__)}`")
    print(f"{environment_line(args.threads)}; {cpu_facts()}; batch {tuple(tokens.shape)} padded")
    print(markdown_table(["path", "ms", "x FP32 torch", "rel. error vs FP32", "rel. error vs our fake"], table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
