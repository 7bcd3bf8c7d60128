"""load_model: tiny names, fair-esm hub files, HF folders and caches, ESMFold both ways; errors are clear."""

import hashlib
import logging
import sys

import pytest
import torch

from ptq_protein.models import ModelFamily, load_model, tiny_esm2, tiny_esmfold, tiny_esmfold_config, tiny_hf_esm2
from ptq_protein.models.checkpoints import file_sha256
from ptq_protein.support.errors import InputError, MissingWeightsError

SEQUENCES = ["MKTAYIAKQRQISFVKSHFSRQ", "GSHMLEDPV"]
FOLD_SEQUENCE = "MKTAYIAKQ"


def lm_logits(loaded):
    tokens, mask = loaded.tokenize(SEQUENCES)
    with torch.no_grad():
        if loaded.family is ModelFamily.FAIR_ESM:
            return loaded.model(tokens)["logits"][mask]
        return loaded.model(input_ids=tokens, attention_mask=mask.long()).logits[mask]


def fold(model):
    with torch.no_grad():
        return model.infer(FOLD_SEQUENCE).positions


def test_tiny_names_and_seeds():
    loaded = load_model("tiny-esm2@3")
    assert (loaded.family, loaded.name, loaded.source) == (ModelFamily.FAIR_ESM, "tiny-esm2", "tiny:tiny-esm2:seed=3")
    assert loaded.source_sha256 is None and loaded.max_length == 1022
    reference, _ = tiny_esm2(seed=3)
    assert all(torch.equal(a, b) for a, b in zip(loaded.model.state_dict().values(),
                                                 reference.state_dict().values()))
    assert load_model("tiny-esm2", seed=3).source == loaded.source
    with pytest.raises(InputError, match="seed"):
        load_model("tiny-esm2@3", seed=4)
    folding = load_model("tiny-esmfold")
    assert folding.family is ModelFamily.HF_ESMFOLD and folding.max_length is None
    assert load_model("tiny-esm2", dtype=torch.float64).model.embed_tokens.weight.dtype == torch.float64


def test_fair_esm2_by_name_from_torch_home(homes, fakes):
    """The file under a published name has that model's shapes (6 x 320 for 8M; random weights)."""
    model, _ = tiny_esm2(seed=1, num_layers=6, embed_dim=320, heads=20)
    path = fakes.write_fair_esm2(model, homes.checkpoints / "esm2_t6_8M_UR50D.pt")
    loaded = load_model("esm2_t6_8M_UR50D")
    assert loaded.family is ModelFamily.FAIR_ESM and loaded.source == str(path)
    regression = path.with_name("esm2_t6_8M_UR50D-contact-regression.pt")  # read too: part of the digest
    listing = f"weights {file_sha256(path)}\ncontact-regression {file_sha256(regression)}\n"
    assert loaded.source_sha256 == hashlib.sha256(listing.encode()).hexdigest()
    tokens, mask = loaded.tokenize(SEQUENCES)
    with torch.no_grad():
        assert torch.equal(lm_logits(loaded), model(tokens)["logits"][mask])
    assert torch.equal(loaded.model.contact_head.regression.weight, model.contact_head.regression.weight)


@pytest.mark.filterwarnings("ignore:Regression weights not found")
@pytest.mark.parametrize("regression", ["inline", "none"])
def test_fair_esm2_by_weights_path_with_or_without_regression(tmp_path, homes, fakes, regression):
    """A tiny file loads under a name of the user's own; under a published name (esm2_t33_650M_UR50D, 33 x 1280)
    it is refused, since the name would then label a 2 x 64 model as the 650M one (issue 13)."""
    model, _ = tiny_esm2(seed=2)
    path = fakes.write_fair_esm2(model, tmp_path / "elsewhere" / "my_esm.pt", regression=regression)
    with pytest.warns(UserWarning, match="Regression weights not found") if regression == "none" else _no_op():
        loaded = load_model("my_tiny_esm2", weights=path, hash_weights=False)
    assert loaded.name == "my_tiny_esm2" and loaded.source_sha256 is None
    assert torch.equal(lm_logits(loaded), lm_logits(load_model("tiny-esm2@2")))
    by_path = load_model(path)  # a bare path works too; the name is the file stem
    assert by_path.name == "my_esm" and by_path.family is ModelFamily.FAIR_ESM
    with pytest.raises(InputError, match="2 layers x 64 wide, but esm2_t33_650M_UR50D is 33 x 1280"):
        load_model("esm2_t33_650M_UR50D", weights=path, hash_weights=False)


