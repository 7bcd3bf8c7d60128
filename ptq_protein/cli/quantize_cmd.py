"""``ptq-protein quantize``: calibrate, quantize and save an integer artifact."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from ptq_protein.cli.auto_opts import add_auto_options, auto_budget, run_auto
from ptq_protein.cli.common import (
    add_batch_size_option,
    add_calib_crop_option,
    add_json_option,
    add_runtime_options,
    calib_crop,
    print_json,
    show_progress,
)
from ptq_protein.cli.compare_table import add_check_options, compare_names, comparison_lines
from ptq_protein.cli.models_arg import MODEL_HELP, add_model_options, load_float_model
from ptq_protein.cli.quantize_low_memory import memory_mode, quantize_low_memory
from ptq_protein.cli.quantize_summary import print_summary, summary_of

EXIT_FIDELITY = 3  # the artifact was written, but its own check is far outside what its recipe gives

EXAMPLES = """examples:
  ptq-protein quantize tiny-esmfold --bits 8                      # the embedded demo, no weights needed
  ptq-protein quantize tiny-esm2 --compare w8a8-uniform,a8-pwlq   # also check other recipes, one calibration pass
  ptq-protein quantize esmfold --bits 8                           # bf16-trunk: the folding trunk's pair operations
  ptq-protein quantize esm2_t33_650M_UR50D --bits 8               # w8a8-smoothquant-gptq-lntoken on casp14:50
  ptq-protein quantize esm2_t33_650M_UR50D --preset w4a8-pwlq --calib my.fasta --out runs/650m-w4a8
  ptq-protein quantize tiny-esmfold --auto --budget "tm>=0.99"     # per-layer mixed precision, verified held-out
  ptq-protein quantize tiny-esm2 --auto --budget "logits_rel<=0.02" --unit site
  ptq-protein quantize tiny-esmfold --auto --max-bits-avg 6         # best TM-score at <= 6 bits on average
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("quantize", help="calibrate and quantize a model, save an artifact folder",
                              description="Calibrate and quantize an ESM-2 / ESMFold model and save it as an artifact "
                                          "(model.safetensors with integer codes, recipe.json, report.json/md).",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help=MODEL_HELP)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--bits", type=int, help="4, 6 or 8: the default piecewise-linear recipe at that "
                                                "width (default 8; 8 is bf16-trunk on ESMFold, docs/esmfold.md, "
                                                "and w8a8-smoothquant-gptq-lntoken on ESM-2, docs/embeddings.md)")
    group.add_argument("--preset", help="a named recipe (w8a8-pwlq, w8a8-smoothquant, w8a8-rotate, ...; "
                                        "'ptq-protein presets' lists all, one line each)")
    group.add_argument("--auto", action="store_true",
                       help="search a per-unit precision plan meeting --budget / --max-bits-avg (README: "
                            "Mixed precision)")
    p.add_argument("--calib", default="casp14:50",
                   help="calibration sequences: a FASTA file or a bundled set (default casp14:50, the study's set)")
    p.add_argument("--out", help="artifact folder (default runs/<model>-<preset>)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing --out artifact folder (anything else there is never replaced)")
    add_batch_size_option(p)
    p.add_argument("--backend", choices=["fake", "int8"], default="fake",
                   help="execution backend recorded in the artifact")
    p.add_argument("--num-recycles", type=int, help="ESMFold: recycles during calibration (default: the model's)")
    add_calib_crop_option(p)
    p.add_argument("--smoothquant-alpha", metavar="A|auto",
                   help="*-smoothquant* presets: SmoothQuant's migration strength in [0, 1] (preset: 0.5), or 'auto' "
                        "to pick it, or no smoothing, from a grid by the fidelity check's error (one quantize per "
                        "grid point)")
    p.add_argument("--low-memory", action="store_true",
                   help="fair-esm ESM-2 files: stream the model layer by layer from the memory-mapped checkpoint "
                        "(peak memory about the int8 model plus one float layer); same artifact as the default")
    add_check_options(p)
    add_auto_options(p)
    add_model_options(p)
    add_runtime_options(p)
    add_json_option(p)
    p.set_defaults(func=run)


def _recipe_name(args: argparse.Namespace, family: Optional[str]) -> str:
    """--preset, else --bits' recipe for ``family`` (:func:`_family_hint`), validated before any load."""
    from ptq_protein.recipes.presets import get_preset, preset_for_bits

    if args.preset is not None and not args.preset.strip():
        raise ValueError("--preset '' names no recipe; give a preset name ('ptq-protein presets' lists them) "
                         "or omit it")
    name = args.preset if args.preset is not None else \
        preset_for_bits(args.bits if args.bits is not None else 8, family)
    from ptq_protein.artifact.save_load import check_saveable

    check_saveable(get_preset(name))  # validate early, before any model is loaded or calibrated
    return name


