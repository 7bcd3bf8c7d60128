"""transformers opens artifacts: from_pretrained equals pp.load bit for bit, refuses what pp.load refuses,
and save_pretrained / push_to_hub never write a checkpoint that reloads to other outputs."""

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForMaskedLM, EsmForMaskedLM, EsmForProteinFolding, EsmModel

import ptq_protein as pp
from ptq_protein.models.tiny import esm_tokenizer
from ptq_protein.support.errors import ArtifactError


def _batch(seqs):
    tokens = esm_tokenizer()(seqs, return_tensors="pt", padding=True)  # a padded batch, as users tokenize
    return {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"]}


def _flip_last_tensor_byte(folder):
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def _same_refusal(load_a, load_b):
    with pytest.raises(ArtifactError) as a:
        load_a()
    with pytest.raises(ArtifactError) as b:
        load_b()
    assert str(a.value) == str(b.value)


def test_masked_lm_from_pretrained_is_pp_load(masked_lm_artifact, seqs):
    config = json.loads((masked_lm_artifact / "config.json").read_text())
    assert config["quantization_config"] == {"quant_method": "ptq_protein", "recipe": "w8a8-uniform",
                                             "format_version": 3}
    assert (masked_lm_artifact / "vocab.txt").exists()  # the source folder's tokenizer came along
    ref, model = pp.load(masked_lm_artifact), AutoModelForMaskedLM.from_pretrained(masked_lm_artifact)
    assert type(model) is EsmForMaskedLM and model.is_quantized
    batch = _batch(seqs[:3])
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, ref(**batch).logits)
        low = AutoModelForMaskedLM.from_pretrained(masked_lm_artifact, dtype=torch.bfloat16)  # dtype= is honoured
        query = low.esm.encoder.layer[0].attention.self.query
        assert low(**batch).logits.dtype == torch.bfloat16
        assert query.weight_codes.dtype == torch.int8 and query.weight_scale.dtype == torch.float32


def test_esm_model_from_pretrained_is_pp_load(hf_esm2, seqs, tmp_path):
    q = pp.quantize(hf_esm2.esm, "w8a8-dynamic", calibration=seqs)  # an EsmModel artifact
    pp.save(q, tmp_path / "a")
    ref, model = pp.load(tmp_path / "a"), EsmModel.from_pretrained(tmp_path / "a")
    batch = _batch(seqs[:3])
    with torch.no_grad():
        assert torch.equal(model(**batch).last_hidden_state, ref(**batch).last_hidden_state)
    with pytest.raises(ValueError, match="holds a quantized EsmModel; load it with EsmModel"):
        EsmForMaskedLM.from_pretrained(tmp_path / "a")  # no LM head in the artifact: refused, not invented
    _flip_last_tensor_byte(tmp_path / "a")
    _same_refusal(lambda: pp.load(tmp_path / "a"), lambda: EsmModel.from_pretrained(tmp_path / "a"))


def test_base_model_of_a_masked_lm_artifact(masked_lm_artifact, seqs, tmp_path):
    ref, model = pp.load(masked_lm_artifact), EsmModel.from_pretrained(masked_lm_artifact)
    batch = _batch(seqs[:2])
    with torch.no_grad():
        assert torch.equal(model(**batch).last_hidden_state, ref.esm(**batch).last_hidden_state)
    with pytest.raises(ValueError, match="not a whole ptq-protein model"):  # a part cannot pose as the artifact
        model.save_pretrained(tmp_path / "part")
    assert not (tmp_path / "part").exists()


@pytest.mark.parametrize("head", ["EsmForSequenceClassification", "EsmForTokenClassification"])
def test_task_heads_take_the_quantized_trunk(masked_lm_artifact, seqs, tmp_path, head, caplog):
    """Any ESM task head loads the artifact's quantized trunk; the head itself is float and new (and said so)."""
    import transformers

    ref = pp.load(masked_lm_artifact)
    model = getattr(transformers, head).from_pretrained(masked_lm_artifact, num_labels=3)
    assert type(model).__name__ == head and "newly initialised" in caplog.text
    batch = _batch(seqs[:3])
    with torch.no_grad():
        hidden = ref.esm(**batch).last_hidden_state
        assert torch.equal(model.esm(**batch).last_hidden_state, hidden)
        out = model(**batch, output_hidden_states=True)
        assert torch.equal(out.hidden_states[-1], hidden)
    weight = model.classifier.weight if head == "EsmForTokenClassification" else model.classifier.dense.weight
    assert weight.dtype == torch.float32 and 0 < weight.std() < 0.1  # transformers' initialisation, not garbage
    assert out.logits.shape[-1] == 3
    with pytest.raises(ValueError, match="not a whole ptq-protein model"):
        model.save_pretrained(tmp_path / "head")  # the artifact holds the trunk; this head is the user's


