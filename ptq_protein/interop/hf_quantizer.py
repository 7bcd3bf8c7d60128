"""transformers' view of an artifact: the ``ptq_protein`` quantization method, and a save that cannot break it.

``from_pretrained(artifact)`` reads ``config.json`` (written by
:func:`ptq_protein.artifact.save_load.save`), finds ``quant_method: "ptq_protein"`` and
hands the model to :class:`PtqProteinQuantizer`. transformers builds its model
and reads the tensor file as usual (the names do not match, so nothing useful is
loaded, and the load report is silenced); after that the quantizer replaces the
model's contents with :func:`ptq_protein.artifact.save_load.load`'s model: the same
checks and the same modules, hence outputs equal to ``pp.load``'s bit for bit.

``save_pretrained`` / ``push_to_hub`` of a model holding quantized modules write
the artifact (:func:`save_pretrained`) or refuse in one line; transformers' own
writer would store integer codes under names that reload as random weights.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn
from transformers.modeling_utils import PreTrainedModel
from transformers.quantizers import auto as hf_auto
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from ptq_protein.artifact.hf_files import HF_CONFIG, QUANT_METHOD
from ptq_protein.interop.hf_no_class import register_no_class_config
from ptq_protein.models.float_dtypes import main_dtype

__all__ = ["PtqProteinConfig", "PtqProteinQuantizer", "register", "save_pretrained", "push_to_hub", "graft_trunk"]

logger = logging.getLogger(__name__)


class PtqProteinConfig(QuantizationConfigMixin):
    """``quantization_config`` of an artifact: the recipe's name and the artifact format (all else is sealed)."""

    def __init__(self, recipe: Optional[str] = None, format_version: Optional[int] = None, **kwargs: Any):
        self.quant_method = QUANT_METHOD
        self.recipe = recipe
        self.format_version = format_version


class PtqProteinQuantizer(HfQuantizer):
    """Loads an artifact through :func:`ptq_protein.artifact.save_load.load` inside ``from_pretrained``."""

    requires_calibration = True  # only pre-quantized folders: quantizing happens in ptq-protein

    def __init__(self, quantization_config: PtqProteinConfig, **kwargs: Any):
        super().__init__(quantization_config, **kwargs)
        self.folder: Optional[Path] = None
        self.device = "cpu"
        self.dtype: Optional[torch.dtype] = None

    def validate_environment(self, device_map: Any = None, **kwargs: Any) -> None:
        if isinstance(device_map, dict) and set(device_map) == {""}:
            device_map = device_map[""]
        if device_map is not None and not isinstance(device_map, (str, torch.device, int)):
            raise ValueError(f"device_map={device_map!r}: a ptq-protein artifact loads onto one device; pass "
                             "device_map='cpu' or 'cuda'")
        self.device = "cpu" if device_map is None else str(torch.device(device_map))

    def update_dtype(self, dtype: torch.dtype) -> torch.dtype:
        self.dtype = dtype
        return dtype

    def update_attn_implementation(self, config):
        from ptq_protein.artifact.save_load import TENSORS

        config.transformers_weights = TENSORS  # the artifact's tensor file (the config names an install hint)
        return config

    def _process_model_before_weight_loading(self, model: PreTrainedModel, checkpoint_files=None, **kwargs: Any):
        if not checkpoint_files:
            raise ValueError("from_pretrained found no tensor file in the ptq-protein artifact; re-run quantize")
        self.folder = Path(checkpoint_files[0]).parent
        # transformers reads the integer tensors under names its model lacks; the whole model is replaced after
        model._keys_to_ignore_on_load_missing = {".*"}
        model._keys_to_ignore_on_load_unexpected = {".*"}
        if isinstance(getattr(model, "all_tied_weights_keys", None), dict):  # transformers 5
            model.all_tied_weights_keys = {}  # nothing to tie either (a fair-esm artifact has no such names)
        # The trunk is always replaced after loading (become / graft_trunk): marked initialised, transformers does not
        # fill its float weights with random values first (an ESM-2 650M artifact's load: 3.5 -> 1.1 GiB resident).
        # A task head (classifier) is not marked: it stays float and new, initialised as usual.
        for module in model.base_model.modules():
            module._is_hf_initialized = True
        return model

    def _process_model_after_weight_loading(self, model: PreTrainedModel, **kwargs: Any):
        from ptq_protein.artifact.fair_hf import load_as_transformers
        from ptq_protein.artifact.save_load import DTYPES

        loaded = load_as_transformers(self.folder, device=self.device)
        sealed = main_dtype(loaded.ptq_recipe.get(DTYPES))
        written = json.loads((self.folder / HF_CONFIG).read_text()).get("dtype")  # transformers has read it
        if written != sealed:  # config.json is not read for the model, but its dtype would cast it
            raise ValueError(f"{self.folder / HF_CONFIG} field dtype is {written!r} but the sealed recipe's "
                             f"model runs in {sealed!r}: config.json was edited; restore \"dtype\": \"{sealed}\" "
                             "(to run in another dtype, pass dtype= to from_pretrained)")
        become(model, loaded, self.folder)
        model.config.quantization_config = self.quantization_config
        model.hf_quantizer, model.is_quantized, model.quantization_method = self, True, QUANT_METHOD
        if self.dtype is not None and _dtype_name(self.dtype) != sealed:  # dtype= asked for another one
            model.to(self.dtype)
        return model

    def is_serializable(self) -> bool:
        return True  # save_pretrained writes the artifact (see save_pretrained below)

    @property
    def is_trainable(self) -> bool:
        return False


