"""An embed folder is judged by what its files hold, not by their names.

Every ``LABEL.pt`` and HDF5 file carries the seal of the run that wrote it
(identity + tensor digest). A file of another model copied in, or a damaged one
(truncated, empty, a pickle), never counts as written: a rerun embeds its
sequences again, and ``read_embeddings`` names the file instead of returning it
or raising a raw torch / h5py error. Labels map to files one to one. Two
processes never run one shard at once.
"""

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ptq_protein import read_embeddings
from ptq_protein.models.tiny import tiny_esm2
from ptq_protein.support.errors import InputError
from ptq_protein.support.io_utils import safe_stem
from ptq_protein.workloads.embed import EmbedOptions
from ptq_protein.workloads.embed_run import EmbedRun, fasta_labels
from ptq_protein.workloads.embed_store import label_stem

pytest.importorskip("h5py")
SEQS = {"a": "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "b": "MENDELKKLLAAGHRW", "c": "ACDEFGHIKLMNPQRSTVWYACDEFGHIKL"}
MODEL = {"name": "tiny-esm2", "source": "tiny:tiny-esm2:seed=0"}
UNPICKLED = []


def _mark():
    UNPICKLED.append(True)


class _Trap:
    """A pickle that calls :func:`_mark` if anything ever unpickles it."""

    def __reduce__(self):
        return _mark, ()


@pytest.fixture()
def fasta(tmp_path) -> Path:
    path = tmp_path / "seqs.fasta"
    path.write_text("".join(f">{k}\n{v}\n" for k, v in SEQS.items()))
    return path


def run(model, fasta, out, fmt="pt", identity=MODEL, include=("mean", "contacts")):
    options = EmbedOptions((-1,), include, format=fmt)
    return EmbedRun(fasta_labels(fasta), out, options).run(model, identity)


def same(a: dict, b: dict) -> bool:
    """The same sequences and values (a sequence embedded alone differs from one padded in a batch by float
    rounding only; another model's differ by O(1))."""
    assert set(a) == set(b)
    for k in a:
        for got, want in ((a[k]["mean_representations"][2], b[k]["mean_representations"][2]),
                          (a[k]["contacts"], b[k]["contacts"])):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    return True


@pytest.fixture(scope="module")
def other():
    return tiny_esm2(seed=1)[0]


@pytest.mark.parametrize("fmt", ["pt", "h5"])
def test_a_file_of_another_model_is_named_on_read_and_embedded_again(tmp_path, fasta, esm2, other, fmt):
    run(esm2, fasta, tmp_path / "ours", fmt)
    run(other, fasta, tmp_path / "theirs", fmt, {**MODEL, "source": "tiny:tiny-esm2:seed=1"})
    want = read_embeddings(tmp_path / "ours")
    name = "a.pt" if fmt == "pt" else "embeddings.1-of-1.h5"
    shutil.copy(tmp_path / "theirs" / name, tmp_path / "ours" / name)
    with pytest.raises(InputError, match=rf"{name} was written by another run \(model.source differs"):
        read_embeddings(tmp_path / "ours")
    again = run(esm2, fasta, tmp_path / "ours", fmt)
    assert again.stats.sequences == (1 if fmt == "pt" else 3)  # the foreign file's sequences, computed again
    assert same(read_embeddings(tmp_path / "ours"), want)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


DAMAGE = {"truncated": _truncate, "empty": lambda p: p.write_bytes(b""),
          "pickled": lambda p: p.write_bytes(pickle.dumps(_Trap())), "garbage": lambda p: p.write_bytes(b"x" * 999)}


@pytest.mark.parametrize("fmt, how", [("pt", "truncated"), ("pt", "empty"), ("pt", "pickled"), ("h5", "truncated"),
                                      ("h5", "garbage")])
def test_a_damaged_file_is_named_on_read_and_embedded_again(tmp_path, fasta, esm2, fmt, how):
    out = tmp_path / "o"
    run(esm2, fasta, out, fmt)
    want = read_embeddings(out)
    path = out / ("a.pt" if fmt == "pt" else "embeddings.1-of-1.h5")
    DAMAGE[how](path)
    with pytest.raises(InputError, match=rf"{path.name} is damaged"):
        read_embeddings(out)
    again = run(esm2, fasta, out, fmt)
    assert again.stats.sequences == (1 if fmt == "pt" else 3) and again.skipped == 3 - again.stats.sequences
    assert same(read_embeddings(out), want) and not UNPICKLED


def test_a_flipped_tensor_byte_is_named_on_read(tmp_path, fasta, esm2):
    out = tmp_path / "o"
    run(esm2, fasta, out)
    data = bytearray((out / "b.pt").read_bytes())
    index = data.index(b"data/0") + 200  # inside the first tensor's bytes (the local header is ~100 bytes)
    data[index] ^= 0x40
    (out / "b.pt").write_bytes(bytes(data))
    with pytest.raises(InputError, match="b.pt.*differ from their sealed digest"):
        read_embeddings(out)


def test_a_renamed_copy_is_not_the_label_it_is_named_after(tmp_path, fasta, esm2):
    out = tmp_path / "o"
    run(esm2, fasta, out)
    shutil.copy(out / "a.pt", out / "b.pt")  # a's vectors under b's name, sealed by this very run
    with pytest.raises(InputError, match="b.pt holds 'a'"):
        read_embeddings(out)
    assert run(esm2, fasta, out).stats.sequences == 1  # b again


def test_labels_map_to_files_one_to_one(tmp_path, esm2):
    """'a/b' is written as a_b~<digest>.pt; a FASTA id that is that very stem gets a file of its own."""
    stem = safe_stem("a/b")
    path = tmp_path / "ids.fasta"
    path.write_text(f">a/b\n{SEQS['a']}\n>{stem}\n{SEQS['b']}\n>x~y\n{SEQS['c']}\n")
    run(esm2, path, tmp_path / "o")
    got = read_embeddings(tmp_path / "o")
    assert set(got) == {"a/b", stem, "x~y"}
    assert len({label_stem(label) for label in got}) == 3 and len(list((tmp_path / "o").glob("*.pt"))) == 3
    assert not torch.equal(got["a/b"]["mean_representations"][2], got[stem]["mean_representations"][2])


def test_two_identical_h5_runs_at_once_both_finish_or_one_refuses(tmp_path):
    """Two real processes, one folder, one shard: parts are numbered by the one process that holds the shard."""
    import random

    rng = random.Random(0)
    fasta = tmp_path / "many.fasta"
    fasta.write_text("".join(f">s{i}\n{''.join(rng.choice('ACDEFGHIKLMNPQRSTVWY') for _ in range(20))}\n"
                             for i in range(120)))
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "ptq_protein.cli.main", "embed", "tiny-esm2", str(fasta), "--out", str(out),
           "--format", "h5", "--toks-per-batch", "44", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    for code, err in results:
        assert code == 0 or (code == 2 and "is in use by" in err and len(err.strip().splitlines()) == 1), err
    assert any(code == 0 for code, _ in results)
    assert len(read_embeddings(out)) == 120 and not list(out.glob("parts-*"))


def test_h5_files_get_the_permissions_pt_files_get(tmp_path, fasta, esm2):
    old = os.umask(0o022)
    try:
        run(esm2, fasta, tmp_path / "h5", "h5")
        run(esm2, fasta, tmp_path / "pt", "pt")
    finally:
        os.umask(old)
    modes = {p.stat().st_mode & 0o777 for p in [*(tmp_path / "h5").glob("*.h5"), *(tmp_path / "pt").glob("*.pt")]}
    assert modes == {0o644}


def test_older_files_without_a_seal_are_embedded_again(tmp_path, fasta, esm2):
    """extract.py's own files (or an older release's) carry no seal: computed again, not trusted."""
    out = tmp_path / "o"
    run(esm2, fasta, out)
    torch.save(read_embeddings(out)["c"], out / "c.pt")  # the same dict, written as extract.py writes it
    with pytest.raises(InputError, match="c.pt carries no ptq-protein seal"):
        read_embeddings(out)
    assert run(esm2, fasta, out).stats.sequences == 1
    assert set(read_embeddings(out)) == set(SEQS)
