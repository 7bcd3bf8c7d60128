"""fair-esm ESMFold checkpoints (``esmfold_3B_v1.pt``) -> transformers ``EsmForProteinFolding``.

fair-esm's own ``ESMFold`` needs openfold (not installable here), so it is never
imported; only its state-dict *names* are used. Learned from transformers'
``convert_esm.py`` and fair-esm's ``esm/esmfold/v1``:

* ``esm.*`` -- the ESM-2 stem -- is renamed by the ESM-2 table in
  :mod:`ptq_protein.models.esm_keymap`; the stem's fair-esm LM head
  (``esm.lm_head.*``) has no transformers counterpart in ESMFold and is dropped.
* every other name is identical in both libraries (transformers re-implements
  ``trunk``, ``esm_s_mlp``, ``esm_s_combine``, ``embedding``, ``distogram_head``,
  ``ptm_head``, ``lm_head``, ``lddt_head`` and ``af2_to_esm`` with the openfold
  attribute names; ``convert_esm.py`` copies them with a strict
  ``load_state_dict``).

fair-esm's ``esmfold_3B_v1.pt`` may omit the stem (fair-esm then loads
``esm2_t36_3B_UR50D`` separately); :func:`load_fair_esmfold` then reads the
stem from ``esm2_t36_3B_UR50D.pt`` beside it (or ``stem_path``).

Config: the checkpoint's own ``cfg`` (an omegaconf object, read inertly as a
plain dict: :func:`~ptq_protein.models.checkpoints.plain_config`) describes the
trunk and names the stem; :mod:`ptq_protein.models.esmfold_cfg` turns it into
an ``EsmConfig``, so v1 and differently sized files (the structure-module-only
ablations, ...) load alike. ``config=`` overrides it; a file without a readable
cfg is built as :func:`esmfold_v1_config` (the published v1 architecture).
Every key must then line up: missing, unexpected or mis-shaped tensors are
reported by name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import torch

from ptq_protein.models.checkpoints import load_torch_checkpoint, plain_config, split_state
from ptq_protein.models.esm_keymap import KeyMapping, fair_esm2_to_hf, hf_to_fair_esm2, uses_per_layer_rotary
from ptq_protein.models.esmfold_cfg import config_from_fair_cfg, stem_file_name
from ptq_protein.models.resolve import ESMFOLD_FAIR_STEM, missing_weights, torch_checkpoints_dir
from ptq_protein.models.tokens import esm_vocab
from ptq_protein.support.errors import InputError

__all__ = ["esmfold_v1_config", "fair_esmfold_to_hf", "hf_esmfold_to_fair", "load_fair_esmfold"]

logger = logging.getLogger(__name__)

_STEM = "esm."
_CONTACT_HEAD = "esm.contact_head."
_FAIR_PREFIXES = re.compile(r"^(encoder\.sentence_encoder\.|encoder\.)")  # fair-esm's ESM-2 upgrade_state_dict
_SHOW = 8
# ESM-2 3B (esm2_t36_3B_UR50D), the stem of ESMFold v1 (fair-esm esm/pretrained.py, Lin et al. 2023).
_ESM2_3B = dict(num_hidden_layers=36, hidden_size=2560, num_attention_heads=40)


def esmfold_v1_config(fp16_esm: bool = False):
    """``EsmConfig`` of ESMFold v1 (transformers' ``EsmFoldConfig`` defaults are the v1 trunk)."""
    from transformers import EsmConfig

    from ptq_protein.models.tiny import hf_esm2_config

    base = hf_esm2_config(num_layers=_ESM2_3B["num_hidden_layers"], embed_dim=_ESM2_3B["hidden_size"],
                          heads=_ESM2_3B["num_attention_heads"], token_dropout=True)
    return EsmConfig(**{**base.to_dict(), "is_folding_model": True, "vocab_list": list(esm_vocab()),
                        "esmfold_config": dict(fp16_esm=fp16_esm)})


def fair_esmfold_to_hf(state_dict: Dict[str, torch.Tensor], *, rotary_per_layer: bool = False) -> KeyMapping:
    """Rename a fair-esm ESMFold state dict to transformers names (see the module docstring)."""
    stem = {k[len(_STEM):]: v for k, v in state_dict.items() if k.startswith(_STEM)}
    mapped = fair_esm2_to_hf(stem, enc_prefix=_STEM, head_prefix=None, rotary_per_layer=rotary_per_layer)
    out = dict(mapped.state_dict)
    out.update({k: v for k, v in state_dict.items() if not k.startswith(_STEM)})
    return KeyMapping(out, tuple(_STEM + k for k in mapped.dropped), tuple(_STEM + k for k in mapped.unknown))


def hf_esmfold_to_fair(state_dict: Dict[str, torch.Tensor]) -> KeyMapping:
    """Rename transformers ESMFold names to fair-esm names (inverse of :func:`fair_esmfold_to_hf`)."""
    stem = {k: v for k, v in state_dict.items() if k.startswith(_STEM)}
    mapped = hf_to_fair_esm2(stem, enc_prefix=_STEM, head_prefix=None)
    out = {_STEM + k: v for k, v in mapped.state_dict.items()}
    out.update({k: v for k, v in state_dict.items() if not k.startswith(_STEM)})
    return KeyMapping(out, mapped.dropped, mapped.unknown)


def load_fair_esmfold(path: Union[str, os.PathLike], *, config=None,
                      stem_path: Optional[Union[str, os.PathLike]] = None,
                      allow_pickle: bool = False, mmap: bool = False,
                      data: Optional[Dict[str, object]] = None) -> Tuple[torch.nn.Module, Dict[str, object]]:
    """Build ``EsmForProteinFolding`` from a fair-esm ESMFold checkpoint file.

    Parameters
    ----------
    path
        ``esmfold_3B_v1.pt``-style file: ``{"model": state_dict, "cfg": ...}``.
    config
        ``EsmConfig`` to build; default: the one the file's own ``cfg`` describes
        (:mod:`ptq_protein.models.esmfold_cfg`), or :func:`esmfold_v1_config` for a file
        without a readable cfg. ``fp16_esm`` is kept as given.
    stem_path
        fair-esm ESM-2 checkpoint for the stem when ``path`` has no ``esm.*`` keys
        (default ``<torch hub>/checkpoints/<file>.pt`` for the cfg's ``esm_type``, e.g.
        ``esm2_t36_3B_UR50D.pt`` for v1).
    allow_pickle
        Fully unpickle the files (only for files you trust).
    mmap
        Memory-map ``path`` (see :mod:`ptq_protein.models.mapped`); the tensors
        become the model's parameters either way (``assign=True``, no copy).
    data
        ``path``'s content when the caller has already read it (with the same ``allow_pickle`` and ``mmap``):
        the file is then not read again.

    Returns
    -------
    (model in eval mode, info dict with ``stem_source`` and ``dropped_keys``)
    """
    from transformers import EsmForProteinFolding

    path = Path(path)
    if data is None:
        data = load_torch_checkpoint(path, allow_pickle=allow_pickle, mmap=mmap)
    state, rest = split_state(data, path)
    del data  # the state's tensors stay referenced; the rest of the file's objects need not
    cfg = file_cfg(rest)
    info: Dict[str, object] = {"stem_source": str(path)}
    if not any(k.startswith(_STEM) for k in state):
        stem_file = (Path(stem_path) if stem_path else
                     torch_checkpoints_dir() / f"{stem_file_name(cfg, ESMFOLD_FAIR_STEM)}.pt")
        state = {**state, **_read_fair_stem(stem_file, path, allow_pickle)}
        info["stem_source"] = str(stem_file)
    if config is None:
        config = config_from_fair_cfg(cfg, state, str(path)) if cfg is not None else esmfold_v1_config()
        info["config_source"] = "file cfg" if cfg is not None else "ESMFold v1 (the file has no readable cfg)"
    with _skip_init():
        model = EsmForProteinFolding(config)
    mapped = fair_esmfold_to_hf(state, rotary_per_layer=uses_per_layer_rotary(model))
    if mapped.unknown:
        raise InputError(f"{path}: {len(mapped.unknown)} ESM-2 stem keys have no transformers name "
                         f"(e.g. {list(mapped.unknown)[:_SHOW]}); is this an ESMFold v1 checkpoint?")
    load_checked(model, _fill_contact_head(model, mapped.state_dict, path), where=str(path), assign=True)
    if mmap:
        from ptq_protein.models.mapped import attach_mapping

        attach_mapping(model, state.values())
    info["dropped_keys"] = list(mapped.dropped)
    if mapped.dropped:
        logger.info("%s: dropped %d keys ESMFold does not use (%s ...)", path, len(mapped.dropped), mapped.dropped[0])
    return model.eval(), info


def file_cfg(rest: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """``cfg["model"]`` of a fair-esm ESMFold file as a plain dict, or None when absent or not a mapping."""
    cfg = plain_config(rest.get("cfg"))
    model = cfg.get("model") if isinstance(cfg, dict) else None
    return model if isinstance(model, dict) and model else None


def load_checked(model: torch.nn.Module, state_dict: Dict[str, torch.Tensor], *, where: str,
                 assign: bool = False, fix: str = "with this config: pass the matching config= or the right "
                                                   "checkpoint") -> None:
    """``load_state_dict`` that names missing, unexpected, mis-shaped and integer-typed float keys in one
    :class:`InputError` (torch's own text for an int64 weight says the shapes match).

    ``assign=True`` makes the given tensors the parameters (no copy): the model's
    own storage (empty, or on the meta device) is dropped, so the weights exist once.
    """
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    shapes = sorted(f"{k} {tuple(state_dict[k].shape)} vs {tuple(expected[k].shape)}"
                    for k in set(expected) & set(state_dict) if state_dict[k].shape != expected[k].shape)
    dtypes = sorted(f"{k} {str(state_dict[k].dtype).replace('torch.', '')}" for k in set(expected) & set(state_dict)
                    if expected[k].is_floating_point() and not state_dict[k].is_floating_point())
    problems = [f"{label} ({len(keys)}): {keys[:_SHOW]}" for label, keys in
                (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes),
                 ("integer where a float weight belongs", dtypes)) if keys]
    if problems:
        raise InputError(f"{where}: weights do not match {type(model).__name__}: " + "; ".join(problems)
                         + f" ({fix})")
    model.load_state_dict(state_dict, strict=True, assign=assign)


def _read_fair_stem(stem_file: Path, fold_file: Path, allow_pickle: bool) -> Dict[str, torch.Tensor]:
    """A fair-esm ESM-2 checkpoint (+ its contact regression, if beside it) as ``esm.*`` ESMFold keys."""
    if not stem_file.is_file():
        raise missing_weights(f"ESM-2 stem of {fold_file.name}", [stem_file.name], [stem_file.parent])
    stem_state, _ = split_state(load_torch_checkpoint(stem_file, allow_pickle=allow_pickle), stem_file)
    regression = stem_file.with_name(f"{stem_file.stem}-contact-regression.pt")
    if regression.is_file():
        stem_state = {**stem_state, **split_state(load_torch_checkpoint(regression), regression)[0]}
    return {_STEM + _FAIR_PREFIXES.sub("", k): v for k, v in stem_state.items()}


def _fill_contact_head(model: torch.nn.Module, state: Dict[str, torch.Tensor], path: Path) -> Dict[str, torch.Tensor]:
    """ESMFold never uses the stem's contact head; zero it (with a note) when the files lack it."""
    absent = [k for k in model.state_dict() if k.startswith(_CONTACT_HEAD) and k not in state]
    if absent:
        logger.info("%s: no ESM-2 contact-regression weights (unused by ESMFold); %s set to zero", path, absent)
    return {**state, **{k: torch.zeros_like(model.state_dict()[k]) for k in absent}}


@contextlib.contextmanager
def _skip_init():
    """Skip random init of a model about to be overwritten (transformers >= 5 ``no_init_weights``); else no-op."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # pragma: no cover - transformers 4.x
        yield
        return
    with no_init_weights():
        yield
