"""The ``EsmConfig`` a fair-esm ESMFold file describes: its own ``cfg`` plus the stem's shapes.

fair-esm's ESMFold files (``esmfold_3B_v1.pt``, the ``esmfold_structure_module_only_*``
ablations, ...) store ``cfg["model"]``: fair-esm's ``ESMFoldConfig`` (esm/esmfold/v1/
esmfold.py, trunk.py) as an omegaconf object, read here as a plain dict by
:func:`~ptq_protein.models.checkpoints.plain_config`. Its fields map onto
transformers' ``EsmFoldConfig`` one to one, except the structure module's
(``c_s`` -> ``sequence_dim``, ``no_blocks`` -> ``num_blocks``, ...: transformers'
``convert_esm.py`` makes the same renames). Fields the file leaves out (or sets
to None) keep transformers' defaults, which are fair-esm's except ``chunk_size``.

The cfg names the ESM-2 stem only by ``esm_type`` (fair-esm loads it from its
hub), so the stem's sizes are read from the stem's own tensors: layers counted,
width from ``embed_tokens``, heads from the rotary ``inv_freq`` (half a head's width).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Dict, Mapping, Optional

import torch

from ptq_protein.models.tokens import esm_vocab
from ptq_protein.support.errors import InputError

__all__ = ["STEM_FILES", "config_from_fair_cfg", "stem_file_name"]

logger = logging.getLogger(__name__)

# transformers' EsmFoldTriangularSelfAttentionBlock: the children that read and write the pair state
PAIR_PARTS = ("tri_mul_out", "tri_mul_in", "tri_att_start", "tri_att_end", "mlp_pair")
FUSED_ATTENTION = "sdpa_attention"  # set on a triangle attention run by torch's fused kernel (nn.triangle_sdpa)

#: fair-esm ``esm_type`` -> the hub file of that ESM-2 (fair-esm esm/esmfold/v1/esmfold.py ``esm_registry``).
STEM_FILES = {
    "esm2_8M": "esm2_t6_8M_UR50D_500K", "esm2_8M_270K": "esm2_t6_8M_UR50D",
    "esm2_35M": "esm2_t12_35M_UR50D_500K", "esm2_35M_270K": "esm2_t12_35M_UR50D",
    "esm2_150M": "esm2_t30_150M_UR50D_500K", "esm2_150M_270K": "esm2_t30_150M_UR50D_270K",
    "esm2_650M": "esm2_t33_650M_UR50D", "esm2_650M_270K": "esm2_t33_650M_270K_UR50D",
    "esm2_3B": "esm2_t36_3B_UR50D", "esm2_3B_270K": "esm2_t36_3B_UR50D_500K",
    "esm2_15B": "esm2_t48_15B_UR50D",
}
# fair-esm StructureModuleConfig -> transformers StructureModuleConfig
_STRUCTURE_NAMES = {"c_s": "sequence_dim", "c_z": "pairwise_dim", "c_ipa": "ipa_dim", "c_resnet": "resnet_dim",
                    "no_heads_ipa": "num_heads_ipa", "no_qk_points": "num_qk_points", "no_v_points": "num_v_points",
                    "dropout_rate": "dropout_rate", "no_blocks": "num_blocks",
                    "no_transition_layers": "num_transition_layers", "no_resnet_blocks": "num_resnet_blocks",
                    "no_angles": "num_angles", "trans_scale_factor": "trans_scale_factor", "epsilon": "epsilon",
                    "inf": "inf"}
_TRUNK_NAMES = ("num_blocks", "sequence_state_dim", "pairwise_state_dim", "sequence_head_width",
                "pairwise_head_width", "position_bins", "dropout", "layer_drop", "cpu_grad_checkpoint",
                "max_recycles", "chunk_size")
_TOP_NAMES = ("esm_type", "use_esm_attn_map", "esm_ablate_pairwise", "esm_ablate_sequence", "esm_input_dropout",
              "embed_aa", "bypass_lm", "lddt_head_hid_dim")
_STEM_LAYER = re.compile(r"^esm\.layers\.(\d+)\.")


def stem_file_name(cfg: Optional[Mapping[str, Any]], default: str) -> str:
    """The ESM-2 hub file (without ``.pt``) that the cfg's ``esm_type`` names, else ``default``."""
    esm_type = (cfg or {}).get("esm_type")
    if esm_type is None:
        return default
    if esm_type not in STEM_FILES:
        raise InputError(f"ESMFold cfg names esm_type {esm_type!r}, which fair-esm does not define "
                         f"({', '.join(STEM_FILES)}); is the file an ESMFold checkpoint?")
    return STEM_FILES[esm_type]


