"""One line, exit 2, the file or option named, before the model loads: what a first embed / fold / score user hit.

- the model's identity covers fair-esm's ``-contact-regression.pt`` (an edited head is another model), and a
  checkpoint given by path resumes its folder;
- ``fold --shard`` of another seed into a folder another shard wrote is refused;
- a garbage or edited ``embed_run.json``, another ``--repr-layers``, a dangling ``--out`` link, ``--max-memory``
  below what the process holds, ``RANK`` outside ``WORLD_SIZE``, ``--dms /dev/zero``, a DMS file without
  ``DMS_score``, an unknown safetensors dtype, a repeated FASTA id (and ``--duplicates rename``).
"""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ptq_protein import read_embeddings
from ptq_protein.cli.main import main
from ptq_protein.support.errors import InputError

SEQS = {"a": "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "b": "MENDELKKLLAAGHRW"}


@pytest.fixture()
def fasta(tmp_path) -> Path:
    path = tmp_path / "seqs.fasta"
    path.write_text("".join(f">{k}\n{v}\n" for k, v in SEQS.items()))
    return path


def cli(capsys, *args) -> tuple:
    capsys.readouterr()
    try:
        code = main([*map(str, args), "--quiet"])
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr()
    return code, out.out, out.err.strip()


def one_line(code, err, *words) -> bool:
    return code == 2 and len(err.splitlines()) == 1 and all(w in err for w in words)


@pytest.fixture()
def no_load(monkeypatch):
    """Any embed model load fails the test: refusals come first."""
    from ptq_protein.cli import embed_cmd

    monkeypatch.setattr(embed_cmd, "load_model_or_artifact", lambda *a, **k: pytest.fail("the model was loaded"))


def test_an_edited_contact_head_is_another_model_and_a_path_model_resumes(tmp_path, fasta, esm2, capsys):
    from ptq_protein.models.fair_esm2 import save_fair_esm2

    ckpt, out = save_fair_esm2(esm2, tmp_path / "m.pt"), tmp_path / "o"
    assert cli(capsys, "embed", ckpt, fasta, "--out", out, "--include", "contacts")[0] == 0
    code, stdout, _ = cli(capsys, "embed", ckpt, fasta, "--out", out, "--include", "contacts")
    assert code == 0 and "embedded 0 sequences" in stdout and "2 already written" in stdout
    regression = tmp_path / "m-contact-regression.pt"
    head = torch.load(regression, weights_only=True)
    torch.save({"model": {k: v * 2 for k, v in head["model"].items()}}, regression)
    (out / "a.pt").unlink()
    code, _, err = cli(capsys, "embed", ckpt, fasta, "--out", out, "--include", "contacts")
    assert one_line(code, err, "model.sha256 differs", "choose a new --out")
    assert set(read_embeddings(out)) == {"b"}  # nothing written by the refused run


def test_fold_shard_of_another_seed_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    path = tmp_path / "f.fasta"
    path.write_text(">a\nMKTAYIAKQR\n>b\nMENDELKK\n")
    out = tmp_path / "folds"
    assert cli(capsys, "fold", "tiny-esmfold", "--fasta", path, "--out", out, "--shard", "1/2")[0] == 0
    assert json.loads((out / "fold_run.json").read_text())["model"]["source"] == "tiny:tiny-esmfold:seed=0"
    from ptq_protein.cli import fold_cmd

    monkeypatch.setattr(fold_cmd, "load_model_or_artifact", lambda *a, **k: pytest.fail("the model was loaded"))
    for extra in (["--seed", "1"], ["--num-recycles", "1"]):
        code, _, err = cli(capsys, "fold", "tiny-esmfold", "--fasta", path, "--out", out, "--shard", "2/2", *extra)
        assert one_line(code, err, "holds folds of another run", "fold_run.json"), err
    assert len(json.loads((out / "fold_index.json").read_text())) == 1


def test_an_unreadable_manifest_is_named(tmp_path, fasta, capsys, no_load):
    out = tmp_path / "o"
    out.mkdir()
    (out / "embed_run.json").write_text("{not json")
    with pytest.raises(InputError, match="embed_run.json is not readable JSON"):
        read_embeddings(out)
    code, _, err = cli(capsys, "embed", "tiny-esm2", fasta, "--out", out)
    assert one_line(code, err, "embed_run.json is not readable JSON")


def test_an_edited_format_is_not_an_empty_folder(tmp_path, fasta, esm2):
    from ptq_protein.workloads.embed import EmbedOptions
    from ptq_protein.workloads.embed_run import EmbedRun, fasta_labels

    out = tmp_path / "o"
    EmbedRun(fasta_labels(fasta), out, EmbedOptions()).run(esm2, {"name": "t"})
    manifest = json.loads((out / "embed_run.json").read_text())
    for fmt, match in (("h5", r"a.pt was written by another run \(options.format differs"),
                       ("csv", "records format 'csv'")):
        manifest["options"]["format"] = fmt
        (out / "embed_run.json").write_text(json.dumps(manifest))
        with pytest.raises(InputError, match=match):
            read_embeddings(out)


def test_option_refusals_name_the_values(tmp_path, fasta, capsys, monkeypatch):
    out = tmp_path / "o"
    assert cli(capsys, "embed", "tiny-esm2", fasta, "--out", out)[0] == 0
    from ptq_protein.cli import embed_cmd

    monkeypatch.setattr(embed_cmd, "load_model_or_artifact", lambda *a, **k: pytest.fail("the model was loaded"))
    code, _, err = cli(capsys, "embed", "tiny-esm2", fasta, "--out", out, "--seed", "3")
    assert one_line(code, err, "model.source differs", "'tiny:tiny-esm2:seed=0', this run 'tiny:tiny-esm2:seed=3'")
    code, _, err = cli(capsys, "embed", "tiny-esm2", fasta, "--out", out, "--repr-layers", "0", "2")
    assert one_line(code, err, "options.repr_layers differs", "has [-1], this run [0, 2]") and "None" not in err
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    code, _, err = cli(capsys, "embed", "tiny-esm2", fasta, "--out", tmp_path / "link")
    assert one_line(code, err, "is a link to", "does not exist") and "File exists" not in err
    code, _, err = cli(capsys, "embed", "tiny-esm2", fasta, "--out", tmp_path / "m", "--max-memory", "1K")
    assert one_line(code, err, "--max-memory", "before loading the model")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "5")
    code, _, err = cli(capsys, "embed", "tiny-esm2", fasta, "--out", tmp_path / "r")
    assert one_line(code, err, "RANK=5", "WORLD_SIZE=2") and "--shard" not in err.split(";")[0]


