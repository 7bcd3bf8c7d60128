"""``ptq-protein quantize``: calibrate, quantize and save an integer artifact."""

from __future__ import annotations

import argparse
from pathlib import Path

from ptq_protein.cli.common import (CPU_CALIB_MAX_LENGTH, add_calib_crop_option, add_json_option,
                                    add_runtime_options, calib_crop, print_json, show_progress)
from ptq_protein.cli.models_arg import MODEL_HELP, add_model_options, load_float_model

EXAMPLES = """examples:
  ptq-protein quantize tiny-esmfold --bits 8                      # the embedded demo, no weights needed
  ptq-protein quantize esmfold --bits 8                           # w8a8-pwlq, calibrated on the bundled CASP14 set
  ptq-protein quantize esm2_t33_650M_UR50D --preset w4a8-pwlq --calib my.fasta --out runs/650m-w4a8
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("quantize", help="calibrate and quantize a model, save an artifact folder",
                              description="Calibrate and quantize an ESM-2 / ESMFold model and save it as an artifact "
                                          "(model.safetensors with integer codes, recipe.json, report.json/md).",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help=MODEL_HELP)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--bits", type=int, help="4, 6 or 8: the default piecewise-linear recipe at that width (default 8)")
    group.add_argument("--preset", help="a named recipe (see README: w8a8-uniform, w8a8-pwlq, w8-only, w4a8-pwlq, ...)")
    p.add_argument("--calib", default="casp14:50",
                   help="calibration sequences: a FASTA file or a bundled set (default casp14:50, the study's set)")
    p.add_argument("--out", help="artifact folder (default runs/<model>-<preset>)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out folder")
    p.add_argument("--batch-size", type=int, default=4, help="calibration batch size (default 4)")
    p.add_argument("--backend", choices=["fake", "int8"], default="fake", help="execution backend recorded in the artifact")
    p.add_argument("--num-recycles", type=int, help="ESMFold: recycles during calibration (default: the model's)")
    add_calib_crop_option(p)
    p.add_argument("--low-memory", action="store_true",
                   help="fair-esm ESM-2 files: stream the model layer by layer from the memory-mapped checkpoint "
                        "(peak memory about the int8 model plus one float layer); same artifact as the default")
    p.add_argument("--check", type=int, default=1, metavar="N",
                   help="compare the quantized model with its FP self on the N shortest calibration sequences (0: skip)")
    add_model_options(p)
    add_runtime_options(p)
    add_json_option(p)
    p.set_defaults(func=run)


def _recipe_name(args: argparse.Namespace) -> str:
    from ptq_protein.presets import get_preset, preset_for_bits

    name = args.preset or preset_for_bits(args.bits if args.bits is not None else 8)
    get_preset(name)  # validate early, before any model is loaded
    return name


def run(args: argparse.Namespace) -> int:
    import ptq_protein as pp
    from ptq_protein.api import resolve_calibration
    from ptq_protein.eval.bench.fidelity import compare_to_reference, reference_outputs
    from ptq_protein.models.mapped import mapped_file_of, release_after_forward

    recipe = _recipe_name(args)
    out = Path(args.out or f"runs/{Path(args.model).name}-{recipe}")
    if out.exists() and not args.force:
        raise FileExistsError(f"{out} already exists; pass --force to overwrite it or choose another --out")
    _check_memory(args)
    if args.low_memory:
        qmodel, loaded, references, shortest = _quantize_streaming(args, recipe), None, [], []
    else:
        loaded = load_float_model(args, args.model, mmap=True)
        shortest = sorted(resolve_calibration(args.calib)[1], key=len)[: max(args.check, 0)]
        # The float model is quantized in place (no second copy): keep only its outputs for the check.
        with release_after_forward(loaded.model, mapped_file_of(loaded.model)):
            references = reference_outputs(loaded.model, shortest) if shortest else []
        qmodel = pp.quantize(loaded.model, recipe, calibration=args.calib, batch_size=args.batch_size,
                             backend=args.backend, progress=show_progress(args), num_recycles=args.num_recycles,
                             calib_max_length=calib_crop(args, loaded.device), inplace=True)
    info = _model_info(args, loaded)
    pp.save(qmodel, out, force=args.force, model_info=info)
    summary = _summary(qmodel, out, recipe, info["name"])
    if references:
        summary["fidelity_vs_fp"] = compare_to_reference(references, qmodel, shortest)
    if args.json:
        print_json(summary)
    else:
        _print_summary(summary)
    return 0


def _quantize_streaming(args: argparse.Namespace, recipe: str):
    """--low-memory: layer by layer from the mapped file (no --check: the float model never exists whole)."""
    from ptq_protein.cli.common import resolve_device
    from ptq_protein.models.loading import locate_weights
    from ptq_protein.streaming import quantize_streaming

    path = locate_weights(args.model, args.weights)
    if path is None or not path.is_file() or resolve_device(args.device) != "cpu" or args.dtype != "float32":
        raise ValueError("--low-memory streams fair-esm ESM-2 .pt files on the CPU in float32; "
                         "drop --low-memory for tiny models, Hugging Face folders, other devices or dtypes")
    if args.backend != "fake":
        raise ValueError("--low-memory writes backend 'fake' artifacts; drop --backend or --low-memory")
    return quantize_streaming(path, recipe, calibration=args.calib, batch_size=args.batch_size,
                              calib_max_length=calib_crop(args, "cpu"))


def _model_info(args: argparse.Namespace, loaded) -> dict:
    if loaded is not None:
        return {"name": loaded.name, "family": loaded.family, "source": str(loaded.source),
                "source_sha256": loaded.source_sha256}
    from ptq_protein.models.checkpoints import file_sha256
    from ptq_protein.models.loading import locate_weights

    path = locate_weights(args.model, args.weights).resolve()
    name = path.stem if Path(args.model).exists() else args.model
    return {"name": name, "family": "fair-esm", "source": str(path), "source_sha256": file_sha256(path)}


def _summary(qmodel, out: Path, recipe: str, model_name: str) -> dict:
    state = qmodel.ptq_state
    kinds: dict = {}
    for kind in state.quantized.values():
        kinds[kind] = kinds.get(kind, 0) + 1
    size = sum(f.stat().st_size for f in out.iterdir())
    return {"artifact": str(out), "model": model_name, "recipe": recipe, "config": state.config.describe(),
            "sites_quantized": len(state.quantized), "by_kind": kinds, "fp_sites": len(state.fp_sites),
            "calibration": None if state.calibration is None else state.calibration.to_dict(),
            "artifact_bytes": size}


def _print_summary(summary: dict) -> None:
    print(f"quantized {summary['model']} with {summary['recipe']}: {summary['sites_quantized']} sites "
          f"({', '.join(f'{k}: {v}' for k, v in sorted(summary['by_kind'].items()))})")
    calib = summary["calibration"]
    if calib:
        print(f"calibration: {calib['name']} ({calib['num_sequences']} sequences, sha256 {calib['sha256'][:12]})")
    print(f"artifact: {summary['artifact']} ({summary['artifact_bytes'] / 1e6:.2f} MB)")
    fid = summary.get("fidelity_vs_fp")
    if fid:
        print("fidelity vs its own FP model (measures quantization error, not biology): "
              + ", ".join(f"{k} {v:.4f}" for k, v in fid.items()))


def _check_memory(args: argparse.Namespace) -> None:
    """Refuse, before loading, a run the estimate says cannot fit (see :mod:`ptq_protein.budget`)."""
    from ptq_protein.api import resolve_calibration
    from ptq_protein.budget import check_fits
    from ptq_protein.models.loading import locate_weights

    crop = args.calib_max_length if args.calib_max_length is not None else CPU_CALIB_MAX_LENGTH
    longest = max((len(s) for s in resolve_calibration(args.calib)[1]), default=0)
    tokens = args.batch_size * ((min(longest, crop) if crop else longest) + 2)
    check_fits(locate_weights(args.model, args.weights), low_memory=args.low_memory, calibration_tokens=tokens)
