#!/usr/bin/env python
"""CPU benchmark of backend="int8" (issues 17, 28): one interleaved table against FP32, bf16 and existing engines.

On the seeded random fair-esm ESM-2 of ``quantize.py`` (12 layers x 480,
demo outlier channels) and one batch of random sequences (default 4 x 256), one
run measures side by side, interleaved (the order rotates every round), medians,
each row's time over FP32 eager and its logits' relative error against FP32:

* FP32 eager, FP32 ``torch.compile`` (freezing), the FP model in bf16;
* anchors, each skipped with a note when its package is missing
  (``cpu_anchors.py``): ``quantize_dynamic``, ONNX Runtime dynamic U8S8
  with reduce_range (per-tensor weights, ORT's default, and per-channel) and U8U8 per-channel (the ``[onnx]``
  extra), each labelled exact or saturating by a one-Linear probe on this CPU;
* ours: ``w8a8-uniform``, ``w8a8-pwlq`` and the integer-friendly ``w8a8-pwlq-int``
  on ``backend="fake"`` and ``"int8"`` (engine ``auto``), uniform also exported to ONNX and run by ONNX
  Runtime (``pp.export_onnx``: u8 x u8 integer GEMMs, BOS/EOS rows in float), PWLQ also on the exact
  oneDNN engine; the reference engine on request (``--reference``, slow);
* the issue's goals judged on this run; how rare PWLQ codes outside the base
  region are; resident memory of a loaded ``w8a8-pwlq`` artifact of an ESM-2
  150M-sized model against FP (fresh subprocesses; ``--no-memory`` skips it).

It prints the CPU's AVX-512 / VNNI / AMX flags, ``torch.backends.cpu.get_cpu_capability()``,
threads, versions, and what oneDNN's exactness probe found. No number is asserted.

    python -m scripts.bench cpu_int8 --threads 1 --no-memory   # the issue's table (minutes)
    python -m scripts.bench cpu_int8 --quick --reps 1           # tiny model, seconds (smoke test)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import cpu_anchors as anchor  # noqa: E402  (sibling script: the existing engines)
from bench import ort as bench_ort  # noqa: E402  (sibling module: ONNX Runtime sessions)
from bench.common import (  # noqa: E402  (sibling module: shared model, sequences, timing and table helpers)
    FULL_SHAPE,
    QUICK_SHAPE,
    build_esm2,
    command_line,
    cpu_facts,
    environment_line,
    interleaved,
    markdown_table,
    random_sequences,
)
from bench.cpu_int8_memory import print_memory  # noqa: E402  (sibling script: the resident-memory rows)

INT_PRESETS = ("w8a8-uniform", "w8a8-pwlq", "w8a8-pwlq-int")
def build_models(model, seqs: Sequence[str], presets: Sequence[str], reference: Sequence[str], tokens: torch.Tensor,
                 threads: int, anchors: bool) -> Tuple[Dict[str, object], Dict[str, str]]:
    """Every timed model (callables ``tokens -> {"logits"}``) and the skipped rows' notes, in table order."""
    import ptq_protein as pp
    from ptq_protein.nn import cpu_int8

    models: Dict[str, object] = {"FP32 eager": model}
    notes: Dict[str, str] = {}
    bf16 = copy.deepcopy(model).to(torch.bfloat16)  # before torch.compile: a copy made after it ran mixed dtypes
    builders = [("FP32 compiled (inductor, freezing)", lambda: anchor.fp32_compiled(model, tokens))] if anchors else []
    builders.append(("FP model in bf16", lambda: bf16))
    if anchors:
        builders += [("quantize_dynamic (torch.ao, int8 Linear)", lambda: anchor.quantize_dynamic(model, tokens))]
        builders += ort_builders(model, tokens, threads)
    for name, build in builders:
        try:
            models[name] = build()
        except anchor.Skip as skip:
            notes[name] = str(skip)
    for preset in presets:
        fast = pp.quantize(model, preset, calibration=list(seqs), backend="int8")
        models[f"{preset}, fake"] = fake_twin(fast)
        models[f"{preset}, int8"] = fast
        if preset == "w8a8-uniform" and anchors:
            label = f"{preset}, ONNX export in ONNX Runtime (u8 x u8) [exact]"
            try:
                models[label] = exported_row(fast, tokens, threads)
            except anchor.Skip as skip:
                notes[label] = str(skip)
        if "pwlq" in preset and cpu_int8.available():
            models[f"{preset}, int8, engine onednn (exact)"] = pp.set_engine(copy.deepcopy(fast), "onednn")
        if preset in reference:
            models[f"{preset}, int8 reference"] = pp.set_engine(copy.deepcopy(fast), "reference")
    return models, notes


