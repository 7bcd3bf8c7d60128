"""Loading gaps of issue 13: files read with their own cfg, containers restored, wrong labels and caches refused.

- a fair-esm ESMFold file that is not v1-sized (here: tiny, structure-module-only, i.e. 0 trunk blocks) loads
  by path with no ``config=``, from the cfg stored in it, and folds as the model it was written from;
- the safe unpickler restores dict / list subclasses it does not import (their contents, not an error),
  and reads omegaconf's pickled layout (``data/esmfold_cfg_omegaconf.pt``, written by real omegaconf);
- a dangling ``refs/main`` in the HF cache is one clear error, not a silent older snapshot;
- an official model name on a file of other shapes is refused in one line;
- ``source`` is the absolute path, ``source_sha256`` the file's sha256.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ptq_protein.models import ModelFamily, load_model, tiny_esm2, tiny_esmfold_config
from ptq_protein.models.checkpoints import load_torch_checkpoint, plain_config
from ptq_protein.models.esmfold_convert import hf_esmfold_to_fair
from ptq_protein.support.errors import InputError

DATA = Path(__file__).with_name("data")
FOLD_SEQUENCE = "MKTAYIAKQ"


class AttrDict(dict):
    """A dict subclass the loader does not import (fairseq / hydra style cfg containers)."""


class Items(list):
    """A list subclass the loader does not import."""


def _fold(model):
    with torch.no_grad():
        return model.infer(FOLD_SEQUENCE).positions


def _structure_module_only():
    """A seeded transformers ESMFold with the tiny sizes and 0 trunk blocks (what the omegaconf fixture describes)."""
    from transformers import EsmForProteinFolding

    from ptq_protein.models.tiny import seeded_init_

    config = tiny_esmfold_config()
    config.esmfold_config.trunk.num_blocks = 0
    config.esmfold_config.trunk.max_recycles = 2  # the fixture cfg's (written when the tiny model had 2)
    model = EsmForProteinFolding(config)
    return seeded_init_(model, 4).eval()


def _as_containers(value):
    """The fixture's cfg rebuilt from dict / list subclasses, as a fairseq- or hydra-written file holds it."""
    if isinstance(value, dict):
        return AttrDict({k: _as_containers(v) for k, v in value.items()})
    if isinstance(value, list):
        return Items(_as_containers(v) for v in value)
    return value


@pytest.fixture(scope="module")
def fixture_cfg():
    return plain_config(load_torch_checkpoint(DATA / "esmfold_cfg_omegaconf.pt")["cfg"])


def test_omegaconf_cfg_reads_as_the_dict_it_was_written_from(fixture_cfg):
    model = fixture_cfg["model"]
    assert model["esm_type"] == "esm2_8M" and model["lddt_head_hid_dim"] == 128
    assert model["trunk"]["num_blocks"] == 0 and model["trunk"]["chunk_size"] is None
    assert model["trunk"]["structure_module"] == {
        "c_s": 64, "c_z": 32, "c_ipa": 16, "c_resnet": 128, "no_heads_ipa": 4, "no_qk_points": 4, "no_v_points": 8,
        "dropout_rate": 0.1, "no_blocks": 2, "no_transition_layers": 1, "no_resnet_blocks": 2, "no_angles": 7,
        "trans_scale_factor": 10, "epsilon": 1e-8, "inf": 1e5}
    assert fixture_cfg["optimization"] == {"lr": [0.0001], "max_update": 500000}


def test_dict_and_list_subclasses_are_restored_not_called_truncated(tmp_path):
    path = tmp_path / "cfg.pt"
    nested = AttrDict(a=1, inner=AttrDict(b=[1, 2]), seq=Items([AttrDict(c=3), 4]))
    torch.save({"model": {"w": torch.arange(3.0)}, "cfg": nested}, path)
    data = load_torch_checkpoint(path)
    assert torch.equal(data["model"]["w"], torch.arange(3.0))
    assert plain_config(data["cfg"]) == {"a": 1, "inner": {"b": [1, 2]}, "seq": [{"c": 3}, 4]}


def test_structure_module_only_esmfold_loads_from_its_own_cfg(tmp_path, fixture_cfg):
    """No config=: the CLI's path. The cfg is held in dict subclasses (restored inertly)."""
    model = _structure_module_only()
    state = dict(hf_esmfold_to_fair(model.state_dict()).state_dict)
    path = tmp_path / "esmfold_structure_module_only_tiny.pt"
    torch.save({"model": state, "cfg": _as_containers(fixture_cfg)}, path)
    loaded = load_model(path)
    assert loaded.family is ModelFamily.HF_ESMFOLD
    trunk = loaded.model.config.esmfold_config.trunk
    assert trunk.num_blocks == 0 and trunk.structure_module.num_heads_ipa == 4 and len(loaded.model.trunk.blocks) == 0
    assert torch.equal(_fold(loaded.model), _fold(model))


