"""``ptq-protein export``: an artifact as an ONNX QDQ graph for ONNX Runtime and other QDQ runtimes."""

from __future__ import annotations

import argparse

from ptq_protein.cli.common import add_json_option, print_json

EXAMPLES = """examples:
  ptq-protein export runs/esm2-w8a8 --format onnx --out esm2-w8a8.onnx
  ptq-protein export runs/tiny-esmfold-w8a8 --format onnx --out stem.onnx   # ESMFold: its ESM-2 stem
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="write an artifact as an ONNX QDQ graph (uniform int8 recipes)",
                              description="Write a quantized artifact as ONNX with QuantizeLinear/DequantizeLinear "
                                          "around each quantized site (uint8 codes, the artifact's scales and zero "
                                          "points). Needs the onnx extra: pip install 'ptq-protein[onnx]'.",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact", help="artifact folder written by 'ptq-protein quantize'")
    p.add_argument("--format", default="onnx", choices=["onnx"], help="export format (onnx)")
    p.add_argument("--out", required=True, help="the .onnx file to write")
    p.add_argument("--force", action="store_true",
                   help="replace an existing --out file (and a different vocab.txt / tokens.json beside it)")
    p.add_argument("--hidden-states", action="store_true",
                   help="add every layer's output as 'hidden_states' [batch, length, layers + 1, channels]")
    add_json_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from ptq_protein.interop.onnx_export import export_onnx
    from ptq_protein.interop.onnx_vocab import TOKENS, VOCAB

    out = export_onnx(args.artifact, args.out, force=args.force, hidden_states=args.hidden_states)
    table = json.loads((out.parent / TOKENS).read_text())
    summary = {"artifact": args.artifact, "onnx": str(out), "bytes": Path(out).stat().st_size,
               "inputs": ["input_ids", "attention_mask"], "outputs": table["outputs"],
               "vocab": str(out.parent / VOCAB), "tokens": str(out.parent / TOKENS)}
    if args.json:
        print_json(summary)
    else:
        print(f"wrote {out} ({summary['bytes'] / 1e6:.2f} MB): inputs input_ids, attention_mask [batch, length]; "
              f"outputs {', '.join(table['outputs'])}; ids in {summary['vocab']} and {summary['tokens']}; run it "
              "with ptq_protein.interop.onnx_export.ort_session (exact uint8 kernels)")
    return 0
