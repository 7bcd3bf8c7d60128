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
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    add_json_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ptq_protein.interop.onnx_export import export_onnx

    out = export_onnx(args.artifact, args.out, force=args.force)
    summary = {"artifact": args.artifact, "onnx": str(out), "bytes": Path(out).stat().st_size}
    if args.json:
        print_json(summary)
    else:
        print(f"wrote {out} ({summary['bytes'] / 1e6:.2f} MB): input input_ids [batch, length]; run it with "
              "ptq_protein.interop.onnx_export.ort_session (exact uint8 kernels)")
    return 0
