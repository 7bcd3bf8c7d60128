"""``quantize --low-memory`` (or chosen when only it fits): whether this run streams, and the streamed run
with the same fidelity check as the default mode (the float outputs of the check's sequences streamed too)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from ptq_protein.cli.common import CPU_CALIB_MAX_LENGTH, calib_crop

__all__ = ["memory_mode", "quantize_low_memory", "STREAMED_DEFAULT"]

# --bits 8's recipe where the model is streamed: ESM-2's own default (SmoothQuant, then GPTQ) changes the whole
# model before calibrating it, which a layer-by-layer run cannot do.
STREAMED_DEFAULT = "w8a8-pwlq"


def quantize_low_memory(args: argparse.Namespace, recipe: str):
    """(the quantized model, (the check's sequences, their float outputs) or None with ``--check 0``)."""
    from ptq_protein.models.loading import locate_weights
    from ptq_protein.workflows.recipe_compare import choose_fidelity_sequences
    from ptq_protein.workflows.streaming import quantize_streaming_checked

    path = locate_weights(args.model, args.weights)  # stream_refusal checked it is a fair-esm file on the CPU
    crop = calib_crop(args, "cpu")
    chosen = choose_fidelity_sequences(args.calib, args.check, crop) if args.check > 0 else None
    qmodel, refs = quantize_streaming_checked(path, recipe, args.calib, chosen.sequences if chosen else (),
                                              batch_size=args.batch_size, calib_max_length=crop)
    return qmodel, (None if chosen is None else (chosen, refs))


def memory_mode(args: argparse.Namespace, budget, recipe: str, family: Optional[str]) -> Optional[str]:
    """The recipe to stream layer by layer with (``--low-memory``, or needed to fit); None: the default mode.

    ``recipe``: the default mode's, for the model's ``family`` where known before loading (a ``.pt`` file's is).

    A default recipe (no ``--preset``) that changes the model before calibrating it streams
    :data:`STREAMED_DEFAULT` instead, said in one line. Refuses, before loading, a run that cannot fit, and
    ``--low-memory`` with a recipe that cannot stream.
    """
    from ptq_protein.api import resolve_calibration
    from ptq_protein.models.adapters import ModelAdapter
    from ptq_protein.models.loading import locate_weights
    from ptq_protein.recipes.presets import get_preset
    from ptq_protein.workflows.memory_budget import choose_low_memory

    path = locate_weights(args.model, args.weights)
    refusal = stream_refusal(args, budget, path, family)
    streamed = recipe
    own = None if refusal is not None else _recipe_refusal(recipe)
    if own is not None:
        if args.preset is None and getattr(args, "smoothquant_alpha", None) is None:
            streamed = STREAMED_DEFAULT
        else:
            refusal = own
    if args.low_memory and refusal is not None:
        raise ValueError(f"--low-memory does not apply here: {refusal}; drop --low-memory")
    crop = args.calib_max_length if args.calib_max_length is not None else CPU_CALIB_MAX_LENGTH
    longest = max((len(s) for s in resolve_calibration(args.calib)[1]), default=0)
    # Without --batch-size, the base default (the language models') bounds every family's.
    tokens = (args.batch_size or ModelAdapter.calibration_batch) * ((min(longest, crop) if crop else longest) + 2)
    gptq = budget is None and get_preset(recipe).gptq is not None  # the default mode's recipe
    if not choose_low_memory(path, asked=args.low_memory, calibration_tokens=tokens, stream_refusal=refusal,
                             gptq=gptq):
        return None
    if streamed != recipe:
        print(f"streaming layer by layer: {streamed} (the default {recipe} changes the whole model before "
              "calibrating it: SmoothQuant, GPTQ); --preset picks another", file=sys.stderr)
    return streamed


def _recipe_refusal(recipe: str) -> Optional[str]:
    """Why ``recipe`` cannot run layer by layer (None: it can)."""
    from ptq_protein.passes.plan import plan_calibration
    from ptq_protein.passes.recipe import resolve_recipe
    from ptq_protein.recipes.presets import get_preset

    cfg = get_preset(recipe)
    steps = resolve_recipe(cfg)
    why = steps.not_streamed(plan_calibration(cfg, steps.passes, ()))
    return None if why is None else f"recipe {recipe} cannot stream ({why})"


def stream_refusal(args: argparse.Namespace, budget, path: Optional[Path], family: Optional[str]) -> Optional[str]:
    """Why this run cannot stream layer by layer (None: it can); ``path`` is the weights located for it, ``family``
    what they hold where known before loading."""
    from ptq_protein.cli.common import resolve_device

    if budget is not None:
        return "--auto searches recipes on the float model whole"
    if (path is None or not path.is_file() or resolve_device(args.device) != "cpu"
            or (args.dtype or "float32") != "float32"):
        return ("streaming reads fair-esm ESM-2 .pt files on the CPU in float32 (not tiny models, Hugging Face "
                "folders, other devices or dtypes)")
    if family not in (None, "fair-esm"):  # None: a legacy (not zip) file, read whole; its load tells what it is
        held = {"hf-esmfold": "an ESMFold", "esmc": "an ESM C model"}.get(family, "no ESM-2 this toolkit reads")
        return f"streaming reads fair-esm ESM-2 .pt files, and {path.name} holds {held}"
    if args.backend != "fake":
        return "streaming writes backend 'fake' artifacts (drop --backend)"
    if args.compare is not None and args.compare.strip().lower() != "none":
        return "--compare needs the float model whole"
    return None