def test_hf_folder_and_hf_cache_by_name(tmp_path, homes, fakes):
    model, tokenizer = tiny_hf_esm2(seed=5)
    folder = tmp_path / "my_hf_model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    from_folder = load_model(folder)
    assert from_folder.family is ModelFamily.HF_ESM and from_folder.source == str(folder)
    assert torch.equal(lm_logits(from_folder), lm_logits(load_model("tiny-esm2-hf@5")))
    with pytest.raises(InputError, match="does not fit"):  # a published name on the tiny folder
        load_model("facebook/esm2_t6_8M_UR50D", weights=folder)
    model8, tokenizer8 = tiny_hf_esm2(seed=5, num_layers=6, embed_dim=320, heads=20)  # the 8M shapes
    snapshot = fakes.write_hf_cache(model8, tokenizer8, homes.hf_cache, "facebook/esm2_t6_8M_UR50D")
    for name in ("facebook/esm2_t6_8M_UR50D", "esm2_t6_8M_UR50D"):  # no fair-esm file: the HF cache is next
        cached = load_model(name)
        assert cached.source == str(snapshot) and cached.family is ModelFamily.HF_ESM
        tokens, mask = cached.tokenize(SEQUENCES)
        with torch.no_grad():
            assert torch.equal(lm_logits(cached), model8(input_ids=tokens, attention_mask=mask.long()).logits[mask])


def test_fair_and_hf_tokenization_agree():
    fair, hf, fold_model = load_model("tiny-esm2"), load_model("tiny-esm2-hf"), load_model("tiny-esmfold")
    fair_tokens, fair_mask = fair.tokenize(SEQUENCES)
    hf_tokens, hf_mask = hf.tokenize(SEQUENCES)
    assert torch.equal(fair_tokens, hf_tokens) and torch.equal(fair_mask, hf_mask)
    assert fair_tokens.shape == (2, len(SEQUENCES[0]) + 2) and fair_mask.dtype == torch.bool
    fold_tokens, fold_mask = fold_model.tokenize(["mkt", "ACDEB"])
    assert fold_tokens.tolist() == [[12, 11, 16, 0, 0], [0, 4, 3, 6, 20]]  # AF2 order; B -> X (20)
    assert fold_mask.tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    with pytest.raises(InputError, match="at most 1022 residues"):
        fair.tokenize(["A" * 1023])
    with pytest.raises(InputError, match="input sequence 2.*'J' at position 1"):
        hf.tokenize(["MKT", "JKT"])


def test_esmfold_from_hf_cache(homes, fakes):
    model, tokenizer = tiny_esmfold(seed=0)
    fakes.write_hf_cache(model, tokenizer, homes.hf_cache, "facebook/esmfold_v1")
    loaded = load_model("esmfold")
    assert loaded.family is ModelFamily.HF_ESMFOLD and loaded.model.config.esmfold_config.fp16_esm is False
    assert torch.equal(fold(loaded.model), fold(model))
    tokens, mask = loaded.tokenize([FOLD_SEQUENCE])
    with torch.no_grad():
        forward = loaded.model(tokens, attention_mask=mask.long()).positions
    assert torch.equal(forward, fold(model))