def run(args: argparse.Namespace) -> int:
    import ptq_protein as pp
    from ptq_protein.artifact.save_load import check_artifact_out
    from ptq_protein.workflows.recipe_compare import known_recipes
    from ptq_protein.workflows.shared_calibration import calibrate_recipes

    budget = auto_budget(args)  # a bad budget fails before any model is loaded
    family = _family_hint(args)
    recipe = "auto" if budget is not None else _recipe_name(args, family)
    # Where the family is not known before loading, --bits' recipe is decided after it (_family_default)
    decided = args.preset is not None or args.bits not in (None, 8) or family is not None
    alpha = _smoothquant_alpha(args, recipe, decided=decided)
    if args.check < 0:
        raise ValueError(f"--check {args.check} must be 0 (skip) or a number of sequences")
    _check_recipes(args, recipe, budget)
    out = args.out if args.out is not None else f"runs/{Path(args.model).name}-{recipe}"
    check_artifact_out(out, force=args.force)  # before calibration: refused in words, not after minutes
    out = Path(out)
    streamed = memory_mode(args, budget, recipe, family)
    if streamed is not None:
        recipe = streamed
        out = out if args.out is not None else Path(f"runs/{Path(args.model).name}-{recipe}")
        check_artifact_out(out, force=args.force)
        qmodel, check = quantize_low_memory(args, recipe)  # the float outputs of --check streamed too
        comparison = _fidelity(qmodel, check) if check is not None else None
        summary = summary_of(qmodel, out, recipe, _save(qmodel, out, args, None, comparison))
        summary["low_memory"] = "asked" if args.low_memory else "chosen: only this mode fits in memory"
        if comparison is not None:
            comparison.pop("references")
            _record_check(summary, comparison, out, False, calibration={"passes": 1, "notes": {}})
        return _report(summary, args, demo=False)
    loaded = load_float_model(args, args.model, mmap=True)
    recipe, out = _family_default(args, loaded, recipe, budget, out)
    alpha = _smoothquant_alpha(args, recipe)  # the recipe is known now: refused before any calibration
    demo = _is_demo(loaded)
    crop = calib_crop(args, loaded.device)
    compare, skipped, passes, notes, alpha_search = [], [], {}, {}, None
    if budget is None:
        compare, skipped = known_recipes([n for n in compare_names(args, demo) if n.strip() != recipe])
        _check_sites(loaded.model, recipe, compare)
    check = _fidelity_references(args, loaded, crop)  # before an in-place quantization consumes the FP model
    if budget is not None:
        qmodel = run_auto(args, loaded, budget)
    else:
        target, alpha_search = _tuned_recipe(args, loaded, recipe, alpha, crop)
        # Without recipes to compare, the float model is calibrated and quantized in place (no second copy).
        passes, notes = calibrate_recipes(loaded.model, [target, *compare], args.calib,
                                          batch_size=args.batch_size, progress=show_progress(args),
                                          num_recycles=args.num_recycles, calib_max_length=crop,
                                          inplace=not compare)
        qmodel = pp.quantize(loaded.model, target, calibration=args.calib, statistics=passes[recipe],
                             backend=args.backend, batch_size=args.batch_size, progress=show_progress(args),
                             num_recycles=args.num_recycles, calib_max_length=crop, inplace=not compare)
    comparison = _fidelity(qmodel, check, show_progress(args)) if check is not None else None  # sealed
    summary = summary_of(qmodel, out, recipe, _save(qmodel, out, args, loaded, comparison))
    if alpha_search:
        summary["smoothquant_alpha"] = alpha_search
    if qmodel.ptq_state.plan is not None:
        summary["plan"] = qmodel.ptq_state.plan.to_dict()
    if comparison is not None:
        del qmodel  # the compared recipes are built one at a time next to the FP model
        comparison["rows"] += _compare_rows(args, loaded, compare, passes, comparison.pop("references"))
        _record_check(summary, comparison, out, demo, skipped=skipped,
                      calibration={"passes": len({id(p) for p in passes.values() if p}), "notes": notes})
    return _report(summary, args, demo)


