"""Write ``esmfold_cfg_omegaconf.pt``: a fair-esm ESMFold-style ``cfg`` pickled by real omegaconf, no tensors.

fair-esm's ESMFold files store ``{"model": state_dict, "cfg": DictConfig}`` where
``cfg["model"]`` is its ``ESMFoldConfig`` (esm/esmfold/v1/esmfold.py, trunk.py).
This file holds such a cfg, built with ``OmegaConf.structured`` from dataclasses
with fair-esm's field names and the sizes of a tiny structure-module-only model
(``trunk.num_blocks = 0``, stem ``esm2_8M``), so tests can check that
:func:`ptq_protein.models.checkpoints.plain_config` reads omegaconf's pickled layout
without omegaconf installed. Run once with omegaconf installed (2.4.0 was used):

    python tests/models/data/make_esmfold_cfg.py
"""

import typing as T
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import OmegaConf


@dataclass
class StructureModuleConfig:
    c_s: int = 64
    c_z: int = 32
    c_ipa: int = 16
    c_resnet: int = 128
    no_heads_ipa: int = 4
    no_qk_points: int = 4
    no_v_points: int = 8
    dropout_rate: float = 0.1
    no_blocks: int = 2
    no_transition_layers: int = 1
    no_resnet_blocks: int = 2
    no_angles: int = 7
    trans_scale_factor: int = 10
    epsilon: float = 1e-8
    inf: float = 1e5


@dataclass
class FoldingTrunkConfig:
    _name: str = "FoldingTrunkConfig"
    num_blocks: int = 0
    sequence_state_dim: int = 64
    pairwise_state_dim: int = 32
    sequence_head_width: int = 16
    pairwise_head_width: int = 16
    position_bins: int = 32
    dropout: float = 0
    layer_drop: float = 0
    cpu_grad_checkpoint: bool = False
    max_recycles: int = 2
    chunk_size: T.Optional[int] = None
    structure_module: StructureModuleConfig = field(default_factory=StructureModuleConfig)


@dataclass
class ESMFoldConfig:
    esm_type: str = "esm2_8M"
    fp16_esm: bool = True
    use_esm_attn_map: bool = False
    esm_ablate_pairwise: bool = False
    esm_ablate_sequence: bool = False
    esm_input_dropout: float = 0
    trunk: FoldingTrunkConfig = field(default_factory=FoldingTrunkConfig)
    embed_aa: bool = True
    bypass_lm: bool = False
    lddt_head_hid_dim: int = 128


if __name__ == "__main__":
    cfg = OmegaConf.create({"model": OmegaConf.structured(ESMFoldConfig),
                            "optimization": {"lr": [0.0001], "max_update": 500000}})
    torch.save({"cfg": cfg}, Path(__file__).with_name("esmfold_cfg_omegaconf.pt"))