@pytest.mark.parametrize("with_stem", [True, False])
def test_esmfold_from_fair_esm_checkpoint(homes, fakes, caplog, with_stem):
    model, _ = tiny_esmfold(seed=0)
    fakes.write_fair_esmfold(model, homes.checkpoints / "esmfold_3B_v1.pt", with_stem=with_stem)
    if not with_stem:  # fair-esm keeps the ESM-2 stem in its own file
        with pytest.raises(MissingWeightsError, match="esm2_t36_3B_UR50D.pt"):
            load_model("esmfold", config=tiny_esmfold_config())
        esm2, _ = tiny_esm2(seed=0, num_layers=2, embed_dim=32, heads=4)
        fakes.write_fair_esm2(esm2, homes.checkpoints / "esm2_t36_3B_UR50D.pt")
    with caplog.at_level(logging.INFO, logger="ptq_protein.models.checkpoints"):
        loaded = load_model("esmfold_v1", config=tiny_esmfold_config())
    assert "inert placeholders" in caplog.text  # the non-tensor config object was not executed
    assert loaded.family is ModelFamily.HF_ESMFOLD and loaded.source.endswith("esmfold_3B_v1.pt")
    assert torch.equal(fold(loaded.model), fold(model))


def test_an_esmfold_file_under_another_name_is_read_once(homes, fakes, caplog, tmp_path):
    """A fair-esm ESMFold file is known by its trunk once read; it is not read (nor announced) a second time."""
    model, _ = tiny_esmfold(seed=0)
    path = fakes.write_fair_esmfold(model, tmp_path / "my_esmfold.pt")
    with caplog.at_level(logging.INFO, logger="ptq_protein.models.checkpoints"):
        loaded = load_model(str(path), config=tiny_esmfold_config())
    assert caplog.text.count("inert placeholders") == 1, caplog.text
    assert loaded.family is ModelFamily.HF_ESMFOLD and torch.equal(fold(loaded.model), fold(model))


def test_esmfold_v1_config_is_the_published_architecture():
    from ptq_protein.models.esmfold_convert import esmfold_v1_config

    config = esmfold_v1_config()
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (2560, 36, 40)
    trunk = config.esmfold_config.trunk
    assert (trunk.num_blocks, trunk.sequence_state_dim, trunk.pairwise_state_dim) == (48, 1024, 128)
    assert trunk.structure_module.num_blocks == 8 and config.esmfold_config.fp16_esm is False


def test_esmfold_with_the_wrong_config_names_mismatched_keys(homes, fakes):
    model, _ = tiny_esmfold(seed=0)
    fakes.write_fair_esmfold(model, homes.checkpoints / "esmfold_3B_v1.pt")
    wrong = tiny_esmfold_config()
    wrong.hidden_size, wrong.intermediate_size, wrong.esmfold_config.trunk.num_blocks = 48, 192, 1
    with pytest.raises(InputError) as excinfo:
        load_model("esmfold", config=wrong)
    message = str(excinfo.value)
    assert "shape mismatch" in message and "esm.embeddings.word_embeddings.weight" in message
    assert "unexpected" in message and "trunk.blocks.1." in message and "\n" not in message


def test_missing_weights_message_lists_what_and_where(homes):
    with pytest.raises(MissingWeightsError) as excinfo:
        load_model("esm2_t33_650M_UR50D")
    message = str(excinfo.value)
    for fragment in ("esm2_t33_650M_UR50D.pt", str(homes.checkpoints), str(homes.hf_cache),
                     "models--facebook--esm2_t33_650M_UR50D", "--weights PATH", "TORCH_HOME", "HF_HOME"):
        assert fragment in message
    assert "\n" not in message and isinstance(excinfo.value, FileNotFoundError)
    with pytest.raises(MissingWeightsError, match="esmfold_3B_v1.pt"):
        load_model("esmfold")
    with pytest.raises(MissingWeightsError, match="models--someone--my-esm"):
        load_model("someone/my-esm")
    with pytest.raises(MissingWeightsError, match="nope.pt"):
        load_model("esm2_t6_8M_UR50D", weights=homes.torch_home / "nope.pt")


def test_cache_folders_follow_the_environment(tmp_path, monkeypatch):
    from ptq_protein.models import resolve

    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve.hf_hub_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    assert resolve.hf_hub_cache_dir() == tmp_path / "hf_home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub_cache"))
    assert resolve.hf_hub_cache_dir() == tmp_path / "hub_cache"
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    assert resolve.torch_checkpoints_dir() == tmp_path / "th" / "hub" / "checkpoints"
    snapshots = tmp_path / "hub_cache" / "models--facebook--esm2_t6_8M_UR50D" / "snapshots"
    for revision in ("old", "new"):
        (snapshots / revision).mkdir(parents=True)
        (snapshots / revision / "config.json").write_text("{}")
        (snapshots / revision / "model.safetensors").write_bytes(b"")
    refs = snapshots.parent / "refs"
    refs.mkdir()
    (refs / "main").write_text("old\n")
    assert resolve.hf_snapshot("facebook/esm2_t6_8M_UR50D") == snapshots / "old"  # refs/main wins over mtime
    assert resolve.hf_snapshot("facebook/esm2_t12_35M_UR50D") is None