def _record_check(summary: dict, comparison: dict, out: Path, demo: bool, **extra) -> None:
    """The check's verdict, metrics and table into the summary, and the table into the model card."""
    summary["fidelity_verdict"] = comparison["rows"][0].get("verdict")
    comparison.update({"skipped": [], **extra})
    summary["fidelity_vs_fp"] = comparison.pop("main_metrics")
    summary["comparison"] = comparison
    _card_fidelity(out, comparison, demo)


def _card_fidelity(out: Path, comparison: dict, demo: bool) -> None:
    """Put the fidelity table, as printed, into the artifact's model card (the card is outside the seal)."""
    from ptq_protein.artifact.model_card import write_model_card

    write_model_card(out, "```text\n" + "\n".join(comparison_lines(comparison, demo)) + "\n```")


def _check_recipes(args: argparse.Namespace, recipe: str, budget) -> None:
    """Every recipe this run will build, checked with --backend before any model is loaded or calibrated."""
    from ptq_protein.recipes.config import Backend
    from ptq_protein.recipes.presets import get_preset

    if budget is not None:
        if args.compare is not None and args.compare.strip().lower() != "none":
            raise ValueError("--compare does not apply with --auto (the search compares its own plans): drop it")
        return
    asked = compare_names(args, is_demo=False) if args.compare is not None else []  # demo defaults: skipped if absent
    names = [recipe, *(n.strip() for n in asked if n.strip())]
    for name in dict.fromkeys(names):
        which = "--preset" if name == recipe else "--compare"
        try:
            cfg = get_preset(name)
        except ValueError as err:
            raise ValueError(f"{which}: {err}") from err
        try:
            cfg.replace(backend=Backend(args.backend))
        except ValueError as err:
            raise ValueError(f"{which} {name} cannot run with --backend {args.backend}: {err}") from err


def _check_sites(model, recipe: str, compare) -> None:
    """Every recipe of this run selects sites of the loaded model: refused now, not after minutes of calibration."""
    from ptq_protein.models.adapters import get_adapter
    from ptq_protein.passes.recipe import resolve_recipe
    from ptq_protein.recipes.presets import get_preset

    adapter = get_adapter(model)
    for name in [recipe, *compare]:
        cfg = get_preset(name)
        try:
            resolve_recipe(cfg).choose(model, adapter, cfg)
        except ValueError as err:
            raise ValueError(f"{'--preset' if name == recipe else '--compare'} {name}: {err}") from err


def _smoothquant_alpha(args: argparse.Namespace, recipe: str, decided: bool = True):
    """``--smoothquant-alpha`` checked before any model is loaded: None, a float, or "auto". ``decided``: ``recipe``
    is the one that will run (not --bits' guess for a file whose family the load tells); else only the value."""
    from ptq_protein.recipes.presets import get_preset

    text = args.smoothquant_alpha
    if text is None:
        return None
    if recipe == "auto" or (decided and get_preset(recipe).smoothquant is None):
        raise ValueError(f"--smoothquant-alpha applies to SmoothQuant presets (e.g. --preset w8a8-smoothquant), "
                         f"not {recipe!r}: drop it or pick such a preset")
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"--smoothquant-alpha {text!r} must be a number in [0, 1] or 'auto'")
    return value


def _tuned_recipe(args: argparse.Namespace, loaded, recipe: str, alpha, crop):
    """(the recipe to quantize with, ``{"chosen", "scored_on", "trials"}`` of the alpha search or None)."""
    import dataclasses

    from ptq_protein.recipes.presets import get_preset

    if alpha is None:
        return recipe, None
    cfg = get_preset(recipe)
    if alpha != "auto":
        return cfg.replace(smoothquant=dataclasses.replace(cfg.smoothquant, alpha=alpha)), None
    from ptq_protein.search.smoothquant_alpha import search_smoothquant_alpha
    from ptq_protein.workflows.recipe_compare import choose_fidelity_sequences

    chosen = choose_fidelity_sequences(args.calib, max(args.check, 1), crop)
    tuned, trials = search_smoothquant_alpha(loaded.model, cfg, loaded.validate(list(chosen.sequences)),
                                             calibration=args.calib, batch_size=args.batch_size,
                                             num_recycles=args.num_recycles, calib_max_length=crop)
    return tuned, {"chosen": None if tuned.smoothquant is None else tuned.smoothquant.alpha,
                   "scored_on": list(chosen.ids),
                   "trials": [t.to_dict() for t in trials]}