def test_structure_module_only_esmfold_quantizes_from_the_cli(tmp_path, fixture_cfg):
    model = _structure_module_only()
    path = tmp_path / "sm_only.pt"
    torch.save({"model": dict(hf_esmfold_to_fair(model.state_dict()).state_dict), "cfg": fixture_cfg}, path)
    out = tmp_path / "q"
    done = subprocess.run([sys.executable, "-m", "ptq_protein.cli.main", "quantize", str(path), "--preset", "w8-only",
                           "--out", str(out), "--quiet"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert (out / "model.safetensors").exists()


def test_stem_named_by_esm_type_is_looked_for_beside_the_hub(tmp_path, monkeypatch, fixture_cfg):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    model = _structure_module_only()
    state = {k: v for k, v in hf_esmfold_to_fair(model.state_dict()).state_dict.items() if not k.startswith("esm.")}
    path = tmp_path / "no_stem.pt"
    torch.save({"model": state, "cfg": fixture_cfg}, path)
    with pytest.raises(InputError, match="esm2_t6_8M_UR50D_500K.pt"):  # fair-esm's registry file for esm2_8M
        load_model(path)


def test_an_unsupported_or_missing_cfg_section_is_one_line(tmp_path, fixture_cfg):
    model = _structure_module_only()
    state = dict(hf_esmfold_to_fair(model.state_dict()).state_dict)
    attn = {"model": {**fixture_cfg["model"], "use_esm_attn_map": True}}
    torch.save({"model": state, "cfg": attn}, tmp_path / "attn.pt")
    with pytest.raises(InputError, match="use_esm_attn_map"):
        load_model(tmp_path / "attn.pt")
    torch.save({"model": state, "cfg": {"model": {"esm_type": "esm2_8M"}}}, tmp_path / "no_trunk.pt")
    with pytest.raises(InputError, match="no 'trunk' section"):
        load_model(tmp_path / "no_trunk.pt")


def test_source_is_the_absolute_path_and_its_sha256(tmp_path, monkeypatch):
    from tests.models.conftest import write_fair_esm2

    model, _ = tiny_esm2(seed=1)
    write_fair_esm2(model, tmp_path / "m.pt", regression="inline")
    monkeypatch.chdir(tmp_path)
    loaded = load_model("m.pt")
    assert loaded.source == str(tmp_path / "m.pt") and Path(loaded.source).is_absolute()
    assert loaded.source_sha256 == hashlib.sha256((tmp_path / "m.pt").read_bytes()).hexdigest()


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ptq_protein.cli.main", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def test_a_dangling_refs_main_is_reported_not_replaced_by_an_older_snapshot(tmp_path, monkeypatch):
    from ptq_protein.models import tiny_hf_esm2

    cache = tmp_path / "hub"
    repo = cache / "models--facebook--esm2_t6_8M_UR50D"
    model, tokenizer = tiny_hf_esm2(seed=0, num_layers=6, embed_dim=320, heads=20)
    model.save_pretrained(repo / "snapshots" / "older")
    tokenizer.save_pretrained(repo / "snapshots" / "older")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c0ffee")  # the snapshot it names was never (fully) downloaded
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    with pytest.raises(InputError, match=r"refs/main points to revision 'c0ffee'.*is missing.*other cached "
                                         r"snapshots: older"):
        load_model("facebook/esm2_t6_8M_UR50D")
    (repo / "snapshots" / "c0ffee").mkdir()
    with pytest.raises(InputError, match="lacks config.json or a weights file"):
        load_model("esm2_t6_8M_UR50D")  # the fair-esm name falls through to the same cache
    done = _cli("quantize", "facebook/esm2_t6_8M_UR50D", "--out", str(tmp_path / "q"),
                env={"HF_HUB_CACHE": str(cache), "TORCH_HOME": str(tmp_path / "torch_home")})
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "refs/main" in done.stderr
    (repo / "refs" / "main").write_text("older")  # fixed: the named snapshot loads
    assert load_model("facebook/esm2_t6_8M_UR50D").source == str(repo / "snapshots" / "older")


def test_a_published_name_on_a_file_of_other_shapes_is_one_line_from_the_cli(tmp_path):
    from tests.models.conftest import write_fair_esm2

    model, _ = tiny_esm2(seed=0, num_layers=3, embed_dim=48, heads=4)
    path = write_fair_esm2(model, tmp_path / "small.pt", regression="inline")
    done = _cli("quantize", "esm2_t6_8M_UR50D", "--weights", str(path), "--out", str(tmp_path / "q"), "--quiet")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"ptq-protein quantize: error: {path} holds an ESM model of 3 layers x 48 wide, but esm2_t6_8M_UR50D is "
        "6 x 320: the name does not fit the file; give the matching name, or load the file by its path (or under a "
        "name of your own) to use it as it is"]
    assert not (tmp_path / "q").exists()
    assert _cli("quantize", str(path), "--preset", "w8-only", "--out", str(tmp_path / "q"), "--quiet").returncode == 0


def test_the_esmfold_sized_benchmark_file_needs_no_config(monkeypatch):
    """scripts/make_random_checkpoints.py writes a partial cfg (trunk: 48 blocks) on an 8M stem: the file's cfg plus
    the stem's shapes give the config the benchmark passes by hand (shapes only: built on the meta device)."""
    from transformers import EsmForProteinFolding

    from ptq_protein.models.esmfold_cfg import config_from_fair_cfg

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    from make_random_checkpoints import esmfold_trunk_config

    reference = esmfold_trunk_config()
    with torch.device("meta"):
        model = EsmForProteinFolding(reference)
    built = config_from_fair_cfg({"trunk": {"num_blocks": 48}}, hf_esmfold_to_fair(model.state_dict()).state_dict,
                                 "trunk file")
    assert built.esmfold_config.trunk.to_dict() == reference.esmfold_config.trunk.to_dict()
    for field in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "token_dropout"):
        assert getattr(built, field) == getattr(reference, field), field