def _dtype_name(dtype: Any) -> Optional[str]:
    """``"float16"`` for ``torch.float16`` or ``"float16"``; None for None."""
    return None if dtype is None else str(dtype).replace("torch.", "")


def become(model: PreTrainedModel, loaded: nn.Module, folder: Path) -> None:
    """Make ``model`` the loaded quantized model (or its base model, e.g. ``EsmModel`` of ``EsmForMaskedLM``),
    or give a task head (``EsmForSequenceClassification``, ...) the quantized trunk (:func:`graft_trunk`)."""
    source = loaded
    if type(loaded) is not type(model):
        source = getattr(loaded, getattr(model, "base_model_prefix", ""), None)
        if type(source) is not type(model):
            if graft_trunk(model, loaded, folder):
                return
            raise ValueError(f"{folder} holds a quantized {type(loaded).__name__}; load it with "
                             f"{type(loaded).__name__}.from_pretrained (or AutoModel), not {type(model).__name__}")
    asked = getattr(model.config, "_attn_implementation", None)  # from_pretrained(attn_implementation=...)
    if asked is not None and hasattr(source.config, "_attn_implementation"):
        source.config._attn_implementation = asked
    model.__dict__.clear()
    model.__dict__.update(source.__dict__)
    if source is not loaded:  # part of the model: keep the special-token context reset the whole model had
        _clear_special_rows_after(model)
        model.ptq_part_of = str(folder)
    model.config.name_or_path = str(folder)


def graft_trunk(model: PreTrainedModel, loaded: nn.Module, folder: Path) -> bool:
    """Put the artifact's quantized ESM trunk into a task-head model (False: ``model`` takes no ESM trunk).

    The head (a classifier, ...) stays float and new, as transformers makes it for fine-tuning; a
    masked LM's head is part of the pretrained model, so ``EsmForMaskedLM`` of a trunk-only artifact is
    refused rather than given a random one.
    """
    from transformers import EsmForMaskedLM, EsmModel

    trunk = loaded if isinstance(loaded, EsmModel) else loaded.esm if isinstance(loaded, EsmForMaskedLM) else None
    if trunk is None or isinstance(model, EsmForMaskedLM) or not isinstance(getattr(model, "esm", None), EsmModel):
        return False
    model.esm = trunk
    _clear_special_rows_after(model)
    model.ptq_part_of = str(folder)  # save_pretrained refuses: the artifact holds the trunk, not this head
    model.to(trunk.embeddings.word_embeddings.weight.device)
    model.config.name_or_path = str(folder)
    head = sorted({name.split(".")[0] for name, _ in model.named_parameters() if not name.startswith("esm.")})
    logger.warning("%s: %s holds the quantized ESM trunk of %s; its head (%s) is float and newly initialised: "
                   "train it before use", folder, type(model).__name__, type(loaded).__name__, ", ".join(head))
    return True


def _clear_special_rows_after(model: nn.Module) -> None:
    """A part's forward ends the BOS/EOS rows its trunk recorded, as the whole model's forward did."""
    from ptq_protein.nn.modules import ActQuantizer

    context = next((m.special_tokens for m in model.modules() if isinstance(m, ActQuantizer)), None)
    if context is not None:
        model.register_forward_hook(context.clear, always_call=True)