def _save(qmodel, out: Path, args: argparse.Namespace, loaded, comparison: Optional[dict] = None) -> str:
    """Write the artifact (with the fidelity check's row and verdict, if one ran); returns the model's name."""
    import ptq_protein as pp

    info = _model_info(args, loaded)
    row = None if comparison is None else comparison["rows"][0]
    fidelity = None if row is None else {"sequences": comparison["sequences"]["ids"], **row}
    pp.save(qmodel, out, force=args.force, model_info=info, fidelity=fidelity)
    return info["name"]


def _report(summary: dict, args: argparse.Namespace, demo: bool) -> int:
    """Print the summary; exit 3 when the check is far outside its recipe's bound (the artifact says so too)."""
    import sys

    from ptq_protein.workflows.fidelity_bound import verdict_line

    if args.json:
        print_json(summary)
    else:
        print_summary(summary, demo)
    found = summary.get("fidelity_verdict")
    if found and not found["within"]:
        print(f"ptq-protein quantize: warning: {verdict_line(summary['recipe'], found)}; {summary['artifact']} "
              "is marked so (embed, score, fold and pp.load say it) and this exits with code 3", file=sys.stderr)
        return EXIT_FIDELITY
    return 0


def _is_demo(loaded) -> bool:
    """The embedded tiny models (random weights, no checkpoint): the source says so."""
    return str(loaded.source).startswith("tiny:")


def _fidelity_references(args: argparse.Namespace, loaded, crop):
    """The check's sequences and their FP outputs (kept for every recipe compared), or None with --check 0."""
    from ptq_protein.eval.bench.fidelity import reference_outputs
    from ptq_protein.models.mapped import mapped_file_of, release_after_forward
    from ptq_protein.workflows.recipe_compare import choose_fidelity_sequences

    if args.check <= 0:
        return None
    chosen = choose_fidelity_sequences(args.calib, args.check, crop)
    with release_after_forward(loaded.model, mapped_file_of(loaded.model)):
        refs = reference_outputs(loaded.model, loaded.validate(list(chosen.sequences)), progress=show_progress(args))
    return chosen, refs


def _fidelity(qmodel, check, progress: bool = False) -> dict:
    """The main recipe's row of the fidelity table."""
    from ptq_protein.workflows.recipe_compare import recipe_row

    chosen, refs = check
    row = recipe_row(qmodel.ptq_state.config, qmodel, refs, progress)
    return {"sequences": chosen.to_dict(), "rows": [row.to_dict()], "references": refs, "main_metrics": row.metrics}


def _compare_rows(args: argparse.Namespace, loaded, compare, passes, refs) -> list:
    from ptq_protein.workflows.recipe_compare import compare_recipes

    rows = compare_recipes(loaded.model, compare, passes, refs, backend=args.backend, calibration=args.calib,
                           batch_size=args.batch_size, num_recycles=args.num_recycles,
                           calib_max_length=calib_crop(args, loaded.device))
    return [row.to_dict() for row in rows]


def _model_info(args: argparse.Namespace, loaded) -> dict:
    if loaded is not None:
        return {"name": loaded.name, "family": loaded.family, "source": str(loaded.source),
                "source_sha256": loaded.source_sha256}
    from ptq_protein.models.loading import locate_weights
    from ptq_protein.models.resolve import weights_sha256

    path = locate_weights(args.model, args.weights).resolve()
    name = path.stem if Path(args.model).exists() else args.model
    return {"name": name, "family": "fair-esm", "source": str(path), "source_sha256": weights_sha256(path)}


def _family_hint(args: argparse.Namespace) -> Optional[str]:
    """The model's family where it is known before loading (names, HF folders), so that --bits' recipe and the
    default --out are the ones used, and checked before the load; None: decided after it (:func:`_family_default`)."""
    from ptq_protein.models.loading import family_before_loading

    return family_before_loading(args.model, args.weights)


def _family_default(args: argparse.Namespace, loaded, recipe: str, budget, out: Path):
    """(recipe, out): --bits' recipe for the loaded model's family (ESMFold's 8-bit default differs), where the
    family was not known before loading (:func:`_family_hint`); the default --out follows the recipe used."""
    from ptq_protein.artifact.save_load import check_artifact_out
    from ptq_protein.models.adapters import get_adapter
    from ptq_protein.recipes.presets import preset_for_bits

    if args.preset is not None or budget is not None:
        return recipe, out
    chosen = preset_for_bits(args.bits if args.bits is not None else 8, get_adapter(loaded.model).family)
    if chosen != recipe:
        _check_recipes(args, chosen, budget)
        out = out if args.out is not None else Path(f"runs/{Path(args.model).name}-{chosen}")
        check_artifact_out(out, force=args.force)
    return chosen, out
