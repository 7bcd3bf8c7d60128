"""ESM's structural split read from a hand-made folder in its layout, the study's P@L, and the contact run."""

from __future__ import annotations

import importlib.util
import math
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from ptq_protein.eval.bench.structural_split import read_structural_split, study_contact_precisions
from ptq_protein.support.errors import InputError

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
AA = "ACDEFGHIKLMNPQRSTVWY"


def _domain(rng: np.random.Generator, length: int) -> dict:
    coords = np.cumsum(rng.normal(size=(length, 3)) * 2.2, axis=0)
    dist = np.linalg.norm(coords[:, None] - coords[None], axis=-1)
    dist[rng.integers(0, length)] = np.nan  # a residue without C-beta
    seq = "".join(rng.choice(list(AA), size=length))
    return {"seq": seq, "ssp": "-" * length, "dist": dist, "coords": coords}


def make_split(root: Path, train: int = 3, valid: int = 2, seed: int = 0) -> Path:
    """``root/structural-data`` with splits/fold/4/{train,valid}.txt and pkl/<name[1:3]>/<name>.pkl."""
    rng = np.random.default_rng(seed)
    base = root / "structural-data"
    (base / "splits" / "fold" / "4").mkdir(parents=True)
    for split, count in (("train", train), ("valid", valid)):
        names = [f"d{split[:1]}{i}x_a" for i in range(count)]
        (base / "splits" / "fold" / "4" / f"{split}.txt").write_text("\n".join(names) + "\n")
        for name in names:
            folder = base / "pkl" / name[1:3]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{name}.pkl").write_bytes(pickle.dumps(_domain(rng, int(rng.integers(24, 40)))))
    return root


def test_reads_the_layout_in_order(tmp_path):
    root = make_split(tmp_path)
    train = read_structural_split(root, "train")
    assert [d.name for d in train] == ["dt0x_a", "dt1x_a", "dt2x_a"]
    assert read_structural_split(root / "structural-data", "valid", limit=1)[0].name == "dv0x_a"
    assert all(d.dist.shape == (len(d.seq),) * 2 for d in train)


def test_bad_folders_and_pickles_are_refused(tmp_path):
    with pytest.raises(InputError, match="structural-data/splits"):
        read_structural_split(tmp_path, "train")
    root = make_split(tmp_path)
    evil = root / "structural-data" / "pkl" / "t0" / "dt0x_a.pkl"
    evil.write_bytes(pickle.dumps({"seq": "AAA", "dist": np.zeros((3, 3)), "x": Path("/")}))
    with pytest.raises(InputError, match="refusing"):
        read_structural_split(root, "train")


def _brute_force(pred, dist, lo, hi, count):
    """Every pair with j - i >= lo ranked by (score, then position); out-of-range pairs score -inf."""
    length = len(dist)
    pairs = []
    for i in range(length):
        for j in range(i + lo, length):
            inside = hi is None or j - i < hi
            pairs.append((-(pred[i, j] if inside else -math.inf), i, j))
    pairs.sort()
    hits = sum(1 for _, i, j in pairs[:count] if dist[i, j] < 8)  # NaN < 8 is False
    return hits / count


def test_precisions_match_a_brute_force_count():
    rng = np.random.default_rng(1)
    dom = _domain(rng, 31)
    pred = rng.random((31, 31))
    got = study_contact_precisions(pred, dom["dist"])
    for name, lo, hi in (("local", 3, 6), ("short", 6, 12), ("medium", 12, 24), ("long", 24, None)):
        for label, count in (("P@L", 31), ("P@L2", 15), ("P@L5", 6)):
            assert got[f"{name}_{label}"] == pytest.approx(_brute_force(pred, dom["dist"], lo, hi, count), abs=0)
    # a perfect predictor gets every local contact it can rank
    truth = np.nan_to_num(dom["dist"], nan=99.0) < 8
    perfect = study_contact_precisions(truth.astype(float), dom["dist"])
    i, j = np.triu_indices(31, 3)
    local = int(sum(truth[a, b] for a, b in zip(i, j) if b - a < 6))
    assert perfect["local_P@L"] == pytest.approx(min(local, 31) / 31)


def test_contact_run_on_tiny_esm2(tmp_path):
    pytest.importorskip("esm")
    from ptq_protein.eval.bench.study_contacts import evaluate_study_contacts, study_contact_configs
    from ptq_protein.models.loading import load_model

    root = make_split(tmp_path)
    model = load_model("tiny-esm2").model
    train, valid = read_structural_split(root, "train"), read_structural_split(root, "valid")
    results = evaluate_study_contacts(model, study_contact_configs(), train, valid)
    assert len(results) == 5
    for metrics in results.values():
        assert len(metrics) == 12 and all(0.0 <= v <= 1.0 for v in metrics.values())
    spec = importlib.util.spec_from_file_location("reproduce_study", SCRIPTS / "reproduce_study.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script
    spec.loader.exec_module(script)
    table = script.format_contacts(results, "tiny-esm2")
    assert table.count("\n| ") == 6 and "0.5015" in table and "toolkit check" in table