def test_the_replaced_trunk_is_never_initialised(masked_lm_artifact, monkeypatch):
    """transformers fills missing float weights with random values before the quantizer replaces the trunk: that
    cost the float model's size in memory for nothing (ESM-2 650M: 3.5 GiB resident instead of 1.1). Only a new
    head is initialised."""
    import transformers
    from transformers.models.esm import modeling_esm

    initialised = []
    original = modeling_esm.EsmPreTrainedModel._init_weights

    def spy(self, module):
        initialised.append(type(module).__name__)
        return original(self, module)

    monkeypatch.setattr(modeling_esm.EsmPreTrainedModel, "_init_weights", spy)
    trunk = {"EsmEmbeddings", "EsmEncoder", "EsmLayer", "EsmSelfAttention", "EsmIntermediate", "EsmOutput"}
    AutoModelForMaskedLM.from_pretrained(masked_lm_artifact)
    assert not trunk & set(initialised)
    initialised.clear()
    transformers.EsmForSequenceClassification.from_pretrained(masked_lm_artifact, num_labels=2)
    assert "EsmClassificationHead" in initialised and not trunk & set(initialised)


def test_esmfold_from_pretrained_is_pp_load(esmfold, seqs, tmp_path):
    q = pp.quantize(esmfold, "w8a8-uniform", calibration=seqs[:2], num_recycles=0)
    pp.save(q, tmp_path / "f")
    ref, model = pp.load(tmp_path / "f"), EsmForProteinFolding.from_pretrained(tmp_path / "f")
    with torch.no_grad():
        assert torch.equal(model.infer(seqs[1])["positions"], ref.infer(seqs[1])["positions"])
    _flip_last_tensor_byte(tmp_path / "f")
    _same_refusal(lambda: pp.load(tmp_path / "f"), lambda: EsmForProteinFolding.from_pretrained(tmp_path / "f"))


def test_tampered_files_refused_as_pp_load_refuses(masked_lm_artifact, tmp_path):
    import shutil

    for name, edit in (("recipe.json", lambda t: t.replace('"bits": 8', '"bits": 7', 1)),
                       ("vocab.txt", lambda t: t.replace("L", "Z", 1))):
        folder = tmp_path / name
        shutil.copytree(masked_lm_artifact, folder)
        (folder / name).write_text(edit((folder / name).read_text()))
        _same_refusal(lambda f=folder: pp.load(f), lambda f=folder: AutoModelForMaskedLM.from_pretrained(f))


def test_without_ptq_protein_transformers_says_what_to_install(masked_lm_artifact, monkeypatch):
    from transformers.quantizers import auto

    monkeypatch.delitem(auto.AUTO_QUANTIZATION_CONFIG_MAPPING, "ptq_protein")
    monkeypatch.delitem(auto.AUTO_QUANTIZER_MAPPING, "ptq_protein")
    with pytest.raises(ValueError, match="install ptq-protein from source"):
        AutoModelForMaskedLM.from_pretrained(masked_lm_artifact)


@pytest.mark.parametrize("how", ["quantize", "load", "from_pretrained"])
def test_save_pretrained_writes_the_artifact(masked_lm_artifact, hf_esm2, seqs, tmp_path, how):
    if how == "quantize":
        model = pp.quantize(hf_esm2, "w8a8-pwlq", calibration=seqs, backend="int8")  # what a reload runs here
    else:
        model = pp.load(masked_lm_artifact) if how == "load" else EsmForMaskedLM.from_pretrained(masked_lm_artifact)
    (tmp_path / "out").mkdir()  # transformers users save into existing (empty) folders
    model.save_pretrained(tmp_path / "out")
    batch = _batch(seqs[:3])
    with torch.no_grad():
        want = model(**batch).logits
        for reloaded in (EsmForMaskedLM.from_pretrained(tmp_path / "out"), pp.load(tmp_path / "out")):
            assert torch.equal(reloaded(**batch).logits, want)
    model.save_pretrained(tmp_path / "out")  # an artifact folder is replaced, as transformers overwrites
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="notes.txt"):
        model.save_pretrained(tmp_path / "out")
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="state_dict"):
        model.save_pretrained(tmp_path / "other", state_dict=model.state_dict())


def test_push_to_hub_uploads_the_artifact(masked_lm_artifact, seqs, monkeypatch):
    import huggingface_hub

    model, seen = pp.load(masked_lm_artifact), {}
    batch = _batch(seqs[:2])

    def upload_folder(self, repo_id, folder_path, **kwargs):
        with torch.no_grad():
            seen["equal"] = torch.equal(pp.load(folder_path)(**batch).logits, model(**batch).logits)
        seen["card"] = (huggingface_hub.constants.REPOCARD_NAME, open(f"{folder_path}/README.md").read())

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo",
                        lambda self, repo_id, **kw: huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}"))
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    model.push_to_hub("me/esm2-tiny-w8a8")
    assert seen["equal"] and "library_name: transformers" in seen["card"][1]


def test_float_models_save_as_transformers_does(hf_esm2, seqs, tmp_path):
    hf_esm2.save_pretrained(tmp_path / "fp")
    assert not (tmp_path / "fp" / "recipe.json").exists()
    batch = _batch(seqs[:2])
    with torch.no_grad():
        assert torch.equal(EsmForMaskedLM.from_pretrained(tmp_path / "fp")(**batch).logits, hf_esm2(**batch).logits)


def test_import_stays_light_and_registers_when_transformers_loads():
    code = ("import sys, importlib.util, ptq_protein\n"
            "assert 'transformers' not in sys.modules, 'transformers imported eagerly'\n"
            "importlib.util.find_spec('transformers.modeling_utils')  # a probe must not use up the hook\n"
            "from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING\n"
            "import transformers.modeling_utils\n"
            "assert AUTO_QUANTIZER_MAPPING['ptq_protein'].__name__ == 'PtqProteinQuantizer'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
