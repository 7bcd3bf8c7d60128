"""Where model weights live on disk, found without any network access.

* fair-esm: ``<torch hub dir>/checkpoints/<name>.pt`` (+ optional
  ``<name>-contact-regression.pt``); the hub dir is ``torch.hub.get_dir()``,
  i.e. ``$TORCH_HOME/hub`` with ``TORCH_HOME`` defaulting to
  ``$XDG_CACHE_HOME/torch`` or ``~/.cache/torch``.
* ESM C: ``<torch hub dir>/checkpoints/esmc_300m_2024_12_v0.pth`` (or ``esmc_600m_...``), else the file where
  EvolutionaryScale's own package downloads it: ``data/weights/<file>`` in the Hugging Face snapshot of
  ``EvolutionaryScale/esmc-300m-2024-12`` (``-600m-``), the revision chosen as below.
* Hugging Face: ``<hub cache>/models--<org>--<name>/snapshots/<revision>/``
  where the hub cache is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``
  (huggingface_hub's rules). The revision is the one ``refs/main`` points to
  (an error when that snapshot is missing or incomplete: another revision is
  never taken silently); without ``refs/main``, the most recently modified
  snapshot that has a ``config.json`` and weights.

Environment variables are read at call time, so tests can point them at temp folders.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

import torch

from ptq_protein.support.digests import file_sha256, listing_sha256
from ptq_protein.support.errors import InputError, MissingWeightsError

__all__ = [
    "FAIR_ESM_MODELS",
    "ESMFOLD_NAMES",
    "ESMFOLD_FAIR_CHECKPOINT",
    "ESMFOLD_FAIR_STEM",
    "ESMFOLD_HF_REPO",
    "ESMC_MODELS",
    "esmc_name",
    "esmc_candidates",
    "locate_esmc",
    "torch_checkpoints_dir",
    "hf_hub_cache_dir",
    "hf_snapshot",
    "hf_repo_folder",
    "is_hf_folder",
    "fair_checkpoint_files",
    "contact_regression_path",
    "weights_sha256",
    "missing_weights",
]

#: fair-esm language models that ``load_model`` resolves by name.
FAIR_ESM_MODELS = (
    "esm2_t6_8M_UR50D", "esm2_t12_35M_UR50D", "esm2_t30_150M_UR50D", "esm2_t33_650M_UR50D",
    "esm2_t36_3B_UR50D", "esm2_t48_15B_UR50D", "esm1b_t33_650M_UR50S",
    "esm1v_t33_650M_UR90S_1", "esm1v_t33_650M_UR90S_2", "esm1v_t33_650M_UR90S_3",
    "esm1v_t33_650M_UR90S_4", "esm1v_t33_650M_UR90S_5",
)
ESMFOLD_NAMES = ("esmfold", "esmfold_v1")
#: fair-esm's ESMFold v1 file, and the ESM-2 whose weights it may leave out (fair-esm loads them separately).
ESMFOLD_FAIR_CHECKPOINT = "esmfold_3B_v1.pt"
ESMFOLD_FAIR_STEM = "esm2_t36_3B_UR50D"
ESMFOLD_HF_REPO = "facebook/esmfold_v1"
#: ESM C models ``load_model`` resolves by name: name -> (official file, Hugging Face repository holding it under
#: ``data/weights/``), as EvolutionaryScale's esm/pretrained.py and esm/utils/constants/esm3.py name them.
ESMC_MODELS = {"esmc_300m": ("esmc_300m_2024_12_v0.pth", "EvolutionaryScale/esmc-300m-2024-12"),
               "esmc_600m": ("esmc_600m_2024_12_v0.pth", "EvolutionaryScale/esmc-600m-2024-12")}
_ESMC_HF_FOLDER = "data/weights"
_HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                    "pytorch_model.bin.index.json")


def torch_checkpoints_dir() -> Path:
    """``torch.hub.get_dir()/checkpoints`` (honours ``TORCH_HOME`` at call time)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def hf_hub_cache_dir() -> Path:
    """The Hugging Face hub cache folder, from the environment as huggingface_hub reads it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):  # older name, still honoured by huggingface_hub
        return Path(os.environ["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "huggingface" / "hub"


def hf_repo_folder(repo_id: str) -> Path:
    """``<hub cache>/models--org--name`` for ``repo_id = "org/name"``."""
    return hf_hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))


def hf_snapshot(repo_id: str) -> Optional[Path]:
    """The cached snapshot folder of ``repo_id`` that holds a config and weights, or None."""
    repo = hf_repo_folder(repo_id)
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    candidates = [p for p in snapshots.iterdir() if is_hf_folder(p)]
    ref = repo / "refs" / "main"
    if ref.is_file():
        revision = ref.read_text(encoding="utf-8").strip()
        pinned = snapshots / revision
        if is_hf_folder(pinned):
            return pinned
        raise _dangling_ref(repo_id, ref, pinned, candidates)
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def _dangling_ref(repo_id: str, ref: Path, pinned: Path, candidates: List[Path]) -> InputError:
    """refs/main names a snapshot that is missing or incomplete: say so rather than use another revision."""
    state = "is missing" if not pinned.exists() else "lacks config.json or a weights file"
    others = (f"; other cached snapshots: {', '.join(p.name for p in candidates)} (pass one with --weights PATH)"
              if candidates else "")
    return InputError(f"Hugging Face cache for {repo_id}: {ref} points to revision {pinned.name!r}, but snapshot "
                      f"{pinned} {state} (an interrupted download?); re-download it "
                      f"(huggingface-cli download {repo_id}) or fix refs/main{others}")


def is_hf_folder(path: Path) -> bool:
    """A transformers model folder: ``config.json`` plus a weights file."""
    return (path / "config.json").is_file() and any((path / name).is_file() for name in _HF_WEIGHT_FILES)


_PROVIDE_ESM = ("Provide them with --weights PATH (a fair-esm .pt file or a Hugging Face model folder), put "
                "fair-esm files in $TORCH_HOME/hub/checkpoints, or set HF_HOME/HF_HUB_CACHE to a cache holding them")
_PROVIDE_ESMC = ("Provide them with --weights PATH (the official .pth file), put it in $TORCH_HOME/hub/checkpoints, "
                 "or set HF_HOME/HF_HUB_CACHE to the cache EvolutionaryScale's package downloaded it to")


def missing_weights(name: str, files: Sequence[str], folders: Iterable[Path]) -> MissingWeightsError:
    """The one-line error for weights that are not on disk: what, where, and how to provide them."""
    searched = ", ".join(str(f) for f in dict.fromkeys(folders))
    provide = _PROVIDE_ESMC if esmc_name(name) is not None else _PROVIDE_ESM
    return MissingWeightsError(f"no local weights for {name!r}: looked for {', '.join(files)} in {searched}; nothing "
                               f"is downloaded. {provide}")


def esmc_name(name: str) -> Optional[str]:
    """The ESM C model ``name`` means (``esmc_300m``, or its repository ``EvolutionaryScale/esmc-300m-2024-12``)."""
    return next((short for short, (_, repo) in ESMC_MODELS.items() if name in (short, repo)), None)


def esmc_candidates(short: str) -> List[Path]:
    """Where ESM C ``short``'s file may lie, in search order (existing or not; see the module docstring)."""
    filename, repo_id = ESMC_MODELS[short]
    found = [torch_checkpoints_dir() / filename]
    snapshots = hf_repo_folder(repo_id) / "snapshots"
    ref = hf_repo_folder(repo_id) / "refs" / "main"
    revisions = ([ref.read_text(encoding="utf-8").strip()] if ref.is_file() else
                 sorted((p.name for p in snapshots.iterdir()), key=lambda n: -(snapshots / n).stat().st_mtime)
                 if snapshots.is_dir() else [])
    return found + [snapshots / revision / _ESMC_HF_FOLDER / filename for revision in revisions or ["*"]]


