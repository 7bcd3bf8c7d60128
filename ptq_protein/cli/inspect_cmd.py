"""``ptq-protein inspect``: per-site activation statistics on calibration data, table + histogram plots."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ptq_protein.cli.common import (
    add_batch_size_option,
    add_json_option,
    add_runtime_options,
    print_json,
    show_progress,
)
from ptq_protein.cli.models_arg import MODEL_HELP, add_model_options, load_float_model

EXAMPLES = """examples:
  ptq-protein inspect tiny-esmfold --calib casp14:5 --out runs/inspect
  ptq-protein inspect esm2_t33_650M_UR50D --calib my.fasta --preset w8a8-uniform --json
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("inspect", help="per-site activation statistics (range, asymmetry, kurtosis, SQNR)",
                              description="Calibrate on sequences and report, for each quantization site, its range, "
                                          "asymmetry, kurtosis and the SQNR the chosen recipe would give.",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--calib", default="casp14:50", help="calibration sequences: FASTA or bundled set "
                                                        "(default casp14:50)")
    p.add_argument("--preset", default="w8a8-pwlq", help="recipe whose sites and quantizers are evaluated "
                                                         "(default w8a8-pwlq)")
    add_batch_size_option(p)
    p.add_argument("--top", type=int, default=9, help="plot the N most asymmetric sites (default 9)")
    p.add_argument("--out", help="folder for report.json, report.md and histograms.png (never an artifact folder)")
    p.add_argument("--force", action="store_true", help="replace report files an earlier inspect wrote in --out")
    add_model_options(p)
    add_runtime_options(p)
    add_json_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import ptq_protein as pp
    from ptq_protein.passes.site_report import report_markdown
    from ptq_protein.support.io_utils import atomic_write_text

    _check_args(args)
    loaded = load_float_model(args, args.model)
    qmodel = pp.quantize(loaded.model, args.preset, calibration=args.calib, batch_size=args.batch_size,
                         progress=show_progress(args), inplace=True)
    state = qmodel.ptq_state
    rows = [r for r in state.report if "count" in r]
    if args.out:
        out = Path(args.out)
        atomic_write_text(out / "report.json", json.dumps(state.report, indent=2, default=str))
        title = f"{loaded.name} activations ({args.preset})"
        atomic_write_text(out / "report.md", report_markdown(state.report, title=title))
        worst = sorted(rows, key=lambda r: -abs(r.get("asymmetry", 0.0)))[: args.top]
        if worst:
            from ptq_protein.support.plots import plot_site_histograms

            plot_site_histograms(state.histograms, [r["site"] for r in worst], out / "histograms.png",
                                 title=f"{loaded.name}: most asymmetric sites")
    if args.json:
        print_json(state.report)
    else:
        print(report_markdown(state.report, title=f"{loaded.name} activations ({args.preset})"))
    return 0


_OUTPUTS = ("report.json", "report.md", "histograms.png")


def _check_args(args: argparse.Namespace) -> None:
    """Refuse bad options before calibrating: an empty preset, a negative --top, an --out that must not be written."""
    from ptq_protein.artifact.save_load import is_artifact_dir
    from ptq_protein.support.io_utils import check_out_path

    if not args.preset.strip():
        raise ValueError("--preset '' names no recipe; give a preset name (see README) or omit it")
    if args.top < 0:
        raise ValueError(f"--top {args.top} must be 0 or a number of sites to plot")
    if args.out is None:
        return
    out = Path(args.out)
    if is_artifact_dir(out):
        raise FileExistsError(f"{out} is an artifact folder; inspect would replace its reports: choose another --out")
    check_out_path(out, force=True, what="folder")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file, not a folder; choose another --out")
    taken = [name for name in _OUTPUTS if (out / name).exists()]
    if taken and not args.force:
        raise FileExistsError(f"{out / taken[0]} already exists; pass --force to replace inspect's reports there, "
                              "or choose another --out")
