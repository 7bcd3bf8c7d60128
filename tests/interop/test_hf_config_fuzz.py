"""config.json cannot change an artifact's outputs: every key removed, every value changed to another
valid value of its type, either loads with logits equal to ``pp.load``'s or is refused."""

import copy
import json

import pytest
import torch
from transformers import AutoModelForMaskedLM, EsmForMaskedLM

import ptq_protein as pp
from ptq_protein.models.tiny import esm_tokenizer

_SWAPS = {"float32": "float16", "esm": "bert", "rotary": "absolute"}
_REFUSALS = (ValueError, OSError, RuntimeError, TypeError, ImportError)


def _other(value):
    """Another valid value of the same JSON type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return _SWAPS.get(value, "model.safetensors" if " " in value else value + "x")
    if isinstance(value, list):
        return ["EsmModel"]
    if isinstance(value, dict):
        return {k: _other(v) if i == 0 else v for i, (k, v) in enumerate(value.items())} or {"a": 1}
    return 0


def _cases(config):
    yield from ((f"{key} removed", {k: v for k, v in config.items() if k != key}) for key in config)
    yield from ((f"{key} -> {_other(v)!r}", {**config, key: _other(v)}) for key, v in config.items())
    for key, value in config["quantization_config"].items():
        other = "bitsandbytes_8bit" if key == "quant_method" else _other(value)
        yield f"quantization_config.{key} -> {other!r}", {**config, "quantization_config": {
            **config["quantization_config"], key: other}}


def test_every_config_edit_loads_the_sealed_model_or_is_refused(masked_lm_artifact, seqs):
    tokens = esm_tokenizer()(seqs[:3], return_tensors="pt", padding=True)
    batch = {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"]}
    with torch.no_grad():
        reference = pp.load(masked_lm_artifact)(**batch).logits
    original = json.loads((masked_lm_artifact / "config.json").read_text())
    changed_outputs, refused = [], {}
    try:
        for case, config in _cases(copy.deepcopy(original)):
            (masked_lm_artifact / "config.json").write_text(json.dumps(config))
            try:
                model = AutoModelForMaskedLM.from_pretrained(masked_lm_artifact)
            except Exception as err:  # noqa: BLE001 -- transformers' own refusals have many types
                assert isinstance(err, _REFUSALS) or type(err).__name__.startswith("StrictDataclass"), case
                refused[case] = str(err)
                continue
            with torch.no_grad():
                logits = model(**batch).logits
            if logits.dtype != reference.dtype or not torch.equal(logits, reference):
                changed_outputs.append(case)
    finally:
        (masked_lm_artifact / "config.json").write_text(json.dumps(original))
    assert not changed_outputs, changed_outputs
    assert "config.json field dtype is 'float16'" in refused["dtype -> 'float16'"]
    assert "pip install -e ./ptq-protein" in refused["quantization_config removed"]  # the install hint


def test_no_local_path_in_what_push_to_hub_uploads(hf_esm2, calib_seqs, tmp_path):
    """A model read from a folder under a home dir: no file of the artifact names that folder."""
    source = tmp_path / "home" / "alice" / "models" / "esm"
    hf_esm2.save_pretrained(source)
    esm_tokenizer().save_pretrained(source)
    q = pp.quantize(EsmForMaskedLM.from_pretrained(source), "w8a8-uniform", calibration=list(calib_seqs))
    pp.save(q, tmp_path / "a", model_info={"name": "esm", "source": str(source)})
    q.save_pretrained(tmp_path / "b")  # transformers' way: the config's _name_or_path is the folder
    for folder in (tmp_path / "a", tmp_path / "b"):
        for path in folder.iterdir():
            assert str(tmp_path).encode() not in path.read_bytes(), path
    assert "- read from: esm" in (tmp_path / "a" / "README.md").read_text()
    assert json.loads((tmp_path / "b" / "config.json").read_text())["_name_or_path"] == "esm"


@pytest.mark.parametrize("value, public", [("/home/alice/esm", "esm"), ("~/esm/", "esm"), ("../x/esm", "esm"),
                                           ("facebook/esm2_t6_8M_UR50D", "facebook/esm2_t6_8M_UR50D"),
                                           ("tiny:tiny-esm2:seed=0", "tiny:tiny-esm2:seed=0"), ("", ""), (None, None)])
def test_public_source(value, public):
    from ptq_protein.support.io_utils import public_source

    assert public_source(value) == public


def test_save_pretrained_of_an_untouched_part_says_it_is_a_part(hf_esm2, calib_seqs, tmp_path):
    q = pp.quantize(hf_esm2, "w8a8-uniform", calibration=list(calib_seqs))
    with pytest.raises(ValueError, match=r"it is a part of a quantized model \(such as model.esm\)") as err:
        q.esm.save_pretrained(tmp_path / "d")
    assert "by hand" not in str(err.value).split("(such as model.esm),")[0]


def test_half_of_a_from_pretrained_model_follows_the_dtype(masked_lm_artifact, seqs):
    """README: quantized models follow .half(); transformers' guard for its own quantizers does not apply."""
    tokens = esm_tokenizer()(seqs[:2], return_tensors="pt", padding=True)
    batch = {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"]}
    model = AutoModelForMaskedLM.from_pretrained(masked_lm_artifact).half()
    with torch.no_grad():
        expected = pp.load(masked_lm_artifact).half()(**batch).logits
        assert torch.equal(model(**batch).logits, expected) and expected.dtype == torch.float16
        assert model.float()(**batch).logits.dtype == torch.float32