# ONNX Runtime quantize_dynamic rows: (label, weights, per_channel, reduce_range). reduce_range: 7-bit weights.
ORT_ROWS = (("U8S8 reduce_range, per-tensor W (ORT's default)", "s8", False, True),
            ("U8S8 reduce_range, per-channel W", "s8", True, True),
            ("U8U8, per-channel W", "u8", True, False))


def ort_builders(model, tokens: torch.Tensor, threads: int) -> List[tuple]:
    """The ONNX Runtime rows, each named with what its saturation probe found on this CPU (``ort_exact``)."""
    rows = []
    for label, weights, per_channel, reduce_range in ORT_ROWS:
        try:
            exact = "exact" if anchor.ort_exact(weights, per_channel, reduce_range) else "SATURATES (int16 pairs)"
        except anchor.Skip:
            exact = "skipped"
        rows.append((f"ONNX Runtime dynamic {label} [{exact}]",
                     lambda w=weights, c=per_channel, r=reduce_range: anchor.ort_dynamic(model, tokens, threads, w, c,
                                                                                         r)))
    return rows


def exported_row(qmodel: torch.nn.Module, tokens: torch.Tensor, threads: int):
    """Our artifact exported to ONNX (``pp.export_onnx``) and run by ONNX Runtime: what a user of that engine gets."""
    import ptq_protein as pp

    try:
        from ptq_protein.interop.onnx_export import export_onnx

        folder = Path(tempfile.mkdtemp(prefix="bench_export_"))
        pp.save(qmodel, folder / "artifact")
        logits = bench_ort.logits_fn(export_onnx(folder / "artifact", folder / "model.onnx"), threads, "input_ids")
    except Exception as err:  # noqa: BLE001  (onnxruntime missing or export failure: a skipped row, named)
        raise anchor.Skip(f"ONNX export failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}") from err
    return lambda t: {"logits": logits(t)}


def fake_twin(fast: torch.nn.Module) -> torch.nn.Module:
    """A copy of an int8 model on the fake backend (same parameters, float simulation)."""
    from ptq_protein.nn.modules import QuantLinear
    from ptq_protein.recipes.config import Backend

    fake = copy.deepcopy(fast)
    for m in fake.modules():
        if isinstance(m, QuantLinear):
            m.backend = Backend.FAKE
    return fake


def exact_knots_twin(fast: torch.nn.Module, tokens: torch.Tensor) -> torch.nn.Module:
    """A copy of a PWLQ int8 model whose site plans take only exactly stored knots (the rule before 2026-12-03).

    Plans are built at a module's first forward, so that forward runs with the
    knot tolerance set to 0; the copy keeps those plans.
    """
    twin = copy.deepcopy(fast)
    with exact_knots_only(), torch.no_grad():
        twin(tokens)
    return twin


@contextlib.contextmanager
def exact_knots_only():
    """PWLQ plans built inside take a knot only when it is stored exactly (knot tolerance 0)."""
    from ptq_protein.nn import cpu_pwlq

    saved, cpu_pwlq._KNOT_ROUNDING = cpu_pwlq._KNOT_ROUNDING, 0.0
    try:
        yield
    finally:
        cpu_pwlq._KNOT_ROUNDING = saved


def time_forwards(models: Dict[str, object], tokens: torch.Tensor, reps: int) -> Dict[str, tuple]:
    """(median, fastest) seconds, engine and logits error vs FP32 eager per model over ``reps`` interleaved rounds
    (after one warm-up each, which gives the logits).

    On a shared machine the fastest round is the one least disturbed by other
    processes; the goals are judged on the medians.
    """
    import ptq_protein as pp

    engines, errors = {}, {}
    with torch.no_grad():
        ref = models["FP32 eager"](tokens)["logits"].double()
        for name, m in models.items():
            logits = m(tokens.to(torch.long))["logits"].double()
            errors[name] = float((logits - ref).norm() / ref.norm())
            engines[name] = pp.engine_used(m) if hasattr(m, "ptq_state") else None
        times = interleaved({name: lambda m=m: m(tokens) for name, m in models.items()}, reps)
    return {name: (statistics.median(v), min(v), engines[name], errors[name]) for name, v in times.items()}


