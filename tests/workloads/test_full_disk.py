"""A write that runs out of disk during an ``embed --format h5`` run is one line naming the file, exit 1 (HDF5's own
writer printed thousands of lines and crashed with SIGSEGV); a rerun with room resumes to a clean run's result."""

import errno
import subprocess
import sys

import pytest
import torch

from ptq_protein import read_embeddings
from ptq_protein.cli.main import main
from ptq_protein.support import io_utils

pytest.importorskip("h5py")
SEQ = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ" * 6
ARGS = ["--format", "h5", "--include", "per_tok", "mean", "contacts", "--toks-per-batch", "1000", "--quiet"]
LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
from ptq_protein.cli.main import main
sys.exit(main(["embed", "tiny-esm2", *sys.argv[2:]]))
"""


@pytest.fixture()
def fasta(tmp_path):
    path = tmp_path / "x.fasta"
    path.write_text("".join(f">s{i}\n{SEQ}\n" for i in range(12)))
    return path


@pytest.mark.parametrize("limit, where", [(20_000, "parts-1-of-1/000001.h5"), (2_000_000, "embeddings.1-of-1.h5")])
def test_a_write_past_the_limit_is_one_line_and_the_rerun_resumes(tmp_path, fasta, limit, where):
    out = tmp_path / "o"
    run = subprocess.run([sys.executable, "-c", LIMITED, str(limit), str(fasta), "--out", str(out), *ARGS],
                         capture_output=True, text=True, timeout=300)
    err = run.stderr.strip()
    assert run.returncode == 1 and len(err.splitlines()) == 1, err[-2000:]
    assert f"{where}: File too large" in err and "free space there" in err
    assert main(["embed", "tiny-esm2", str(fasta), "--out", str(out), *ARGS]) == 0
    assert main(["embed", "tiny-esm2", str(fasta), "--out", str(tmp_path / "clean"), *ARGS]) == 0
    got, want = read_embeddings(out), read_embeddings(tmp_path / "clean")
    assert got.keys() == want.keys()
    for label in want:
        torch.testing.assert_close(got[label]["representations"][2], want[label]["representations"][2])


def test_a_full_disk_names_the_file_and_the_disk(tmp_path, fasta, capsys, monkeypatch):
    real_open = open

    def full_disk_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        if "w" in mode and ".h5" in str(path):
            handle.write = lambda data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device"))
        return handle

    monkeypatch.setattr(io_utils, "open", full_disk_open, raising=False)
    assert main(["embed", "tiny-esm2", str(fasta), "--out", str(tmp_path / "o"), *ARGS]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "000001.h5: No space left on device (the disk holding it is full" in err
    assert not [p for p in (tmp_path / "o").rglob("*") if ".tmp-" in p.name]
