"""transformers' config entry for artifacts of ptq-protein's own model classes (ESM C): reading it is the refusal.

``from_pretrained`` reads ``config.json`` through ``AutoConfig`` before it loads any model code, so this entry is
registered as soon as transformers' ``configuration_auto`` exists (:mod:`ptq_protein.interop.hf_hook`), not with the
quantizer (which waits for ``modeling_utils``): otherwise ``AutoModel.from_pretrained(artifact)`` in a fresh process
gave transformers' generic "does not recognize this architecture" instead of the one line saying why.
It imports only what ``configuration_auto`` has imported already.
"""

from __future__ import annotations

from typing import Any, Optional

from transformers.configuration_utils import PretrainedConfig
from transformers.models.auto.configuration_auto import AutoConfig

from ptq_protein.artifact.hf_files import NO_CLASS_MODEL_TYPE, no_class_message

__all__ = ["NoTransformersClassConfig", "register_no_class_config"]


class NoTransformersClassConfig(PretrainedConfig):
    """``config.json`` of an artifact of ptq-protein's own model class (ESM C): reading it is the refusal."""

    model_type = NO_CLASS_MODEL_TYPE

    def __init__(self, architectures: Optional[list] = None, **kwargs: Any):
        raise ValueError(no_class_message((architectures or ["model"])[0]))


def register_no_class_config() -> None:
    """Register the entry with ``AutoConfig`` (idempotent)."""
    try:
        AutoConfig.register(NO_CLASS_MODEL_TYPE, NoTransformersClassConfig)
    except ValueError:  # registered already
        pass