def locate_esmc(name: str) -> Path:
    """The first of :func:`esmc_candidates` that exists, else the error naming every place searched."""
    candidates = esmc_candidates(esmc_name(name))
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise missing_weights(name, list(dict.fromkeys(p.name for p in candidates)), [p.parent for p in candidates])
    return found.absolute()


def fair_checkpoint_files(name: str) -> List[Path]:
    """[<name>.pt, <name>-contact-regression.pt] in the torch hub checkpoints folder."""
    main = torch_checkpoints_dir() / f"{name}.pt"
    return [main, contact_regression_path(main)]


def contact_regression_path(path: Path) -> Path:
    """``NAME-contact-regression.pt`` beside a fair-esm ``NAME.pt``: the contact head's weights, read with it."""
    return path.with_name(f"{path.stem}-contact-regression.pt")


def weights_sha256(path: Path, file_digest: Optional[str] = None) -> str:
    """The digest of what a fair-esm ESM-2 model reads: the file's sha256 alone, or, with its
    ``-contact-regression.pt`` beside it, the sha256 of "weights SHA" and "contact-regression SHA" lines,
    so that an edit of either changes the model's identity (``file_digest``: the file's, if computed)."""
    digest = file_digest or file_sha256(path)
    regression = contact_regression_path(path)
    if not regression.is_file():
        return digest
    return listing_sha256([("weights", digest), ("contact-regression", file_sha256(regression))])
