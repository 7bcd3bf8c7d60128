"""``--engine openvino``: an ESM-2 artifact compiled by OpenVINO computes what the artifact's simulation computes.

Reference: the artifact's fake backend (the simulation of record) run in float64, a path that shares no code with
OpenVINO's graph. Bound as for ONNX export (tests/interop/test_onnx_export.py): with float32 float parts, each
token's state within ``max(1e-5, 2 x |fake float64 - fake float32|)``, except where OpenVINO's float LayerNorm
or GELU rounds a value across a code boundary (a tie): that moves one code of one token by one step, so up to
2% of the tokens may differ, by under 2% each. In OpenVINO's default precision (bfloat16 float parts on CPUs
with it) the whole batch stays within 3 x what a bfloat16 cast of the same simulation moves. A wrong scale,
zero point, BOS/EOS rule or layer index costs about the quantization error itself on most tokens, far above
either bound (checked below with one scale doubled).
"""

import copy
import json
import shutil

import pytest
import torch

import ptq_protein as pp
from ptq_protein.models.lm_outputs import lm_forward, lm_tokens
from ptq_protein.support import io_utils
from ptq_protein.support.errors import ArtifactError, InputError

pytest.importorskip("openvino")
from ptq_protein.interop import openvino_engine  # noqa: E402
from ptq_protein.interop.openvino_engine import load_openvino, why_not  # noqa: E402

pytestmark = pytest.mark.skipif(why_not("cpu") is not None, reason="the engine is offered only on VNNI/AMX CPUs")

FLOOR = 1e-5


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PTQ_PROTEIN_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def fair_artifact(esm2, calib_seqs, tmp_path_factory):
    out = tmp_path_factory.mktemp("ov") / "a"
    pp.save(pp.quantize(esm2, "w8a8-uniform", calibration=list(calib_seqs)), out)
    return out


@pytest.fixture(scope="module")
def included_artifact(esm2, calib_seqs, tmp_path_factory):
    """SmoothQuant + GPTQ + asymmetric A8 with BOS/EOS quantized like residues: no float side path at all."""
    out = tmp_path_factory.mktemp("ov") / "b"
    pp.save(pp.quantize(esm2, "w8a8-smoothquant-gptq", calibration=list(calib_seqs)), out)
    return out


def _rel(got, want, keep):
    return ((got.double() - want)[keep].norm() / want[keep].norm()).item()


def _agrees(got, wide, narrow, keep) -> bool:
    """Every token but the 2% a rounding tie may move within the float32 bound, those within 2%."""
    bound = max(FLOOR, 2 * _rel(narrow, wide, keep))
    rows = ((got.double() - wide).norm(dim=-1) / wide.norm(dim=-1))[keep]
    return bool((rows > bound).float().mean() <= 0.02 and rows.max() < 0.02)


def _reference(artifact, tokens, layers, dtype=torch.float64):
    model = pp.load(artifact, backend="fake").to(dtype)
    return lm_forward(model, tokens, layers, logits=False).representations, model


@pytest.mark.parametrize("artifact", ["fair_artifact", "masked_lm_artifact", "included_artifact"])
def test_float32_parts_match_the_simulation(artifact, seqs, request):
    """Last layer and two inner layers, on a padded batch, against the float64 simulation."""
    path = request.getfixturevalue(artifact)
    tokens, keep = lm_tokens(seqs), lm_tokens(seqs) != 1
    wide, model = _reference(path, tokens, [0, 1, 2])
    narrow = lm_forward(model.float(), tokens, [0, 1, 2], logits=False).representations
    got = lm_forward(load_openvino(path, layers=[0, 1, -1], logits=False, dtype="float32", threads=1), tokens,
                     [0, 1, 2], logits=False).representations
    for layer in (0, 1, 2):
        assert _agrees(got[layer], wide[layer], narrow[layer], keep), layer


def test_default_precision_within_a_bfloat16_cast_of_the_simulation(fair_artifact, seqs):
    tokens, keep = lm_tokens(seqs), lm_tokens(seqs) != 1
    wide, model = _reference(fair_artifact, tokens, [2])
    cast = lm_forward(copy.deepcopy(model).to(torch.bfloat16), tokens, [2], logits=False).representations[2]
    got = lm_forward(load_openvino(fair_artifact, layers=[-1], logits=False, dtype=None, threads=1), tokens, [2],
                     logits=False).representations[2]
    assert _rel(got, wide[2], keep) <= max(FLOOR, 3 * _rel(cast.float(), wide[2], keep))


