"""``load_model``: one offline entry point for tiny, fair-esm and Hugging Face ESM models.

Resolution of ``name_or_path`` (first match wins; nothing is ever downloaded):

1. ``weights=PATH`` given: a folder is a transformers model folder, a file a
   fair-esm ``.pt`` (an ESMFold file when the name is ``esmfold``/``esmfold_v1``
   or the state dict has ``trunk.*`` keys).
2. A tiny registry name, ``tiny-esm2``, ``tiny-esm2-hf``, ``tiny-esmfold``,
   optionally ``@SEED`` (``tiny-esm2@3``) -- see :mod:`ptq_protein.models.tiny`.
3. An existing path: folder -> transformers folder, file -> fair-esm ``.pt``.
4. ``esmfold`` / ``esmfold_v1``: the HF cache ``facebook/esmfold_v1``, else
   fair-esm's ``esmfold_3B_v1.pt`` in the torch hub (see :mod:`.esmfold_convert`).
5. A fair-esm name (``esm2_t33_650M_UR50D``, ...; list in
   :data:`~ptq_protein.models.resolve.FAIR_ESM_MODELS`): ``<torch hub>/checkpoints/<name>.pt``
   (+ ``-contact-regression.pt`` if present), else the HF cache ``facebook/<name>``.
6. An ESM C name (``esmc_300m``, ``esmc_600m``, or their ``EvolutionaryScale/esmc-*`` repositories): the
   official ``.pth`` file in the torch hub or the HF cache (:func:`~ptq_protein.models.resolve.esmc_candidates`).
7. ``org/name``: that repo in the HF cache.

A file holding an ESM C state dict (the official layout) loads as ptq-protein's
:class:`~ptq_protein.models.esmc.ESMC` (:mod:`.esmc_load`), whatever its name.

Otherwise :class:`~ptq_protein.support.errors.MissingWeightsError` lists the files and
folders searched and how to provide them (folders: :mod:`.resolve`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import re
import zipfile
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch

from ptq_protein.data.fasta import ESM2_MAX_RESIDUES, ESM_AMINO_ACIDS, validate_sequence
from ptq_protein.models import resolve
from ptq_protein.models.checkpoints import file_sha256, load_torch_checkpoint, split_state
from ptq_protein.models.declared import check_name_fits
from ptq_protein.models.esmc_load import load_esmc, refuse_partial_esmc
from ptq_protein.models.esmfold_convert import load_fair_esmfold
from ptq_protein.models.fair_esm2 import load_fair_esm2
from ptq_protein.models.families import ModelFamily, file_family
from ptq_protein.models.finite import check_finite_weights
from ptq_protein.models.hf_folder import folder_sha256, own_loader_artifact, read_hf_folder
from ptq_protein.models.mapped import attach_mapping, mapped_file_of
from ptq_protein.models.tiny import TINY_MODELS, build_tiny
from ptq_protein.models.tokens import (
    esmc_vocab,
    esmfold_tokenizer,
    tokenize_esmc,
    tokenize_esmfold,
    tokenize_fair_esm,
    tokenize_hf_esm,
)
from ptq_protein.support.errors import InputError
from ptq_protein.support.process_memory import loading

__all__ = ["ModelFamily", "LoadedModel", "load_model", "locate_weights", "family_before_loading"]

logger = logging.getLogger(__name__)

_TINY_SEED = re.compile(r"(?P<name>[\w-]+)@(?P<seed>\d+)")
# besides the weights, what an HF folder's load reads (EsmTokenizer.from_pretrained reads the last four)


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model plus what is needed to feed it and to record where it came from.

    ``source`` is the absolute path of the file or folder read, or ``"tiny:<name>:seed=<n>"``;
    ``source_sha256`` is the sha256 of the weights file (for a folder: of a
    listing of its config and weight files' hashes; for a fair-esm ESM-2 file
    with its ``-contact-regression.pt``: of both, :func:`~ptq_protein.models.resolve.weights_sha256`), or
    None for tiny models or when hashing was turned off. ``max_length`` is the longest accepted
    sequence (1022 for ESM-2 language models; None for ESMFold).
    """

    model: torch.nn.Module
    alphabet_or_tokenizer: Any
    family: ModelFamily
    name: str
    source: str
    source_sha256: Optional[str] = None
    max_length: Optional[int] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", ModelFamily(self.family))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def validate(self, sequences: Sequence[str]) -> List[str]:
        """Cleaned, upper-case sequences; :class:`InputError` names the bad one and the fix."""
        return [validate_sequence(s, alphabet=ESM_AMINO_ACIDS, max_length=self.max_length,
                                  where=f"{self.name} input sequence {i + 1}") for i, s in enumerate(sequences)]

    def tokenize(self, sequences: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(tokens, mask) on the model's device: mask is True on real tokens, False on padding.

        fair-esm / hf-esm / esmc: shape (B, L_max + 2), ESM ids with BOS/EOS (the three agree);
        hf-esmfold: shape (B, L_max), AF2 residue indices as ``EsmForProteinFolding.forward`` takes them.
        """
        sequences = self.validate(sequences)
        if self.family is ModelFamily.FAIR_ESM:
            tokens, mask = tokenize_fair_esm(self.alphabet_or_tokenizer, sequences)
        elif self.family is ModelFamily.HF_ESM:
            tokens, mask = tokenize_hf_esm(self.alphabet_or_tokenizer, sequences)
        elif self.family is ModelFamily.ESMC:
            tokens, mask = tokenize_esmc(sequences)
        else:
            tokens, mask = tokenize_esmfold(sequences)
        return tokens.to(self.device), mask.to(self.device)


@loading()  # its freed temporaries go back to the system; the heap is trimmed after
def load_model(name_or_path: Union[str, os.PathLike], weights: Optional[Union[str, os.PathLike]] = None,
               device: Union[str, torch.device] = "cpu", dtype: torch.dtype = torch.float32, *,
               seed: Optional[int] = None, config=None, fp16_esm: Optional[bool] = None,
               allow_pickle: bool = False, hash_weights: bool = True, mmap: bool = False,
               check_finite: Optional[bool] = None) -> LoadedModel:
    """Load a model by name or path, offline (resolution order in the module docstring).

    Parameters
    ----------
    name_or_path
        Tiny name (`tiny-esm2[@SEED]`), fair-esm name, `esmfold`, HF repo id, or a path.
    weights
        Explicit checkpoint file or HF folder (overrides every search).
    device, dtype
        Where and in which floating dtype to put the model.
    seed
        Seed of a tiny model (default 0; also settable as `name@SEED`).
    config
        `EsmConfig` for a fair-esm ESMFold file (default: the v1 config).
    fp16_esm
        ESMFold only: keep the ESM-2 stem in float16; default False on CPU, else the config's value.
    allow_pickle
        Fully unpickle `.pt` files (only for files you trust); default: tensors only.
    hash_weights
        Compute `source_sha256` (reads the whole file once).
    mmap
        fair-esm `.pt` files: memory-map the file; the weights are read as used and
        `ptq_protein.quantize` (`inplace=True`) hands each layer's pages back
        once used (see `ptq_protein.models.mapped`). Do not edit such a model's
        weights in place. Default False: the file is read into memory.
    check_finite
        Refuse a file holding a NaN or infinite weight before anything runs (one pass over the weights).
        Default: when the file is read into memory, not when it is mapped (quantize's mapped load reads
        each layer as it calibrates, and refuses non-finite values there).

    Raises
    ------
    MissingWeightsError
        Nothing local matches; the message lists what was searched.
    InputError
        Unknown name, corrupt file, weights that do not fit the architecture, a
        published name (`esm2_t6_8M_UR50D`) on a file of other shapes
        (`ptq_protein.models.declared`), or a dangling HF `refs/main`.
    """
    name = str(name_or_path)
    tiny = _TINY_SEED.fullmatch(name)
    if tiny and tiny.group("name") in TINY_MODELS:
        if seed is not None and seed != int(tiny.group("seed")):
            raise InputError(f"{name!r} names seed {tiny.group('seed')} but seed={seed} was passed; give one")
        name, seed = tiny.group("name"), int(tiny.group("seed"))
    if weights is None and name in TINY_MODELS:
        loaded = _load_tiny(name, 0 if seed is None else seed)
    else:
        loaded = _load_file(name, _locate(name, weights), config, allow_pickle, hash_weights, mmap,
                            not mmap if check_finite is None else check_finite)
    return _place(loaded, device, dtype, fp16_esm)


# --- resolution ----------------------------------------------------------------


def recorded_source(name_or_path: Union[str, os.PathLike], weights: Optional[Union[str, os.PathLike]] = None,
                    seed: Optional[int] = None) -> Tuple[str, str]:
    """(``name``, ``source``) that :func:`load_model` records for these arguments, without reading any weights
    (what an output folder's identity holds, compared before a rerun loads the model)."""
    name = str(name_or_path)
    tiny = _TINY_SEED.fullmatch(name)
    if tiny and tiny.group("name") in TINY_MODELS:
        name, seed = tiny.group("name"), int(tiny.group("seed"))
    if weights is None and name in TINY_MODELS:
        return name, _tiny_source(name, 0 if seed is None else seed)
    path = _locate(name, weights)
    return _label(name, path), str(path)


def _tiny_source(name: str, seed: int) -> str:
    return f"tiny:{name}:seed={seed}"


def _label(name: str, path: Path) -> str:
    return path.stem if Path(name).expanduser().absolute() == path else name


def locate_weights(name_or_path: Union[str, os.PathLike], weights: Optional[Union[str, os.PathLike]] = None
                   ) -> Optional[Path]:
    """The file or folder :func:`load_model` would read, without reading it (None for tiny models)."""
    name = str(name_or_path)
    tiny = _TINY_SEED.fullmatch(name)
    if weights is None and (name in TINY_MODELS or (tiny and tiny.group("name") in TINY_MODELS)):
        return None
    return _locate(name, weights)


def family_before_loading(name_or_path: Union[str, os.PathLike],
                          weights: Optional[Union[str, os.PathLike]] = None) -> Optional[str]:
    """The :class:`ModelFamily` value :func:`load_model` will report, where it is known without reading weights: a
    tiny name, ``esmfold``, fair-esm's ESMFold file, a Hugging Face folder (its config.json), a zip-format ``.pt``
    file (unpickled with its tensors mapped, not read: about half a second for a 5 GB file); None otherwise (a
    file the load will refuse in words). Lets a command pick its recipe, its memory mode and its outputs before
    a long load."""
    name = str(name_or_path)
    tiny = _TINY_SEED.fullmatch(name)
    short = tiny.group("name") if tiny else name
    if weights is None and short in TINY_MODELS:
        return TINY_MODELS[short].family
    if name.split("/", 1)[-1] in resolve.ESMFOLD_NAMES:
        return ModelFamily.HF_ESMFOLD.value
    path = _locate(name, weights)
    if path.name == resolve.ESMFOLD_FAIR_CHECKPOINT:
        return ModelFamily.HF_ESMFOLD.value
    if path.is_dir() and resolve.is_hf_folder(path):
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return None  # the load refuses it in words
        folding = isinstance(config, dict) and bool(config.get("is_folding_model"))
        return (ModelFamily.HF_ESMFOLD if folding else ModelFamily.HF_ESM).value
    if path.is_file() and zipfile.is_zipfile(path):  # a legacy file cannot be mapped: its load tells
        try:
            data = load_torch_checkpoint(path, mmap=True, quiet=True)
        except (InputError, OSError, RuntimeError, ValueError):
            return None  # the load refuses it in words (or reads it with allow_pickle)
        return file_family(data).value
    return None


def _locate(name: str, weights: Optional[Union[str, os.PathLike]]) -> Path:
    """The file or folder to load for ``name`` (see the module docstring)."""
    if weights is not None:
        path = Path(weights).expanduser().absolute()  # absolute: recorded as the artifact's source
        if not path.exists():
            raise resolve.missing_weights(name, [path.name], [path.parent])
        return path
    path = Path(name).expanduser().absolute()
    if path.exists():
        return path
    short = name.split("/", 1)[1] if name.startswith("facebook/") else name
    if short in resolve.ESMFOLD_NAMES:
        return _search(name, [(resolve.ESMFOLD_HF_REPO, None), (None, resolve.ESMFOLD_FAIR_CHECKPOINT)])
    if short in resolve.FAIR_ESM_MODELS:
        order = [(None, f"{short}.pt"), (f"facebook/{short}", None)]
        return _search(name, order[::-1] if name.startswith("facebook/") else order)
    if resolve.esmc_name(name) is not None:
        return resolve.locate_esmc(name)
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        return _search(name, [(name, None)])
    known = list(TINY_MODELS) + list(resolve.ESMFOLD_NAMES) + list(resolve.FAIR_ESM_MODELS) + list(resolve.ESMC_MODELS)
    close = difflib.get_close_matches(short, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise InputError(f"unknown model {name!r}: {hint}not a file or folder, nor one of {', '.join(known)}, "
                     "nor a Hugging Face repo id (org/name); check the spelling or pass --weights PATH")


def _search(name: str, order: Sequence[Tuple[Optional[str], Optional[str]]]) -> Path:
    """Try (HF repo id, None) and (None, torch hub file name) candidates in order."""
    files, folders = [], []
    for repo_id, filename in order:
        if repo_id is not None:
            snapshot = resolve.hf_snapshot(repo_id)
            if snapshot is not None:
                return snapshot.absolute()
            files.append(f"{resolve.hf_repo_folder(repo_id).name}/snapshots/*/config.json")
            folders.append(resolve.hf_hub_cache_dir())
        else:
            candidate = resolve.torch_checkpoints_dir() / filename
            if candidate.is_file():
                return candidate.absolute()
            files.append(filename)
            folders.append(candidate.parent)
    raise resolve.missing_weights(name, files, folders)


# --- loaders -------------------------------------------------------------------


def _load_tiny(name: str, seed: int) -> LoadedModel:
    model, vocab, spec = build_tiny(name, seed=seed)
    max_length = None if spec.family in (ModelFamily.HF_ESMFOLD.value, ModelFamily.ESMC.value) else ESM2_MAX_RESIDUES
    return LoadedModel(model, vocab, spec.family, name, _tiny_source(name, seed), None, max_length)


def _load_file(name: str, path: Path, config, allow_pickle: bool, hash_weights: bool, mmap: bool,
               check_finite: bool) -> LoadedModel:
    loaded = _read_file(name, path, config, allow_pickle, hash_weights, mmap)
    if loaded.family is not ModelFamily.HF_ESMFOLD:
        check_name_fits(name, loaded.model, str(path))  # a published name on a file of other shapes
    if check_finite:
        mapped = mapped_file_of(loaded.model)  # a mapped file's pages are handed back as they are checked
        check_finite_weights(loaded.model, str(path), after=None if mapped is None else mapped.release_one)
    return loaded


def _read_file(name: str, path: Path, config, allow_pickle: bool, hash_weights: bool, mmap: bool) -> LoadedModel:
    label = _label(name, path)
    if path.is_dir():
        hf = resolve.is_hf_folder(path)
        # an artifact transformers' loader does not open as a quantized model (fair-esm: pp.load's own layout;
        # ESM C: its config.json only makes transformers refuse it)
        if (path / "recipe.json").is_file() and (not hf or own_loader_artifact(path)):
            raise InputError(f"{path} is a ptq-protein artifact (recipe.json), not a float model: load it with "
                             "ptq_protein.load, or load its source model")
        if not hf:
            raise InputError(f"{path} is a folder but not a Hugging Face model folder (needs config.json and "
                             "model.safetensors or pytorch_model.bin); point at the snapshot folder")
        model, tokenizer, folding = read_hf_folder(path)
        family = ModelFamily.HF_ESMFOLD if folding else ModelFamily.HF_ESM
        digest = folder_sha256(path) if hash_weights else None
        max_length = None if family is ModelFamily.HF_ESMFOLD else ESM2_MAX_RESIDUES
        return LoadedModel(model, tokenizer, family, label, str(path), digest, max_length)
    digest = file_sha256(path) if hash_weights else None
    if name in resolve.ESMFOLD_NAMES or path.name == resolve.ESMFOLD_FAIR_CHECKPOINT:
        model, _ = load_fair_esmfold(path, config=config, allow_pickle=allow_pickle, mmap=mmap)
        return LoadedModel(model, esmfold_tokenizer(), ModelFamily.HF_ESMFOLD, label, str(path), digest, None)
    data = load_torch_checkpoint(path, allow_pickle=allow_pickle, mmap=mmap)
    family = file_family(data)
    if family is ModelFamily.ESMC:
        model = load_esmc(data, str(path))
        if mmap:
            attach_mapping(model, data.values())
        return LoadedModel(model, esmc_vocab(), ModelFamily.ESMC, label, str(path), digest, None)
    refuse_partial_esmc(data, str(path))
    state, _ = split_state(data, path)
    if family is ModelFamily.HF_ESMFOLD:
        del state
        model, _ = load_fair_esmfold(path, config=config, allow_pickle=allow_pickle, mmap=mmap, data=data)
        return LoadedModel(model, esmfold_tokenizer(), ModelFamily.HF_ESMFOLD, label, str(path), digest, None)
    model, alphabet = _load_fair_esm(label, path, data, allow_pickle)
    if mmap:
        attach_mapping(model, state.values())
    digest = resolve.weights_sha256(path, digest) if hash_weights else None  # + the contact head's file it read
    return LoadedModel(model, alphabet, ModelFamily.FAIR_ESM, label, str(path), digest, ESM2_MAX_RESIDUES)


def _load_fair_esm(name: str, path: Path, data: dict, allow_pickle: bool):
    """fair-esm's own loader on already-read data (+ contact regression file beside it, if any)."""
    import esm

    regression_path = resolve.contact_regression_path(path)
    regression = None
    if regression_path.is_file():
        regression = load_torch_checkpoint(regression_path, allow_pickle=allow_pickle)
    if regression is None:
        logger.info("%s: no %s beside it; contact prediction will be wrong", path, regression_path.name)
    is_esm2 = isinstance(data.get("cfg"), dict) and "model" in data["cfg"]
    if is_esm2:
        return load_fair_esm2(data, regression, path)
    # fair-esm picks its ESM-2 vs ESM-1 code path from the name; make it agree with the file's content.
    core_name = name if name.startswith("esm2") == is_esm2 else ("esm2_local" if is_esm2 else "esm1_local")
    try:
        model, alphabet = esm.pretrained.load_model_and_alphabet_core(core_name, data, regression)
    except RuntimeError as e:
        raise InputError(f"{path}: weights do not fit the architecture its config describes: "
                         f"{' '.join(str(e).split())[:400]}") from e
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise InputError(f"{path}: not a fair-esm checkpoint layout fair-esm can read ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:200]}); check that it is an ESM-2 .pt file") from e
    return model.eval(), alphabet


def _place(loaded: LoadedModel, device, dtype: torch.dtype, fp16_esm: Optional[bool]) -> LoadedModel:
    """Move to device/dtype; for ESMFold optionally keep the stem in float16 (fair-esm's and HF's default on GPU)."""
    if not dtype.is_floating_point:
        raise InputError(f"dtype {dtype} is not a floating-point dtype; use float32, bfloat16 or float16")
    model = loaded.model.to(device=device, dtype=dtype)
    if loaded.family is ModelFamily.HF_ESMFOLD:
        on_cpu = torch.device(device).type == "cpu"
        half = (not on_cpu and bool(model.config.esmfold_config.fp16_esm)) if fp16_esm is None else fp16_esm
        model.config.esmfold_config.fp16_esm = half
        if half:
            model.esm.half()
    return dataclasses.replace(loaded, model=model.eval())