def config_from_fair_cfg(cfg: Mapping[str, Any], state: Mapping[str, torch.Tensor], where: str):
    """transformers ``EsmConfig`` of a fair-esm ESMFold from its ``cfg["model"]`` and fair-name ``state``
    (with ``esm.*``).

    ``fp16_esm`` is left False: :func:`ptq_protein.models.load_model` chooses it for the device.
    """
    from transformers import EsmConfig

    from ptq_protein.models.tiny import hf_esm2_config

    if not isinstance(cfg.get("trunk"), Mapping):
        raise InputError(f"{where}: its cfg has no 'trunk' section ({sorted(cfg)[:8]}); "
                         "is it a fair-esm ESMFold checkpoint?")
    if cfg.get("use_esm_attn_map"):
        raise InputError(f"{where}: use_esm_attn_map=True (ESM attention maps as pair input) is not supported by "
                         "transformers' ESMFold, which this toolkit builds; no published ESMFold uses it")
    trunk = _known(cfg["trunk"], {n: n for n in _TRUNK_NAMES}, where, "trunk")
    trunk["structure_module"] = _known(cfg["trunk"].get("structure_module") or {}, _STRUCTURE_NAMES, where,
                                       "structure_module")
    folding = {**_known(cfg, {n: n for n in _TOP_NAMES}, where, "cfg"), "trunk": trunk, "fp16_esm": False}
    layers, width, heads = _stem_sizes(state, where)
    base = hf_esm2_config(num_layers=layers, embed_dim=width, heads=heads, token_dropout=True)
    return EsmConfig(**{**base.to_dict(), "is_folding_model": True, "vocab_list": list(esm_vocab()),
                        "esmfold_config": folding})


def _known(section: Mapping[str, Any], names: Mapping[str, str], where: str, label: str) -> Dict[str, Any]:
    """``section``'s fields under transformers' names; None (fair-esm: "default") and unknown fields dropped."""
    unknown = sorted(k for k in section if k not in names and k not in ("_name", "structure_module", "trunk",
                                                                          "fp16_esm"))
    if unknown:
        logger.info("%s: %s fields %s have no transformers counterpart; ignored", where, label, unknown)
    return {names[k]: v for k, v in section.items() if k in names and v is not None}


def _stem_sizes(state: Mapping[str, torch.Tensor], where: str):
    """(layers, width, heads) of the ``esm.*`` ESM-2 stem in fair-esm names."""
    indices = {int(m.group(1)) for k in state for m in [_STEM_LAYER.match(k)] if m}
    embed = state.get("esm.embed_tokens.weight")
    inv_freq = state.get("esm.layers.0.self_attn.rot_emb.inv_freq")
    if not indices or embed is None or inv_freq is None:
        raise InputError(f"{where}: the ESM-2 stem (esm.layers.*, esm.embed_tokens, rotary inv_freq) is not in the "
                         "file or beside it, so its size is unknown; put the stem's fair-esm file beside it")
    width, head_dim = int(embed.shape[1]), 2 * int(inv_freq.shape[0])
    if width % head_dim:
        raise InputError(f"{where}: stem width {width} is not a multiple of its head width {head_dim}")
    return max(indices) + 1, width, width // head_dim
