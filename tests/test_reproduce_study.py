"""scripts/reproduce_study.py: every study row has a study-exact recipe, and the table prints every row."""

import importlib.util
import sys
from pathlib import Path

import ptq_protein as pp

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "reproduce_study.py"


def _script():
    spec = importlib.util.spec_from_file_location("reproduce_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_row_names_presets_and_prints():
    script = _script()
    recipes = [r for row in script.STRUCTURE_ROWS for r in row[1:3] if r]
    assert all(r in pp.PRESETS for r in recipes)
    assert all(row[1] == "fp" or row[1].startswith("study-") for row in script.STRUCTURE_ROWS)
    means = {r: (0.5, 3) for r in recipes}
    table = script.format_table(means, "tiny-esmfold", 128)
    for row in script.STRUCTURE_ROWS:
        line = next(l for l in table.splitlines() if l.startswith(f"| {row[0]} |"))
        assert f"{row[3]:.4f}" in line and "0.5000 (3)" in line
    assert "9 bits per value" in table and "toolkit check" in table and "cropped to 128" in table
    assert "normalised by the prediction's length" in table
    assert "missing" in script.format_table({}, "esmfold", None)


def test_the_structure_run_asks_for_the_study_normalisation():
    from ptq_protein.cli.main import build_parser

    args = build_parser().parse_args(["eval", "structure", "--model", "tiny-esmfold", "--out", "x",
                                      *_script().STUDY_TM_NORMALIZE])
    assert args.tm_normalize == "sequence"