def _holds_quantized_modules(model: nn.Module) -> bool:
    from ptq_protein.passes.float_source import quantized_recipe

    return quantized_recipe(model) is not None


def save_pretrained(model: PreTrainedModel, save_directory, is_main_process: bool = True,
                    state_dict: Optional[dict] = None, push_to_hub: bool = False, variant: Optional[str] = None,
                    **kwargs: Any) -> None:
    """``save_pretrained`` of a quantized model: the artifact (``pp.save``), into an empty or artifact folder."""
    from ptq_protein.artifact.save_load import save

    if state_dict is not None or variant is not None:
        raise ValueError("save_pretrained(state_dict=/variant=) would write tensors that are not the quantized "
                         "model; call save_pretrained(folder) alone (it writes a ptq-protein artifact)")
    if getattr(model, "ptq_state", None) is None:
        part = getattr(model, "ptq_part_of", None)
        what = (f"the part of the model loaded from {part}" if part else
                "a part of a quantized model (such as model.esm), or a model given quantized modules by hand")
        raise ValueError(f"this {type(model).__name__} holds quantized modules but is not a whole ptq-protein model: "
                         f"it is {what}. Save the whole model pp.quantize or pp.load returned, or quantize the part "
                         "alone (pp.quantize(model.esm, ...)) and save that")
    if not is_main_process:
        return
    path = Path(save_directory)
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        path.rmdir()  # transformers writes into existing folders; pp.save fills a new one atomically
    save(model, path, force=True, model_info=(getattr(model, "ptq_recipe", None) or {}).get("model"))
    if push_to_hub:
        _upload(path, kwargs.pop("repo_id", path.name), **kwargs)


def push_to_hub(model: PreTrainedModel, repo_id: str, *, commit_message: Optional[str] = None,
                private: Optional[bool] = None, token: Any = None, revision: Optional[str] = None,
                create_pr: bool = False, **kwargs: Any) -> Any:
    """``push_to_hub`` of a quantized model: the artifact folder, card included, uploaded as it is."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "artifact"
        save_pretrained(model, folder)
        return _upload(folder, repo_id, commit_message=commit_message, private=private, token=token,
                       revision=revision, create_pr=create_pr)


def _upload(folder: Path, repo_id: str, commit_message: Optional[str] = None, private: Optional[bool] = None,
            token: Any = None, revision: Optional[str] = None, create_pr: bool = False, **_: Any) -> Any:
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    return api.upload_folder(repo_id=repo, folder_path=str(folder), revision=revision, create_pr=create_pr,
                             commit_message=commit_message or "Upload ptq-protein artifact")


def _guard(name: str, ours):
    """``PreTrainedModel.<name>`` that hands quantized models to ``ours`` and every other model to transformers."""
    original = getattr(PreTrainedModel, name)

    def method(self, *args: Any, **kwargs: Any):
        if _holds_quantized_modules(self):
            return ours(self, *args, **kwargs)
        return original(self, *args, **kwargs)

    method.__wrapped__, method.__name__, method.__doc__ = original, name, original.__doc__
    method.ptq_protein_guard = True
    return method


def register() -> None:
    """Register the method and config with transformers; guard save_pretrained/push_to_hub/half/float (idempotent)."""
    register_no_class_config()
    if QUANT_METHOD not in hf_auto.AUTO_QUANTIZATION_CONFIG_MAPPING:
        hf_auto.register_quantization_config(QUANT_METHOD)(PtqProteinConfig)
    if QUANT_METHOD not in hf_auto.AUTO_QUANTIZER_MAPPING:
        hf_auto.register_quantizer(QUANT_METHOD)(PtqProteinQuantizer)
    # .half()/.float(): transformers refuses them on every quantized model; ours follow the dtype like pp.load's
    for name, ours in (("save_pretrained", save_pretrained), ("push_to_hub", push_to_hub),
                       ("half", nn.Module.half), ("float", nn.Module.float)):
        if not getattr(getattr(PreTrainedModel, name), "ptq_protein_guard", False):
            setattr(PreTrainedModel, name, _guard(name, ours))


register()  # importing this module first (before transformers' models) registers too
