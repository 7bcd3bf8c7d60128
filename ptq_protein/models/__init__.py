"""Models: tiny seeded stand-ins, offline loading of fair-esm / Hugging Face checkpoints, ESMFold conversion.

Importing this package imports torch but not transformers or fair-esm; those
load on first use.
"""

from ptq_protein.models.loading import LoadedModel, ModelFamily, load_model
from ptq_protein.models.outliers import OutlierSpec, channel_asymmetry, channel_kurtosis
from ptq_protein.models.tiny import (
                                     DEMO_OUTLIERS,
                                     TINY_MODELS,
                                     build_tiny,
                                     tiny_esm2,
                                     tiny_esmfold,
                                     tiny_esmfold_config,
                                     tiny_hf_esm2,
)

__all__ = [
    "LoadedModel",
    "ModelFamily",
    "load_model",
    "OutlierSpec",
    "channel_asymmetry",
    "channel_kurtosis",
    "DEMO_OUTLIERS",
    "TINY_MODELS",
    "build_tiny",
    "tiny_esm2",
    "tiny_hf_esm2",
    "tiny_esmfold",
    "tiny_esmfold_config",
]