def test_a_wrong_scale_is_seen(fair_artifact, seqs, tmp_path):
    """The bound can fail: the same artifact with one activation scale doubled lands outside it."""
    tokens, keep = lm_tokens(seqs), lm_tokens(seqs) != 1
    wide, model = _reference(fair_artifact, tokens, [2])
    narrow = lm_forward(model.float(), tokens, [2], logits=False).representations[2]
    broken = pp.load(fair_artifact, backend="fake")
    broken.layers[0].fc1.input_quant.scale.mul_(2)
    pp.save(broken, tmp_path / "broken")
    got = lm_forward(load_openvino(tmp_path / "broken", layers=[-1], logits=False, dtype="float32", threads=1),
                     tokens, [2], logits=False).representations[2]
    assert not _agrees(got, wide[2], narrow, keep)


def test_logits_match_the_simulation(masked_lm_artifact, seqs):
    tokens, keep = lm_tokens(seqs), lm_tokens(seqs) != 1
    model = pp.load(masked_lm_artifact, backend="fake")
    wide = lm_forward(copy.deepcopy(model).double(), tokens, [], logits=True).logits
    narrow = lm_forward(model, tokens, [], logits=True).logits
    got = lm_forward(load_openvino(masked_lm_artifact, layers=[], logits=True, dtype="float32", threads=1), tokens,
                     [], logits=True).logits
    assert _agrees(got, wide, narrow, keep)


def test_converted_once_and_the_seal_checked_every_time(fair_artifact, tmp_path, monkeypatch):
    load_openvino(fair_artifact, layers=[-1], logits=False, dtype=None, threads=1)
    monkeypatch.setattr(openvino_engine, "_convert", lambda *a, **k: pytest.fail("converted again"))
    load_openvino(fair_artifact, layers=[-1], logits=False, dtype=None, threads=1)  # from the cache
    copied = tmp_path / "copy"
    copied.mkdir()
    for file in fair_artifact.iterdir():
        (copied / file.name).write_bytes(file.read_bytes())
    tensors = copied / "model.safetensors"
    data = bytearray(tensors.read_bytes())
    data[-1] ^= 1
    tensors.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="does not match"):
        load_openvino(copied, layers=[-1], logits=False, dtype=None, threads=1)


@pytest.fixture(scope="module")
def converted(fair_artifact, tmp_path_factory):
    """One run's conversion of ``fair_artifact``, in a cache of its own (``(cache root, folder)``)."""
    root = tmp_path_factory.mktemp("ov-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PTQ_PROTEIN_CACHE", str(root))
        load_openvino(fair_artifact, layers=[-1], logits=False, dtype=None, threads=1)
    (folder,) = (root / "openvino").iterdir()
    return folder


def _first_run(converted, tmp_path):
    """Another run's finished conversion, set aside to appear in this test's cache: ``(where it goes, it)``."""
    first = shutil.copytree(converted, tmp_path / "first")
    info = json.loads((first / "info.json").read_text())
    (first / "info.json").write_text(json.dumps({**info, "by": "the first run"}))  # whole, and told apart
    return openvino_engine.cache_root() / "openvino" / converted.name, first


def _appears_when(name, first, folder, monkeypatch):
    """``first`` moves to ``folder`` when the conversion calls ``io_utils.<name>`` (another run finishing then)."""
    real = getattr(io_utils, name)

    def appear_then(*args, **kwargs):
        folder.parent.mkdir(parents=True, exist_ok=True)
        first.rename(folder)
        return real(*args, **kwargs)

    monkeypatch.setattr(io_utils, name, appear_then)