def test_bad_names_and_files_are_input_errors(tmp_path, homes):
    with pytest.raises(InputError, match="unknown model 'esm3'"):
        load_model("esm3")
    broken = tmp_path / "esm2_t6_8M_UR50D.pt"
    broken.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(InputError, match="could not be read as a PyTorch file"):
        load_model("esm2_t6_8M_UR50D", weights=broken)
    not_fair = tmp_path / "plain.pt"
    torch.save({"weight": torch.zeros(2)}, not_fair)
    with pytest.raises(InputError, match="not a fair-esm checkpoint"):
        load_model(not_fair)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(InputError, match="not a Hugging Face model folder"):
        load_model(empty_dir)
    with pytest.raises(InputError, match="floating-point"):
        load_model("tiny-esm2", dtype=torch.int8)


def test_fair_esm2_with_wrong_shapes_names_the_keys(tmp_path, fakes):
    model, _ = tiny_esm2(seed=0)
    path = fakes.write_fair_esm2(model, tmp_path / "esm2_t6_8M_UR50D.pt", regression="inline")
    data = torch.load(path, weights_only=False)
    del data["model"]["encoder.sentence_encoder.layers.1.fc1.weight"]
    torch.save(data, path)
    with pytest.raises(InputError, match="layers.1.fc1.weight"):
        load_model(path)


class _no_op:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_mapped_esmfold_file_folds_the_same_and_still_refuses_a_nan(fakes, tmp_path):
    """``fold``/``embed`` map a ``.pt`` file (its pages are the weights: no second copy) and keep the finite check."""
    from ptq_protein.models.mapped import mapped_file_of
    from ptq_protein.support.errors import InputError

    model, _ = tiny_esmfold(seed=0)
    path = fakes.write_fair_esmfold(model, tmp_path / "my_esmfold.pt")
    loaded = load_model(str(path), config=tiny_esmfold_config(), mmap=True, check_finite=True)
    assert mapped_file_of(loaded.model) is not None and torch.equal(fold(loaded.model), fold(model))
    with torch.no_grad():
        model.trunk.blocks[0].seq_attention.o_proj.weight[0, 0] = float("nan")
    bad = fakes.write_fair_esmfold(model, tmp_path / "bad.pt")
    with pytest.raises(InputError, match="non-finite"):
        load_model(str(bad), config=tiny_esmfold_config(), mmap=True, check_finite=True)
    assert mapped_file_of(load_model(str(bad), config=tiny_esmfold_config(), mmap=True).model) is not None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/pagemap")
def test_a_mapped_pt_file_is_not_made_resident_by_its_finite_check(fakes, tmp_path, monkeypatch):
    """``fold CKPT`` maps a fair-esm file and checks every weight is finite: each weight's pages go back once it is
    checked, so the check never holds the file (a 48-block trunk's load peaked at 3.1 GB, then 0.67 GB)."""
    from page_map import PAGE, pages_present

    from ptq_protein.models import finite

    checked, held = [], []
    check = finite._all_finite

    def spy(tensor):  # before each check: every weight checked so far has no page mapped
        held.extend(t for t in checked if any(pages_present(t)))
        if tensor.numel() * tensor.element_size() >= 2 * PAGE:
            checked.append(tensor)
        return check(tensor)

    monkeypatch.setattr(finite, "_all_finite", spy)
    model, _ = tiny_esmfold(seed=0)
    path = fakes.write_fair_esmfold(model, tmp_path / "my_esmfold.pt")
    loaded = load_model(str(path), config=tiny_esmfold_config(), mmap=True, check_finite=True).model
    assert len(checked) > 10 and not held
    assert torch.equal(fold(loaded), fold(model))  # read back from the file, unchanged
