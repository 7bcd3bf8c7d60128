"""Small commands import only what they need, and the TM-score search gives one answer in numpy and in torch.

``tmscore``, ``lddt``, ``contacts``, ``--help`` and ``--version`` run in a fresh
interpreter under ``python -X importtime``, whose report names every module
the command imported: torch and transformers (seconds of imports) must not be
among them. The search is one implementation for numpy arrays and torch
tensors; the two backends must agree on the bundled structures.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
from eval_testlib import FULL_NATIVE, STRUCTURES

from ptq_protein.eval import arrays
from ptq_protein.eval.contacts import contact_map
from ptq_protein.eval.tmscore import paired_ca, tm_score_batch
from ptq_protein.eval.tmsearch import tm_search

MODEL = STRUCTURES / "noise_7TV9_3.model.pdb.gz"
NATIVE = STRUCTURES / "7TV9.native.pdb.gz"
HEAVY = ("torch", "transformers", "esm")


def _imported_modules(argv: list) -> set:
    """Modules a fresh ``python -m ptq_protein.cli.main ARGV`` imported, read from ``-X importtime``."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "ptq_protein.cli.main", *map(str, argv)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("argv, needed", [
    (["tmscore", MODEL, NATIVE], "ptq_protein.eval.tmsearch"),
    (["tmscore", MODEL, NATIVE, "--pairing", "sequence", "--json"], "ptq_protein.eval.tmsearch"),
    (["lddt", MODEL, NATIVE], "ptq_protein.eval.lddt"),
    (["contacts", "PRED", FULL_NATIVE], "ptq_protein.eval.contacts"),
    (["--help"], "argparse"),
    (["--version"], "argparse"),
], ids=["tmscore", "tmscore-sequence-json", "lddt", "contacts", "help", "version"])
def test_small_commands_do_not_import_torch(tmp_path, full_native, argv, needed):
    if "PRED" in argv:
        pred = tmp_path / "pred.npy"
        np.save(pred, contact_map(full_native).astype(np.float32))
        argv = [pred if a == "PRED" else a for a in argv]
    modules = _imported_modules(argv)
    assert needed in modules  # the command really ran its code
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"{argv[0]} imported {heavy[:5]}"


@pytest.fixture(scope="module")
def bundled_pairs(golden) -> tuple:
    """(ids, paired CA coordinates, normalisation lengths) of a third of the golden cases (12-513 pairs)."""
    cases = golden["cases"][::3]
    with warnings.catch_warnings():  # some cases pair unrelated residues on purpose
        warnings.simplefilter("ignore")
        paired = [paired_ca(STRUCTURES / c["model"], STRUCTURES / c["native"], c["pairing"]) for c in cases]
    return [c["id"] for c in cases], [(m, n) for m, n, _ in paired], [length for _, _, length in paired]


def test_numpy_and_torch_searches_agree_on_bundled_structures(bundled_pairs):
    torch = pytest.importorskip("torch")
    ids, pairs, lengths = bundled_pairs
    on_numpy = tm_score_batch(pairs, lengths)
    on_torch = tm_score_batch([(torch.as_tensor(m), torch.as_tensor(n)) for m, n in pairs], lengths)
    assert len(on_numpy) == len(on_torch) == len(ids)
    for case_id, a, b in zip(ids, on_numpy, on_torch):
        assert (a.n_aligned, a.length) == (b.n_aligned, b.length), case_id
        assert (a.gdt_ts, a.gdt_ha) == (b.gdt_ts, b.gdt_ha), case_id  # from integer counts: exactly equal
        assert a.tm_score == pytest.approx(b.tm_score, rel=0, abs=1e-12), case_id
        assert a.rmsd == pytest.approx(b.rmsd, rel=0, abs=1e-12), case_id


def test_search_returns_arrays_of_the_inputs_library(bundled_pairs):
    torch = pytest.importorskip("torch")
    _, pairs, lengths = bundled_pairs
    m, n = pairs[0]
    out = tm_search(m[None], n[None], [len(m)], lengths[:1])
    assert all(isinstance(v, np.ndarray) for v in (out.tm_score, out.gdt_counts, out.rmsd))
    out_t = tm_search(torch.as_tensor(m)[None], torch.as_tensor(n)[None], torch.tensor([len(m)]),
                      torch.tensor(lengths[:1]))
    assert all(isinstance(v, torch.Tensor) for v in (out_t.tm_score, out_t.gdt_counts, out_t.rmsd))
    assert float(out.tm_score[0]) == pytest.approx(float(out_t.tm_score[0]), rel=0, abs=1e-12)


def test_array_api_compat_numpy_gives_the_same_scores(bundled_pairs, monkeypatch):
    """numpy < 2.1 runs the search through array-api-compat's numpy namespace: the same numbers."""
    _, pairs, lengths = bundled_pairs
    native = tm_score_batch(pairs[::4], lengths[::4])
    monkeypatch.setattr(arrays, "_NATIVE_NUMPY", False)
    assert arrays.namespace(np.zeros(1)) is not np
    assert tm_score_batch(pairs[::4], lengths[::4]) == native


def test_bench_small_commands_prints_its_table(capsys):
    """scripts/bench/small_commands.py: every row timed, a baseline commit extracted and run (no timing asserted)."""
    import importlib.util
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    if not (repo / ".git").exists():
        pytest.skip("--baseline needs a git checkout")
    path = repo / "scripts" / "bench" / "small_commands.py"
    spec = importlib.util.spec_from_file_location("bench_small_commands", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--rounds", "1", "--warmup", "0", "--only", "tmscore", "--baseline", "HEAD"]) == 0
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith(("| command", "| ---"))]
    assert [r[0] for r in rows] == ["floor: python -c 'import numpy, Bio.PDB'", "tmscore", "tmscore (baseline)"]
    for row in rows:
        assert all(float(v) > 0 for v in (row[1], row[3], row[4])), row
