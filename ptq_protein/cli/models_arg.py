"""Model loading for CLI commands: a model name/path, or an artifact folder."""

from __future__ import annotations

import argparse
from pathlib import Path

MODEL_HELP = ("model name (tiny-esm2, tiny-esm2-hf, tiny-esmfold, esm2_t33_650M_UR50D, esmfold, "
              "facebook/esm2_t6_8M_UR50D, "
              "...), a checkpoint path, or a Hugging Face folder; weights are read from local files only")

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", metavar="PATH", help="checkpoint file or folder to use instead of the caches")


def load_float_model(args: argparse.Namespace, name: str, mmap: bool = False, device: "str | None" = None):
    """LoadedModel for ``name`` on the requested device/dtype (``mmap``: see ``load_model``).

    ``device`` overrides ``--device`` (an evaluation rank's ``cuda:LOCAL_RANK``).
    """
    import torch

    from ptq_protein.cli.common import resolve_device
    from ptq_protein.models.loading import load_model

    seed = getattr(args, "seed", None)
    torch.manual_seed(0 if seed is None else seed)
    tiny = str(name).startswith("tiny-")  # --seed chooses a tiny model's weights (tiny-esm2@N names one too)
    return load_model(name, weights=getattr(args, "weights", None), device=device or resolve_device(args.device),
                      dtype=getattr(torch, _DTYPES[args.dtype or "float32"]), seed=seed if tiny else None, mmap=mmap)


def is_artifact(path: str) -> bool:
    return (Path(path) / "recipe.json").exists()