def tail_rates(model, tokens: torch.Tensor) -> Dict[str, float]:
    """Over every int8 PWLQ site: codes outside the base region, int8 GEMMs per site, tail columns.

    Per site as :func:`ptq_protein.nn.cpu_pwlq.pwlq_operands` sorts it: the base
    GEMM plus one per dense correction operand; tail regions (few columns) run
    in one small float32 GEMM over ``tail columns`` of K.
    """
    from ptq_protein.nn import cpu_pwlq
    from ptq_protein.nn.int_fast import encode_codes, prepack_module
    from ptq_protein.nn.modules import QuantLinear

    counts = {"codes": 0, "outside": 0, "sites": 0, "gemms": 0, "tail_sites": 0, "tail_cols": 0.0}
    handles = []

    def hook(mod, args):
        x = args[0].reshape(-1, args[0].shape[-1])
        codes, params = encode_codes(mod.input_quant, x)
        plan = cpu_pwlq.pwlq_plan(params[1], prepack_module(mod), None)
        ops = cpu_pwlq.pwlq_operands(codes, plan)
        out = (codes < plan.base_lo) | (codes > plan.base_hi)
        counts["codes"] += out.numel()
        counts["outside"] += int(out.sum())
        counts["sites"] += 1
        counts["gemms"] += 1 + len(ops.dense)
        if ops.cols is not None:
            counts["tail_sites"] += 1
            counts["tail_cols"] += ops.cols.numel() / codes.shape[1]

    for m in model.modules():
        if isinstance(m, QuantLinear) and m.input_quant is not None and m.input_quant.codebook is not None:
            handles.append(m.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for h in handles:
            h.remove()
    return {"codes outside base": round(counts["outside"] / max(counts["codes"], 1), 3),
            "int8 GEMMs per site": round(counts["gemms"] / max(counts["sites"], 1), 2),
            "sites with a tail GEMM": f"{counts['tail_sites']}/{counts['sites']}",
            "tail columns / K": round(counts["tail_cols"] / max(counts["tail_sites"], 1), 3)}


def tail_table(big, big_tokens, label: str, exact_knots: bool = False) -> List[list]:
    import ptq_protein as pp
    from ptq_protein.models.adapters import get_adapter
    from ptq_protein.models.tiny import tiny_esm2

    rows = [[f"{label} (this benchmark)", *tail_rates(big, big_tokens).values()]]
    if exact_knots:
        with exact_knots_only():
            rows.append([f"{label}, exact knots only", *tail_rates(big, big_tokens).values()])
    seqs = random_sequences(6, 48, seed=5)
    for label, outliers in (("tiny-esm2 (demo outliers)", "demo"), ("tiny-esm2, no outliers", None)):
        kwargs = {} if outliers == "demo" else {"outliers": None}
        tiny = tiny_esm2(seed=0, **kwargs)[0]
        q = pp.quantize(tiny, "w8a8-pwlq", calibration=seqs[:4], backend="int8")
        tokens = get_adapter(tiny).make_batch(seqs[4:]).inputs["tokens"]
        rows.append([label, *tail_rates(q, tokens).values()])
    return rows


# --- tables ------------------------------------------------------------------------------


def forward_rows(t: Dict[str, tuple], notes: Dict[str, str]) -> List[list]:
    fp, fp_min = t["FP32 eager"][:2]
    rows = [[name, engine or "-", round(sec * 1000, 1), f"{sec / fp:.2f}x", f"{fastest / fp_min:.2f}x", f"{err:.2%}"]
            for name, (sec, fastest, engine, err) in t.items()]
    return rows + [[name, "skipped", "-", "-", "-", note] for name, note in notes.items()]


def goal_lines(t: Dict[str, tuple], presets: Sequence[str]) -> List[str]:
    """The issue's goals, judged on the medians of this run."""
    fp = t["FP32 eager"][0]
    ratio = {name: v[0] / fp for name, v in t.items()}
    lines = []
    uni = t.get("w8a8-uniform, int8")
    if uni:
        qd = ratio.get("quantize_dynamic (torch.ao, int8 Linear)")
        lines.append(f"uniform int8 {ratio['w8a8-uniform, int8']:.2f}x <= 0.5x: "
                     f"{_met(ratio['w8a8-uniform, int8'] <= 0.5)}"
                     + ("" if qd is None else f"; no slower than quantize_dynamic ({qd:.2f}x): "
                        f"{_met(ratio['w8a8-uniform, int8'] <= qd)}"))
        exact_ort = [n for n in t if n.startswith("ONNX Runtime") and n.endswith("[exact]")]
        if exact_ort:
            best = min(exact_ort, key=ratio.get)
            lines.append(f"uniform int8 no slower than the fastest exact ONNX Runtime row ({best}, "
                         f"{ratio[best]:.2f}x): {_met(ratio['w8a8-uniform, int8'] <= ratio[best])}")
    pwlq = [n for n in t if "pwlq" in n and ", int8" in n and "reference" not in n]
    if pwlq:
        best = min(pwlq, key=ratio.get)
        line = f"best PWLQ int8 ({best}) {ratio[best]:.2f}x <= 0.6x: {_met(ratio[best] <= 0.6)}"
        if uni:
            met = _met(t[best][3] <= 0.75 * uni[3])
            line += f"; error {t[best][3]:.2%} <= 0.75 x uniform int8's {uni[3]:.2%}: {met}"
        lines.append(line)
    for preset in presets:
        if f"{preset}, int8" in t:
            i8, fk = ratio[f"{preset}, int8"], ratio[f"{preset}, fake"]
            lines.append(f"{preset}: int8 (auto) {i8:.2f}x no slower than fake {fk:.2f}x: {_met(i8 <= fk)}")
    return lines


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny 2 x 64 model, length 32 (smoke test)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1, as in the issue)")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    parser.add_argument("--calib-seqs", type=int, default=8, help="calibration sequences (default 8)")
    parser.add_argument("--batch-size", type=int, default=4, help="forward batch size (default 4)")
    parser.add_argument("--presets", default=",".join(INT_PRESETS), help="int8 presets (comma-separated)")
    parser.add_argument("--reference", default="",
                        help="presets also timed on the reference engine (comma-separated; '' for none)")
    parser.add_argument("--no-memory", action="store_true", help="skip the 150M memory subprocesses")
    parser.add_argument("--no-anchors", action="store_true",
                        help="skip FP32 torch.compile, quantize_dynamic and ONNX Runtime")
    parser.add_argument("--exact-knots", action="store_true",
                        help="also time w8a8-pwlq int8 with plans that take only exactly stored knots (as before)")
    parser.add_argument("--memory-only", action="store_true", help="only the 150M memory subprocesses")
    args = parser.parse_args(argv)
    if min(args.threads, args.reps, args.calib_seqs, args.batch_size) < 1:
        parser.error("--threads, --reps, --calib-seqs and --batch-size must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_only:
        print(f"`{command_line(argv, __file__)}`\n\n{environment_line(args.threads)}\n\n{cpu_facts()}\n")
        print_memory(args.threads, args.quick)
        return 0
    shape = QUICK_SHAPE if args.quick else FULL_SHAPE
    torch.manual_seed(0)
    model, _ = build_esm2(shape)
    from ptq_protein.models.adapters import get_adapter

    tokens = get_adapter(model).make_batch(random_sequences(args.batch_size, shape.seq_len, seed=2)).inputs["tokens"]
    facts = cpu_facts()
    print(f"# backend='int8' on CPU (issues 17, 28): {shape.describe()}, batch {args.batch_size} x {shape.seq_len}\n\n"
          f"`{command_line(argv, __file__)}`\n\n{environment_line(args.threads)}\n\n{facts}\n\n"
          f"toolkit check, random weights; {args.reps} interleaved reps, medians\n")
    presets = [p for p in args.presets.split(",") if p]
    from ptq_protein.nn import cpu_int8

    print(f"oneDNN int8 exactness probe: mode {cpu_int8.mode()}: {cpu_int8.reason()}\n")
    models, notes = build_models(model, random_sequences(args.calib_seqs, shape.seq_len, seed=1), presets,
                                 [p for p in args.reference.split(",") if p], tokens, args.threads, not args.no_anchors)
    if args.exact_knots and "w8a8-pwlq, int8" in models:
        models["w8a8-pwlq, int8, exact knots only"] = exact_knots_twin(models["w8a8-pwlq, int8"], tokens)
    t = time_forwards(models, tokens, args.reps)
    print(markdown_table(["model", "engine", "forward ms (median)", "vs FP32 eager", "vs FP32 (fastest)",
                          "logits error vs FP32"], forward_rows(t, notes)) + "\n")
    print("\n".join(f"- {line}" for line in goal_lines(t, presets)) + "\n")
    if "w8a8-pwlq" in presets:
        print("## PWLQ sites: codes outside the base region, int8 GEMMs per site, tail columns (mean)\n")
        print(markdown_table(["model", "codes outside base", "int8 GEMMs per site", "sites with a tail GEMM",
                              "tail columns / K"],
                             tail_table(models["w8a8-pwlq, int8"], tokens, shape.describe(),
                                        args.exact_knots)) + "\n")
    if not args.no_memory:
        print_memory(args.threads, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
