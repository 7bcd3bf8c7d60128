"""The eval runners: keyed by target, resumable, length cap, summaries, and the ``eval`` CLI end to end.

Targets are short prefixes of bundled cameo139 targets with their natives cut
to the same residues (cameo139 numbering is 1-based along the sequence), so
every fold takes well under a second with the tiny models.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from ptq_protein.data.sets import load_set
from ptq_protein.eval.bench.results_store import ResultsStore, check_run_info
from ptq_protein.eval.bench.runner import RunOptions, normalize_recipes
from ptq_protein.eval.bench.structure_task import STRUCTURE_COLUMNS, evaluate_structure
from ptq_protein.eval.bench.summary import MetricSpec, bootstrap_mean_ci, summarize
from ptq_protein.eval.structure import load_structure
from ptq_protein.eval.tmscore import tm_score

# (id in our FASTA, bundled cameo139 source target, residues kept); FASTA order != file-name order.
PIECES = (("T3", "7ER0_A", 44), ("T1", "7EQH_A", 30), ("T2", "7F0A_A", 37))
FAST = RunOptions(calibration=None, num_recycles=0)


@pytest.fixture(scope="module")
def tiny_esmfold():
    from ptq_protein.models.loading import load_model

    return load_model("tiny-esmfold").model


@pytest.fixture(scope="module")
def user_set(tmp_path_factory):
    """FASTA + natives folder: files listed in another order than the FASTA, one named in upper case."""
    root = tmp_path_factory.mktemp("userset")
    cameo = load_set("cameo139")
    natives = root / "natives"
    natives.mkdir()
    fasta = []
    for new_id, source, keep in PIECES:
        target = cameo.get(source)
        fasta.append(f">{new_id} cut from {source}\n{target.sequence[:keep]}\n")
        name = f"{new_id.lower() if new_id == 'T2' else new_id}.pdb"
        (natives / name).write_text(_cut_pdb(cameo.native_text(target), keep))
    (root / "set.fasta").write_text("".join(fasta))
    return root


def _cut_pdb(text: str, keep: int) -> str:
    lines = [ln for ln in text.splitlines() if ln.startswith("ATOM") and int(ln[22:26]) <= keep]
    return "\n".join(lines + ["END"]) + "\n"


def _bench(user_set, limit=None):
    return load_set(f"{user_set / 'set.fasta'}:{user_set / 'natives'}", limit=limit)


def _rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_rows_are_keyed_by_target_not_by_file_order(tmp_path, tiny_esmfold, user_set):
    bench = _bench(user_set)
    assert bench.ids == ["T3", "T1", "T2"]
    out = evaluate_structure(tiny_esmfold, bench, ["fp"], tmp_path, FAST)
    rows = {r["target"]: r for r in _rows(out["results"])}
    assert sorted(rows) == ["T1", "T2", "T3"]
    for new_id, _, keep in PIECES:
        row = rows[new_id]
        native = load_structure(user_set / "natives" / f"{new_id.lower() if new_id == 'T2' else new_id}.pdb")
        assert int(row["length"]) == keep
        assert int(row["native_length"]) == len(native)  # distinct per target: a mix-up would show
        # Independent recomputation from the written PDB and this target's own native file.
        expected = tm_score(load_structure(tmp_path / row["pdb"]), native, pairing="sequence").tm_score
        assert float(row["tm_score"]) == pytest.approx(expected, abs=1e-5)
    assert len({r["native_length"] for r in rows.values()}) == 3


def test_resume_neither_redoes_nor_duplicates(tmp_path, tiny_esmfold, user_set, monkeypatch):
    import ptq_protein.eval.bench.folding as folding

    real, calls = folding.fold_one, []

    def counting(model, sequence, num_recycles=None):
        if len(calls) == stop_after[0]:
            raise KeyboardInterrupt  # an interrupted run, half way
        calls.append(sequence)
        return real(model, sequence, num_recycles)

    monkeypatch.setattr(folding, "fold_one", counting)
    bench, recipes = _bench(user_set), ["fp", "w8-only"]
    stop_after = [4]  # fp x 3 targets, then one w8-only target
    with pytest.raises(KeyboardInterrupt):
        evaluate_structure(tiny_esmfold, bench, recipes, tmp_path, FAST)
    assert len(_rows(tmp_path / "results.csv")) == 4
    stop_after = [math.inf]
    calls.clear()
    evaluate_structure(tiny_esmfold, bench, recipes, tmp_path, FAST)
    assert len(calls) == 2  # only the two w8-only targets not done
    calls.clear()
    evaluate_structure(tiny_esmfold, bench, recipes, tmp_path, FAST)
    assert calls == []
    rows = _rows(tmp_path / "results.csv")
    keys = [(r["recipe"], r["target"]) for r in rows]
    assert len(keys) == len(set(keys)) == 6
    assert all(r["status"] == "ok" for r in rows)
    w8 = [r for r in rows if r["recipe"] == "w8-only"]
    assert all(0.0 < float(r["tm_fidelity"]) <= 1.0 + 1e-6 for r in w8)


def test_over_length_target_is_reported_not_fatal(tmp_path, tiny_esmfold, user_set, caplog):
    options = RunOptions(calibration=None, num_recycles=0, max_length=40)
    with caplog.at_level("WARNING"):
        out = evaluate_structure(tiny_esmfold, _bench(user_set), ["fp"], tmp_path, options)
    rows = {r["target"]: r for r in _rows(out["results"])}
    assert rows["T3"]["status"] == "skipped: length 44 > cap 40"
    assert rows["T3"]["tm_score"] == ""
    assert rows["T1"]["status"] == rows["T2"]["status"] == "ok"
    assert "T3" in caplog.text and "44 > cap 40" in caplog.text
    assert "skipped: length 44 > cap 40" in out["summary"].read_text()
    assert out["counts"]["skipped"] == 1 and out["counts"]["ok"] == 2
    # A larger cap on resume runs the skipped target and replaces its row.
    out = evaluate_structure(tiny_esmfold, _bench(user_set), ["fp"], tmp_path, FAST)
    assert out["counts"] == {"ok": 1, "skipped": 0, "error": 0, "resumed": 2}
    rows = _rows(out["results"])
    assert len(rows) == 3 and all(r["status"] == "ok" for r in rows)


def test_target_without_native_scored_only_against_fp(tmp_path, tiny_esmfold, user_set):
    bench = load_set(user_set / "set.fasta", limit=1)  # no natives folder
    out = evaluate_structure(tiny_esmfold, bench, ["fp", "w8-only"], tmp_path, FAST)
    rows = _rows(out["results"])
    assert [r["tm_score"] for r in rows] == ["", ""]
    assert all(r["status"] == "ok" and r["tm_fidelity"] for r in rows)


def test_contacts_agree_between_fair_esm_and_transformers():
    """tiny-esm2 and tiny-esm2-hf hold the same weights: two implementations, one contact map."""
    from ptq_protein.eval.bench.contacts_task import predict_contacts
    from ptq_protein.models.loading import load_model

    fair, hf = load_model("tiny-esm2").model, load_model("tiny-esm2-hf").model
    before = hf.config._attn_implementation
    seq = load_set("cameo139").get("7F9H_A").sequence[:60]
    np.testing.assert_allclose(predict_contacts(hf, seq), predict_contacts(fair, seq), atol=1e-5)
    assert hf.config._attn_implementation == before  # eager attention only for the call


# --- store and summary ----------------------------------------------------------------


def test_store_replaces_by_key_and_refuses_another_table(tmp_path):
    store = ResultsStore(tmp_path / "r.csv", ("target", "recipe", "status", "x"))
    store.put({"target": "a", "recipe": "fp", "status": "error: boom"})
    assert not store.is_done("fp", "a")
    store.put({"target": "a", "recipe": "fp", "status": "ok", "x": 0.5})
    again = ResultsStore(tmp_path / "r.csv", ("target", "recipe", "status", "x"))
    assert again.rows() == [{"target": "a", "recipe": "fp", "status": "ok", "x": "0.5"}]
    with pytest.raises(ValueError, match="new --out"):
        ResultsStore(tmp_path / "r.csv", ("target", "recipe", "status", "y"))
    check_run_info(tmp_path, {"model": "m", "set": "s"})
    check_run_info(tmp_path, {"model": "m", "set": "s"})
    with pytest.raises(ValueError, match="model: 'm' -> 'other'"):
        check_run_info(tmp_path, {"model": "other", "set": "s"})


def test_bootstrap_interval_against_direct_resampling():
    x = np.random.default_rng(3).normal(0.1, 0.05, size=40)
    mean, low, high = bootstrap_mean_ci(x, resamples=4000, seed=1)
    assert mean == pytest.approx(x.mean())
    se = x.std(ddof=1) / math.sqrt(x.size)  # normal approximation: the interval is about +-1.96 se
    assert low == pytest.approx(mean - 1.96 * se, abs=0.3 * se)
    assert high == pytest.approx(mean + 1.96 * se, abs=0.3 * se)
    assert bootstrap_mean_ci([0.2, 0.2]) == (0.2, 0.2, 0.2)
    with pytest.raises(ValueError):
        bootstrap_mean_ci([])


def test_summarize_pairs_by_target_and_counts_wins():
    def row(recipe, target, value, status="ok"):
        return {"recipe": recipe, "target": target, "status": status, "rmsd": value}

    rows = [row("fp", "a", "2.0"), row("fp", "b", "3.0"), row("fp", "c", "1.0"),
            row("q", "b", "2.5"), row("q", "a", "2.5"), row("q", "c", "", "skipped: length 9 > cap 8")]
    fp, q = summarize(rows, ["fp", "q"], MetricSpec("rmsd", "RMSD", higher_is_better=False))
    assert (fp.n, fp.mean, fp.median) == (3, 2.0, 2.0)
    assert q.n_paired == 2 and q.delta == pytest.approx(0.0)  # (+0.5 on a, -0.5 on b), paired by id
    assert (q.wins, q.losses, q.ties) == (1, 1, 0)  # lower RMSD is the win (target b)


def test_normalize_recipes_puts_fp_first_once():
    assert normalize_recipes("w8a8-pwlq, fp,w8a8-pwlq") == ("fp", "w8a8-pwlq")
    assert normalize_recipes(["w8-only"]) == ("fp", "w8-only")
    with pytest.raises(ValueError, match="unknown recipe"):
        normalize_recipes("w9a9")


# --- CLI end to end -------------------------------------------------------------------


def _cli(args):
    from ptq_protein.cli.main import main

    return main(["eval", *args, "--quiet"])


def test_cli_structure_writes_every_output(tmp_path, user_set):
    out = tmp_path / "eval"
    code = _cli(["structure", "--model", "tiny-esmfold", "--recipes", "fp,w8a8-pwlq",
                 "--set", f"{user_set / 'set.fasta'}:{user_set / 'natives'}", "--limit", "2",
                 "--calib", str(user_set / "set.fasta"), "--num-recycles", "0", "--out", str(out)])
    assert code == 0
    rows = _rows(out / "results.csv")
    assert list(rows[0]) == list(STRUCTURE_COLUMNS)
    assert sorted((r["recipe"], r["target"]) for r in rows) == [("fp", "T1"), ("fp", "T3"),
                                                                ("w8a8-pwlq", "T1"), ("w8a8-pwlq", "T3")]
    assert all(r["status"] == "ok" for r in rows)
    assert (out / "pdb" / "w8a8-pwlq" / "T3.pdb").exists()
    summary = (out / "summary.md").read_text()
    assert "w8a8-pwlq" in summary and "tiny random model" in summary and "Δ mean vs FP" in summary
    assert (out / "fp_vs_quantized.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_contacts_writes_every_output(tmp_path, user_set):
    out = tmp_path / "contacts"
    code = _cli(["contacts", "--model", "tiny-esm2", "--recipes", "fp,w8a8-pwlq",
                 "--set", f"{user_set / 'set.fasta'}:{user_set / 'natives'}",
                 "--calib", str(user_set / "set.fasta"), "--out", str(out)])
    assert code == 0
    rows = _rows(out / "results.csv")
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)
    for r in rows:  # an empty cell: no native long-range contact in this short fragment (undefined, not 0.0)
        assert r["long_P@L"] == "" or 0.0 <= float(r["long_P@L"]) <= 1.0
        assert 0.0 <= float(r["local_P@L"]) <= 1.0  # i, i+3..5 contacts exist in any fold
        assert (out / r["contacts"]).exists()
    assert all(float(r["mae_vs_fp"]) == 0.0 for r in rows if r["recipe"] == "fp")
    assert "long-range P@L" in (out / "summary.md").read_text()
    assert (out / "fp_vs_quantized.png").read_bytes()[:4] == b"\x89PNG"
    # Resuming with another model is refused instead of mixing two runs in one table.
    assert _cli(["contacts", "--model", "tiny-esm2@1", "--set", f"{user_set / 'set.fasta'}",
                 "--out", str(out)]) == 2


def test_tm_normalize_sequence_counts_unobserved_native_residues(tmp_path, tiny_esmfold, user_set):
    """A native missing residues 5-14: ``sequence`` normalises by the full sequence; recorded and printed."""
    import json

    (tmp_path / "natives").mkdir()
    text = (user_set / "natives" / "T1.pdb").read_text()
    (tmp_path / "natives" / "T1.pdb").write_text("\n".join(
        ln for ln in text.splitlines() if not (ln.startswith("ATOM") and 5 <= int(ln[22:26]) <= 14)) + "\n")
    (tmp_path / "set.fasta").write_text((user_set / "set.fasta").read_text())
    bench = load_set(f"{tmp_path / 'set.fasta'}:{tmp_path / 'natives'}").select(["T1"])
    out_dir = tmp_path / "run"
    out = evaluate_structure(tiny_esmfold, bench, ["fp"], out_dir,
                             RunOptions(calibration=None, num_recycles=0, tm_normalize="sequence"))
    row = _rows(out["results"])[0]
    native = load_structure(tmp_path / "natives" / "T1.pdb")
    pred = load_structure(out_dir / row["pdb"])
    by_sequence = tm_score(pred, native, pairing="sequence", normalize="sequence")
    by_native = tm_score(pred, native, pairing="sequence")
    observed = int(np.isfinite(native.ca).all(-1).sum())
    assert int(row["native_length"]) == by_sequence.length == 30 and by_native.length == observed < 30
    assert float(row["tm_score"]) == pytest.approx(by_sequence.tm_score, abs=1e-5)
    assert by_sequence.tm_score < by_native.tm_score
    assert json.loads((out_dir / "run.json").read_text())["tm_normalize"] == "sequence"
    assert "normalised by the prediction's full sequence length" in out["summary"].read_text()
    with pytest.raises(ValueError, match="tm_normalize"):  # resuming with the other normalisation is refused
        evaluate_structure(tiny_esmfold, bench, ["fp"], out_dir, FAST)
    # the calibration batch size is recorded resolved (ESMFold's default: 1), and a resume may not change it
    assert json.loads((out_dir / "run.json").read_text())["calibration_batch_size"] == 1
    with pytest.raises(ValueError, match="calibration_batch_size: 1 -> 2"):
        evaluate_structure(tiny_esmfold, bench, ["fp"], out_dir,
                           RunOptions(calibration=None, num_recycles=0, tm_normalize="sequence", batch_size=2))


def test_run_options_reject_an_unknown_tm_normalize():
    from ptq_protein.support.errors import InputError

    with pytest.raises(InputError, match="tm_normalize='model' is not one of"):
        RunOptions(tm_normalize="model")


def test_recipes_of_one_run_share_calibration_passes_and_give_the_rows_of_separate_runs(tmp_path, user_set,
                                                                                          monkeypatch):
    from ptq_protein.passes import forwards

    calls = []
    for name in ("calibrate", "study_calibrate"):  # every calibration pass runs through forwards
        real = getattr(forwards, name)
        monkeypatch.setattr(forwards, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or
                            _real(*a, **k))
    common = ["--set", f"{user_set / 'set.fasta'}:{user_set / 'natives'}", "--calib", str(user_set / "set.fasta")]
    recipes = ["w8a8-pwlq", "w8a8-uniform", "study-a8-uniform", "study-a8-pwlq"]
    assert _cli(["contacts", "--model", "tiny-esm2", "--recipes", ",".join(["fp", *recipes]), *common,
                 "--out", str(tmp_path / "together")]) == 0
    assert sorted(calls) == ["calibrate", "study_calibrate"]  # one pass of ours, one of the study's
    together = {(r["recipe"], r["target"]): r for r in _rows(tmp_path / "together" / "results.csv")}
    for recipe in recipes:
        assert _cli(["contacts", "--model", "tiny-esm2", "--recipes", f"fp,{recipe}", *common,
                     "--out", str(tmp_path / recipe)]) == 0
        for row in _rows(tmp_path / recipe / "results.csv"):
            other = together[(row["recipe"], row["target"])]
            assert {k: v for k, v in row.items() if k != "seconds"} == \
                {k: v for k, v in other.items() if k != "seconds"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fold_one_writes_the_pdb_of_a_half_precision_model(tiny_esmfold, dtype):
    """transformers' PDB writer goes through numpy, which has no bfloat16: the fold still writes its PDB,
    and the PDB's CA coordinates are the returned ones (to the PDB's 3 decimals)."""
    import copy

    import torch

    from ptq_protein.eval.bench.folding import fold_one

    model = copy.deepcopy(tiny_esmfold).to(getattr(torch, dtype))
    pdb, plddt, ca = fold_one(model, "MKTAYIAKQRQISFVKSHFSRQ", num_recycles=0)
    native = load_structure(pdb)
    assert len(native) == 22 and 0.0 <= plddt <= 100.0
    np.testing.assert_allclose(native.ca, ca.double().numpy(), atol=1e-3)