@pytest.mark.parametrize("when", ["atomic_dir", "_move_into_place"])  # before the temp folder, before its rename
def test_a_conversion_finished_meanwhile_by_another_run_is_used(fair_artifact, converted, tmp_path, monkeypatch,
                                                               when):
    """Two runs convert at once: the slower one finds the faster one's folder in place and reads it."""
    folder, first = _first_run(converted, tmp_path)
    _appears_when(when, first, folder, monkeypatch)
    lm = load_openvino(fair_artifact, layers=[-1], logits=False, dtype=None, threads=1)
    assert not first.exists()  # the race happened: this run converted, and the other run's folder came first
    assert json.loads((folder / "info.json").read_text())["by"] == "the first run"
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no temp folder left
    assert str(folder) in lm.engine_words
    got = lm_forward(lm, lm_tokens(["MKTAYIAKQ"]), [2], logits=False).representations[2]
    assert got.shape[:2] == (1, 11) and torch.isfinite(got).all()


@pytest.mark.parametrize("broken", ["another folder", "no model.bin", "bad info.json"])
def test_a_broken_cache_folder_is_refused_in_one_line(fair_artifact, converted, tmp_path, monkeypatch, broken):
    """Whether it appeared during the conversion or was there before the run (then refused before converting)."""
    folder, first = _first_run(converted, tmp_path)
    if broken == "no model.bin":
        (first / "model.bin").unlink()
    elif broken == "bad info.json":
        (first / "info.json").write_text("{")
    else:
        shutil.rmtree(first)
        first.mkdir()
        (first / "notes.txt").write_text("not ptq-protein's")
    found = sorted(p.name for p in first.iterdir())
    _appears_when("_move_into_place", first, folder, monkeypatch)
    with pytest.raises(FileExistsError, match="is not a whole converted OpenVINO model"):
        load_openvino(fair_artifact, layers=[-1], logits=False, dtype=None, threads=1)
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no temp folder left
    assert sorted(p.name for p in folder.iterdir()) == found  # kept as found
    monkeypatch.setattr(openvino_engine, "_convert", lambda *a, **k: pytest.fail("converted next to a broken folder"))
    with pytest.raises(FileExistsError, match="remove it and run again"):
        load_openvino(fair_artifact, layers=[-1], logits=False, dtype=None, threads=1)


def test_other_models_refused_in_one_line(esmc, calib_seqs, tmp_path):
    pp.save(pp.quantize(esmc, "w8a8-uniform", calibration=list(calib_seqs)), tmp_path / "c")
    with pytest.raises(InputError, match="ESM-2 artifacts"):
        load_openvino(tmp_path / "c", layers=[-1], logits=False, dtype=None, threads=1)


def test_where_it_cannot_run(monkeypatch):
    from ptq_protein.nn import backend_choice

    assert "drop --device cuda" in why_not("cuda")
    monkeypatch.setattr(backend_choice, "cpu_flags", lambda: frozenset({"avx2"}))
    assert "no VNNI or AMX" in why_not("cpu")
    monkeypatch.setattr(openvino_engine.importlib.util, "find_spec", lambda name: None)
    assert "pip install 'ptq-protein[openvino]'" in why_not("cpu")


def test_cli_embeds_with_openvino_and_refuses_what_it_cannot(fair_artifact, tmp_path, capsys):
    from ptq_protein.cli.main import main

    fasta = tmp_path / "s.fasta"
    fasta.write_text(">a\nMKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ\n>b\nMENDELKKLLAAGHRW\n")
    art = str(fair_artifact)
    assert main(["embed", art, str(fasta), "--out", str(tmp_path / "ov"), "--engine", "openvino",
                 "--dtype", "float32"]) == 0
    assert main(["embed", art, str(fasta), "--out", str(tmp_path / "pt"), "--backend", "fake"]) == 0
    for label in "ab":
        got = torch.load(tmp_path / "ov" / f"{label}.pt")["mean_representations"][2]
        want = torch.load(tmp_path / "pt" / f"{label}.pt")["mean_representations"][2]
        assert ((got - want).norm() / want.norm()).item() < 1e-3
    capsys.readouterr()
    for extra, words in ((["--include", "contacts"], "no contacts"), (["--backend", "int8"], "drop it"),
                         ([], "runs artifacts")):
        model = "tiny-esm2" if words == "runs artifacts" else art
        assert main(["embed", model, str(fasta), "--out", str(tmp_path / "x"), "--engine", "openvino", *extra]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()
    # a folder embedded by the torch engine is not completed by OpenVINO's
    assert main(["embed", art, str(fasta), "--out", str(tmp_path / "pt"), "--engine", "openvino"]) == 2
