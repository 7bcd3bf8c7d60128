"""``embed`` runs: HDF5 equals .pt, resumes, refusals of another run, shards, torchrun ranks, memory splits."""

import json
from pathlib import Path

import pytest
import torch

from ptq_protein import read_embeddings
from ptq_protein.cli.main import main
from ptq_protein.workloads import embed_run
from ptq_protein.workloads.embed import EmbedOptions
from ptq_protein.workloads.embed_run import EmbedRun, fasta_labels
from ptq_protein.workloads.shards import Shard

pytest.importorskip("h5py")
SEQS = {"a": "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "b": "MENDELKKLLAAGHRW", "c": "ACDEFGHIKLMNPQRSTVWYACDEFGHIKL",
        "d": "GSHMLEDPVAGVSKEELLKLAEEAR", "e": "MSTNPKPQRKTKRNTNRRPQDVKFPGG"}
INCLUDE = ["mean", "per_tok", "bos", "contacts", "logits"]


@pytest.fixture()
def fasta(tmp_path) -> Path:
    path = tmp_path / "seqs.fasta"
    path.write_text("".join(f">{k}\n{v}\n" for k, v in SEQS.items()))
    return path


def embed(*args) -> int:
    try:
        return main(["embed", *map(str, args), "--quiet"])
    except SystemExit as stop:  # the parser's own refusals (--max-memory): one line, exit 2
        return stop.code


def test_h5_reads_back_as_the_pt_files(tmp_path, fasta, artifact):
    assert embed(artifact, fasta, "--out", tmp_path / "pt", "--include", *INCLUDE, "--repr-layers", "0", "-1") == 0
    assert embed(artifact, fasta, "--out", tmp_path / "h5", "--include", *INCLUDE, "--repr-layers", "0", "-1",
                 "--format", "h5") == 0
    pt, h5 = read_embeddings(tmp_path / "pt"), read_embeddings(tmp_path / "h5")
    assert set(pt) == set(SEQS) and set(h5) == set(SEQS)
    for label in SEQS:
        assert pt[label].keys() == h5[label].keys()
        for key in ("representations", "mean_representations", "bos_representations"):
            assert pt[label][key].keys() == h5[label][key].keys() == {0, 2}
            for layer in (0, 2):
                assert torch.equal(pt[label][key][layer], h5[label][key][layer])
        assert torch.equal(pt[label]["contacts"], h5[label]["contacts"])
    import h5py

    (shard_file,) = (tmp_path / "h5").glob("*.h5")
    with h5py.File(shard_file) as handle:
        identity = json.loads(handle.attrs["ptq_protein_embed"])
    assert identity["model"]["recipe"] == "w8a8-uniform" and len(identity["model"]["tensors_sha256"]) == 64
    assert identity["options"]["include"] == INCLUDE and len(identity["fasta_sha256"]) == 64
    assert not list((tmp_path / "h5").glob("parts-*"))  # merged into the shard file


@pytest.mark.parametrize("fmt", ["pt", "h5"])
def test_rerun_computes_only_what_is_missing(tmp_path, fasta, esm2, fmt, monkeypatch):
    options = EmbedOptions((-1,), ("mean",), format=fmt)
    first = EmbedRun(fasta_labels(fasta), tmp_path / "o", options, Shard(1, 2)).run(esm2, {"name": "t"})
    assert first.stats.sequences in (2, 3)
    again = EmbedRun(fasta_labels(fasta), tmp_path / "o", options).run(esm2, {"name": "t"})
    assert again.skipped == first.stats.sequences and again.stats.sequences == 5 - first.stats.sequences
    done = EmbedRun(fasta_labels(fasta), tmp_path / "o", options).run(esm2, {"name": "t"})
    assert done.stats.sequences == 0 and done.skipped == 5
    assert set(read_embeddings(tmp_path / "o")) == set(SEQS)


def test_another_run_is_refused_in_one_line(tmp_path, fasta, artifact, capsys):
    out = tmp_path / "o"
    assert embed(artifact, fasta, "--out", out) == 0
    capsys.readouterr()
    other = tmp_path / "other.fasta"
    other.write_text(fasta.read_text().replace("MENDEL", "MENDEK"))  # same ids and count, other content
    ran = json.loads((out / "embed_run.json").read_text())["options"]["backend"]  # the backend chosen here
    cases = [(["tiny-esm2"], "model"), ([artifact, other], "FASTA content"),
             ([artifact, fasta, "--include", "bos"], "options.include"),
             ([artifact, fasta, "--backend", "fake" if ran == "int8" else "int8"], "options.backend")]
    for argv, what in cases:
        argv = argv + ([fasta] if len(argv) == 1 else [])
        assert embed(*argv, "--out", out) == 2
        err = capsys.readouterr().err
        assert what in err and "choose a new --out" in err and len(err.strip().splitlines()) == 1