def test_dms_files_are_checked_like_fasta_files(tmp_path):
    """``/dev/zero`` was read until memory ran out; run in a child process with 6 GiB of address space, so a
    regression fails the test instead of hanging the suite or filling the machine."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    done = subprocess.run([sys.executable, "-m", "ptq_protein.cli.main", "score", "tiny-esm2", "--sequence",
                           SEQS["a"], "--dms", "/dev/zero", "--out", str(tmp_path / "s.csv"), "--quiet"],
                          capture_output=True, text=True, timeout=60, preexec_fn=cap)
    assert done.returncode == 2 and "/dev/zero is a device or pipe, not a regular file" in done.stderr
    from ptq_protein.workloads.dms_csv import DMS_SCORE_COLUMN, read_dms

    path = tmp_path / "dms.csv"
    path.write_text("mutant,fitness\nM1A,0.5\n")
    with pytest.raises(InputError, match="no column 'DMS_score'") as caught:
        read_dms(path, require=(DMS_SCORE_COLUMN,))
    assert "--mutation-col" not in str(caught.value)
    with pytest.raises(InputError, match="--mutation-col"):
        read_dms(path, mutation_col="variant")


def test_an_unknown_tensor_dtype_is_named(tmp_path, artifact):
    import shutil

    import ptq_protein as pp
    from ptq_protein.support.digests import file_sha256

    art = Path(shutil.copytree(artifact, tmp_path / "art"))
    tensors = art / "model.safetensors"
    raw = tensors.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = raw[8:8 + size].replace(b'"dtype":"I8"', b'"dtype":"F4"', 1)
    tensors.write_bytes(raw[:8] + header + raw[8 + size:])
    recipe = json.loads((art / "recipe.json").read_text())
    recipe["files"]["model.safetensors"] = {"sha256": file_sha256(tensors), "bytes": tensors.stat().st_size}
    (art / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(InputError, match="has dtype 'F4', which no ptq-protein artifact holds") as caught:
        pp.load(art)
    assert "sub-byte" not in str(caught.value)


def test_a_repeated_id_hint_names_an_option_that_exists(tmp_path, capsys):
    path = tmp_path / "dup.fasta"
    path.write_text(f">T1085\n{SEQS['a']}\n>T1085\n{SEQS['b']}\n")
    code, _, err = cli(capsys, "embed", "tiny-esm2", path, "--out", tmp_path / "o")
    assert one_line(code, err, "'T1085' appears more than once", "--duplicates rename")
    assert cli(capsys, "embed", "tiny-esm2", path, "--out", tmp_path / "o", "--duplicates", "rename")[0] == 0
    assert set(read_embeddings(tmp_path / "o")) == {"T1085", "T1085#2"}


def test_an_artifact_is_known_by_its_whole_sealed_file(tmp_path, fasta, capsys):
    """Same tensors, another default backend (sealed in the recipe): another model, so its outputs are not mixed."""
    arts = {b: tmp_path / f"art-{b}" for b in ("fake", "int8")}
    for backend, art in arts.items():
        assert cli(capsys, "quantize", "tiny-esm2", "--preset", "w8a8-dynamic", "--backend", backend, "--check", "0",
                   "--out", art)[0] == 0
    recipes = [json.loads((art / "recipe.json").read_text()) for art in arts.values()]
    assert recipes[0]["tensors_sha256"] == recipes[1]["tensors_sha256"]  # what the identity held alone
    out = tmp_path / "o"
    assert cli(capsys, "embed", arts["fake"], fasta, "--out", out)[0] == 0
    (out / "a.pt").unlink()
    code, _, err = cli(capsys, "embed", arts["int8"], fasta, "--out", out)
    assert one_line(code, err, "model.sha256 differs")
