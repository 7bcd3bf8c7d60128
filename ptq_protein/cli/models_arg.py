"""Model loading for CLI commands: a model name/path, or an artifact folder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

MODEL_HELP = ("model name (tiny-esm2, tiny-esm2-hf, tiny-esmfold, tiny-esmc, esm2_t33_650M_UR50D, esmc_600m, "
              "esmfold, facebook/esm2_t6_8M_UR50D, "
              "...), a checkpoint path, or a Hugging Face folder; weights are read from local files only")

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", metavar="PATH", help="checkpoint file or folder to use instead of the caches")


def add_backend_option(parser: argparse.ArgumentParser) -> None:
    """--backend, for commands that run a float model or an artifact (embed, score)."""
    parser.add_argument("--backend", choices=["fake", "int8"],
                        help="artifacts: run the quantized layers simulated (fake) or with integer GEMMs (int8); "
                             "default: the artifact's")


def load_float_model(args: argparse.Namespace, name: str, mmap: bool = False, device: "str | None" = None,
                     check_finite: "bool | None" = None):
    """The float LoadedModel for ``name`` on the requested device/dtype (``mmap``, ``check_finite``: see
    ``load_model``).

    ``device`` overrides ``--device`` (an evaluation rank's ``cuda:LOCAL_RANK``). An artifact folder, or
    weights that load as a quantized model, are refused: every caller quantizes this model or treats it as FP.
    """
    import torch

    from ptq_protein.cli.common import resolve_device
    from ptq_protein.models.loading import load_model
    from ptq_protein.passes.float_source import already_quantized, require_float

    for given in (name, getattr(args, "weights", None)):
        if given is not None and is_artifact(str(given)):
            identity = artifact_identity(str(given))
            raise ValueError(already_quantized(str(given), identity["recipe"], identity["source"]))
    seed = getattr(args, "seed", None)
    torch.manual_seed(0 if seed is None else seed)
    tiny = str(name).startswith("tiny-")  # --seed chooses a tiny model's weights (tiny-esm2@N names one too)
    loaded = load_model(name, weights=getattr(args, "weights", None), device=device or resolve_device(args.device),
                        dtype=getattr(torch, _DTYPES[args.dtype or "float32"]), seed=seed if tiny else None,
                        mmap=mmap, check_finite=check_finite)
    require_float(loaded.model, str(name))
    return loaded


def is_artifact(path: str) -> bool:
    return (Path(path) / "recipe.json").exists()


def check_model_or_artifact(args: argparse.Namespace, command: str) -> bool:
    """True for an artifact folder; refuses options that cannot apply to what ``args.model`` is (before it loads)."""
    backend = getattr(args, "backend", None)  # fold has no --backend
    if is_artifact(args.model):
        given = [o for o, v in (("--weights", args.weights), ("--dtype", args.dtype if command == "fold" else None))
                 if v is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} cannot apply to an artifact ({args.model} carries its own "
                             f"weights and dtypes); drop the option, or {command} with the float model instead")
        return True
    if backend is not None:
        raise ValueError(f"--backend applies to artifacts; {args.model} is a float model (drop --backend, or "
                         "quantize it first)")
    return False


def load_model_or_artifact(args: argparse.Namespace, artifact: bool, device: str,
                           streamed: bool = False) -> Tuple[Any, Dict[str, Any]]:
    """(model, identity): what an output records of it (names and digests, never a local path).

    ``streamed``: the command runs each layer once per pass (``fold``), so an artifact's tensor file is mapped
    on CPU (``pp.load(mapped=True)``) and its layers' pages can be handed back after their forward.
    """
    if artifact:
        import ptq_protein as pp

        model = pp.load(args.model, device=device, backend=getattr(args, "backend", None),
                        mapped=streamed and device == "cpu")
        if args.dtype:  # the parts kept in floating point (attention, LayerNorm, heads); codes and scales unchanged
            import torch

            from ptq_protein.models.mapped import mapped_file_of

            model = model.to(getattr(torch, _DTYPES[args.dtype]))
            handle = mapped_file_of(model)
            if handle is not None:  # the cast read the mapped floats into copies: their pages are not needed now
                handle.release_all()
        return model, artifact_identity(args.model)
    # a .pt file mapped, not read: its pages are the weights (read into memory, the file's peak was twice its size)
    loaded = load_float_model(args, args.model, device=device, mmap=True, check_finite=True)
    from ptq_protein.models.fused_float import use_fast_float_

    use_fast_float_(loaded.model)  # embed and score only read outputs: attention as one SDPA call, one-pass GELU
    return loaded.model, {"name": loaded.name, "sha256": loaded.source_sha256, "recipe": "fp",
                          "source": _shown_source(loaded.source)}


def _shown_source(source: str) -> str:
    """A float model's source as an output records it: a tiny model's seed, a file's name (never a local path)."""
    return source if source.startswith("tiny:") else Path(source).name


def model_hint(args: argparse.Namespace, artifact: bool) -> Dict[str, Any]:
    """What an output folder's identity records of the model that is known before loading it: an artifact's
    digests, a float model's name and source (as the load will record them; no weights are read)."""
    if artifact:
        return artifact_identity(args.model)
    from ptq_protein.models.loading import recorded_source

    seed = args.seed if str(args.model).startswith("tiny-") else None  # as load_float_model passes it
    name, source = recorded_source(args.model, getattr(args, "weights", None), seed)
    return {"name": name, "source": _shown_source(source)}


def run_backend(args: argparse.Namespace, artifact: bool, device: str) -> Optional[str]:
    """The backend an artifact will run here (``--backend``, else the fastest exact one: ``nn.backend_choice``),
    known before it loads, so an output folder records what computed it; None for a float model."""
    if not artifact:
        return None
    if getattr(args, "backend", None):
        return args.backend
    import torch

    from ptq_protein.nn.backend_choice import choose_backend
    from ptq_protein.recipes.config import QuantConfig

    recipe = _recipe(args.model)
    try:
        config = QuantConfig.from_dict(recipe["config"])
    except (KeyError, TypeError, ValueError):
        return "fake"  # pp.load refuses a corrupt recipe in one line; this guess never runs
    return choose_backend(config, torch.device(device))[0].value


def _recipe(folder: str) -> Dict[str, Any]:
    import json

    try:
        recipe = json.loads((Path(folder) / "recipe.json").read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise ValueError(f"{folder}/recipe.json is not readable JSON ({type(err).__name__}); re-run quantize") from err
    if not isinstance(recipe, dict):
        raise ValueError(f"{folder}/recipe.json is not a recipe object; re-run quantize")
    return recipe


def artifact_identity(folder: str) -> Dict[str, Any]:
    """An artifact's digests (its tensors; its tensor file, which holds the sealed recipe), recipe and source
    model, from its recipe.json (verified at load); not its path, so a moved or renamed artifact resumes its
    folder."""
    recipe = _recipe(folder)
    config, source, files = recipe.get("config"), recipe.get("model"), recipe.get("files")
    sealed = files.get("model.safetensors") if isinstance(files, dict) else None
    return {"tensors_sha256": recipe.get("tensors_sha256"),
            # the tensor file's sha256 covers the whole sealed recipe too (scales, bits, default backend)
            "sha256": sealed.get("sha256") if isinstance(sealed, dict) else None,
            "recipe": config.get("name") if isinstance(config, dict) else None,
            "source": source.get("name") if isinstance(source, dict) else None}
