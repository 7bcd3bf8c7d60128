"""The ptq-protein command: quantize, fold, inspect; exit codes and one-line errors."""

import json

import pytest
from Bio.PDB import PDBParser

from ptq_protein.cli.main import main


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_quantize_then_fold_writes_parseable_pdbs(tmp_path, capsys):
    art = tmp_path / "art"
    code, out, err = _run(capsys, "quantize", "tiny-esmfold", "--bits", "8", "--calib", "casp14:3",
                          "--num-recycles", "0", "--out", str(art), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["recipe"] == "bf16-trunk" and summary["trunk_dtype"] == "bfloat16"  # ESMFold's 8-bit default
    assert (art / "model.safetensors").exists() and (art / "recipe.json").exists()
    fasta = tmp_path / "t.fasta"
    fasta.write_text(">one\nMKTAYIAKQRQISFVK\n>two\nGSHMLEDPVAGVSKEELLK\n")
    code, out, err = _run(capsys, "fold", str(art), "--fasta", str(fasta), "--out", str(tmp_path / "preds"),
                          "--num-recycles", "0")
    assert code == 0, err
    for name, length in (("one", 16), ("two", 19)):
        structure = PDBParser(QUIET=True).get_structure(name, str(tmp_path / "preds" / f"{name}.pdb"))
        residues = list(structure.get_residues())
        assert len(residues) == length
        bfactors = [a.get_bfactor() for a in structure.get_atoms()]
        assert all(0.0 <= b <= 100.0 for b in bfactors)
    # an existing --out is not overwritten
    code, _, err = _run(capsys, "quantize", "tiny-esmfold", "--out", str(art))
    assert code == 2 and "--force" in err and "\n" not in err.strip()


@pytest.mark.parametrize("model, preset, hinted, point", [
    ("tiny-esm2", "w8a8-pwlq", True, "on neither point"), ("tiny-esm2", None, False, "the accurate point"),
    ("tiny-esm2", "w8a8-smoothquant", False, "the fast point"), ("tiny-esmfold", None, False, None)])
def test_the_summary_says_where_a_language_model_recipe_sits(tmp_path, capsys, model, preset, hinted, point):
    """w8a8-pwlq runs an ESM-2 LM on CPU at about FP32's speed: the summary names the recipe whose fused integer
    layer is faster, once, and only where it applies; for a language model it says which point the recipe is on
    (ESM-2's default: the accurate one), for ESMFold nothing."""
    argv = ["quantize", model, "--calib", "casp14:2", "--check", "0", "--compare", "none", "--out", str(tmp_path / "a")]
    code, out, err = _run(capsys, *argv, *(["--preset", preset] if preset else []))
    assert code == 0, err
    speed = [line for line in out.splitlines() if line.startswith("speed:")]
    assert len(speed) == int(hinted)
    assert not hinted or "--preset w8a8-smoothquant" in speed[0]
    points = [line for line in out.splitlines() if line.startswith("embeddings on a CPU:")]
    assert len(points) == (point is not None) and (point is None or point in points[0])
    if preset is None and point is not None:
        assert "with w8a8-smoothquant-gptq-lntoken" in out  # --bits 8's recipe for an ESM-2


def test_inspect_writes_report_and_plot(tmp_path, capsys):
    code, out, err = _run(capsys, "inspect", "tiny-esm2", "--calib", "casp14:2", "--out", str(tmp_path / "i"))
    assert code == 0, err
    assert "asymmetry" in out and "special_min" in out and "special_max" in out  # BOS/EOS ranges apart
    assert (tmp_path / "i" / "report.json").exists() and (tmp_path / "i" / "histograms.png").exists()
    rows = json.loads((tmp_path / "i" / "report.json").read_text())
    lm = [r for r in rows if "special_max" in r]
    assert lm and all(r["special_count"] > 0 for r in lm)
    assert max(r["special_max"] - r["special_min"] for r in lm) > max(r["max"] - r["min"] for r in lm)


@pytest.mark.parametrize("argv, needle", [
    (("quantize", "tiny-esm2", "--preset", "w9a9"), "unknown preset"),
    (("quantize", "tiny-esm2", "--bits", "5"), "--bits 5"),
    (("quantize", "esm2_t33_650M_UR50D", "--out", "{tmp}/x"), "esm2_t33_650M_UR50D"),
    (("quantize", "tiny-esm2", "--calib", "{tmp}/bad.fasta", "--out", "{tmp}/y"), "bad.fasta"),
    (("fold", "{tmp}/nothing", "--fasta", "{tmp}/bad.fasta", "--out", "{tmp}/z"), "bad.fasta"),
])
def test_bad_input_one_line_exit_2(tmp_path, capsys, monkeypatch, argv, needle):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "bad.fasta").write_text(">x\nMKT1AY\n")
    code, _, err = _run(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