def test_shards_and_torchrun_ranks_share_the_work(tmp_path, fasta, esm2, monkeypatch):
    options = EmbedOptions((-1,), ("mean",), format="h5")
    full = EmbedRun(fasta_labels(fasta), tmp_path / "full", options).run(esm2, {"name": "t"})
    assert full.stats.sequences == 5
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        from ptq_protein.workloads.shards import choose_shard

        shard = choose_shard(None)
        assert shard == Shard(rank + 1, 2)
        EmbedRun(fasta_labels(fasta), tmp_path / "ranks", options, shard).run(esm2, {"name": "t"})
    files = sorted(p.name for p in (tmp_path / "ranks").glob("*.h5"))
    assert files == ["embeddings.1-of-2.h5", "embeddings.2-of-2.h5"]
    a, b = read_embeddings(tmp_path / "full"), read_embeddings(tmp_path / "ranks")
    assert set(a) == set(b) == set(SEQS)
    for label in SEQS:
        torch.testing.assert_close(a[label]["mean_representations"][2], b[label]["mean_representations"][2])
    with pytest.raises(ValueError, match="under torchrun"):
        choose_shard("1/2")


def test_memory_budget_splits_batches_and_refuses_what_cannot_fit(tmp_path, fasta, esm2, monkeypatch):
    from ptq_protein.workloads import embed_memory

    calls = []
    real = embed_run.embed_all
    monkeypatch.setattr(embed_run, "embed_all", lambda m, r, batches, *a, **k: calls.append(batches) or
                        real(m, r, batches, *a, **k))
    monkeypatch.setattr(embed_run, "resident_bytes", lambda: 0)
    options = EmbedOptions((-1,), ("mean", "contacts"))
    one = embed_memory.batch_bytes(__import__("ptq_protein.models.lm_outputs", fromlist=["lm_info"]).lm_info(esm2),
                                   1, 30, 1, True, False)
    report = EmbedRun(fasta_labels(fasta), tmp_path / "o", options).run(esm2, {"name": "t"}, max_memory=one)
    assert all(len(b) == 1 for b in calls[0])  # every batch split down to one sequence
    assert set(report.refused) == {"a"}  # 33 residues > 30: alone over the budget, named
    assert "raise --max-memory" in report.refused["a"]
    assert set(read_embeddings(tmp_path / "o")) == set(SEQS) - {"a"}


@pytest.mark.parametrize("text, what", [(">a\nMKTJ\n", "J"), (">a\nMKT\n>a\nMKV\n", "lines 1 and 3"),
                                        ("", "no FASTA records")])
def test_bad_fasta_refused_before_the_model_loads(tmp_path, text, what, capsys, monkeypatch):
    from ptq_protein.cli import embed_cmd

    monkeypatch.setattr(embed_cmd, "load_model_or_artifact", lambda *a: pytest.fail("the model was loaded"))
    path = tmp_path / "bad.fasta"
    path.write_text(text)
    assert embed("tiny-esm2", path, "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert what in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "embed_run.json").exists()


@pytest.mark.parametrize("argv, what", [(["--out", "/proc/x"], "cannot be written"),
                                        (["--toks-per-batch", "0"], "--toks-per-batch"),
                                        (["--shard", "3/2"], "--shard"), (["--max-memory", "lots"], "--max-memory"),
                                        (["--repr-layers", "9"], "layer 9 does not exist"),
                                        (["--backend", "int8"], "--backend applies to artifacts")])
def test_bad_options_one_line(tmp_path, fasta, argv, what, capsys):
    argv = argv if "--out" in argv else argv + ["--out", str(tmp_path / "o")]
    assert embed("tiny-esm2", fasta, *argv) == 2
    err = capsys.readouterr().err
    assert what in err and len(err.strip().splitlines()) == 1


def test_a_foreign_folder_is_refused(tmp_path, fasta, capsys):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine")
    assert embed("tiny-esm2", fasta, "--out", tmp_path / "o") == 2
    assert "did not write" in capsys.readouterr().err
    assert (tmp_path / "o" / "notes.txt").read_text() == "mine"
