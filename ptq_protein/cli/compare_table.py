"""The fidelity check of ``ptq-protein quantize``: which recipes, on which sequences, and its table."""

from __future__ import annotations

import argparse
from typing import Any, Dict, List, Union

# The comparison the embedded demos (tiny-esmfold, tiny-esm2, ...) run by default, so the first
# command shows what the recipe buys against the uniform baseline and against the study's own
# W8 + PWLQ A8 (9 bits per activation value), and at what storage. The uniform baseline shares the
# main recipe's calibration pass; the study recipe collects its own statistics (batch 1, whole
# tensors, BOS/EOS included), which is most of the command's time on CPU (see README Quickstart).
DEMO_COMPARE = ("w8a8-pwlq", "w8a8-uniform", "study-w8a8-pwlq")

DEFAULT_CHECK_SEQUENCES = 3

NOT_BIOLOGY = "measures quantization error, not biology"


def add_check_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", type=int, default=DEFAULT_CHECK_SEQUENCES, metavar="N",
                        help="compare the quantized model with its FP self on the N median-length calibration "
                             f"sequences, cropped like calibration (default {DEFAULT_CHECK_SEQUENCES}; 0: skip)")
    parser.add_argument("--compare", metavar="RECIPE[,RECIPE]",
                        help="run the same check for these presets too, from the same calibration pass where their "
                             "statistics allow, and print one table (default: "
                             f"{','.join(DEMO_COMPARE)} on the embedded tiny demos, none otherwise; 'none' "
                             "turns it off)")


def compare_names(args: argparse.Namespace, is_demo: bool) -> List[str]:
    """The recipe names asked for with --compare (or the demo default); unknown names are left to the caller."""
    if args.compare is None:
        names = list(DEMO_COMPARE) if is_demo and args.check > 0 else []
        if getattr(args, "backend", "fake") != "fake":  # the study's recipes simulate in float only
            names = [n for n in names if not n.startswith("study-")]
    elif args.compare.strip().lower() == "none":
        names = []
    else:
        names = args.compare.split(",")
        if args.check <= 0:
            raise ValueError("--compare needs the fidelity check: drop --check 0 or give --check N with N >= 1")
    return names


def print_comparison(comparison: Dict[str, Any], demo: bool) -> None:
    for line in comparison_lines(comparison, demo):
        print(line)


def comparison_lines(comparison: Dict[str, Any], demo: bool) -> List[str]:
    """The fidelity table as printed (and copied into the model card)."""
    from ptq_protein.workflows.fidelity_bound import verdict_line

    lines: List[str] = []
    seqs = comparison["sequences"]
    lengths = "/".join(map(str, sorted(set(seqs["lengths"]))))
    size = f"cropped to {lengths} residues" if seqs["lengths"] != seqs["full_lengths"] else f"{lengths} residues"
    lines.append(f"fidelity vs the FP model ({'toolkit check, random weights: ' if demo else ''}{NOT_BIOLOGY})")
    lines.append(f"on {seqs['source']} ({', '.join(seqs['ids'])}; {size}):")
    rows = comparison["rows"]
    structure = any("tm_vs_fp" in r for r in rows)
    key, label = ("tm_vs_fp", "TM vs FP") if structure else ("top1_agreement", "top-1 agreement")
    if not any(key in r for r in rows):  # a trunk without a head (EsmModel): hidden states, no top-1 to agree on
        key, label = "", ""
    width = max(len("recipe"), *(len(r["recipe"]) for r in rows))
    bits = [row_bits(row) for row in rows]
    bits_width = max(len("bits W/A"), *map(len, bits))
    lines.append(f"  {'recipe':<{width}}  {'bits W/A':>{bits_width}}  rel. error  {label}".rstrip())
    for row, shown in zip(rows, bits):
        last = f"  {row[key]:>{len(label)}.4f}" if key else ""
        outside = (row.get("verdict") or {}).get("within") is False
        lines.append(f"  {row['recipe']:<{width}}  {shown:>{bits_width}}  {row['relative_error']:>10.4f}{last}"
                     + ("  << outside its bound" if outside else ""))
        if "avg_bits" in row:
            lines.append(f"  note: {row['recipe']} is a mixed plan: widths per unit as shown, {row['avg_bits']:.2f} "
                         "bits per value on average")
    for name, note in comparison["calibration"]["notes"].items():
        lines.append(f"  note: {name} {note}")
    for row in rows:
        if (row.get("verdict") or {}).get("within") is False:
            lines.append(f"  note: {verdict_line(row['recipe'], row['verdict'])}")
    return lines


def row_bits(row: Dict[str, Any]) -> str:
    """A row's "bits W/A" cell: the stored widths, then the trunk's dtype where it runs its own (``bf16-trunk``:
    ``fp/fp, trunk bf16``: nothing quantized, yet not the float model either)."""
    bits = f"{_bits(row['weight_bits'])}/{_bits(row['activation_bits'])}"
    trunk = row.get("trunk_dtype")
    return bits if trunk is None else f"{bits}, trunk {_DTYPE_SHORT.get(trunk, trunk)}"


_DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16"}


def _bits(value: Union[int, str, None]) -> str:
    """A width as printed: None is floating point; a mixed plan's span (``"4-8"``) prints as it is."""
    return "fp" if value is None else str(value)
